"""Review round 4, chapters 1 and 3: the statements the review found wrong or unclear stay
fixed, and the numbers that replaced them equal what the recorded run (the H200's naive
breakdown) and the library (the traffic count, the chips, the merge figure) give."""
import json
import math
import os
import re

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import ROOT, require
from flashbook import plots, reference, runtime, softmax, tiled
from notebook_text import (NoPlot, book_page, cell_ids, cell_source,
                           flat, markdown, notebook, run_glued, glue_role as _glue)

CH1 = notebook("01_attention_numpy")
CH3 = notebook("03_online_softmax")
RECORD = os.path.join(ROOT, "benchmarks", "results", "naive_breakdown_h200", "naive_breakdown.json")



def _run(code, **names):
    names = {"np": np, "pd": pd, "math": math, "torch": torch, "softmax": softmax,
             "reference": reference, "tiled": tiled, "plt": NoPlot(), **names}
    return run_glued(code, quiet=True, **names)


def _record():
    require(os.path.isfile(RECORD), "no recorded naive breakdown")
    with open(RECORD, encoding="utf-8") as f:
        return json.load(f)


def _dropdown(text):
    """The body of the one MyST dropdown in ``text``, and the text outside it."""
    found = re.findall(r"^:::\{dropdown\}[^\n]*\n(.*?)^:::$", text, re.S | re.M)
    assert len(found) == 1, found
    return found[0], text.replace(found[0], "")


# --- finding 1 (WRONG): why the softmax's share grows with N --------------------------------

def test_chapter_1_gives_the_measured_reason_the_softmax_share_grows():
    prose = flat(cell_source(CH1, "37bf9eaf"))
    assert "the softmax's share grows with $N$, as $S$ and $P$ do" not in prose
    assert ("That is not because $S$ and $P$ grow as $N^2$, since the products' work grows as "
            "$N^2$ too.") in prose
    assert "In this record the products ran faster at the larger size" in prose
    assert "The softmax moved its bytes more slowly instead" in prose
    for key in ("tbg_short_n", "tbg_short_matmul_pct", "tbg_short_tflops", "tbg_tflops",
                "tbg_short_softmax_tbs", "tbg_softmax_tbs"):
        assert _glue(key) in prose, key
    # the numbers, recomputed from the record: bf16, d = 128, the shortest length and the one shown
    rec = _record()
    rows = {r["n"]: r for r in rec["rows"] if (r["d"], r["dtype"]) == (128, "bfloat16")}
    short, shown = rows[min(rows)], rows[8192]

    def tflops(r):
        seconds = (r["ms"]["Q K^T (matmul)"] + r["ms"]["P V (matmul)"]) / 1e3
        return 2 * 2 * r["batch_heads"] * r["n"] ** 2 * r["d"] / seconds / 1e12

    def softmax_tbs(r):     # S read and P written, 2 bytes a number, over the whole softmax's time
        return 2 * r["batch_heads"] * r["n"] ** 2 * 2 / (r["softmax_ms"] / 1e3) / 1e12

    assert (round(tflops(short)), round(tflops(shown))) == (129, 424)
    assert (f"{softmax_tbs(short):.1f}", f"{softmax_tbs(shown):.1f}") == ("1.6", "1.1")
    # N^2 alone would keep the share: with the short length's speeds the share would not move
    work = lambda r: 4 * r["batch_heads"] * r["n"] ** 2 * r["d"]           # noqa: E731
    assert work(shown) / work(short) == (shown["n"] / short["n"]) ** 2 == 64
    glued, _ = _run(cell_source(CH1, "c01-gpu-steps"), plots=NoPlot(), STEP_LABELS={})
    assert glued["tbg_short_n"] == str(short["n"]) == "1024" and glued["tbg_n"] == "8192"
    assert glued["tbg_short_tflops"] == f"{tflops(short):.0f}"
    assert glued["tbg_tflops"] == f"{tflops(shown):.0f}"
    assert glued["tbg_short_softmax_tbs"] == f"{softmax_tbs(short):.1f}"
    assert glued["tbg_softmax_tbs"] == f"{softmax_tbs(shown):.1f}"
    assert glued["tbg_d"] == "128"


# --- finding 2 (WRONG): not every kernel always rescales ------------------------------------

def test_chapter_3_says_which_kernels_always_rescale_and_that_fa4_skips_it():
    text = flat(cell_source(CH3, "5b97eeaf"))
    assert "it always multiplies by the factor" not in text
    assert ("This book's kernels, like FlashAttention-2's, always multiply by the factor, which "
            "is cheap next to the matrix products.") in text
    assert ("FlashAttention-4 {cite}`zadouri2026flashattention4` skips it unless a row's maximum "
            "has grown by more than a threshold") in text
    assert "{doc}`A3 <A3_lab_notes>`" in text
    a3 = markdown(notebook("A3_lab_notes"))
    assert "## Lazy rescaling" in a3 and "FlashAttention-4" in a3
    # what the sentence rests on: a reference point that lags the maximum keeps the result exact
    rng = np.random.default_rng(0)
    x, v = rng.normal(scale=3, size=512) + 0.01 * np.arange(512), rng.standard_normal((512, 4))
    threshold, ref, l, o, skipped = 8.0, -math.inf, 0.0, np.zeros(4), 0
    for xj, vj in zip(x, v):
        if xj > ref + threshold or ref == -math.inf:       # move the reference only now and then
            alpha, ref = math.exp(ref - xj) if ref > -math.inf else 0.0, xj
            l, o = l * alpha, o * alpha
        else:
            skipped += 1
        w = math.exp(xj - ref)                              # at most e^threshold
        l, o = l + w, o + w * vj
    assert skipped > 500 and np.abs(o / l - softmax.softmax(x) @ v).max() < 1e-12
    # the book's kernels rescale at every key tile, with no test on the maximum's growth
    with open(os.path.join(ROOT, "flashbook", "kernels", "forward.py"), encoding="utf-8") as f:
        fold = f.read().split("def fold_values")[1].split("\ndef ")[0]
    assert "acc = acc * alpha[:, None]" in fold and "if " not in fold.split('"""')[-1]


# --- finding 3: "kernel" is defined where chapter 1 first uses it ---------------------------

def test_chapter_1_defines_kernel_at_its_first_use():
    prose = [(c["id"], "".join(c["source"])) for c in CH1["cells"] if c["cell_type"] == "markdown"]
    first = next((cid, text) for cid, text in prose if re.search(r"\bkernel\b", text))
    assert first[0] == "b64174db"
    text = flat(first[1])
    at = re.search(r"\bkernel\b", first[1]).start()
    assert "{term}`kernel`" in first[1][at - 7:at + 8]                     # linked to the glossary
    # defined in a sentence of its own, before the steps are listed
    assert ("Each step is a separate {term}`kernel`: a compiled function that runs on the device, "
            "on a GPU as many copies in parallel (chapter 6 writes one). The figures time each step") in text
    with open(os.path.join(ROOT, "book", "glossary.md"), encoding="utf-8") as f:
        assert re.search(r"^kernel$", f.read(), re.M)


# --- finding 4: the traffic count states its assumptions; the profile is folded -------------

def test_chapter_1_states_the_tile_and_formulas_behind_its_traffic_counts():
    glued, _ = _run(cell_source(CH1, "c01-traffic"), flashbook=__import__("flashbook"))
    n, d, tile = 4096, 128, 128
    assert (glued["hbm_n"], glued["hbm_d"], glued["hbm_tile"]) == (str(n), str(d), str(tile))
    assert glued["hbm_naive_x"] == f"{1 + n / d:.0f}" == "33"                 # (4Nd + 4N^2) / 4Nd
    assert glued["hbm_flash_x"] == f"{(2 + 2 * n / tile) / 4:.1f}" == "16.5"  # (2 + 2N/B_r)Nd / 4Nd
    flash = tiled.io_flash(n, n, d, tile, tile)
    assert flash.reads["K"] == flash.reads["V"] == (n // tile) * n * d        # once per query tile
    assert glued["hbm_ratio"] == f"{flash.hbm_total / tiled.io_naive(n, n, d).hbm_total:.2f}" == "0.50"
    assert glued["l2_h200"] == str(runtime.chip("H200").l2_mib) == "60"
    text = cell_source(CH1, "37bf9eaf")
    prose = flat(text)
    assert "$1 + N/d$ times the least: {glue:text}`hbm_naive_x` times" in prose
    assert "works on tiles of $B_r$ = {glue:text}`hbm_tile` queries" in prose
    assert r"$(2 + 2N/B_r)\,Nd$ elements" in prose
    assert "block of queries" not in prose
    assert "traffic = " not in cell_source(CH1, "41cc934a")                  # the count has its own cell
    # the profiler's detail and the traffic formulas are folded, their facts kept; the main
    # text says only that FlashAttention's traffic is still quadratic and points to chapter 4
    fold, outside = _dropdown(text)
    assert re.search(r"^:::\{dropdown\} What the GPU record and a profiler show \(optional\)", text, re.M)
    for fact in (_glue("ncu_shape"), _glue("ncu_dram"), _glue("ncu_qkv"), _glue("ncu_l2"),
                 r"$(2 + 2N/B_r)\,Nd$ elements", _glue("hbm_tile"), _glue("hbm_flash_x")):
        assert fact in fold and fact not in outside, fact
    # what a chapter-1 reader cannot judge yet (a counter's name, the tensor cores' busy share,
    # the sparse peak) is left to chapter 7's profile, which the box names
    for later in ("dram__bytes_read", _glue("ncu_tflops"), _glue("ncu_peak_pct"), _glue("ncu_tensor"),
                  "2:4", "TFLOP/s of", "Nsight"):
        assert later not in text, later
    assert "Chapter 7 shows the whole profile." in flat(fold)
    assert "{term}`L2 cache`" in fold and "chapter 7\nmeasures how many" in fold
    assert ("still grows as $N^2$, only with a smaller constant: chapter 4 counts it."
            in flat(outside))


# --- finding 5: the merge figure shows both sides' factors ----------------------------------

def test_the_merge_figure_prints_both_factors_and_draws_bars_from_zero():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # block 1's maximum (0.5) is below block 0's (3): there the block's side shrinks, not the old
    # one; block 2's (5) is above: there the old side shrinks
    x = np.array([3.0, -0.5, 1.0, 2.0, -1.0, 0.5, -2.0, 0.2, 5.0, 1.0, 2.0, -0.3])
    fig, ax = plt.subplots()
    plots.online_merge(ax, x, 4)
    boxes = [t.get_text() for t in ax.texts if t.get_text().startswith("\u2295")]
    assert len(boxes) == 3 and "old" not in boxes[0]
    factors = []
    for b, box in enumerate(boxes[1:], 1):
        m = re.fullmatch(r"\u2295  m=(\S+), l=(\S+)\n= old (\S+) \u00d7 (\S+)\n\+ block (\S+) \u00d7 (\S+)", box)
        assert m, box
        l_new, l_old, alpha, l_blk, beta = (float(m.group(i)) for i in range(2, 7))
        assert math.isclose(l_new, l_old * alpha + l_blk * beta, abs_tol=0.02), box   # checkable by hand
        blk = softmax.block_state(x[4 * b:4 * b + 4])
        assert l_blk == round(float(blk.row_sum), 2)
        factors.append((alpha, beta))
    (a1, b1), (a2, b2) = factors
    assert a1 == 1.0 and b1 == round(math.exp(0.5 - 3.0), 2) and 0 < b1 < 1    # the block shrinks
    assert b2 == 1.0 and a2 == round(math.exp(3.0 - 5.0), 2) and 0 < a2 < 1    # the old state shrinks
    # every bar starts at 0 and is as tall as its score, so the smallest score has a bar too
    bars = ax.patches
    assert len(bars) == x.size
    assert all(p.get_y() == 0 for p in bars)
    assert np.allclose([p.get_height() for p in bars], x)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0"]
    plt.close(fig)
    text = flat(cell_source(CH3, "e1e1781b"))
    assert "Each merge box prints both factors, the old state's and the new block's" in text
    assert "shrinks by $e^{m_1 - m} \\le 1$" not in text
    alt = next(c for c in CH3["cells"] if c["id"] == "fa27fcbc")["metadata"]["mystnb"]["image"]["alt"]
    assert "both factors" in alt and "green block brings a larger maximum" not in alt


# --- findings 6 to 12: the smaller ones -----------------------------------------------------

def test_the_variance_argument_says_zero_mean():
    assert "independent, with mean 0 and variance 1, so is each product" in flat(cell_source(CH1, "1c820799"))
    assert ("independent, with mean 0 and standard deviation $\\sigma$"
            in flat(cell_source(CH3, "dbc1374d")))
    # why it matters: with mean 1 a product of two unit-variance entries has variance 1 + 2 = 3
    rng = np.random.default_rng(0)
    for mean, want in ((0.0, 1.0), (1.0, 3.0)):
        a, b = rng.normal(mean, 1.0, size=(2, 400_000))
        assert abs((a * b).var() - want) < 0.05 * want


def test_chapter_1_gives_the_scaled_spread_and_weight_over_every_width():
    text = flat(cell_source(CH1, "4bf0ba9c"))
    assert _glue("sat_pmax_scaled") + " at every width" not in text
    for key in ("sat_std_scaled_min", "sat_std_scaled_max", "sat_pmax_scaled_min", "sat_pmax_scaled_max"):
        assert _glue(key) in text, key
    glued, ns = _run(cell_source(CH1, "6687b8f1"), plots=_Saturation(), rng=np.random.default_rng(0))
    sat = ns["sat"]
    assert glued["sat_pmax_scaled_min"] == f"{sat['pmax_scaled'].min():.3f}"
    assert glued["sat_pmax_scaled_max"] == f"{sat['pmax_scaled'].max():.3f}"
    assert glued["sat_std_scaled_min"] == f"{sat['std_scaled'].min():.2f}"
    assert glued["sat_std_scaled_max"] == f"{sat['std_scaled'].max():.2f}"
    assert sat["pmax_scaled"].min() < sat["pmax_scaled"].max() < 0.1     # one sample per width varies


class _Saturation(NoPlot):
    """The library's saturation numbers, with the drawing left out."""
    saturation_stats = staticmethod(plots.saturation_stats)


class _Steps(NoPlot):
    """A fixed timing in place of the live one (the shares of the review's CPU build)."""

    @staticmethod
    def measure_naive_steps(n, d, **kw):
        return {"ms": {"Q K^T (matmul)": 9.94, "softmax: moving S in and P out": 5.31,
                       "softmax: max, exp, sum": 1.68, "P V (matmul)": 7.59},
                "device": "cpu", "dtype": "float32", "n": n, "d": d, "batch_heads": 4}


def test_chapter_1_gives_the_cpu_shares_to_a_whole_percent_and_says_they_vary():
    code = cell_source(CH1, "41cc934a")
    glued, ns = _run(code, plots=_Steps(), CPU=True, STEP_LABELS={}, flashbook=__import__("flashbook"))
    ms = ns["steps"]["ms"]
    total = sum(ms.values())
    products = 100 * (ms["Q K^T (matmul)"] + ms["P V (matmul)"]) / total
    # a live CPU timing is not worth a tenth of a percent: whole percents, as the legend draws them
    assert glued["tb_matmul_pct"] == f"{products:.0f}" == "71"
    assert glued["tb_softmax_pct"] == f"{100 - products:.0f}" == "29"
    assert glued["tb_move_pct"] == f"{100 * ms['softmax: moving S in and P out'] / total:.0f}"
    assert ".1f" not in code
    assert "(rounded to whole percents; CPU shares vary from run to run)" in flat(cell_source(CH1, "37bf9eaf"))


def test_chapter_1_compares_with_no_peak_and_leaves_the_rate_to_later_chapters():
    fold, _ = _dropdown(cell_source(CH1, "37bf9eaf"))
    fold = flat(fold)
    assert "on the H200's datasheet" not in fold and "peak" not in fold
    assert "And what remains is matrix work on the chip's tensor cores; chapters 9 and 10 measure how fast it runs." in fold
    code = cell_source(CH1, "c01-ncu")
    assert "bf16_tflops" not in code and "ncu_peak" not in code and "ncu_tensor" not in code
    assert runtime.chip("H200").bf16_tflops == 989.0        # the dense figure chapters 6 and 9 use


def test_chapter_3_says_ieee_754_does_not_define_bf16():
    text = flat(cell_source(CH3, "1f397647"))
    assert "defines the formats, their ranges" not in text
    assert "The IEEE 754 standard defines fp16, fp32 and fp64" in text
    assert ("bf16 (fp32's exponent with {glue:text}`bf16_fraction_bits` fraction bits) is an "
            "industry format outside it (described in Intel's white paper {cite}`intel2018bfloat16`).") in text
    assert "@misc{intel2018bfloat16," in book_page("references.bib")
    glued, _ = _run(cell_source(CH3, "d6043d86"))
    bf16, fp32 = torch.finfo(torch.bfloat16), torch.finfo(torch.float32)
    assert glued["bf16_fraction_bits"] == 7 and bf16.eps == 2.0 ** -7
    assert math.floor(math.log2(bf16.max)) == math.floor(math.log2(fp32.max)) == 127   # fp32's exponent


def test_chapter_1_says_what_it_computes_and_what_it_measures():
    head = flat(cell_source(CH1, "42dccb5a"))
    assert "computed and measured" not in head
    assert ("computed for fp32, fp16 and bf16 at $N$ = {glue:text}`mem_n_min` … "
            "{glue:text}`mem_n_max` and measured for the float64 reference up to "
            "{glue:text}`meas_n_max`") in head
    seq_lens = [1024 * 2**i for i in range(7)]
    glued, _ = _run(cell_source(CH1, "00dc3012"), seq_lens=seq_lens, MiB=2**20, GiB=2**30,
                    itemsize={"fp32": 4, "fp16": 2, "bf16": 2},
                    s4096={"fp32": 4096**2 * 4, "fp16": 4096**2 * 2, "bf16": 4096**2 * 2})
    assert (glued["mem_n_min"], glued["mem_n_max"]) == ("1K", "64K")
    sizes = re.search(r"for n_meas in (\[[\d, ]+\])", cell_source(CH1, "1d71aa18")).group(1)
    largest = max(json.loads(sizes))
    glued, _ = _run(cell_source(CH1, "c2337824"), measured=[(largest // 2, 0, 3.0), (largest, 0, 3.0)],
                    ratios=[3.0, 3.0])
    assert glued["meas_n_max"] == f"{largest // 1024}K" == "4K"


def test_chapter_1_reads_the_memory_plot_out():
    ids = cell_ids(CH1)
    assert ids.index("343b189c") + 1 == ids.index("c01-layer-mem") < ids.index("3797eb13")
    text = flat(cell_source(CH1, "3797eb13"))
    assert text.startswith("Read off the plot: at {glue:text}`layer_n_fits` tokens the fp16 score "
                           "matrices of one layer take {glue:text}`layer_s_fits` GiB, under an A100's")
    assert "past even an H200's {glue:text}`h200_gb` GB" in text
    # GiB against a datasheet's "GB": the comparisons hold whichever way "GB" is read
    assert ("(A datasheet's \"GB\" is a rounded figure. Read as $10^9$ or as $2^{30}$ bytes, it gives "
            "the same comparisons; chapter 6 sets it beside what the driver reports.)") in text
    a100, h200 = (runtime.chip(c).hbm_gib for c in ("A100", "H200"))
    for gb in (1e9, 2**30):
        assert 32 * 32768**2 * 2 < a100 * gb and 32 * 65536**2 * 2 > h200 * gb
    assert "assert layer_s[n_fits] * GiB < a100_gib * 1e9" in cell_source(CH1, "c01-layer-mem")
    glued, _ = _run(cell_source(CH1, "c01-layer-mem"), heads_=32, kv_heads=8, d_=128, GiB=2**30,
                    itemsize={"fp32": 4, "fp16": 2, "bf16": 2}, flashbook=__import__("flashbook"))
    heads, gib = 32, 2**30                                   # LLaMA-3-8B: 32 query heads, 8 K/V heads
    assert glued["layer_s_fits"] == f"{heads * 32768**2 * 2 / gib:.0f}" == "64"
    assert glued["layer_s_past"] == f"{heads * 65536**2 * 2 / gib:.0f}" == "256"
    assert glued["layer_qkvo"] == f"{(2 * 32 + 2 * 8) * 65536 * 128 * 2 / gib:.2f}" == "1.25"
    assert (glued["a100_gb"], glued["h200_gb"]) == ("80", "141")
    assert (glued["layer_n_fits"], glued["layer_n_past"]) == ("32K", "64K")


def test_chapter_3_and_a2_say_which_edge_is_scanned():
    """Re-check N1: A2 scans only the overflow edge; the smallest positive number is read from
    its bit pattern (``smallest_positive``), as A2's table note says."""
    ch3 = flat(cell_source(CH3, "dbc1374d"))
    assert "and the smallest positive number of each format, by scanning the format" not in ch3
    assert ("finds it by scanning the format one value at a time, and reads each format's smallest "
            "positive number from its bit pattern") in ch3
    a2 = flat(cell_source("A2_floating_point", "807ea18e"))
    assert "(the overflow edge scanned one representable value at a time)" in a2
