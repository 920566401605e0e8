"""The review of the reference pages (intro, how to run, which kernel, what real FlashAttention
adds, the sources checked, the teacher's guide, the glossary): each corrected statement as the
page now makes it, with the number or the signature behind it read from the library or a
recorded run, so that the wrong statement cannot come back."""
import glob
import inspect
import json
import os
import re

import numpy as np
import pytest

from conftest import ROOT, require
from flashbook import bench, runtime
from notebook_text import book_page, cells, glossary_entry, glue_text_value, source_of

BOOK = os.path.join(ROOT, "book")
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _code_cells(text):
    return ["\n".join(line for line in cell.splitlines() if not line.startswith(":tags:"))
            for cell in re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, re.S)]


def _glued(name):
    """Run every code cell of a book page with glue_text captured: the values it glues."""
    import flashbook.display

    glued = {}

    def capture(key, value, fmt=""):
        glued[key] = glue_text_value(value, fmt)

    real = flashbook.display.glue_text
    flashbook.display.glue_text = capture
    cwd = os.getcwd()
    try:
        os.chdir(BOOK)        # where the book build runs a page
        ns = {"display": lambda *a, **k: None, "print": lambda *a, **k: None}
        for code in _code_cells(book_page(name)):
            exec(code, ns)
    finally:
        os.chdir(cwd)
        flashbook.display.glue_text = real
    return glued


def _glossary_terms():
    block = book_page("glossary.md").split("```{glossary}")[1].split("```")[0]
    return {line.strip() for line in block.splitlines() if line and not line.startswith(" ")}


# --- which_kernel: one record, one rule, one convention --------------------------------------

def test_which_kernel_counts_the_flex_wins_as_chapter_12_does():
    from flashbook.bench import chapter12

    path = bench.run_path("masks")
    require(path is not None and (path / "masks.json").is_file(), "no recorded masks run")
    rows = json.load(open(path / "masks.json"))["rows"]
    verdicts = chapter12.flex_verdicts(rows)
    glued = _glued("which_kernel.md")
    for part in ("fwd", "fwd_bwd"):
        assert glued[f"mk_{part}_wins"] == str(verdicts[part]["win"])
        assert glued[f"mk_{part}_losses"] == str(verdicts[part]["loss"])
    assert glued["mk_shapes"] == str(len(rows))
    page = book_page("which_kernel.md")
    assert "chapter12.flex_verdicts" in page                # the function chapter 12 counts with
    assert "> 1 for r in masks_rows" not in page              # not every ratio above 1
    assert "27 of 28" not in page and "faster in {glue:text}`mk_fwd_wins` of" not in page
    assert "beyond the run-to-run noise in {glue:text}`mk_fwd_wins`" in page
    assert any("flex_verdicts" in source_of(c) for c in cells("12_masks.ipynb") if c["cell_type"] == "code")


def test_which_kernel_gives_every_ratio_as_a_speed():
    glued = _glued("which_kernel.md")
    from flashbook.bench import decoding

    dec = decoding.repeat_ratios(bench.run_paths("decode_repeats"))
    speed = 1 / dec["fd_cudnn_ms"]
    batch = speed.index.get_level_values("batch")
    assert glued["dec_big_lo"] == f"{speed[batch == 64].min():.2f}"
    assert glued["dec_small_hi"] == f"{speed[batch <= 8].max():.2f}"
    page = book_page("which_kernel.md")
    assert "times cuDNN's time" not in page and "times cuDNN's speed at batch 1 and 8" in page
    assert "every ratio is a speed" in page


def test_which_kernel_reads_as_a_decision_page_not_a_test_log():
    page = book_page("which_kernel.md")
    prose = re.sub(r"```\{code-cell\}.*?```", "", page, flags=re.S)
    for phrase in ("stress class", "run 14", "runs 11 and 12", "front door", "error bound",
                   "d = seq_k - seq_q", "more registers a thread"):
        assert phrase not in prose, phrase
    assert "$\\delta$ = seq_k − seq_q" in page           # d is the head dimension everywhere else
    assert "timed on an H200, also run on an H100" in page and "(an H100 runs the same kernels; not timed against cuDNN)" in page
    assert "not measured)" not in page                    # chapter 10 recorded the Gluon kernel on an H100
    from flashbook.bench import runs                      # the H100 run: chapter 10's Gluon cell, recorded there
    record = runs.gpu_record("10_making_it_fast")
    assert "H100" in record["provenance"]["gpu"]
    assert "Gluon" in runs.recorded_output("10_making_it_fast", "407b1adc")
    glued = _glued("which_kernel.md")
    assert glued["gl_len_n"] == "1,000 and 4,097" and "[" not in glued["gl_len_n"]
    assert int(glued["vl_failed"]) == 0 and int(glued["vl_classes"]) > 0
    assert "flashbook.distributed.ring_attention(q, k, v, causal=True, layout=\"zigzag\")" in page


def test_which_kernel_maps_flash_attn_and_flex_to_the_real_signatures():
    from flashbook.distributed import ring_attention, shard
    from flashbook.kernels import flash_decode
    from flashbook.kernels.dispatch import flash_attention
    from flashbook.kernels.varlen import flash_attention_varlen

    page = book_page("which_kernel.md")
    section = page.split("## Coming from flash-attn or FlexAttention")[1].split("## What it gives")[0]
    fa = inspect.signature(flash_attention).parameters
    for name in ("scale", "softmax_scale", "window", "window_size", "softcap", "alibi_slopes", "prefix", "dq_mode"):
        assert name in fa, name
    assert fa["dropout_p"].default == 0.0 and fa["deterministic"].default is False   # flash-attn's, accepted
    assert fa["return_attn_probs"].default is False
    assert fa["dq_mode"].default == "separate"
    assert "`q.transpose(1, 2)`" in section and "`softmax_scale=`" in section and "`window_size=`" in section
    assert "no dropout (`dropout_p` must be 0.0)" in section and '`dq_mode="separate"`' in section
    from flashbook.kernels.dispatch import flash_attn_func   # flash-attn's order of arguments, as the table says
    assert list(inspect.signature(flash_attn_func).parameters) == [
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs"]
    assert "`flashbook.flash_attn_func(q, k, v, ...)`: the same layout, arguments and order" in section
    varlen = list(inspect.signature(flash_attention_varlen).parameters)
    assert varlen[:7] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    params = inspect.signature(flash_attention_varlen).parameters
    assert all(params[n].kind == inspect.Parameter.KEYWORD_ONLY for n in varlen[7:])   # flash-attn's 8th is dropout_p
    assert "the same seven positional arguments in the same order" in section
    assert "`num_splits=None` chooses the split" in section
    with pytest.raises(ValueError, match="num_splits"):   # flash-attn's num_splits=0 ("choose") is refused
        import torch
        q = torch.randn(1, 2, 1, 16)
        k = torch.randn(1, 2, 40, 16)
        flash_decode(q, k, k, num_splits=0)
    dec = inspect.signature(flash_decode).parameters
    assert dec["causal"].default is True and "defaults to `causal=True`" in section
    for absent in ("k", "v", "rotary_cos", "rotary_sin", "alibi_slopes"):
        assert absent not in dec, absent
    assert "softcap" in dec and "return_softmax_lse" in dec   # as flash-attn's
    assert "`flashbook.flash_attn_with_kvcache(...)`, the same layout, arguments and order" in section
    assert "does not write the new tokens' keys and values into the cache" in section
    assert "block_table" in dec and "cache_seqlens" in dec
    assert "layout" in inspect.signature(ring_attention).parameters
    assert "layout" in inspect.signature(shard).parameters
    # softcap 0.0, flash-attn's "off", is off here too
    from flashbook import masks

    assert masks.check_softcap(0.0) is None and "`softcap=0.0`" in section


def test_the_library_refuses_flash_attns_dropout_and_both_names_of_one_argument():
    torch = pytest.importorskip("torch")
    import flashbook

    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        flashbook.flash_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(TypeError, match="softmax_scale"):
        flashbook.flash_attention(q, q, q, scale=0.5, softmax_scale=0.5)


# --- the glossary --------------------------------------------------------------------------

REQUESTED = ("wgmma", "warpgroup", "TMA", "mbarrier", "warp specialisation", "CUDA graph", "tensor pipe",
             "Gluon", "split-K", "KV cache", "program", "kernel", "atomic add", "memory ordering")


@pytest.mark.parametrize("term", REQUESTED)
def test_the_glossary_defines_the_terms_the_chapters_use(term):
    assert term in _glossary_terms(), term
    assert len(glossary_entry(term)) > 40


def test_the_glossary_counts_m_in_elements_as_notation_and_chapter_4_do():
    smem = glossary_entry("shared memory")
    chips = runtime.CHIPS
    t4 = chips["T4"].smem_per_block_kib * 1024 // 2
    h100 = chips["H100"].smem_per_block_kib * 1024 // 2
    assert chips["H200"].smem_per_block_kib == chips["H100"].smem_per_block_kib
    assert f"$M$ = {t4:,} on a T4, {h100:,} on an H100 or H200" in smem
    assert "counted in *elements*, not bytes" in smem
    assert "of size $M$): 64 KiB" not in smem        # M given in bytes
    hbm = glossary_entry("HBM")
    assert "tens of GiB" not in hbm
    assert f"from {chips['T4'].hbm_gib} GB on a T4 to {chips['H200'].hbm_gib} GB on an H200" in hbm
    assert "DRAM" in hbm


def test_the_glossarys_delta_and_split_k_say_what_they_do():
    delta = glossary_entry("delta")
    assert "without storing $P$" not in delta and "one tile at a time" in delta
    rng = np.random.default_rng(0)
    p = rng.random((4, 6)); p /= p.sum(1, keepdims=True)
    v, do = rng.standard_normal((6, 3)), rng.standard_normal((4, 3))
    o, dp = p @ v, do @ v.T
    assert np.allclose((do * o).sum(1), (p * dp).sum(1))      # rowsum(dO o O) = sum_j P dP
    split = glossary_entry("split-K")
    assert "second kernel" in split and "FlashAttention-2 paper" in split


# --- the other pages -------------------------------------------------------------------------

def test_what_real_fa_adds_counts_what_chapter_10_tries_and_knows_varlen_is_in_the_book():
    page = book_page("what_real_fa_adds.md")
    assert "tries the first three" not in page and "Chapter 10 tries the first two" in page
    varlen = page.split("## Variable-length batches")[1].split("## Paged KV caches")[0]
    assert "`flashbook.flash_attention_varlen`" in varlen
    from flashbook.kernels.varlen import flash_attention_varlen

    assert {"cu_seqlens_q", "max_seqlen_q"} <= set(inspect.signature(flash_attention_varlen).parameters)
    paged = page.split("## Paged KV caches")[1]
    assert "`flash_attn_with_kvcache(..., block_table=...)`" in paged
    assert "{cite}`flash_attn_interface,flash_attn_paged`" not in page     # "[Dao, 2024, Dao, 2024]"
    assert "which lost and stay in the lab" not in page and "a tie" in page
    assert "fraction of its matrix peak to most of it" not in page and "25–40%" in page and "50–73%" in page


def test_the_intro_maps_every_chapter_and_the_reference_pages():
    page = book_page("intro.md")
    table = page.split("## The path through the book")[1].split("## Three ways")[0]
    chapters = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]_*.ipynb")))
    for path in chapters:
        n = int(os.path.basename(path)[:2])
        assert re.search(rf"(^|[|·] ){n} ", table, re.M), n
    assert "12 one kernel, many masks" in table and "which function to use" in table
    assert "(which_kernel.md)" in page
    assert "about a minute" not in page


def test_how_to_run_installs_the_release_you_are_reading():
    import yaml

    import flashbook

    page = book_page("how_to_run.md")
    assert "v<version>" not in page and "{glue:text}`version_tag`" in page
    assert "(install-library)=\n## Use the library in your own code" in page
    glued = _glued("how_to_run.md")
    assert glued["version_tag"] == f"v{flashbook.__version__}"
    repo = yaml.safe_load(open(os.path.join(ROOT, "_config.yml")))["repository"]["url"]
    install = next(c for c in _code_cells(page) if "pip install" in c)
    assert 'f\'pip install "flashbook @ git+{repo}@{tag}"\'' in install and repo.startswith("https://github.com/")
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    assert '"torch>=2.4"' in pyproject and "triton>=3.3.0" in pyproject
    assert "`torch>=2.4`" in page and "`triton>=3.3.0`" in page


def test_a_release_rewrites_the_release_line_of_the_pages_with_code(tmp_path, monkeypatch):
    """The page names the release in its cell's source, so the build's cache (keyed on the
    source) runs it again after a release; --sync-setup keeps the line the library's version."""
    import sys

    import flashbook

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import colab_edition

    assert f'RELEASE = "v{flashbook.__version__}"' in book_page("how_to_run.md")
    book = tmp_path / "book"
    book.mkdir()
    (book / "page.md").write_text('x = 1\nRELEASE = "v0.0.1"   # kept\n', encoding="utf-8")
    monkeypatch.setattr(colab_edition, "ROOT", str(tmp_path))
    monkeypatch.setattr(colab_edition, "book_notebooks", lambda: [])
    monkeypatch.setattr(colab_edition, "config", lambda: {})
    monkeypatch.setattr(colab_edition, "version", lambda: "9.8.7")
    assert colab_edition.sync_setup_cells() == [os.path.join("book", "page.md")]
    assert (book / "page.md").read_text(encoding="utf-8") == 'x = 1\nRELEASE = "v9.8.7"   # kept\n'


def test_how_to_run_names_the_versions_every_recorded_gpu_run_used():
    glued = _glued("how_to_run.md")
    seen = set()
    for path in glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True):
        text = open(path, encoding="utf-8", errors="replace").read()
        seen |= set(re.findall(r'"torch": "([^"]+)"', text))
    require(seen, "no recorded provenance")
    assert seen == {glued["gpu_torch"]}, seen       # one torch behind every recorded run the page sums up


def test_sources_checked_says_what_a_causal_run_would_change():
    seed = bench.check_seed_table()
    chip = runtime.chip(seed.chip)
    for p in ("fwd", "bwd"):
        naive, flash = seed.claims[f"naive_{p}_time"].claimed, seed.claims[f"flash_{p}_time"].claimed
        assert naive < seed.floor_ms[("naive", p, True)]             # impossible, mask or not
        assert flash >= seed.floor_ms[("flash", p, True)]            # possible if causal ...
        pct = 100 * seed.flops[f"{p}_causal"] / (flash * 1e-3) / 1e12 / chip.fp16_tflops
        assert 90 < pct < 100                                        # ... at 93-97% of the peak
    page = book_page("sources_checked.md")
    s117 = page.split("(s1-17)=")[1].split("(s1-18)=")[0]
    assert "does not say whether its run was causal" in s117
    assert "{glue:text}`s117_imp` of the {glue:text}`s117_n` times are\nimpossible" not in s117
    assert "{glue:text}`s117_causal_lo`" in s117 and "not impossible" in s117


def test_the_teachers_guide_counts_its_rubric_rows_and_times_nothing_unrecorded():
    words = {12: "Twelve", 13: "Thirteen", 14: "Fourteen", 15: "Fifteen", 16: "Sixteen",
             17: "Seventeen", 18: "Eighteen", 19: "Nineteen", 20: "Twenty"}
    guide = book_page("teachers_guide.md")
    rubric = guide.split("## Rubrics for the open exercises")[1].split("\n## ")[0]
    rows = [line for line in rubric.splitlines() if re.match(r"\| \d+, ", line)]
    assert f"{words[len(rows)]} exercises ask for an argument" in rubric
    assert any(line.startswith("| 12, to discuss: reading a profile") for line in rows)
    for phrase in ("in about a minute", "in a minute or\ntwo", "take seconds"):
        assert phrase not in guide, phrase
