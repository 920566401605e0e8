"""Every chapter notebook follows the book's conventions (CONTRIBUTING.md).

Execution itself is checked by the book build (`make book`, warnings and cell
errors fail it) and by tests/test_book.py on its output.
"""
import glob
import json
import os
import re
import sys

import pytest
import yaml

from conftest import ROOT
from notebook_text import cells, notebook, source_of, source_text

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
#: the chapters (01_... to 11_...); the others are appendix pages (A2_...), which share
#: the setup cell and the storage conventions but have no exercises
CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", os.path.basename(p))]
CONFIG = yaml.safe_load(open(os.path.join(ROOT, "_config.yml")))
REPO_URL = CONFIG["repository"]["url"]


def toc_files():
    toc = yaml.safe_load(open(os.path.join(ROOT, "_toc.yml")))
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [ch["file"] for ch in part["chapters"]]
    return files


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1


def test_toc_lists_every_notebook_and_every_entry_exists():
    files = toc_files()
    for f in files:
        assert any(os.path.exists(os.path.join(ROOT, f + ext)) for ext in (".md", ".ipynb")), f
    listed = {f for f in files if f.startswith("notebooks/")}
    on_disk = {os.path.relpath(p, ROOT)[: -len(".ipynb")] for p in NOTEBOOKS}
    assert on_disk == listed


def test_repository_url_is_defined_once():
    """_config.yml holds the URL; every other mention must be that same URL."""
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPO_URL)
    hits = [p for p in glob.glob(os.path.join(ROOT, "*.yml")) if REPO_URL in open(p).read()]
    assert hits == [os.path.join(ROOT, "_config.yml")]
    files = ["README.md", "CITATION.cff", "pyproject.toml", "book/*.md"]
    for pattern in files:
        for path in glob.glob(os.path.join(ROOT, pattern)):
            for url in re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", open(path).read()):
                assert url == REPO_URL, f"{path}: {url} differs from _config.yml's {REPO_URL}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_conventions(path):
    nb = notebook(path)
    name = os.path.basename(path)
    assert re.fullmatch(r"(\d\d|A\d)_[a-z0-9_]+\.ipynb", name)
    cells = nb["cells"]
    # stored without outputs: the book build executes them
    for c in cells:
        if c["cell_type"] == "code":
            assert c.get("outputs") == [] and c.get("execution_count") is None, f"{name} has outputs"
    # cell 1: the Colab setup cell, hidden in the book, installing from the one URL
    setup = "".join(cells[0]["source"])
    assert cells[0]["cell_type"] == "code"
    assert "remove-cell" in cells[0]["metadata"].get("tags", [])
    assert f'source = "git+{REPO_URL}@v' in setup  # the release tag (tests/test_colab.py)
    assert "-c" in setup and "torch" in setup  # torch and co. pinned as installed, never reinstalled
    for url in re.findall(r"https://github\.com/[^\s\"')]+", json.dumps(nb)):
        assert url.startswith(REPO_URL), f"{name}: {url} is not the repository URL in _config.yml"
    # cell 2: the title and what you will learn
    head = "".join(cells[1]["source"])
    if name.startswith("A"):  # an appendix page: its title, and no exercises
        assert head.startswith(f"# {name[:2]}. "), f"{name}: title must read '# {name[:2]}. ...'"
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
        return
    number = int(name[:2])
    assert head.startswith(f"# {number}. "), f"{name}: title must read '# {number}. ...'"
    assert "## What you will learn" in head
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for heading in ("## Summary", "## Exercises", "## Further reading"):
        assert heading in text, f"{name} lacks '{heading}'"
    assert text.index("## Summary") < text.index("## Exercises") < text.index("## Further reading")
    solutions = [c for c in cells if "solution" in c["metadata"].get("tags", [])]
    assert len(solutions) >= 3, f"{name}: at least three exercises need solutions"
    for c in solutions:
        tags = c["metadata"]["tags"]
        if c["cell_type"] == "code":
            assert "hide-input" in tags or "hide-cell" in tags, f"{name}: solution not hidden"
        else:
            assert "dropdown" in "".join(c["source"]), f"{name}: prose solution not folded"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_appendix_pages_have_a_chapters_setup_cell():
    chapter_cells = {source_of(cells(p)[0]) for p in CHAPTERS}
    for p in set(NOTEBOOKS) - set(CHAPTERS):
        assert source_of(cells(p)[0]) in chapter_cells, f"{p}: setup cell differs"


def test_student_edition_drops_solutions_only(tmp_path):
    import subprocess
    import sys
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "student_edition.py"), str(tmp_path)],
                   check=True, capture_output=True)
    for path in CHAPTERS:
        full = notebook(path)
        student = notebook(tmp_path / os.path.basename(path))
        n_solutions = sum("solution" in c["metadata"].get("tags", []) for c in full["cells"])
        assert n_solutions >= 3
        assert len(student["cells"]) == len(full["cells"]) - n_solutions
        assert not any("solution" in c["metadata"].get("tags", []) for c in student["cells"])
        # the exercises themselves (and their stubs) are still there
        text = source_text(student, sep="")
        assert "## Exercises" in text


# Colab ships numpy, scipy, pandas, matplotlib, torch, triton, ipywidgets, IPython;
# the setup cell adds flashbook. Anything else a chapter imports would fail there.
COLAB_HAS = {"numpy", "scipy", "pandas", "matplotlib", "torch", "triton", "ipywidgets",
             "IPython", "flashbook", "math", "time", "tracemalloc", "functools", "itertools",
             "dataclasses", "os", "sys", "json", "collections", "textwrap", "warnings",
             "inspect", "statistics", "fractions", "decimal", "random", "platform", "tqdm"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_imports_exist_on_colab(path):
    src = source_text(path, "code")
    for mod in re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][\w]*)", src, flags=re.M):
        assert mod in COLAB_HAS or mod in sys.stdlib_module_names, \
            f"{os.path.basename(path)} imports {mod}, which Colab lacks"


def test_glue_works_without_myst_nb(monkeypatch, capsys):
    import sys
    from flashbook.display import glue
    monkeypatch.setitem(sys.modules, "myst_nb", None)   # as on Colab: not installed
    glue("x", 1.5, display=False)                        # silently nothing
    glue("y", 2.5)                                       # shown
    assert "2.5" in capsys.readouterr().out


CHAPTERS = [p for p in NOTEBOOKS if os.path.basename(p)[0].isdigit()]   # appendices have no exercises


@pytest.mark.parametrize("path", CHAPTERS, ids=os.path.basename)
def test_every_exercise_has_a_check(path):
    """Spec -> stub -> check: one `check("chNN.exK", ...)` per exercise, and one stub convention."""
    import nbformat

    from flashbook.grade import exercises_in

    nb = nbformat.read(path, as_version=4)
    chapter = os.path.basename(path)[:2]
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    section = md[md.index("## Exercises"):md.index("## Further reading")]
    numbers = re.findall(r"^(?:### Exercise (\d+)|\*\*(\d+)\. )", section, re.M)
    numbers = [int(a or b) for a, b in numbers]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 3, numbers
    assert exercises_in(nb) == [f"ch{chapter}.ex{k}" for k in numbers]
    start = next(i for i, c in enumerate(nb.cells) if "## Exercises" in c.source.splitlines())
    end = next(i for i, c in enumerate(nb.cells) if "## Further reading" in c.source.splitlines())
    for c in nb.cells[start:end]:
        if c.cell_type == "code" and "solution" not in c.metadata.get("tags", []):
            assert not re.search(r"^\s+(return None|\.\.\.)\s*(#.*)?$", c.source, re.M), \
                f"a stub returns None or `...`: raise NotImplementedError instead\n{c.source[:200]}"


def test_no_glued_value_inside_math():
    """A glue role inside $...$ is not rendered (the page shows 'glue:text' as symbols), so a
    glued number goes in the text beside the formula."""
    bad = []
    for path in NOTEBOOKS + sorted(glob.glob(os.path.join(ROOT, "book", "*.md"))):
        if path.endswith(".md"):
            texts = [open(path, encoding="utf-8").read()]
        else:
            texts = [source_of(c) for c in cells(path) if c["cell_type"] == "markdown"]
        for text in texts:
            bad += [(os.path.basename(path), m.group(0)[:60])
                    for m in re.finditer(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", text, re.S) if "{glue" in m.group(0)]
    assert not bad, bad


def test_the_cache_prefill_runs_every_notebook_of_the_book():
    """tools/prefill_cache.py (make book's first step) executes exactly the book's notebooks:
    every .ipynb the table of contents lists, and nothing else."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import prefill_cache

    listed = prefill_cache.book_notebooks()
    assert listed == sorted(set(listed), key=listed.index) and all(p.endswith(".ipynb") for p in listed)
    assert {os.path.relpath(p, ROOT) for p in listed} == {os.path.relpath(p, ROOT) for p in NOTEBOOKS}
    assert prefill_cache.timeout_s() >= 600
    with pytest.raises(SystemExit):
        prefill_cache.main(["--jobs", "0"])


def _kernels_of_this_process() -> list[int]:
    """The pids of the Jupyter kernels this process started that still run (Linux's /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"ipykernel" in command:
            found.append(int(pid))
    return found


def test_the_cache_prefill_never_stops_the_build(tmp_path):
    """prefill_cache.execute runs a notebook in a kernel over IPC sockets (kernels started side
    by side over TCP can pick the same port); a kernel that cannot start is a failed notebook
    the build runs again, never an exception that stops `make book`."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import nbformat
    import prefill_cache

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os\nprint(6 * 7, os.getcwd())")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    good = tmp_path / "good.ipynb"
    nbformat.write(nb, good)
    path, executed, seconds, error = prefill_cache.execute(str(good), 60)
    assert error is None and seconds > 0
    assert executed.cells[0].outputs[0]["text"] == f"42 {tmp_path}\n"   # in the notebook's folder
    assert _kernels_of_this_process() == []   # shut down, not left to die with its parent

    nb.metadata["kernelspec"]["name"] = "no-such-kernel"
    bad = tmp_path / "bad.ipynb"
    nbformat.write(nb, bad)
    path, executed, seconds, error = prefill_cache.execute(str(bad), 60)
    assert path == str(bad) and executed is None and "no-such-kernel" in error


def test_no_page_links_to_a_branch_of_the_repository():
    """Repository paths are written as code (`benchmarks/...`) and linked at the release tag by
    the book's extension (``flashbook_sphinx.repository_links``); a hand-written link to a branch
    would drift from the release the page describes."""
    pattern = re.compile(r"github\.com/flashbook-dev/flashbook/(?:blob|tree)/(?!v\d)")
    pages = NOTEBOOKS + sorted(glob.glob(os.path.join(ROOT, "book", "*.md")))
    bad = [os.path.basename(p) for p in pages if pattern.search(open(p, encoding="utf-8").read())]
    assert not bad, bad
