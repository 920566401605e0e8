"""Chapter 12 (one kernel, many masks) after the eighth review: what a corrected sentence rests on
(the library, the recorded runs) and the page's source. Where a sentence quotes a number, the
number the page glues is recomputed from the data."""
import glob
import json
import os

import numpy as np
import pandas as pd
import pytest

from conftest import require
from flashbook import bench, masks
from notebook_text import cell_source, flat, markdown, run_glued

CH12 = "12_masks"


def _tile_cells(*more):
    return [cell_source(CH12, cid) for cid in ("7791a783", "eb979f00", *more)]


def test_fused_bwd_rounds_reads_each_repeat_of_the_recorded_run(tmp_path):
    """``chapter12.fused_bwd_rounds`` against the files read directly: the gain is ``fused_bwd``'s,
    the spread the larger of the two compared variants' (not the interleaved one's), and "every"
    compares every repeat of one launch with every repeat of two."""
    from flashbook.bench import chapter12

    got = chapter12.fused_bwd_rounds()
    require(got is not None, "run fused_bwd is not recorded")
    fused = chapter12.fused_bwd()
    for name, rows in fused["gains"].items():
        for n, gain in rows:
            assert got[name, n]["gain"] == pytest.approx(gain)
    seen = 0
    for path in sorted(glob.glob(os.path.join(str(bench.run_path("fused_bwd")), "*.json"))):
        for row in json.load(open(path))["rows"]:
            name, n, d, *_ = row["shape"].split(":")
            if "times_ms" not in row or d != "128":
                continue
            two = "separate" if "separate" in row["times_ms"] else "library"
            key = (name, {"4K": 4096, "8K": 8192, "16K": 16384, "32K": 32768}[n])
            assert got[key]["spread"] == pytest.approx(100 * max(row["spread"][two], row["spread"]["halves"]))
            t2, t1 = row["times_ms"][two], row["times_ms"]["halves"]
            assert got[key]["every"] == (1 if max(t1) < min(t2) else -1 if min(t1) > max(t2) else 0)
            seen += 1
    assert seen == len(got) == 7
    # what the chapter says: packed documents from 8K, every one-grid repeat faster, 16K and 32K
    # inside the spread; the causal mask at 16K slower in every repeat, beyond the two variants' spread
    # (the README's 10.2% is the interleaved variant's, which the comparison does not include)
    for n in (8192, 16384, 32768):
        assert got["documents", n]["every"] == 1
    assert [n for n in (8192, 16384, 32768) if got["documents", n]["gain"] <= got["documents", n]["spread"]] \
        == [16384, 32768]
    slow = got["causal", 16384]
    assert slow["every"] == -1 and -slow["gain"] > slow["spread"]
    (tmp_path / "index.json").write_text(json.dumps({"runs": {"fused_bwd": {"path": "nowhere"}}}))
    assert chapter12.fused_bwd_rounds(tmp_path) is None


def test_ch12_one_grid_row_states_the_noise_rule_repeat_by_repeat():
    glued, _ = run_glued(cell_source(CH12, "e16e7c60"), quiet=True, np=np, pd=pd)
    assert glued["fb_doc_noisy"] == "16K and 32K"
    assert glued["fb_causal"] == "6.2% faster at 4K, 4.4% slower at 16K"
    assert glued["do_clear_gains"] == "5.6% at d = 128, N = 8K and 3.4% at d = 64, N = 8K"
    table = flat(cell_source(CH12, "b98bd1a6"))
    assert ("within the repeats' spread at {glue:text}`fb_doc_noisy`, but every one-grid repeat beat every "
            "two-launch repeat") in table
    assert "Causal: {glue:text}`fb_causal`, slower in every repeat there, so it keeps two launches" in table
    text = flat(markdown(CH12))
    assert "{glue:text}`fb_doc` off" not in text and "These runs dealt the heads out" not in text


def test_ch12_documents_row_says_whose_tiling_and_gives_flashbooks_own():
    """The tile table's documents row is one grid over the packed row (a BlockMask's tiling);
    flashbook's varlen kernel tiles each document from its start: computed, not typed."""
    glued, ns = run_glued(_tile_cells("c12-doc-tiles", "c12-doc-glue"), quiet=True,
                          rng=np.random.default_rng(12), masks=masks, np=np, pd=pd)
    lengths = np.diff(ns["doc_cu"])
    assert lengths[-1] == 27 and glued["doc_min"] == "27" and glued["doc_max"] == "1,999"
    want = {k: sum(masks.tile_counts(int(x), int(x), 128, 64, causal=True)[k] for x in lengths)
            for k in ("full", "partial", "visited")}
    assert want == {"full": 686, "partial": 134, "visited": 820}
    assert {k: int(glued[f"docs_{k}"]) for k in want} == want
    assert (glued["docs_grid_full"], glued["docs_grid_partial"], glued["docs_grid_visited"]) == ("527", "296", "823")
    text = flat(markdown(CH12))
    assert "a few hundred to two thousand tokens" not in text
    assert "{glue:text}`doc_min` to {glue:text}`doc_max` tokens" in text
    assert "that is what a FlexAttention `BlockMask` does (a `BlockMask` lists, per query tile, the key tiles" in text
    assert "The documents row tiles the packed row" not in text
    assert "That is {glue:text}`docs_full` whole and {glue:text}`docs_partial` cut tiles" in text


def test_ch12_a_window_visits_w_plus_br_keys_in_tiles():
    glued, _ = run_glued(_tile_cells(), quiet=True, rng=np.random.default_rng(12), masks=masks, np=np, pd=pd)
    assert glued["w1k_per_tile"] == "18" == str((1024 + 128) // 64)
    text = flat(markdown(CH12))
    assert "$W / B_c + 2$" not in text
    assert "it visits about $(W + B_r)/B_c$ key tiles" in text and "{glue:text}`w1k_per_tile`" in text


def test_ch12_names_the_tiles_each_mask_runs_and_the_recorded_rows_ran_them():
    from flashbook.kernels import configs

    _, ns = run_glued(_tile_cells("c12-tile-table"), quiet=True, rng=np.random.default_rng(12), masks=masks,
                      np=np, pd=pd)
    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    for r in json.load(open(path / "masks.json"))["rows"]:
        keys = r["window"][0] + 1 if r["window"][0] >= 0 else None
        assert ns["tile_shape"]("forward", keys is None, keys) == " × ".join(map(str, r["forward_tile"]))
    table = ns["table"]
    assert list(table.loc["window of fewer keys"]) == ["64 × 64"] * 3
    assert table.loc["causal (Triton), soft cap, packed documents", "forward"] == "128 × 64"
    assert table.loc["causal, default call (Gluon forward)", "forward"] == "128 × 128"
    assert table.loc[f"window of {configs.LONG_WINDOW:,} keys or more"].tolist() == \
        table.loc["causal (Triton), soft cap, packed documents"].tolist()
    assert "tile_shape(\"forward\", keys is None, keys)" in cell_source(CH12, "588254b7")   # the page checks too


def test_ch12_minus_infinity_section_ties_to_chapters_2_and_4():
    text = flat(cell_source(CH12, "d59dce09"))
    assert "Chapter 2's exercise 4" in text and "Chapter 4's guard" in text
    assert "Under the causal mask that is safe" in text and "a row that sees any key sees key 0" in text
    assert "A window breaks this" in text
    assert "$2^{x \\log_2 e}$" in text
    assert "chapter 4's guard" in flat(cell_source(CH12, "0b0dceaa"))
    # the kernel does store 0 for a row that has seen no key, but only without a window
    import inspect

    from flashbook.kernels import forward

    source = inspect.getsource(forward.shifted_scores.fn)
    assert "if WINDOW:" in source and 'tl.where(new_max == float("-inf"), 0.0, new_max)' in source


def test_ch12_calls_its_key_loop_ranges_phases():
    text = flat(markdown(CH12))
    for wrong in ("three stages", "masked stage", "two of these stages", "the stage of its lower edge"):
        assert wrong not in text, wrong
    assert "three *phases*" in text and "three phases" in text
    assert "pipeline stages of chapter 6's `num_stages`" in text


def test_ch12_states_the_stress_rule_and_its_final_count():
    from flashbook.bench import chapter12

    stress = flat(cell_source(CH12, "808d4022"))
    assert "2 \\max|X_\\text{torch} - X_{64}|" in stress and "`kernels.checks.output_error_grads`" in stress
    assert "from the stored, rounded $O$" in stress and "autograd takes $\\delta$ from $P$ and $dP$" in stress
    reruns = chapter12.stress_reruns()
    require(reruns is not None, "no recorded stress runs")
    glued, _ = run_glued(cell_source(CH12, "1bb6d6c1"), quiet=True, varlen_err={"o": 0.0}, dtype="float32")
    assert glued["st_tests"] == glued["st_passed"] == str(reruns["tests"])
    # over the runs, not in each: every class ran at least once (one run alone took them all)
    assert glued["st_not_rerun_phrase"] == (f"each of the {reruns['classes']} mask classes ran at least once, "
                                            "the one that had failed included.")
    assert "{glue:text}`st_passed` of {glue:text}`st_tests` checks passed" in stress
    assert "One mask class in one run is one check" in stress and "tests passed" not in stress
    # 8 runs x 192 classes is not 550: one run took every class, the others some of them
    assert reruns["complete"] == 1 and reruns["files"] * reruns["classes"] != reruns["tests"]
    assert glued["st_cover"] == (f"one of them ran all {reruns['classes']} mask classes, "
                                 f"the other {reruns['files'] - 1} some of them")
    assert "It ran {glue:text}`st_files` times on the GPU: {glue:text}`st_cover`." in stress


def test_ch12_figure_and_terms():
    assert "rect=(0, 0.1, 1, 1)" in cell_source(CH12, "1cc47166")   # the legend below the x-labels
    assert "whole + masked: `1+3` is one green tile and three orange ones" in flat(cell_source(CH12, "d59dce09"))
    text = markdown(CH12)
    for term in ("{term}`Gluon`", "{term}`warps <warp>`", "{term}`special-function unit`"):
        assert term in text
    assert "stream" not in text and "sm_90" not in text
    assert "CUDA events (the comparison's timer" in flat(text)
    growth = flat(cell_source(CH12, "c12-window-growth"))
    assert "its tiles are {glue:text}`w1k_tile`" in growth and "three of its operations per score instead of one" in growth


def test_ch12_keeps_the_lab_log_off_the_page():
    text = flat(markdown(CH12))
    for residue in ("was not profiled", "not timed itself", "The first recording", "Why was not profiled",
                    "was not timed", "### Lessons from tuning the window", "### Where the time goes"):
        assert residue not in text, residue
    assert "## What mattered for speed" in text


def test_ch12_names_the_profiles_own_draw_of_documents():
    """"Where flashbook still loses" profiles another draw of packed documents (masks_profile.py:
    seed 0) than the timed row (masks_bench.py: seed n + d): the page says so and gives the
    profiled draw, computed with the function both scripts use."""
    import inspect

    from conftest import benchmark_script

    bench_script, profile_script = benchmark_script("masks_bench"), benchmark_script("masks_profile")
    assert bench_script.documents is masks.random_documents
    assert inspect.signature(profile_script._inputs).parameters["seed"].default == 0
    assert "masks_bench.documents(shape[\"n\"], seed)" in inspect.getsource(profile_script._inputs)
    assert "seed=n + d" in inspect.getsource(bench_script.main)
    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rec = json.load(open(path / "masks.json"))
    glued, _ = run_glued(cell_source(CH12, "c12-profile-draw"), quiet=True, np=np, masks=masks, masks_rec=rec)
    drawn = bench_script.documents(8192, 0)
    lengths = [int(x) for x in np.diff(drawn)]
    assert glued["dp_n_docs"] == str(len(lengths))
    assert glued["dp_lengths"] == ", ".join(map(str, lengths[:-1])) + f" and {lengths[-1]}"
    causal = bench_script.allowed_pairs(8192, True, (-1, -1), drawn) / 8192 ** 2
    assert glued["dp_pairs"] == f"{causal:.3f}"
    row = next(r for r in rec["rows"] if (r["mask"], r["seq"], r["head_dim"]) == ("documents", 8192, 128))
    assert row["allowed_pairs"] == bench_script.allowed_pairs(8192, True, (-1, -1), bench_script.documents(8192, 8192 + 128))
    assert glued["dp_row_pairs"] == f"{row['allowed_fraction']:.3f}" and float(glued["dp_pairs"]) > row["allowed_fraction"]
    text = flat(cell_source(CH12, "a5000337"))
    assert ("The profile packs another random draw of documents than the table's row (seed 0 in "
            "`benchmarks/masks_profile.py`, seed $N + d$ in `masks_bench.py`)") in text
    for name in ("dp_n_docs", "dp_lengths", "dp_pairs", "dp_row_pairs"):
        assert "{glue:text}`%s`" % name in text


def test_ch12_visible_tile_table_imports_what_it_calls_and_the_speed_table_shows_spreads():
    tiles = cell_source(CH12, "c12-tile-table")   # tile_shape is defined in the hidden cell that imports configs
    assert "from flashbook.kernels import configs, hopper_choices" in tiles and "tile_shape(" in tiles
    helper = cell_source(CH12, "eb979f00")
    assert "from flashbook.kernels import configs" in helper and "configs.tiles_for" in helper
    from notebook_text import cell_ids

    order = cell_ids(CH12)
    assert order.index("eb979f00") < order.index("588254b7")   # tile_shape exists where the rows are checked
    table = cell_source(CH12, "20b191f2")
    assert '"spread %, fwd"' in table and '"spread %, fwd+bwd"' in table
    assert "max(f['spread']['fwd'], x['spread']['fwd'])" in table
    assert "the full table's \"spread %\" columns" in flat(cell_source(CH12, "448189c1"))
    text = flat(markdown(CH12))
    for wrong in ("goes further: it *stores* 0", "inward for the whole one", "the prefix of 8 {glue:text}"):
        assert wrong not in text, wrong
    assert "flash-attn calls such packed sequences of varying length *varlen*" in text


def test_ch12_heaviest_first_gain_gives_its_grid_and_the_long_rows():
    """The heaviest-first row quotes its small grid (batch 1, 16 heads: 512 forward programs) and
    that from 16K tokens on the order made no difference beyond the spread, read from the run."""
    from flashbook.bench import chapter12

    order = chapter12.window_order()
    require(order is not None, "runs window_order and window_tiles are not recorded")
    rec = json.load(open(bench.run_path("window_order")))
    row = next(r for r in rec["rows"] if r["shape"] == "window 4K at 4K")
    assert (order["batch"], order["heads"], order["seq"]) == (row["batch"], row["heads"], row["seq"]) == (1, 16, 4096)
    late = []
    for r in rec["rows"]:
        if r["mask"] == "window" and r["seq"] >= 16384:
            t = r["times"]
            ratio = np.median(t["heavy-off"]["fwd"]) / np.median(t["rule"]["fwd"])
            spread = max((max(t[v]["fwd"]) - min(t[v]["fwd"])) / np.median(t[v]["fwd"]) for v in ("heavy-off", "rule"))
            assert abs(ratio - 1) <= spread
            late.append(ratio)
    assert len(late) == 4 and order["late_within"]
    assert (order["late_lo"], order["late_hi"]) == pytest.approx((min(late), max(late)))
    glued, _ = run_glued(cell_source(CH12, "e16e7c60"), quiet=True, np=np, pd=pd)
    assert (glued["wo_batch"], glued["wo_heads"], glued["wo_programs"], glued["wo_late_from"]) == ("1", "16", "512", "16K")
    table = flat(cell_source(CH12, "b98bd1a6"))
    assert "{glue:text}`wo_programs` forward programs, a small grid" in table
    # chapter 10's rung 5 gained most in its large causal grids: no "as in rung 5" for "no change"
    assert "the plain order took {glue:text}`wo_late_lo`–{glue:text}`wo_late_hi` times as long, within the " \
        "repeats' spread. |" in table and "rung 5" not in table


def test_ch12_backward_claim_follows_the_recorded_rows():
    """"Where the lead is smallest: the backward": from 8K on, a plain window's or packed documents'
    backward (fwd+bwd less fwd) took Flex 0.96 to 1.05 times ours; Flex's was faster at 7 of the 9
    shapes, by up to 4%, beyond the spread of the difference (both timings' spreads, in ms, added)
    only for packed documents at 8K and 16K, so "level" is wrong. With the soft cap ours is faster.
    No row of the comparison has flashbook slower beyond the noise."""
    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rows = json.load(open(path / "masks.json"))["rows"]

    def bwd(r):
        return ((r["flex"]["fwd_bwd_ms"] - r["flex"]["fwd_ms"]) / (r["flashbook"]["fwd_bwd_ms"] - r["flashbook"]["fwd_ms"]))

    level = [bwd(r) for r in rows if r["seq"] > 4096 and r["mask"] in ("window", "documents")]
    capped = [bwd(r) for r in rows if r["seq"] > 4096 and "softcap" in r["mask"]]
    assert 0.9 < min(level) < 1 < max(level) < 1.1 and min(capped) > 1.05
    from flashbook.bench import chapter12

    alone = chapter12.backward_alone(rows)
    assert [a["ratio"] for a in alone] == pytest.approx(level)
    for a, r in zip(alone, [r for r in rows if r["seq"] > 4096 and r["mask"] in ("window", "documents")]):
        spreads = [(i["spread"]["fwd_bwd"] * i["fwd_bwd_ms"] + i["spread"]["fwd"] * i["fwd_ms"])
                   / (i["fwd_bwd_ms"] - i["fwd_ms"]) for i in (r["flashbook"], r["flex"])]
        assert a["spread"] == pytest.approx(max(spreads))
    faster = [a for a in alone if a["ratio"] < 1]
    clear = [(a["mask"], a["seq"]) for a in alone if 1 - a["ratio"] > a["spread"]]
    assert (len(faster), len(alone)) == (7, 9) and clear == [("documents", 8192), ("documents", 16384)]
    assert round(100 * max(1 - a["ratio"] for a in alone)) == 4
    from flashbook import plots

    glued, _ = run_glued(_tile_cells() + [cell_source(CH12, "20b191f2"), cell_source(CH12, "588254b7")],
                         quiet=True, rng=np.random.default_rng(12), masks=masks, np=np, pd=pd, plots=plots)
    assert (glued["mb_bwd_flex_faster"], glued["mb_bwd_n"], glued["mb_bwd_gap"], glued["mb_bwd_clear"]) == \
        ("7", "9", "4", "8K and 16K")
    verdicts = chapter12.flex_verdicts([r for r in rows if r["seq"] > 4096])
    assert (glued["mb_rows_long"], glued["mb_fwd_wins_long"], glued["mb_fwd_ties_long"]) == \
        ("21", str(verdicts["fwd"]["win"]), str(verdicts["fwd"]["tie"]))
    assert (glued["mb_both_wins_long"], glued["mb_both_ties_long"]) == \
        (str(verdicts["fwd_bwd"]["win"]), str(verdicts["fwd_bwd"]["tie"]))
    text = flat(markdown(CH12))
    for wrong in ("Where flashbook still loses", "The backward is the slower half", "(the rule is in the box below)",
                  "Seven choices in the library"):
        assert wrong not in text, wrong
    lead = flat(cell_source(CH12, "a5000337"))
    assert lead.startswith("**Where the lead is smallest: the backward.**") and "{glue:text}`mb_bwd_lo`" in lead
    assert "one run without repeats" in lead
    assert "level, within a few per cent" not in lead and "is level with FlexAttention's" not in text
    for name in ("mb_bwd_flex_faster", "mb_bwd_n", "mb_bwd_gap", "mb_bwd_clear"):
        assert "{glue:text}`%s`" % name in lead
    verdict = flat(cell_source(CH12, "448189c1"))
    assert "## Measured against FlexAttention On an H200, from 8K tokens on, flashbook's forward was faster" in verdict
    # whose speed and against what: flashbook, in the forward and with the backward; its backward alone
    # lost beyond the spread for packed documents (the lead paragraph's mb_bwd_clear, same rows)
    assert "It was never slower beyond the noise." not in verdict and "slower beyond the noise in" not in verdict
    assert ("flashbook was never slower beyond the noise, forward or with the backward; its backward alone "
            "was, for packed documents at {glue:text}`mb_bwd_clear` (below).") in verdict
    assert (chapter12.flex_verdicts(rows)["fwd"]["loss"], chapter12.flex_verdicts(rows)["fwd_bwd"]["loss"]) == (0, 0)
    clear = [a for a in chapter12.backward_alone(rows) if 1 - a["ratio"] > a["spread"]]
    assert clear and {a["mask"] for a in clear} == {"documents"}
    assert "(a spread: slowest minus fastest of three repeats, over their median)" in verdict


def test_ch12_quotes_which_kernels_steady_forward_range_with_its_rule():
    """The chapter's from-8K forward range and which_kernel's range differ in their rows; the chapter
    also quotes which_kernel's (rows whose forward repeats agreed within 3%, 4K included), glued from
    the recorded rows with the same rule."""
    from flashbook import plots

    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rows = json.load(open(path / "masks.json"))["rows"]
    calm = [r["flex_over_flashbook_fwd"] for r in rows
            if max(r["flashbook"]["spread"]["fwd"], r["flex"]["spread"]["fwd"]) < 0.03]
    glued, _ = run_glued(_tile_cells() + [cell_source(CH12, "20b191f2"), cell_source(CH12, "588254b7")],
                         quiet=True, rng=np.random.default_rng(12), masks=masks, np=np, pd=pd, plots=plots)
    assert glued["mb_fwd_calm_n"] == str(len(calm))
    assert (glued["mb_fwd_calm_lo"], glued["mb_fwd_calm_hi"]) == (f"{min(calm):.2f}", f"{max(calm):.2f}")
    verdict = flat(cell_source(CH12, "448189c1"))
    # one headline (from 8K on); the other subsets sit in the dropdown of the same cell
    headline, box = verdict.split(":::{dropdown} How the rows were timed and judged (optional)")
    assert ("Flex ÷ ours in the forward, over the {glue:text}`mb_fwd_calm_n` shapes whose forward repeats agreed "
            "within 3%, 4K included: {glue:text}`mb_fwd_calm_lo` to {glue:text}`mb_fwd_calm_hi`.") in box
    assert "{glue:text}`mb_fwd_wins` of {glue:text}`mb_rows`" in box
    for name in ("mb_fwd_calm_n", "mb_fwd_wins`", "mb_both_wins`"):
        assert name not in headline, name


def test_ch12_speed_lessons_are_numbered_and_label_the_table():
    """"What mattered for speed": five numbered lessons; each row of the measurements names its
    lesson, and each measured cell opens with a bold headline before its (glued) detail."""
    box = cell_source(CH12, "b98bd1a6")
    lessons, table = box.split(":::{dropdown} The measurements (optional)\n")
    assert [line[:3] for line in lessons.splitlines() if line[:1].isdigit()] == ["1. ", "2. ", "3. ", "4. ", "5. "]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| lesson", "| ---"))]
    assert table.count("| lesson | change | why it helps | measured |") == 1
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2", "| 3", "| 3", "| 4", "| 5", "| 5"]
    for row in rows:
        measured = row.split(" | ")[3]
        assert measured.startswith("**") and "{glue:text}" in measured, row[:40]
    assert "taken last first" not in box and "The kernel numbers the query tiles in reverse" in box
    # HEAVY_LAST=True is what reverses the order (forward.query_tile_index), named for the order it undoes
    assert "names the natural order it undoes" not in box
    assert "The flag `HEAVY_LAST` turns this on where the heavy tiles would otherwise come last." in box
    import inspect

    from flashbook.kernels import forward
    assert "if CAUSAL or HEAVY_LAST:\n        pid_m = tl.num_programs(0) - 1 - pid_m" in inspect.getsource(
        forward.query_tile_index.fn)


def test_ch12_soft_cap_instructions_are_counted_in_the_compiled_kernel():
    """The soft cap's "three of its operations per score instead of one": in the forward compiled
    for sm_90 here, it adds one MUFU.EX2 and one MUFU.RCP beside each of the softmax's exp2."""
    from flashbook.bench import chapter12

    sass = chapter12.soft_cap_sass()
    require(sass is not None, "this machine cannot compile for sm_90 and disassemble")
    plain, cap, per = sass["plain"], sass["softcap"], sass["scores_per_thread"]
    added = cap["EX2"] - plain["EX2"]
    assert added == cap["RCP"] - plain["RCP"] > 0 and added % per == 0 and plain["EX2"] - added < per
    growth = flat(cell_source(CH12, "c12-window-growth"))
    assert "No profile separates the causes; the likely ones:" in growth
    assert "{glue:text}`sc_cap_ex2` and {glue:text}`sc_cap_rcp`" in growth
    # the unit's time per score against the tensor cores' (4d FLOPs), per clock on one SM: Hopper's
    # 16 special-function results against 4096 dense bf16 FLOPs (no clock enters)
    sfu = chapter12.soft_cap_sfu_share(sass)
    assert (sfu["copies"], sfu["plain_ops"], sfu["cap_ops"]) == (2, 1, 3)
    tensor_clocks = 4 * 128 / 4096
    assert sfu["cap_share"] == pytest.approx(3 / 16 / tensor_clocks) == pytest.approx(3 * sfu["plain_share"])
    assert sfu["plain_share"] < 1 < sfu["cap_share"]
    assert "{glue:text}`sc_cap_share` times the tensor cores' time" in growth and "{glue:text}`sc_plain_share`" in growth


def test_ch12_soft_cap_share_from_counts():
    """``soft_cap_sfu_share`` on the counts the expert cross-compiled (68/4 and 132/68, 32 scores
    a thread): 1 and 3 operations per score, and the per-clock rates give 0.5 and 1.5."""
    from flashbook.bench import chapter12

    sfu = chapter12.soft_cap_sfu_share({"plain": {"EX2": 68, "RCP": 4}, "softcap": {"EX2": 132, "RCP": 68},
                                        "scores_per_thread": 32})
    assert (sfu["copies"], sfu["plain_ops"], sfu["cap_ops"]) == (2, 1, 3)
    assert sfu["plain_share"] == 0.5 and sfu["cap_share"] == 1.5
    # the rates the prose names are the ones used, glued, not typed
    assert (sfu["sfu_per_clock"], sfu["tensor_flop_per_clock"]) == (16, 4096)
    growth = flat(cell_source(CH12, "c12-window-growth"))
    assert "{glue:text}`sfu_per_clock` such results and {glue:text}`tensor_per_clock` bf16" in growth
    assert "16 such" not in growth and "4,096" not in growth


def test_ch12_small_tiles_why_is_the_tile_arithmetic():
    """Lesson 3's reason is counted with ``masks.tile_counts`` at the timed shape (1K window,
    N = 16K): 64 x 64 tiles cover 0.064 of the scores against 0.068, 12% of them masked against
    22%; the time fell by more than the work."""
    from flashbook.bench import chapter12

    tiles = chapter12.forward_tiles()
    require(tiles is not None and tiles["sweep"] is not None, "the forward tile sweep is not recorded")
    glued, _ = run_glued(cell_source(CH12, "e16e7c60"), quiet=True, np=np, pd=pd)
    own = masks.tile_counts(16384, 16384, 64, 64, causal=True, window=(1024, 0))
    big = masks.tile_counts(16384, 16384, 128, 64, causal=True, window=(1024, 0))
    assert (own["partial"], own["visited"], big["partial"], big["visited"]) == (496, 4216, 496, 2232)
    assert (glued["wf_cover_own"], glued["wf_cover_big"]) == ("0.064", "0.068")
    assert (glued["wf_masked_own"], glued["wf_masked_big"], glued["wf_work_cut"]) == ("12", "22", "5.6")
    cut = 100 * (1 - tiles["sweep"]["best_ms"] / tiles["sweep"]["default_ms"])
    assert glued["wf_time_cut"] == f"{cut:.0f}" and cut > 5.6
    table = flat(cell_source(CH12, "b98bd1a6"))
    assert "programs half as tall suit it" not in table
    assert "{glue:text}`wf_masked_own`% of them are masked against {glue:text}`wf_masked_big`%" in table
    # two likely reasons, neither profiled: the masked share, and two programs per SM against one
    # (shared memory from ``smem``, computed, not typed)
    from flashbook import runtime, smem

    h200 = runtime.chip("H200")
    own_b, big_b = (smem.smem_bytes(m, 64, 128, num_stages=3, arch="sm_90") for m in (64, 128))
    assert (glued["wf_smem_own"], glued["wf_smem_big"], glued["wf_smem_sm"]) == \
        (str(own_b // 1024), str(big_b // 1024), str(h200.smem_per_sm_kib)) == ("112", "128", "228")
    assert (glued["wf_per_sm_own"], glued["wf_per_sm_big"]) == ("2", "1")
    assert "the smaller masked share is the likely rest" not in table
    assert "Two likely reasons, not separated by a profile: the smaller masked share, and" in table
    assert "the masked share alone would have to explain more" in table


def test_ch12_soft_cap_is_a_ceiling_checked_against_the_measured_rate():
    """The SFU bound is a ceiling from peak rates: plain causal runs at about half the tensor peak,
    so the two added SFU operations alone would leave about 0.67 of its rate; 0.53 was measured.
    The Triton versions (compile here, timed run) are glued, not typed."""
    import triton

    from flashbook import plots, runtime
    from flashbook.bench import chapter12

    path = bench.run_path("masks")
    require(path is not None, "no recorded masks run")
    rec = json.load(open(path / "masks.json"))
    sass = {"plain": {"EX2": 68, "RCP": 4}, "softcap": {"EX2": 132, "RCP": 68}, "scores_per_thread": 32}
    sfu = chapter12.soft_cap_sfu_share(sass)
    causal = {r["seq"]: r["flashbook"]["fwd_tflops_visited"] for r in rec["rows"] if r["mask"] == "causal"}
    capped = [r for r in rec["rows"] if r["mask"] == "softcap"]
    units = [runtime.chip("H200").bf16_tflops / causal[r["seq"]] for r in capped]
    bound = float(np.median([u / (u + sfu["cap_share"] - sfu["plain_share"]) for u in units]))
    measured = float(np.median([r["flashbook"]["fwd_tflops_visited"] / causal[r["seq"]] for r in capped]))
    assert 1.9 < float(np.median(units)) < 2.2 and 0.64 < bound < 0.70 and measured < bound - 0.1
    source = cell_source(CH12, "2b96b818")
    assert 'g("sc_triton", triton.__version__)' in source and 'masks_rec["provenance"]["triton"]' in source
    growth = flat(cell_source(CH12, "c12-window-growth"))
    assert "would set the pace" not in growth and "would set the ceiling" in growth
    assert "Triton {glue:text}`sc_triton` (the timed run used {glue:text}`mb_triton`)" in growth
    for name in ("sc_plain_units", "sc_bound", "tf_cap"):
        assert "{glue:text}`%s`" % name in growth
    # the rest: the arithmetic around the special-function operations, not "both branches" as such
    assert ("The arithmetic around those operations likely takes the rest: the Taylor series' multiply-adds, "
            "the closed form's adds and the select") in growth and "the unit may not reach its peak rate" in growth
    assert "computes both branches for every score" not in growth
    assert rec["provenance"]["triton"] != "" and triton.__version__
