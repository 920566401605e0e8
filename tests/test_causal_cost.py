"""benchmarks/causal_cost.py splits the causal forward's time into its costs: its tile counts
and its fit are checked here on made-up numbers whose parts are known."""
from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import ROOT
from notebook_text import cell_source

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import causal_cost as cc  # noqa: E402


def test_the_passes_tiles_are_chapter_7s_counts():
    steps = cc.passes((128,))
    assert [(s["seq_k"], s["causal"]) for s in steps] == [(4096, False), (2048, False), (1024, False), (4096, True)]
    bh = 8 * 16
    full, half, quarter, causal = (cc.tiles(s, 128, 64) for s in steps)
    assert full == {"programs": 32 * bh, "unmasked": 32 * 64 * bh, "masked": 0}
    assert half["unmasked"] == 32 * 32 * bh and quarter["unmasked"] == 32 * 16 * bh
    # 1,056 tiles a head, 64 of them on the diagonal (chapter 7's count)
    assert causal == {"programs": 32 * bh, "unmasked": (1056 - 64) * bh, "masked": 64 * bh}


def _rows(f, a, b, noise=()):
    rows = []
    for i, s in enumerate(cc.passes((128,))):
        t = cc.tiles(s, 128, 64)
        x = t["programs"] * f + t["unmasked"] * a + t["masked"] * b
        rows.append(dict(s, **t, x=x * (1 + (noise[i] if i < len(noise) else 0))))
    return rows


def test_decompose_recovers_the_costs_it_was_made_of():
    got = cc.decompose(_rows(f=900.0, a=100.0, b=130.0), "x")
    assert got["f"] == pytest.approx(900.0) and got["a"] == pytest.approx(100.0)
    assert got["b"] == pytest.approx(130.0) and got["b_over_a"] == pytest.approx(1.3)
    assert got["fit_residual"] < 1e-12
    assert sum(got["parts"].values()) == pytest.approx(got["causal_total"])


def test_loss_shares_add_up_to_the_excess_over_half():
    rows = _rows(f=900.0, a=100.0, b=130.0)
    got = cc.loss_shares(rows, "x")
    full, causal = rows[0]["x"], rows[3]["x"]
    assert got["ratio_to_half"] == pytest.approx(causal / (0.5 * full))
    assert sum(got["shares"].values()) == pytest.approx(got["ratio_to_half"] - 1)
    assert got["shares"]["unexplained"] == pytest.approx(0, abs=1e-12)
    # the extra tiles: 1,056 visited against 1,024, each at a
    bh = 8 * 16
    assert got["shares"]["more_tiles"] * 0.5 * full == pytest.approx(32 * bh * 100.0)
    # a noisy full pass leaves its misfit unexplained, never hidden in another share
    noisy = cc.loss_shares(_rows(f=900.0, a=100.0, b=130.0, noise=(0.01, -0.01, 0.0)), "x")
    assert noisy["shares"]["unexplained"] != pytest.approx(0, abs=1e-6)


def test_decompose_refuses_too_few_full_passes():
    with pytest.raises(ValueError, match="three full passes"):
        cc.decompose(_rows(1.0, 1.0, 1.0)[1:], "x")


def _recorded():
    from flashbook import bench

    run = bench.run_path("causal_cost")
    if run is None or not (run / "analysis.json").is_file():
        pytest.fail("the recorded causal_cost run is missing")
    return run


def test_the_recorded_analysis_is_what_analyse_computes_from_the_raw_files():
    run = _recorded()
    stored = json.loads((run / "analysis.json").read_text())
    again = cc.analyse(run)
    assert stored.keys() == again.keys() == {"64", "128"}
    for d in stored:
        for q in ("inst", "cycles", "ncu_us", "ms"):
            assert again[d][q]["ratio_to_half"] == pytest.approx(stored[d][q]["ratio_to_half"], rel=1e-12)
            assert again[d][q]["shares"] == pytest.approx(stored[d][q]["shares"], rel=1e-9, abs=1e-12)
        # the excess is real (above the repeats' spread) and the diagonal's tiles are not most of it
        at = again[d]
        assert min(at[q]["ratio_to_half"] for q in ("inst", "cycles", "ncu_us", "ms")) > 1.08
        assert all(at[q]["shares"]["more_tiles"] < 0.4 * (at[q]["ratio_to_half"] - 1) for q in at if q in
                   ("inst", "cycles", "ncu_us", "ms"))
        assert max(p["spread"] for p in at["passes"]) < 0.08


def test_chapter_9_quotes_the_measured_split():
    from flashbook.bench import chapter9

    _recorded()
    values = chapter9.build().values
    keys = [k for k in values if k.startswith("cc_")]
    assert sorted(keys) == sorted(chapter9.measured.CAUSAL_COST_KEYS)
    assert all(values[k] != "n/a" for k in keys)

    def ends(text):
        lo, _, hi = text.partition(" to ")
        return float(lo), float(hi or lo)

    excess, tiles, fixed, masked = (ends(values[k]) for k in ("cc_excess", "cc_tiles", "cc_fixed", "cc_masked"))
    # the parts of each measure add up to its excess, so the ranges must overlap
    assert tiles[0] + fixed[0] + masked[0] <= excess[1] + 0.2 and tiles[1] + fixed[1] + masked[1] >= excess[0] - 0.2
    assert ends(values["cc_mask_ratio"])[0] > 1     # a masked tile costs more than an unmasked one
    assert float(values["cc_idle_causal"]) - float(values["cc_idle_full"]) < tiles[0]   # the tail is small
    prose = cell_source("09_benchmarks.ipynb", "memory-md")
    for k in keys:
        assert f"{{glue:text}}`{k}`" in prose, k
