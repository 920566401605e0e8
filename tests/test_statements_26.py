"""An expert's and a newcomer's corrections outside chapters 7, 8 and 10: each statement as
the book now makes it, with the number behind it read from the library or a recorded run.
(tests/test_statements.py holds the corrections made before; these are the ones it lacked.)"""
import math
import os
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, require
from flashbook import bench, runtime, tiled
from notebook_text import book_page, cell_source, markdown, notebook, run_glued

from test_statements import BOOK

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _glued_by(code, **names):
    """Run one hidden cell with glue_text / g captured: the values it glues, by name."""
    return run_glued(code, quiet=True, pd=pd, np=np, math=math, bench=bench, **names)[0]


def _ncu_forward():
    run = bench.run_path("kernel_ncu")
    require(run is not None and run.exists(), "no recorded Nsight Compute run")
    from flashbook.bench import profiles

    passes = profiles.pass_table(run)
    return passes[(passes["impl"] == "triton") & (passes["pass_"] == "forward")
                  & (passes["dim"] == 128) & ~passes["causal"]].iloc[0]


# --- the expert's items ---------------------------------------------------------------

def test_s14_says_tiling_multiplies_the_traffic_by_d_over_2br():
    """S1.4 once said tiling "divides" the traffic by d / 2B_r: it multiplies it (d < 2B_r)."""
    page = book_page("sources_checked.md")
    s14 = page.split("(s1-4)=")[1].split("(s1-5)=")[0]
    assert "multiplies it by a\nconstant, about $d / 2B_r$" in s14 and "divides it" not in s14
    n, d, br = 65536, 128, 128
    ratio = tiled.io_flash(n, n, d, br, br).hbm_total / tiled.io_naive(n, n, d).hbm_total
    assert ratio == pytest.approx(d / (2 * br), rel=0.01) and ratio < 1
    # chapters 4 and 6 say the same thing the other way round: the naive count divided by 2B_r / d
    assert "divided\nby a constant (about $2B_r/d$, 4 here:" in cell_source(notebook("06_gpu_and_triton.ipynb"), "5f5032c5")


def test_s114_puts_the_key_blocks_outside_only_in_fa2s_backward():
    s114 = book_page("sources_checked.md").split("(s1-14)=")[1].split("(s1-15)=")[0]
    assert "FlashAttention-2 *backward*; its forward puts the query blocks outside" in s114
    # the book's FA2 order: query tiles outside, visited row by row
    order = tiled.tile_schedule(8, 8, 4, 4, order="fa2")
    assert [i for i, _ in order] == sorted(i for i, _ in order)


def test_chapter_9_says_fa2s_benchmark_holds_half_the_tokens():
    """FlashAttention-2's section 4.1 fixes 16K tokens per shape; chapter 9's harness 32K."""
    from flashbook.bench import chapter9

    glued = dict(chapter9.build().glued())
    assert glued["tokens"] == "32768" and int(glued["tokens"]) == 2 * 16 * 1024
    prose = cell_source(notebook("09_benchmarks.ipynb"), "speed-md")
    assert "(which holds\n16K tokens, half as many)" in prose
    assert "as in FlashAttention-2's own benchmark" not in prose


def test_chapter_6_reserves_a_kib_per_thread_block_with_its_source():
    """The CUDA guide reserves 1 KB of shared memory per thread block (not per SM)."""
    for c in runtime.CHIPS.values():
        if c.arch != "sm_75":
            assert c.smem_per_sm_kib - c.smem_per_block_kib == 1, c.name
    nb = notebook("06_gpu_and_triton.ipynb")
    prose = cell_source(nb, "c06-buffers-model")
    assert ("CUDA reserves\n{glue:text}`a100_smem_reserved_kib` KiB of shared memory for each "
            "resident program, a thread block\n{cite}`nvidia_cuda_guide`") in prose
    assert "for itself" not in prose and "1 KiB" not in prose
    assert ('glue("a100_smem_reserved_kib", a100.smem_per_sm_kib - a100.smem_per_block_kib'
            in cell_source(nb, "dc4a6996"))


def test_what_real_fa_adds_cites_each_feature_to_its_own_source():
    page = book_page("what_real_fa_adds.md")
    varlen = page.split("## Variable-length batches")[1].split("## Paged KV caches")[0]
    paged = page.split("## Paged KV caches")[1].split("## Where to read more")[0]
    assert "{cite}`flash_attn_interface`" in varlen and "flash_attn_paged" not in varlen
    assert "release 2.5 on {cite}`flash_attn_paged`" in paged
    assert "flash_attn_repo" not in page            # the v2.1 notes are about the causal corner
    bib = book_page("references.bib")
    entry = bib.split("@misc{flash_attn_paged,")[1].split("\n}")[0]
    assert "Release 2.5 added a paged KV cache" in entry
    # FA3's intra-warpgroup overlap: the softmax of S_j against P_{j-1} V_{j-1}
    assert "the softmax of tile $j$\nis also overlapped with the product $P_{j-1}V_{j-1}$" in page
    assert "the products of the next" not in page


def test_book_pages_hold_no_control_characters():
    """A "\\t" once ate the backslash of "\\times" in the teacher's guide."""
    for name in os.listdir(BOOK):
        if name.endswith(".md"):
            text = book_page(name)
            bad = sorted({hex(ord(ch)) for ch in text if ord(ch) < 32 and ch not in "\n"})
            assert not bad, (name, bad)
    assert "$B_r \\times B_c\n  \\times d$" in book_page("teachers_guide.md")


# --- section 2: prose numbers from the recorded GPU runs --------------------------------

def test_chapter_11_reads_the_shortest_calls_times_from_the_repeats():
    """ "Single runs of the shortest calls (batch 1, 13 to 24 µs)" was typed: it is glued now
    from the three recorded runs, where the single runs strayed furthest."""
    from flashbook.bench import decoding

    nb = notebook("11_decoding_and_many_gpus.ipynb")
    repeats_paths = bench.run_paths("decode_repeats")
    require(len(repeats_paths) == 3, "no recorded decoding repeats")
    glued = _glued_by(cell_source(nb, "c11-m5") + "\n" + cell_source(nb, "c11-m6"), decoding=decoding)
    calls = pd.concat(pd.read_csv(p / "decode.csv") for p in repeats_paths)
    calls = calls[(calls["status"] == "ok") & (calls["batch"] == 1) & (calls["seq"] <= 8192)]
    med = 1000 * calls[calls["impl"].isin(["flash_decode", "flash_decode-paged", "sdpa-cudnn"])] \
        .groupby(["impl", "seq"])["ms"].median()
    assert glued["rep_short_us"] == f"{med.min():.0f} to {med.max():.0f}"
    prose = cell_source(nb, "c11-m7")
    assert "13 to 24" not in prose and "{glue:text}`rep_short_us` µs each" in prose


def test_chapter_12_says_what_the_gpu_runs_did_with_alibi_and_the_one_failure():
    runs = os.path.join(RESULTS, "stress_h200")
    require(os.path.isdir(runs), "no recorded stress runs")
    cases = list(ET.parse(os.path.join(runs, "14_classes_masks_a76a87d.junit.xml")).iter("testcase"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
    alibi = [c for c in cases if "alibi" in c.get("name")]
    assert alibi and not any("alibi" in name for name in failed)          # ALiBi ran, and passed
    assert len(failed) == 1 and "varlen-fp16" in failed[0] and "window3,0" in failed[0]
    replay = open(os.path.join(runs, "15_replay_after_rule.log"), encoding="utf-8").read()
    assert "seed 3060000" in replay and "call 0: right" in replay and "wrong" not in replay
    nb = notebook("12_masks.ipynb")
    alibi_md, stress_md = cell_source(nb, "d4610833"), cell_source(nb, "808d4022")
    assert "has not been run on a GPU" not in alibi_md
    assert "On the H200 its classes in the GPU stress test (below; `kernels.stress.ALIBI_MASKS`) all passed." in " ".join(
        alibi_md.split())                                                  # the stress test: 60 calls a class
    assert "run 14" not in alibi_md   # the run's file name is the data's business, not the reader's
    assert "not been replayed" not in stress_md and "Replayed on the H200" in stress_md
    assert "the case passes" in stress_md
    page = book_page("which_kernel.md")
    assert "not yet replayed" not in page and "run 14" not in page   # no test-run log in its table


# --- section 3: the L2's help, measured, not promised -------------------------------------

@pytest.mark.parametrize("name,cell_id", [("01_attention_numpy.ipynb", "c01-ncu"),
                                          ("04_tiled_forward.ipynb", "34db79f2"),
                                          ("06_gpu_and_triton.ipynb", "28a19756")])
def test_chapters_quote_the_recorded_dram_bytes_and_l2_hits(name, cell_id):
    fwd = _ncu_forward()
    qkv_mb = 3 * fwd["batch"] * fwd["heads"] * fwd["seq"] * fwd["dim"] * 2 / 1e6
    assert abs(fwd["dram_mb"] / qkv_mb - 1) < 0.01          # Q, K and V once: what the prose says
    nb = notebook(name)
    code = cell_source(nb, cell_id)
    names = {}
    if name.startswith("06"):        # the rest of chapter 6's cell needs its earlier cells
        code = "# what the L2 cache does" + code.split("# what the L2 cache does")[1]
        names["chips"] = runtime.CHIPS   # the profiled chip's peak, against the rate the pass reached
    if name.startswith("04"):
        names["MiB"] = 2**20
        names["runtime"] = runtime
        names["tiled"] = tiled
    glued = _glued_by(code, **names)
    assert glued["ncu_dram"] == f"{fwd['dram_mb']:.1f}" and glued["ncu_l2"] == f"{fwd['l2_hit']:.0f}"
    assert glued["ncu_qkv"] == f"{qkv_mb / 3:.1f}"
    assert float(glued["ncu_l2"]) > 80
    text = markdown(nb)
    # chapter 1 gives the profile; chapter 6 points to chapter 1 and quotes the L2's share; chapter 4
    # points to chapter 1 and quotes only the ratio to its own count, no typed MB
    keys = {"06": ("ncu_l2",), "04": ("ncu_model_x",)}.get(name[:2], ("ncu_shape", "ncu_dram", "ncu_qkv", "ncu_l2"))
    for key in keys:
        assert "{glue:text}`" + key + "`" in text, key
    if name.startswith("04"):
        assert "{doc}`chapter 1 <01_attention_numpy>`" in text and "$Q$, $K$ and $V$ once each" in " ".join(text.split())
        assert glued["ncu_dram"] not in text and glued["ncu_qkv"] not in text
    if name.startswith("06"):
        assert "[chapter 1](01_attention_numpy.ipynb)" in text and "$Q$, $K$ and $V$ once each" in text
    assert "chapter 11 shows" not in text          # decoding's profile says nothing about re-reads
    if name.startswith("04"):
        from flashbook.kernels import configs

        cfg = configs.default("forward", cc=90, block_d=configs.block_d(128), elem_bytes=2)
        assert cfg.block_m == 128 and "NCU_BLOCK_Q = 128" in code      # the kernel's query tile
        model = (fwd["batch"] * fwd["heads"]
                 * tiled.io_flash(int(fwd["seq"]), int(fwd["seq"]), 128, 128, 64).hbm_reads * 2 / 1e6)
        assert glued["ncu_model_x"] == f"{model / fwd['dram_mb']:.0f}" and model / fwd["dram_mb"] > 10


# --- section 4 and the pages' typed numbers -------------------------------------------------

def _glossary_entry(term):
    block = book_page("glossary.md").split("```{glossary}")[1].split("```")[0]
    lines = block.splitlines()
    start = lines.index(term)
    body = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break
        body.append(line.strip())
    return " ".join(body)


def test_the_glossarys_numbers_are_the_librarys():
    chips = runtime.CHIPS
    l2 = _glossary_entry("L2 cache")
    found = dict((name, int(mib)) for mib, name in re.findall(r"(\d+) MiB\s+(?:on )?an? (\w+)", l2))
    assert found == {name: c.l2_mib for name, c in chips.items()}, found
    smem = _glossary_entry("shared memory")
    assert f"{chips['T4'].smem_per_block_kib} KiB on a T4" in smem
    assert chips["H100"].smem_per_block_kib == chips["H200"].smem_per_block_kib
    assert f"up to {chips['H100'].smem_per_block_kib} KiB per program on\nan H100 or H200".replace("\n", " ") in smem
    sm = _glossary_entry("SM")
    assert f"({chips['T4'].sms} on a T4, {chips['H200'].sms} on an H200)" in sm
    assert _glossary_entry("warp").startswith(f"{runtime.WARP_SIZE} GPU threads")
    eps = _glossary_entry("eps")
    for dtype, exp in ((np.float64, 52), (np.float32, 23), (np.float16, 10)):
        assert np.finfo(dtype).eps == 2.0**-exp and f"$2^{{-{exp}}}$" in eps
    ulp = _glossary_entry("ulp")
    assert np.spacing(np.float64(0.75)) == 2.0**-53 and "$2^{-53}$ for float64" in ulp


def test_the_glossary_names_the_sdpa_backends_chapter_9_compares():
    sdpa = _glossary_entry("SDPA")
    for name in ("`sdpa-math`", "`sdpa-efficient`", "`sdpa-flash`", "`sdpa-cudnn`", "`flashbook-atomic`",
                 "MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
        assert name in sdpa, name
    assert "({term}`SDPA`)" in cell_source(notebook("09_benchmarks.ipynb"), "speed-md")


def test_which_kernel_describes_the_runs_it_quotes():
    """which_kernel.md's words about its runs (shapes, heads, lengths) against the records."""
    page = book_page("which_kernel.md")
    rows = bench.load_recorded_json("front_door")["rows"]
    seqs, dims = sorted({r["seq"] for r in rows}), sorted({r["head_dim"] for r in rows})
    assert {r["dtype"] for r in rows} == {"bf16"} and {r["backend"] for r in rows} == {"gluon"}
    assert (seqs[0], seqs[-1], dims) == (1024, 16384, [64, 128]) and {r["causal"] for r in rows} == {True, False}
    assert "bfloat16, head_dim 64 and 128, 1K to 16K tokens, causal or not" in page
    assert all(r["sdpa-cudnn"][p] < r["sdpa-flash"][p] for r in rows for p in ("fwd_ms", "bwd_ms"))
    assert "its FlashAttention-2\nbackend was slower at every shape" in page
    runs = bench.run_paths("decode_repeats")
    settings = bench.provenance_for(runs[-1] / "decode.csv")["settings"]
    assert (settings["heads"], settings["kv_heads"], settings["head_dim"], settings["n_new"]) == (32, 8, 128, 1)
    assert settings["dtype"] == "bf16" and "(decoding: bfloat16, 32\nquery heads on 8 KV heads, head_dim 128, one new token)" in page
    assert (min(settings["seqs"]), max(settings["seqs"])) == (2048, 131072) and "caches of 2K to 128K tokens" in page
    assert sorted(settings["batches"]) == [1, 8, 64] and "at batch 1 and 8" in page and "at batch 64" in page
    gluon = {r["seq"] for r in bench.load_recorded_json("gluon_lengths")["rows"]}
    assert min(gluon) >= 64 and "any length from one tile (64 queries, 64 keys) up" in page


def test_the_teachers_guide_dates_its_colab_tiers_with_a_source():
    """Colab's GPU offer changes: the guide names when and where its list was seen, and tells a
    teacher to check, instead of 'at the time of writing'."""
    guide = " ".join(book_page("teachers_guide.md").split())
    assert "at the time of writing" not in guide
    assert "H100 GPUs (as listed in March 2026 {cite}`mccormick2026colab`; check Colab's own page" in guide
    entry = book_page("references.bib").split("@misc{mccormick2026colab,")[1].split("\n}")[0]
    assert "Updated March 2026" in entry and "url" in entry


def test_the_appendix_pages_are_lettered_in_order():
    """Every page of the appendix part up to the lab notes carries its letter, A1 first, in the
    order of the table of contents."""
    import yaml

    with open(os.path.join(ROOT, "_toc.yml")) as f:
        toc = yaml.safe_load(f)
    files = next(p for p in toc["parts"] if p["caption"] == "Appendix")["chapters"]
    titles = []
    for entry in files[:3]:
        path = os.path.join(ROOT, entry["file"])
        if os.path.exists(path + ".md"):
            titles.append(book_page(os.path.basename(path) + ".md").splitlines()[0])
        else:
            titles.append(markdown(notebook(os.path.basename(path))).splitlines()[0])
    assert [t.split(".")[0] for t in titles] == ["# A1", "# A2", "# A3"], titles
