"""Review round 10, chapters 4 and 5: the newcomer's items. The loop's reader's guide names the
flattened (batch, head) axis and the helpers, the paper's constant of 12 is reconciled with the
table's 12.3 to 13.4, the profile's 1/22 is a ratio of reads on an H200, the non-matmul rows
have units, L2 and memory-bound are glossed where they first appear, the seed article is named
and linked, and the code writes the element-wise product as `*`."""
import math

import numpy as np
import pytest

from flashbook import runtime, tiled
from flashbook.io_counter import as_counter
from notebook_text import NoPlot, book_page, cell_source, flat, markdown, notebook, run_glued

CH4, CH5 = notebook("04_tiled_forward"), notebook("05_backward_recompute")
KiB, MiB = 2**10, 2**20


def _glue(name):
    return "{glue:text}`" + name + "`"


# ---------------------------------------------------------------- chapter 4

def test_reading_the_code_names_the_programs_axis_and_the_helpers():
    text = flat(cell_source(CH4, "c04-loop-md"))
    assert ("The `io.…` calls only count traffic, for later, and return what they are given "
            "(`io.matmul(a, b)` returns `a @ b`)") in text
    assert ("`_t` transposes the last two axes, `_normalise` divides by $l$ and `_lse` is $m + \\log l$ "
            "(0 and $-\\infty$ for a row with $l = 0$)") in text
    assert "`_mask_scores` sets the scores it hides to $-\\infty$" in text
    assert ("Here a program handles one query tile of one (batch, head) pair. The arrays' first axis holds "
            "every such pair, flattened (`programs`), so one pass of the `i` loop does the work of that many "
            "programs.") in text
    # what the guide says is what the code does
    x = np.arange(6.0).reshape(1, 2, 3)
    for io in (tiled.IOCounter(), as_counter(None)):
        assert io.hold("S/P", x) is x and io.read("Q", x) is x and io.write("O", x) is x
        assert np.array_equal(io.matmul(x, tiled._t(x)), x @ np.swapaxes(x, -1, -2))
    assert tiled._t(x).shape == (1, 3, 2)
    acc, l = np.ones((1, 2, 3)), np.array([[2.0, 0.0]])
    assert np.array_equal(tiled._normalise(acc, l), [[[0.5] * 3, [0.0] * 3]])
    assert np.array_equal(tiled._lse(np.array([[1.0, 5.0]]), l), [[1 + math.log(2), -np.inf]])
    assert tiled._flatten(np.zeros((2, 3, 7, 4))).shape == (6, 7, 4)
    import inspect
    assert "programs, n_q, _ = q.shape" in inspect.getsource(tiled._forward_fa2)


def test_the_paper_constant_of_12_is_reconciled_with_the_table():
    text = flat(cell_source(CH4, "800ac299"))
    assert "passes: $3\\times 4 = 12$. The table's " + _glue("ratio_lo") + " to " + _glue("ratio_hi") in text + " adds three things"
    for name in ("three_d", "h100_bc", "h100_tc", "h100_tc_exact"):
        assert _glue(name) in text, name
    assert ("$m$ and $l$, four more elements per row and pass" in text
            and "traffic paid once ($K$ and $V$ read, $O$, $m$, $l$ zeroed, the final pass for lse)" in text)
    glued, _ = run_glued([cell_source(CH4, "b8c3a2db"), cell_source(CH4, "c04b8c3a")], quiet=True,
                         np=np, math=math, tiled=tiled, runtime=runtime, KiB=KiB, plt=NoPlot(),
                         traffic=NoPlot())
    assert (glued["ratio_lo"], glued["ratio_hi"], glued["bound_ratio"]) == ("12.3", "13.4", "13")
    assert (glued["h100_bc"], glued["h100_tc"], glued["h100_tc_exact"], glued["three_d"]) == (
        "227", "19", "18.0", "384")
    # by hand: the H100's count, and the three parts above 12
    n, d, m = 4096, 128, 227 * 1024 // 2
    assert math.ceil(n / 227) == 19 and 4 * n * d / m == pytest.approx(18.04, abs=0.01)
    moved = tiled.io_flash(n, n, d, 128, 227, order="fa1").hbm_total
    assert moved == 31_789_056 == 19 * n * (3 * d + 4) + 2 * n * d + n * (d + 2) + 3 * n
    bound = tiled.io_bound(n, d, m)
    assert 12 * (19 * m / (4 * n * d)) * (3 * d + 4) / (3 * d) == pytest.approx(12.77, abs=0.01)
    assert moved / bound == pytest.approx(13.44, abs=0.01)


def test_the_profile_ratio_is_one_of_reads_on_an_h200():
    text = flat(cell_source(CH4, "2db0895f"))
    assert "A profile of chapter 7's kernel on an H200," in text
    assert _glue("l2_h200") + " MiB on an H200" in text
    assert ("1/" + _glue("ncu_model_x") + " of the reads this chapter counts for that shape ("
            + _glue("ncu_reads_nd") + " $Nd$ counted, $3Nd$ delivered)") in text
    from flashbook import bench
    run = bench.run_path("kernel_ncu")
    if run is None or not run.exists():
        pytest.skip("no recorded Nsight Compute run")
    assert "H200" in (run / "provenance.txt").read_text()
    glued, _ = run_glued(cell_source(CH4, "34db79f2"), quiet=True, np=np, MiB=MiB, runtime=runtime,
                         tiled=tiled)
    assert glued["l2_h200"] == str(runtime.chip("H200").l2_mib) == "60"
    # N = 4096, B_r = 128: Nd + 32 (2Nd) = 65 Nd counted reads, against 3Nd delivered: 1/22
    assert glued["ncu_reads_nd"] == "65" and glued["ncu_model_x"] == "22" == f"{65 / 3:.0f}"


def test_the_non_matmul_rows_have_units_and_their_time_is_in_the_main_text():
    code = cell_source(CH4, "1fcb1f10")
    assert '"matmul FLOPs (S = QK^T, PV)"' in code and '"non-matmul ops, score tile"' in code
    assert '"non-matmul ops, output tile"' in code and '"matmul (S = QK^T, PV)"' not in code
    glued, _ = run_glued([code, cell_source(CH4, "c04a1f10")], quiet=True, runtime=runtime, math=math)
    assert (glued["mm_flops"], glued["ns_fa1"], glued["ns_fa2"]) == ("8,388,608", "147,456", "114,688")
    assert (glued["ns_pct_fa1"], glued["ns_pct_fa2"]) == ("1.8", "1.4")
    assert (glued["ew_share_fa1"], glued["ew_share_fa2"], glued["exp_share"]) == ("75", "63", "25")
    main = flat(cell_source(CH4, "b28bb58c").split(":::{dropdown}")[0])
    for name in ("ns_fa1", "ns_fa2", "mm_flops", "ns_pct_fa1", "ns_pct_fa2", "ew_share_fa1", "ew_share_fa2"):
        assert _glue(name) in main, name
    assert "operations on single elements against " + _glue("mm_flops") + " matmul FLOPs" in main


def test_l2_is_glossed_where_it_first_appears():
    text = markdown(CH4)
    first = text.index("L2")
    assert text[first:].startswith("L2 cache` (an on-chip cache that\nall SMs share; chapter 6)")


# ---------------------------------------------------------------- chapter 5

def test_the_seed_article_is_named_and_linked():
    cost = flat(cell_source(CH5, "d2444121"))
    assert ('One of the articles this book grew from, "FlashAttention, principles and implementation" '
            "({ref}`The sources, checked, S1.8 <s1-8>`), says") in cost
    assert "In the same article ({ref}`S1.17 <s1-17>`), the memory table for" in flat(cell_source(CH5, "3beb04ff"))
    assert "source article" not in markdown(CH5) and "The article this book grew from" not in markdown(CH5)
    page = book_page("sources_checked.md")
    assert "(s1-8)=\n### S1.8 · \"the computation really doubles\"" in page and "(s1-17)=\n### S1.17" in page
    assert '## Source 1: "FlashAttention, principles and implementation"' in page


def test_memory_bound_is_defined_at_its_first_use():
    text = flat(markdown(CH5))
    first = text.index("memory-bound")
    assert text[first:].startswith("memory-bound*: its time is set by the bytes it moves rather than by "
                                   "its arithmetic (chapter 6 makes this precise)")


def test_the_code_writes_the_elementwise_product_as_a_star():
    for cid in ("fc0f3a83", "3150ec5d"):
        code = cell_source(CH5, cid)
        assert "dO o O" not in code and "P o (dP" not in code and "P o dP" not in code, cid
    assert "# delta = rowsum(dO * O)" in cell_source(CH5, "fc0f3a83")
    assert '("dS = P * (dP - delta)"' in cell_source(CH5, "3150ec5d")
