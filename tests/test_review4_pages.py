"""The fourth review of the front matter and the appendix pages (README, intro, how to run,
notation, glossary, teacher's guide, references): each corrected statement as the page now
makes it, and where it can be read, the fact behind it (the Makefile, the requirements, the
tools, the library, the chapters' own text or a recorded run), so that the wrong statement
cannot come back."""
import glob
import inspect
import json
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, metadata

import pytest
import yaml

from conftest import ROOT, require
from flashbook import runtime, tiled
from notebook_text import NOTEBOOKS, book_page, cell_source, cells, flat, glossary_entry, markdown, source_of

TOOLS = os.path.join(ROOT, "tools")


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _readme():
    return _read("README.md")


def _requires_python(package):
    try:
        return metadata(package)["Requires-Python"]
    except PackageNotFoundError:
        return None


# --- 1, 2, 3, 19: what `make` needs and installs -------------------------------------------------

def test_make_needs_python_3_11_while_the_library_keeps_its_floor():
    """"Python 3.9 or newer" was wrong for `make`: torch 2.13 asks for 3.10, and the versions
    the book is built with (triton 3.9, numpy 2.4, ...) for 3.11. The library alone keeps
    pyproject's floor."""
    from packaging.specifiers import SpecifierSet

    assert "TORCH_SPEC ?= torch==2.13.0" in _read("Makefile")
    torch_floor = _requires_python("torch")
    require(torch_floor is not None, "torch is not installed")
    assert not SpecifierSet(torch_floor).contains("3.9") and SpecifierSet(torch_floor).contains("3.10")
    for package in ("numpy", "triton"):
        floor = _requires_python(package)
        if floor is not None:                                  # triton: Linux only
            assert not SpecifierSet(floor).contains("3.10"), (package, floor)
    assert sys.version_info >= (3, 11)                         # the tests run where make runs
    page = flat(book_page("how_to_run.md"))
    assert "You need Python 3.9 or newer" not in page
    assert "You need Linux (on Windows, WSL), Python 3.11 or newer, `make` and `git`" in page
    assert "PyTorch 2.13 alone needs 3.10" in page
    readme = flat(_readme())
    assert "(Python 3.9+, `make`, `git`)" not in readme and "in WSL; Python 3.11+,\n`make`, `git`;" in _readme()
    # the library on its own: pyproject's floor, as the last section of how_to_run says
    pyproject = _read("pyproject.toml")
    assert 'requires-python = ">=3.9"' in pyproject and '"torch>=2.4"' in pyproject
    library = flat(book_page("how_to_run.md").split("(install-library)=")[1])
    assert "it asks for Python 3.9 or newer, `torch>=2.4`" in library
    assert "asks less: Python 3.9 and torch 2.4" in readme


CPU_BUILD = 'make book TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"'


def test_the_default_torch_is_pypis_cuda_build_and_the_cpu_build_is_asked_for():
    """PyPI's Linux x86-64 `torch==2.13.0` is the CUDA build on any machine; the page said the
    default was the CPU build. The Makefile's default names no other index."""
    default = re.search(r"^TORCH_SPEC \?= (.*)$", _read("Makefile"), re.M).group(1)
    assert default == "torch==2.13.0" and "--index-url" not in default
    assert '"$(TORCH_SPEC)"' in _read("Makefile")              # passed on to tools/venv_install.py
    page = flat(book_page("how_to_run.md"))
    assert "that is the CPU build" not in page and "TORCH_SPEC=torch`" not in page
    assert "From PyPI on Linux x86-64 that is the CUDA build, on any machine" in page
    assert CPU_BUILD in page
    readme = flat(_readme())
    assert "TORCH_SPEC=torch` for PyPI's CUDA build" not in readme
    assert "`torch==2.13.0` is the CUDA build" in readme and CPU_BUILD in readme


def test_jupyterlab_is_installed_before_it_is_started():
    """`make` installs no JupyterLab, so `.venv/bin/jupyter lab` alone failed."""
    for name in ("requirements.txt", "requirements-dev.txt"):
        assert "jupyterlab" not in _read(name).lower(), name
    page = book_page("how_to_run.md")
    install = page.index(".venv/bin/pip install jupyterlab")
    assert install < page.index(".venv/bin/jupyter lab notebooks/")
    assert "`make` does not install JupyterLab" in flat(page)
    for text in (page, _readme()):
        bare = [m.start() for m in re.finditer(r"jupyter lab", text)
                if not text[:m.start()].endswith(".venv/bin/")]
        assert bare == [], bare
    assert ".venv/bin/pip install jupyterlab" in _readme()


def test_make_test_runs_the_tests_that_need_no_gpu():
    makefile = _read("Makefile")
    test_target = makefile.split("\ntest:")[1].split("\n\n")[0]
    assert '-m "not gpu"' in test_target
    assert "-m gpu" in makefile.split("\ngpu-test:")[1].split("\n\n")[0]
    readme, page = flat(_readme()), flat(book_page("how_to_run.md"))
    assert "run every test that needs no GPU" in readme and "run every test\n" not in _readme()
    assert "runs every test that needs no GPU" in page and "# runs every test (it" not in page
    assert "make gpu-test # on a machine with a CUDA GPU: the GPU tests" in page


# --- 4, 20: the README's lists --------------------------------------------------------------------

def test_gpu_run_sh_runs_three_benchmarks_and_chapters_6_to_12():
    script = _read("tools", "gpu_run.sh")
    runs = [line for line in script.splitlines() if line.startswith("$py -m flashbook.bench")]
    assert len(runs) == 3 and not any("--peer" in line for line in runs)
    assert any("--sweep-blocks" in line for line in runs) and any("--ladder" in line for line in runs)
    globs = re.search(r"tools/run_notebooks\.py \S+ (.*?) \|\|", script).group(1).split()
    executed = sorted({int(os.path.basename(p)[:2]) for g in globs for p in glob.glob(os.path.join(ROOT, g))})
    assert executed == list(range(6, 13))
    readme = flat(_readme())
    assert "chapters 6-10 executed" not in readme
    assert ("bash tools/gpu_run.sh OUT_DIR # the sweep, the block sweep and the ladder (not the --peer "
            "# runs), and chapters 6-12 executed") in readme


def test_readme_lists_the_which_function_page():
    assert os.path.isfile(os.path.join(ROOT, "book", "which_kernel.md"))
    where = flat(_readme().split("## What is where")[1].split("notebooks/")[0])
    assert "introduction, how to run, which function to use, notation," in where


# --- 5, 6, 10, 11, 12, 15, 16: the teacher's guide ----------------------------------------------

def _largest_square(chip, d, stages):
    fits = [b for b in (16, 32, 64, 128, 256)
            if tiled.smem_bytes(b, b, d, num_stages=stages, arch=chip.arch) <= chip.smem_per_block_bytes]
    return max(fits) if fits else None


def test_ch6_ex4_rubric_says_why_the_t4_stops_where_the_a100_does():
    """The T4 does not stop earlier: at d = 128 both stop at 64, the T4 because sm_75 keeps fp32
    operand copies without stages (its 64 KiB hold 64 x 64 exactly), the A100 because of its
    three stages (with one or two, 128 fits)."""
    t4, a100 = runtime.chip("T4"), runtime.chip("A100")
    assert _largest_square(t4, 128, 3) == _largest_square(a100, 128, 3) == 64
    assert {_largest_square(t4, 128, s) for s in (1, 2, 3)} == {64}
    assert tiled.smem_bytes(64, 64, 128, num_stages=3, arch="sm_75") == t4.smem_per_block_bytes == 64 * 1024
    assert _largest_square(a100, 128, 1) == _largest_square(a100, 128, 2) == 128
    solution = source_of(next(c for c in cells("06_gpu_and_triton") if "The T4 column ignores the stages" in source_of(c)))
    assert "largest_square_tile(c, 128, 3)" in solution
    guide = flat(book_page("teachers_guide.md"))
    assert "so its column stops earlier" not in guide
    assert ("the T4 stops at the same tile as the A100, for another reason: on sm_75 Triton keeps fp32 "
            "copies of the operand tiles and no pipeline stages, so `num_stages` does not change its "
            "count, and its 64 KiB hold exactly a 64 × 64 tile at $d$ = 128; the A100 stops at 64 "
            "because of its three stages (with one or two stages, 128 fits)") in guide


def test_ch7_misconception_names_the_forwards_extra_work_not_recomputation():
    """Chapter 7 times forward passes, which recompute nothing; recomputation is the backward's."""
    assert "$4BHN^2d$ for the forward" in flat(markdown("07_triton_forward"))
    guide = flat(book_page("teachers_guide.md"))
    assert "It does *more* (recomputation)" not in guide
    assert ("It does the same two matrix products plus the online softmax's rescaling (and its "
            "backward, chapter 8, recomputes $S$ and $P$); it is faster because it moves far fewer "
            "bytes.") in guide


def test_session_8_says_the_atomic_dq_differs_only_on_a_gpu():
    """In the interpreter chapter 8's cell asserts both modes are bitwise repeatable; the
    book shows the run recorded on a GPU (the guide names it), where the atomic dQ differed."""
    code = cell_source("08_triton_backward", "43428188")
    assert "In the interpreter both modes are deterministic" in code and "assert all(same.values())" in code
    with open(os.path.join(ROOT, "benchmarks", "results", "gpu_outputs", "08_triton_backward.json")) as f:
        recorded = json.load(f)
    gpu = recorded["provenance"]["gpu"]     # "NVIDIA H100 80GB HBM3": the guide names its chip
    chip = next(name for name in ("H100", "H200", "A100", "T4") if name in gpu)
    shown = "".join(o.get("text", "") for c in recorded["cells"] if c["id"] == "43428188" for o in c["outputs"])
    assert "dq_mode='atomic'    dQ: bitwise equal: False" in shown
    guide = flat(book_page("teachers_guide.md"))
    assert "| 20: run the atomic dQ twice, compare bits (on a GPU; see below) |" in guide
    assert ("Session 8's demo shows the atomic dQ's nondeterminism only on a GPU: the interpreter runs "
            "the programs one at a time, in order, so there both runs agree bit for bit") in guide
    assert f"the book's page shows the run recorded on an {chip}" in guide


def _exercise_count(chapter):
    name = os.path.basename(glob.glob(os.path.join(NOTEBOOKS, f"{chapter:02d}_*.ipynb"))[0])
    part = markdown(name).split("## Exercises")[1].split("## Further reading")[0]
    found = [int(bold or heading)
             for bold, heading in re.findall(r"^(?:\*\*(\d+)\. |### Exercise (\d+)\b)", part, re.M)]
    assert found == list(range(1, len(found) + 1)), (chapter, found)
    return len(found)


def test_the_session_plan_places_every_exercise_and_each_session_is_90_minutes():
    table = book_page("teachers_guide.md").split("## Timing of a 90-minute session")[1].split("\n\n")[2]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == list(range(1, 13))
    for session, explain, demo, in_class, exercises in rows:
        assert int(explain) + int(demo.split(":")[0]) + int(in_class) == 90, session
        placed = sorted(int(n) for n in re.findall(r"\d+", exercises))
        assert placed == list(range(1, _exercise_count(int(session)) + 1)), (session, exercises)
    assert rows[1][4] == "1, 2, 3 (4 as homework)" and rows[9][4] == "1, 2 (3, 4 and 5 as homework)"


def test_colabs_paid_h100_runs_the_gluon_kernel():
    from flashbook.kernels import hopper

    assert "get_device_capability(device)[0] == 9" in inspect.getsource(hopper.available)
    guide = flat(book_page("teachers_guide.md"))
    assert "add L4, A100 and H100 GPUs" in guide
    assert "an H100 also runs chapter 10's Gluon kernel, which needs a Hopper GPU" in guide
    assert "needs an H100 or H200" in flat(book_page("how_to_run.md"))


def test_persistent_kernel_misconception_matches_the_recorded_ratios():
    """"Slower at every shape" overstated it: on full attention with the old tiles the ratios
    are within noise (up to 0.999); it was never faster, and lost most on causal rows."""
    from flashbook.bench.experiments import GLUON_SHORT_SWEEPS, schedule_pairs

    pairs = schedule_pairs(GLUON_SHORT_SWEEPS[1], "persistent", "overlap")
    require(pairs is not None, "no recorded persistent run")
    ratio = pairs["first_over_second"]
    assert (ratio < 1).all()                                                     # never faster
    old = ratio[~pairs["causal"] & (pairs["tiles"] == "m64 n128 s2")]
    n64 = ratio[~pairs["causal"] & pairs["tiles"].str.contains(" n64 ")]
    causal = ratio[pairs["causal"]]
    assert old.min() > 0.96 and old.max() > 0.99                                # within noise
    assert n64.min() < old.min() and causal.min() < n64.min()                  # slowest: causal
    guide = flat(book_page("teachers_guide.md"))
    assert "at every shape measured" not in guide
    assert ("was never faster than the same tiles launched one per tile: within noise on full "
            "attention with the old default's tiles, slower with 64-key tiles, and slowest on "
            "causal rows") in guide


def test_ch10_ex5_rubric_keeps_the_outlier_unexplained():
    solution = flat(markdown("10_making_it_fast"))
    # one pair, left unexplained (no cause is claimed for it), and the reason for the threshold
    assert "A single pair like that is why the threshold is there." in solution
    assert "GPU noise" not in solution and "because" not in solution.split("A slower graph is possible")[1][:400]
    guide = flat(book_page("teachers_guide.md"))
    assert "a graph slower than the call is GPU noise" not in guide
    assert ("a graph slower than the call is possible (one outlier at 16K, not explained), which is "
            "why the threshold is there") in guide


# --- 7 and the two new glossary entries ---------------------------------------------------------

def test_glossary_tensor_core_says_where_tl_dot_uses_them():
    source = _read("tests", "test_compile_targets.py")
    assert 'assert r["tensor_core_ops"] == 0, f"sm_75' in source and 'r.get("dot_precision") == "ieee"' in source
    entry = glossary_entry("tensor core")
    assert "`tl.dot` runs on them;" not in entry and not entry.endswith("`tl.dot` runs on them.")
    assert ("`tl.dot` runs on them from sm_80 on, for 16-bit inputs and for fp32 inputs in TF32 mode; "
            "on a T4 (sm_75), and for fp32 inputs in full-precision (\"ieee\") mode, Triton compiles it "
            "into plain fused multiply-adds instead.") in entry
    assert "into plain fused multiply-adds, not tensor-core instructions" in flat(book_page("how_to_run.md"))


def test_glossary_register_and_special_function_unit_entries():
    """Two entries other chapters link: their numbers are the library's, from the CUDA guide."""
    register = glossary_entry("register")
    assert f"at most {runtime.MAX_REGS_PER_THREAD} of them, 32 bits each {{cite}}`nvidia_cuda_guide`" in register
    assert "the fastest memory a GPU has" in register and '"spills"' in register
    assert "{term}`local memory`" in register and "{term}`register spill`" in register
    sfu = glossary_entry("special-function unit")
    assert f"{runtime.SFU_PER_CLOCK_PER_SM} results per clock per SM on sm_75, sm_80 and sm_90" in sfu
    fp32 = runtime.FP32_PER_CLOCK_PER_SM
    assert fp32["sm_75"] == fp32["sm_80"] == 64 and fp32["sm_90"] == 128
    assert ("against 64 fp32 fused multiply-adds per clock per SM on sm_75 and sm_80 and 128 on "
            "sm_90 {cite}`nvidia_cuda_guide`") in sfu
    block = book_page("glossary.md").split("```{glossary}")[1].split("```")[0]
    assert "special-function unit\nSFU\n" in block and "\nregister\n  " in block
    assert "{term}`registers <register>`" in glossary_entry("SM")
    assert "{term}`special-function units <special-function unit>`" in glossary_entry("SM")
    table = book_page("glossary.md").split("## English and Chinese")[1]
    assert "| register | 寄存器 | (not in the sources) |" in table
    assert "| special-function unit (SFU) | 特殊函数单元 | (not in the sources) |" in table
    bib = book_page("references.bib")
    guide = bib.split("@misc{nvidia_cuda_guide,")[1].split("\n}")[0]
    assert "Arithmetic Instructions (results per clock cycle per multiprocessor)" in guide


def test_new_chinese_terms_are_not_in_the_sources():
    from test_sources import seed_text

    both = seed_text("S1") + seed_text("S2")
    for term in ("寄存器", "特殊函数"):
        assert term not in both


# --- 8, 9, 14: running without a GPU, and where recorded runs come from -------------------------

def test_pages_say_the_triton_chapters_need_linux():
    assert "triton>=3.3.0; platform_system == 'Linux'" in _read("pyproject.toml")
    assert "triton exists only for Linux" in _read("tools", "setup_cell.py")
    intro = flat(book_page("intro.md"))
    assert "run top to bottom on a laptop's CPU" not in intro
    assert ("notebooks run top to bottom on a Linux laptop's CPU (the GPU chapters through Triton's "
            "interpreter, at small sizes), so a class can work through them live; on macOS and Windows, "
            "which have no `triton` package, chapters 1 to 5 and A2 run there and the rest in Colab.") in intro
    guide = flat(book_page("teachers_guide.md"))
    assert "the notebooks run top to bottom on a Linux laptop's CPU" in guide
    assert ("Chapters 6 to 12 and the lab notes do need Linux (on Windows, WSL) or Colab: `triton` has "
            "no macOS or Windows package, and their first cell stops there.") in guide
    readme = flat(_readme())
    assert "(a laptop CPU runs the kernels in Triton's interpreter)" not in readme
    assert "on Linux a laptop CPU runs the kernels in Triton's interpreter; macOS and Windows have no triton" in readme


def test_colab_step_does_not_say_the_triton_chapters_ask_for_a_gpu():
    for path in sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))):
        text = markdown(path).lower()
        assert "change runtime" not in text and "gpu runtime" not in text, path
    page = flat(book_page("how_to_run.md"))
    assert "The Triton chapters (6 onwards) ask for one" not in page
    assert ("The Triton chapters (6 onwards) run faster on one; without it they run their kernels in "
            "Triton's interpreter, at small sizes ({ref}`see below <without-gpu>`).") in page
    assert "(without-gpu)=\n## Without a GPU: Triton's interpreter" in book_page("how_to_run.md")


LOADERS = re.compile(r"load_recorded\w*|results_dir|run_paths?\b|chapter\d+\w*\.build|bench\.load\w*|latest_results")


def test_recorded_runs_section_names_every_chapter_that_reads_them():
    readers = set()
    for path in sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))):
        code = "\n".join(source_of(c) for c in cells(path) if c["cell_type"] == "code")
        if LOADERS.search(code):
            readers.add(os.path.basename(path).split("_")[0])
    assert {"01", "04", "06", "09", "10", "11", "12", "A3"} <= readers
    assert readers <= {"01", "04", "06", "07", "08", "09", "10", "11", "12", "A3"}, readers
    page = flat(book_page("how_to_run.md"))
    assert "Chapters 9 and 10 draw their tables and figures" not in page
    assert ("Every chapter that shows GPU measurements reads them from runs recorded on a GPU: chapter "
            "1's time bar, chapter 4's profiler reading, the tables, figures and numbers of chapters 6 to 12, and the "
            "lab notes'.") in page
    # the book's recorded cell outputs are read from one fixed place, not by this lookup
    assert 'RESULTS = Path("benchmarks") / "results" / "gpu_outputs"' in _read("book", "_ext", "gpu_outputs.py")
    assert "`benchmarks/results/gpu_outputs/` of the clone that builds it" in page


# --- 13, 18: the references ---------------------------------------------------------------------

def _bibliography():
    sys.path.insert(0, TOOLS)
    try:
        import colab_edition
    finally:
        sys.path.remove(TOOLS)
    return colab_edition


def _cited_keys():
    pattern = re.compile(r"\{cite(?::\w+)?\}`([\w\s,-]+)`")
    texts = [markdown(p) for p in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))]
    texts += [book_page(os.path.basename(p)) for p in glob.glob(os.path.join(ROOT, "book", "*.md"))]
    return {k.strip() for t in texts for group in pattern.findall(t) for k in group.split(",")}


def test_every_citation_names_one_entry():
    """"[Dao, 2024]" stood for four entries: an author and a year now identify one, in the book
    (author_year) and in the Colab edition (tools/colab_edition.cite), which use the same
    author and year fields."""
    ce = _bibliography()
    bib = ce.bibliography()
    assert _cited_keys() <= set(bib)
    labels = {}
    for key, label in bib.items():
        labels.setdefault(label, []).append(key)
    assert {label: keys for label, keys in labels.items() if len(keys) > 1} == {}
    assert bib["dao2023flashattention2"] == ("Dao", "2024")
    software = {"flash_attn_repo": "2023", "flash_attn_paged": "2024a",
                "flash_attn_interface": "2024b", "flash_attn3_bwd_source": "2025"}
    assert {k: bib[k] for k in software} == {k: ("Dao-AILab", y) for k, y in software.items()}
    text = book_page("references.bib")
    for key in software:
        entry = text.split("@misc{" + key + ",")[1].split("\n}")[0]
        assert "url    = {https://github.com/Dao-AILab/flash-attention" in entry, key
    assert ce.cite("flash_attn_paged", False, "R") == "[(Dao-AILab, 2024a)](R)"
    assert ce.cite("nvidia_cuda_guide,nvidia_ptx_isa", False, "R") == "[(NVIDIA, 2025a; NVIDIA, 2025b)](R)"
    config = yaml.safe_load(_read("_config.yml"))["sphinx"]["config"]
    assert config["bibtex_reference_style"] == "author_year" and config["bibtex_default_style"] == "plain"
    page = flat(book_page("references.md"))
    assert "a letter tells them apart (\"[Dao-AILab, 2024a]\", \"[Dao-AILab, 2024b]\")" in page


def test_reference_titles_render_without_markup_or_lost_capitals():
    from pybtex.database import parse_file
    from pybtex.plugin import find_plugin

    raw = book_page("references.bib")
    assert "\\texttt" not in raw and "\\url" not in raw
    style = find_plugin("pybtex.style.formatting", "plain")()
    rendered = {e.key: e.text.render_as("text")
                for e in style.format_bibliography(parse_file(os.path.join(ROOT, "book", "references.bib"))).entries}
    assert "I/O complexity" in rendered["hong1981io"]
    assert "backward main loop for Hopper" in rendered["flash_attn3_bwd_source"]
    assert "flash-attn's Python interface: flash_attn_func and flash_attn_varlen_func" in rendered["flash_attn_interface"]
    assert "(Triton tutorial 06)" in rendered["triton_tutorial_attention"]
    assert "(Triton tutorial 02)" in rendered["triton_tutorial_softmax"]
    assert "David Cox. Triton: an intermediate language" in rendered["tillet2019triton"]
    assert all("\\" not in text for text in rendered.values())


# --- 17: notation ----------------------------------------------------------------------------------

def _identifiers():
    found = set()
    for path in glob.glob(os.path.join(ROOT, "flashbook", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            found |= set(re.findall(r"\b\w+\b", f.read()))
    for path in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb")):
        found |= set(re.findall(r"\b\w+\b", "\n".join(source_of(c) for c in cells(path) if c["cell_type"] == "code")))
    return found


def test_notation_sizes_spell_only_names_the_code_uses():
    sizes = book_page("notation.md").split("## Sizes")[1].split("## Arrays")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in sizes.strip().splitlines()[2:]]
    names = {n for _, code, _ in rows for n in re.findall(r"`(\w+)`", code)}
    assert "n_q_tiles" not in names and {"kv_heads", "n_k_tiles"} <= names
    assert names - _identifiers() == set()
    assert "| $T_r$ | (not named in the code) |" in sizes
    assert "| $H_{kv}$ | `kv_heads` | number of key/value heads" in sizes
    kernels = book_page("notation.md").split("## In the Triton kernels")[1]
    assert "| `group` | $H / H_{kv}$ |" in kernels                 # the symbol the new row defines


def test_make_says_it_needs_linux():
    """Re-check N1: make executes the Triton chapters, whose first cell stops without triton,
    and triton installs only on Linux."""
    assert 'triton>=3.3.0; platform_system == "Linux"' in _read("requirements.txt")
    assert "only for Linux" in cell_source("06_gpu_and_triton", "39f70af8")   # the setup cell
    readme, page = flat(_readme()), flat(book_page("how_to_run.md"))
    assert "a fresh Linux machine (on Windows, in WSL" in readme and "`make venv` still sets up `.venv`" in readme
    assert "You need Linux (on Windows, WSL), Python 3.11 or newer" in page
    assert "On macOS, `make venv` sets up `.venv`, where chapters 1 to 5 and A2 run" in page


def test_the_references_page_says_how_its_list_is_sorted():
    """Re-check N3: organisations' names sort after people's (their braces), as the page now says;
    the built list is in that order."""
    assert "people first, then organisations such as Dao-AILab and NVIDIA" in flat(book_page("references.md"))
    html = os.path.join(ROOT, "_build", "html", "book", "references.html")
    if os.path.exists(html):
        text = re.sub(r"<[^>]+>", " ", open(html, encoding="utf-8").read()).split("count the entries")[1]
        assert text.index("Zadouri") < text.index("Dao-AILab") < text.index("NVIDIA")
