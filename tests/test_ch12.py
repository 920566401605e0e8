"""Chapter 12 (one kernel, many masks): the recorded comparison with FlexAttention it reads,
and the tile arithmetic its prose states."""
import functools
import json

import numpy as np
import pytest

from flashbook import bench, masks
from notebook_text import cells, source_of


def _masks_run():
    path = bench.run_path("masks")
    assert path is not None, "benchmarks/results/index.json has no 'masks' run"
    return json.load(open(path / "masks.json"))


@functools.lru_cache(maxsize=None)
def _rule_counts(n, block_q, block_k, window):
    """``masks.tile_counts`` under the causal rule (it evaluates the rule on every entry, so a
    row's shape is counted once: the masks that share a window share the count)."""
    return masks.tile_counts(n, n, block_q, block_k, causal=True, window=window)


def test_the_recorded_flex_comparison_is_whole_and_right():
    run = _masks_run()
    prov = run["provenance"]
    assert prov["gpu"]["name"] == "NVIDIA H200" and prov["torch"] and prov["triton"] and prov["command"]
    assert run["checks"], "no correctness checks recorded"
    for c in run["checks"]:   # both implementations within the rule against float64
        assert c["flashbook"]["ok"] and c["flex"]["ok"], c["mask"]
    assert len(run["rows"]) >= 8
    for r in run["rows"]:
        f, x = r["flashbook"], r["flex"]
        assert 0 < f["fwd_ms"] < f["fwd_bwd_ms"] and 0 < x["fwd_ms"] < x["fwd_bwd_ms"], r["mask"]
        assert r["flex_over_flashbook_fwd"] == pytest.approx(x["fwd_ms"] / f["fwd_ms"])
        assert r["flex_over_flashbook_fwd_bwd"] == pytest.approx(x["fwd_bwd_ms"] / f["fwd_bwd_ms"])
        assert r["mask"] == "documents" or r["tiles"] == _rule_counts(r["seq"], *r["forward_tile"], tuple(r["window"]))


@pytest.mark.parametrize("window", [256, 1024, 4096])
def test_a_window_costs_its_w_plus_br_keys_in_tiles_per_query_tile(window):
    """The chapter: each query tile visits about (W + B_r) / B_c key tiles (its W + B_r - 1 keys
    rounded up to whole tiles, at most one more where they do not line up), whatever N."""
    n, bm, bn = 16384, 128, 64
    kinds = masks.tile_kinds(n, n, bm, bn, causal=True, window=(window - 1, 0))
    visited = (kinds != "skipped").sum(axis=1)
    middle = visited[window // bm + 1:]            # rows whose window lies wholly inside the keys
    spans = -(-(window + bm - 1) // bn)            # W + B_r - 1 keys in whole tiles
    assert middle.min() >= spans and middle.max() <= spans + 1, (middle.min(), middle.max())
    assert middle.max() == spans == (window + bm) // bn   # the tiles here line up: exactly (W + B_r) / B_c
    assert np.all(visited <= spans + 1)


def test_a_floored_maximum_loses_very_negative_rows_and_minus_infinity_does_not():
    s = np.array([-300.0, -301.0, -302.5], dtype=np.float32)
    assert np.exp2(s - np.float32(0)).sum() == 0                      # what the chapter prints as nan
    p = np.exp2(s - s.max())
    exact = np.exp2(s.astype(np.float64) - s.max())
    assert abs(p.sum() - exact.sum()) < 1e-6


def test_the_repeats_and_the_profile_the_chapter_reads():
    """Each recorded time is the median of its repeats; the profiles' GPU time is the sum of
    their kernels; the chapter's claims on them hold in the records: plans cut the host's
    time of the windowed call, and a window's time grows about as N while causal's grows
    about as N^2 (from 4K to 32K)."""
    run = _masks_run()
    for r in run["rows"]:
        for impl in ("flashbook", "flex"):
            for key in ("fwd", "fwd_bwd"):
                times = r[impl]["repeats"][key]
                assert len(times) == 3 and r[impl][f"{key}_ms"] == pytest.approx(float(np.median(times)))
    path = bench.run_path("masks_profile")
    before, after = (json.load(open(path / f)) for f in ("profile_1_before_plans.json", "profile_2_plans.json"))
    for record in (before, after):
        for row in record["profiles"]:
            for impl in ("flashbook", "flex"):
                busy = sum(k["us_per_step"] for k in row[impl]["kernels"].values()) / 1e3
                assert row[impl]["gpu_busy_ms"] == pytest.approx(busy)
    a, b = before["profiles"][0], after["profiles"][0]
    assert (a["name"], a["n"], a["window"]) == (b["name"], b["n"], b["window"]) == ("window", 4096, 1024)
    assert b["flashbook"]["host_us"]["median_us"] < 0.6 * a["flashbook"]["host_us"]["median_us"]
    assert b["flashbook"]["fwd_bwd_ms"] < b["flex"]["fwd_bwd_ms"] < a["flashbook"]["fwd_bwd_ms"]

    def power(mask, window):
        t = {r["seq"]: r["flashbook"]["fwd_bwd_ms"] for r in run["rows"] if r["mask"] == mask and r["window"][0] == window}
        return np.log(t[32768] / t[8192]) / np.log(4)   # from 8K: at 4K the call waits on the host

    assert 0.8 < power("window", 1024) < 1.2 and 1.6 < power("causal", -1) < 2.1


def test_the_window_order_and_tiles_the_chapter_quotes():
    """``bench.chapter12.window_order`` against the recorded files read directly: the forward of a
    window as long as the sequence in the plain order, last first and as the causal mask; the tile
    gains, each a median of three repeats; and the signs the chapter's rule rests on."""
    from flashbook.bench import chapter12
    from flashbook.kernels import configs

    got = chapter12.window_order()
    assert got is not None, "runs window_order and window_tiles are not recorded"
    order = json.load(open(bench.run_path("window_order")))
    rows = {r["shape"]: r for r in order["rows"]}
    assert order["provenance"]["gpu"]["name"] == "NVIDIA H200" and order["provenance"]["command"]
    t = rows["window 4K at 4K"]["times"]
    assert got["plain_fwd"] == float(np.median(t["heavy-off"]["fwd"]))
    assert got["last_fwd"] == float(np.median(t["rule"]["fwd"]))
    assert got["causal_fwd"] == float(np.median(rows["causal 4K B1"]["times"]["rule"]["fwd"]))
    assert got["plain_fwd"] > 1.2 * got["last_fwd"] and abs(got["last_fwd"] / got["causal_fwd"] - 1) < 0.1
    assert got["exact"] and got["rows"] == len(order["rows"]) == 10
    sweeps = json.load(open(bench.run_path("window_tiles")))["sweeps"]
    assert (got["long"], got["short"]) == (3, 2) and all(len(s["rows"]) == 15 for s in sweeps)
    for kernel, short in (("backward_dkdv", "dkdv"), ("backward_dq", "dq")):
        ratios = []
        for s in sweeps:
            def med(cfg):
                return float(np.median([r["bwd_ms"] for r in s["rows"] if r["kernel"] == kernel
                                        and tuple(r["config"]) == cfg]))
            ratios.append((s["window"], med(chapter12.SHORT_TILES[kernel]) / med(chapter12.CAUSAL_TILES[kernel])))
        long = [100 * (r - 1) for w, r in ratios if w >= configs.LONG_WINDOW]
        brief = [100 * (1 / r - 1) for w, r in ratios if w < configs.LONG_WINDOW]
        assert min(long) > 0 and min(brief) > 0, (kernel, ratios)   # the rule's signs
        assert (got[f"gain_{short}_lo"], got[f"gain_{short}_hi"]) == pytest.approx((min(long), max(long)))
        assert (got[f"loss_{short}_lo"], got[f"loss_{short}_hi"]) == pytest.approx((min(brief), max(brief)))
    # the library's choice follows: 4K keys take the causal tiles, 1K the short window's
    assert configs.tiles_for(False, 4097) == (True, False) and configs.tiles_for(False, 1025) == (False, True)
    assert configs.default("backward_dq", cc=90, block_d=128, elem_bytes=2, causal=True) == \
        configs.Config(*chapter12.CAUSAL_TILES["backward_dq"])
    assert configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=True) == \
        configs.Config(*chapter12.CAUSAL_TILES["backward_dkdv"])
    assert configs.default("backward_dq", cc=90, block_d=128, elem_bytes=2, window=True) == \
        configs.Config(*chapter12.SHORT_TILES["backward_dq"])
    assert configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, window=True) == \
        configs.Config(*chapter12.SHORT_TILES["backward_dkdv"])


def test_the_short_windows_one_loop_the_chapter_quotes(tmp_path):
    """``bench.chapter12.one_loop`` against the recorded file read directly: the times each row
    took with three loops and with one, the rows the rule gives one loop (1K windows), the signs
    the rule rests on, and no run recorded under a root without it."""
    from flashbook.bench import chapter12
    from flashbook.kernels import autograd, configs

    got = chapter12.one_loop()
    assert got is not None, "run one_loop is not recorded"
    run = json.load(open(bench.run_path("one_loop") / "one_loop.json"))
    assert run["provenance"]["gpu"]["name"] == "NVIDIA H200" and run["provenance"]["command"]
    saved = {r["shape"]: 100 * (1 - r["median_ms"]["one"] / r["median_ms"]["three"]) for r in run["rows"]}
    short = [saved[s] for s in saved if s.startswith("window") and s.endswith(":1K")]
    kept = [-saved[s] for s in ("window:8K:128:4K", "causal:8K:128", "documents:8K:128")]
    assert len(short) == 6 and min(short) > 0 and min(kept) > 0     # the rule's signs
    assert (got["gain_lo"], got["gain_hi"]) == pytest.approx((min(short), max(short)))
    assert (got["loss_lo"], got["loss_hi"]) == pytest.approx((min(kept), max(kept)))
    assert got["lengths"] == ["4K", "8K", "16K", "32K"] and got["exact"]
    # what the rule runs: "rule" took the one-loop kernels for 1K windows, three loops elsewhere
    assert autograd.one_loop(configs.tiles_for(False, 1025)[1]) == {"ONE_LOOP": True}
    assert autograd.one_loop(configs.tiles_for(False, 4097)[1]) == {} == autograd.one_loop(False)
    # FlexAttention's time over flashbook's for the 1K window, before (run masks_window_order) and after
    def ratios(folder):
        rows = json.load(open(folder / "masks.json"))["rows"]
        return {r["seq"]: r["flex_over_flashbook_fwd_bwd"] for r in rows if r["mask"] == "window"
                and r["window"] == [1024, 0]}
    before, after = ratios(bench.run_path("masks_window_order")), ratios(bench.run_path("one_loop"))
    assert got["flex"] == [(n, before.get(n), after[n]) for n in (4096, 8192, 16384, 32768)]
    assert all(b is not None for _, b, _ in got["flex"])
    (tmp_path / "index.json").write_text(json.dumps({"runs": {"one_loop": {"path": "nowhere"}}}))
    assert chapter12.one_loop(tmp_path) is None


def test_the_one_launch_backward_the_chapter_quotes(tmp_path):
    """``bench.chapter12.fused_bwd`` against the recorded files read directly: what one launch in
    FlexAttention's order saved at every d = 128 row, the signs the library's rule rests on
    (packed documents gain at every length, the causal mask loses at 16K), and no run recorded
    under a root without it."""
    from flashbook.bench import chapter12

    got = chapter12.fused_bwd()
    assert got is not None, "run fused_bwd is not recorded"
    saved = {}
    for path in sorted(bench.run_path("fused_bwd").glob("*.json")):
        run = json.load(open(path))
        assert run["provenance"]["gpu"]["name"] == "NVIDIA H200" and run["provenance"]["command"]
        for r in run["rows"]:
            if "median_ms" in r:
                assert all(r["bitwise_equal"].values())
                saved[r["shape"]] = 100 * (1 - r["median_ms"]["halves"] / r["median_ms"]["library"])
    docs = [(n, saved[f"documents:{n // 1024}K:128"]) for n in (4096, 8192, 16384, 32768)]
    def flat(rows):
        return [x for row in rows for x in row]

    assert flat(got["gains"]["documents"]) == pytest.approx(flat(docs)) and min(g for _, g in docs) > 0
    assert flat(got["gains"]["causal"]) == pytest.approx([4096, saved["causal:4K:128"], 16384, saved["causal:16K:128"]])
    assert saved["causal:16K:128"] < 0 and got["exact"]
    assert "documents:16K:64" not in saved   # refused: its two kernels' grids differ
    (tmp_path / "index.json").write_text(json.dumps({"runs": {"fused_bwd": {"path": "nowhere"}}}))
    assert chapter12.fused_bwd(tmp_path) is None


def test_a_short_windows_forward_tiles_are_the_recorded_fastest_and_the_chapter_says_so():
    from flashbook.bench import chapter12
    from flashbook.kernels import configs

    got = chapter12.forward_tiles()
    assert got is not None and got["sweep"] is not None, "runs masks_d64 and window_fwd_tiles are missing"
    best = configs.Config(*got["sweep"]["best"])
    for d in (64, 128):   # the library's choice is the sweep's fastest
        assert configs.default("forward", cc=90, block_d=d, elem_bytes=2, window=True) == best
        assert configs.default("forward", cc=90, block_d=d, elem_bytes=2, causal=True) != best
    assert got["sweep"]["best_ms"] < 0.9 * got["sweep"]["default_ms"]
    for d in (64, 128):
        before, after, lengths = got["flex"][d]
        assert after[0] > before[0] and after[0] >= 1.0 and len(lengths) >= 3   # no slower than Flex's now
    prose = next(source_of(c) for c in cells("12_masks.ipynb") if "Small forward tiles for a short window" in source_of(c))
    row = next(line for line in prose.splitlines() if "Small forward tiles for a short window" in line)
    for name in ("wf_best", "wf_default", "wf_timed"):   # the table's row: before -> after, and the sweep's size
        assert f"{{glue:text}}`{name}`" in row, name


def test_a_long_windows_tiles_at_d64_are_the_recorded_faster_ones():
    """Chapter 12 quotes run ``window_d64_tiles``: at d = 64 a 4K window's forward on the window's
    own tiles against the causal mask's. The library must choose the faster of the two there, and
    the quoted tiles must be what ``configs`` gives each choice."""
    from flashbook.bench import chapter12
    from flashbook.kernels import configs

    long = chapter12.long_window_tiles()
    assert long is not None, "run window_d64_tiles is missing"
    assert long["window"] + 1 >= configs.LONG_WINDOW and long["d"] == 64
    assert 0 < long["window_ms"] < long["causal_ms"]
    bd = configs.block_d(long["d"])
    assert configs.tiles_for(False, long["window"] + 1, bd) == (False, True)
    assert configs.tiles_for(False, long["window"] + 1, 128) == (True, False)
    window = configs.default("forward", cc=90, block_d=bd, elem_bytes=2, window=True)
    causal = configs.default("forward", cc=90, block_d=bd, elem_bytes=2, causal=True)
    assert [window.block_m, window.block_n, window.num_warps, window.num_stages] == [64, 64, 4, 3]
    assert [causal.block_m, causal.block_n, causal.num_warps, causal.num_stages] == [128, 64, 8, 3]


def test_the_document_order_the_chapter_quotes():
    """``chapter12.document_order`` against run ``document_order`` read directly: each gain is the
    share of the order given's median backward that the heaviest-first order saved, the gradients
    were bitwise equal, the clear gains beat both orders' spread; and ``chapter12.document_profile``'s
    halves add up to its recorded GPU time (the delta kernel counted with the backward)."""
    from flashbook.bench import chapter12

    got = chapter12.document_order()
    assert got is not None and got["exact"], "run document_order is missing or not bitwise"
    rows = {r["shape"]: r for r in json.load(open(bench.run_path("document_order")))["rows"]}
    for n, d, gain in got["gains"]:
        row = rows[f"documents:{n // 1024}K:{d}"]
        ms = row["median_ms"]
        assert gain == pytest.approx(100 * (1 - ms["halves"] / ms["given_order"]))
        assert ((n, d) in got["clear"]) == (gain > 100 * max(row["spread"].values()))
        assert max(row["spread"].values()) <= got["spread"]
    assert (8192, 128) in got["clear"]   # the chapter's case: the long document packed last
    prof = chapter12.document_profile()
    assert prof is not None, "run document_profile is missing"
    for i in range(2):
        assert prof["forward"][i] + prof["backward"][i] == pytest.approx(1e3 * prof["busy"][i])
    # the chapter: the backward is still the slower half, the forward makes up for it
    assert prof["backward"][0] > prof["backward"][1]
    assert prof["forward"][0] < prof["forward"][1] and prof["busy"][0] < prof["busy"][1]


def test_every_rule_written_as_flexattention_is_the_same_function():
    """Chapter 12's side-by-side: each mask_mod / score_mod, run by torch's FlexAttention (eager,
    float64, CPU), equals masks.attention under the keywords beside it, on fresh random inputs."""
    import pandas as pd
    import torch
    from notebook_text import cell_source, run_glued

    pytest.importorskip("torch.nn.attention.flex_attention")
    nb = "12_masks.ipynb"
    shown = []
    _, ns = run_glued(cell_source(nb, "c12-flex-table"), torch=torch, np=np, pd=pd, masks=masks,
                      display=shown.append)
    table = ns["flex_df"]
    assert len(shown) == 1 and len(table) == 7
    assert (table["max |difference|"] < 1e-12).all() and (table["max |difference|"] > 0).any()
    # every rule of the chapter, each through the keyword the chapter's kernels take
    keywords = " ".join(table["flashbook keywords"])
    for name in ("causal=True", "window=(5, 0)", "doc_ids_q=doc", "prefix=8", "softcap=5.0", "alibi_slopes=slopes"):
        assert name in keywords
    # the check would catch a wrong rule: ALiBi with the opposite sign differs
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 24, 16)) for _ in range(3))
    wrong = ns["flex"](*map(torch.tensor, (q, k, v)), "kv_idx <= q_idx", "score + slopes[h] * (q_idx - kv_idx)")
    right = masks.attention(q, k, v, causal=True, alibi_slopes=ns["slopes"].numpy())
    assert np.abs(wrong.numpy() - right).max() > 1e-3
    prose = cell_source(nb, "c12-flex")
    assert "bottom-right" in prose and "already multiplied by the scale" in prose and "torch.abs(q_idx - kv_idx)" in prose
