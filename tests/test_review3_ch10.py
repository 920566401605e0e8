"""Review round 3, chapter 10: the statements corrected after the review stay corrected, and
the numbers behind them come from the recorded runs (read here on a CPU, nothing timed)."""
import json

import pytest

from notebook_text import cell_ids, flat, markdown, notebook, run_glued, sources_by_id

CH10 = "10_making_it_fast.ipynb"


@pytest.fixture(scope="module")
def ch():
    from flashbook.bench import chapter10
    return chapter10.build()


@pytest.fixture(scope="module")
def text():
    return flat(markdown(notebook(CH10)))


def test_the_summary_gives_the_goals_range_for_the_goals_shapes_only(ch, text):
    """0.80-0.87 (forward) holds at d = 128 and N >= 4K, the goals' shapes; at 1K and 2K the
    forward falls lower, so the summary names the lengths too."""
    from flashbook.bench.readback import PERFORMANCE_TARGETS

    goals = [t for t in PERFORMANCE_TARGETS if t.kind == "goal"]
    assert all(t.head_dims == (128,) and t.min_seq == 4096 for t in goals)
    table = ch.tables["goals"].reset_index()
    assert table["seq"].min() == 4096
    fwd = table[table["target"].str.startswith("forward")]["ratio"]
    assert ch.values["goal_fwd_lo"] == f"{fwd.min():.2f}" and ch.values["goal_fwd_hi"] == f"{fwd.max():.2f}"
    # at the shorter lengths the forward is further from cuDNN than the summary's range
    df = ch.frames["results"]
    ok = df[(df["status"] == "ok") & (df["head_dim"] == 128) & (df["seq"] < 4096)]
    ours = ok[ok["impl"] == "flashbook"].set_index(["batch", "heads", "seq", "causal"])["fwd_tflops"]
    cudnn = ok[ok["impl"] == "sdpa-cudnn"].set_index(["batch", "heads", "seq", "causal"])["fwd_tflops"]
    assert (ours / cudnn).min() < fwd.min()
    summary = flat(sources_by_id(notebook(CH10))["next-rungs"])
    assert "its backward at $d$ = 128 and $N \\geq$ 4K." in summary
    assert "its backward at $d$ = 128. Its forward" not in summary


def test_the_ragged_lengths_range_says_where_auto_takes_gluon(ch, text):
    """1.07-1.27 holds only where auto takes Gluon; at the two other ragged shapes Gluon was
    slower than chapter 7's kernel, and the prose says so with their numbers."""
    from flashbook.bench.runs import load_recorded_json
    from flashbook.kernels import hopper_choices

    rows = [r for r in load_recorded_json("gluon_lengths")["rows"] if r["ragged"]]
    left = [r["gluon_over_triton"] for r in rows
            if hopper_choices.slower_than_triton(r["head_dim"], r["seq"], r["seq"], r["causal"])]
    taken = [r["gluon_over_triton"] for r in rows
             if not hopper_choices.slower_than_triton(r["head_dim"], r["seq"], r["seq"], r["causal"])]
    assert left and max(left) < 1 <= min(taken)
    v = ch.values
    assert (v["len_left_lo"], v["len_left_hi"]) == (f"{min(left):.2f}", f"{max(left):.2f}")
    assert (v["len_taken_lo"], v["len_taken_hi"]) == (f"{min(taken):.2f}", f"{max(taken):.2f}")
    assert ("times the Triton forward's speed where `\"auto\"` takes it ({glue:text}`len_left_lo` to "
            "{glue:text}`len_left_hi` where it does not)") in text
    assert "times the Triton forward's speed. On a Hopper" not in text


def test_the_instruction_count_includes_the_rescale_and_bounds_with_it(ch, text):
    """The loop also rescales O each tile (B_r x d multiplies, d / B_c per score, in every rung):
    the bounds now come from the compiled loops, which issue the rescale with everything else,
    and every measured gain is below them."""
    from flashbook.bench import chapter10, score_ops

    loops, _ = score_ops.load_loops()
    # the compiled loops hold the rescale: at d = 128 a rung issues more per score than at d = 64
    for rung in (0, 1, 2):
        for causal in (False, True):
            assert loops.loc[(rung, 128, causal, "masked"), "per_score"] > loops.loc[(rung, 64, causal, "masked"), "per_score"]
    exp2 = ch.tables["exp2_gains"]
    assert (exp2["x previous"] < exp2["bound from the count"]).all()
    split = ch.tables["split_prediction"]
    for r in ch.rung_gains("unmasked main loop").itertuples():
        assert r.vs_prev < split.loc[(r.head_dim, r.seq, r.causal), "bound x (issue slots)"]
    assert ch.values["split_below"] == "smaller than the bound at every shape"
    assert "elementwise work, most of it on the $B_r \\times B_c$ scores" in text and "nearly all of it" not in text
    assert "everything else in the loop is elementwise work on the" not in text
    assert "it also rescales $O$ ($B_r \\times d$ multiplies per tile, $d/B_c$ per score)" in text
    for name in ("exp2_bound_rescale_lo", "split_bound_rescale_hi", "exp2_rescale_below", "split_rescale_below"):
        assert "{glue:text}`" + name + "`" not in text, name      # no bound "with the rescale" on top
    assert chapter10._compiled(ch, 3, 128, False, "main") < chapter10._compiled(ch, 2, 128, False)


def test_the_formula_for_the_share_states_its_model(text):
    assert "nothing overlaps it, removing a share $f$ of them gives $g = 1/(1 - sf)$, so $s = (1 - 1/g)/f$" in text


def test_rung_3_does_not_say_it_helps_full_attention_as_much_as_causal(ch, text):
    """At d = 64 the causal gain (1.22-1.23) is clearly larger than the full one (1.14)."""
    gains = ch.rung_gains("unmasked main loop")
    d64 = gains[gains["head_dim"] == 64]
    assert d64[d64["causal"]]["vs_prev"].min() > d64[~d64["causal"]]["vs_prev"].max() * (1 + ch.noise / 2)
    assert "as much as causal" not in text
    assert "It helps full attention too, since before it every tile paid for the mask." in text


def test_the_graph_outlier_is_said_the_right_way_round(ch):
    """The graph took 1.508 ms against the timed call's 1.283: the call took 15% less time, the
    graph 17.5% more; "15% slower" was the wrong way round."""
    from flashbook import bench

    _, timed = bench.host_overhead_tables()
    long = timed[timed["seq"] == 16384]
    worst = long.loc[(long["inflation"] - 1).abs().idxmax()]
    assert worst["graph_ms"] > worst["timer_ms"]
    assert ch.values["host_long"] == f"{100 * (1 - worst['timer_ms'] / worst['graph_ms']):.0f}"
    assert 100 * (worst["graph_ms"] / worst["timer_ms"] - 1) > float(ch.values["host_long"]) + 1
    sol = flat(sources_by_id(notebook(CH10))["70e55642"])
    assert "the timed call took {glue:text}`host_long`% less time than one replay" in sol
    assert "% slower than the timed call" not in sol
    assert "tutorial's kernel (the lab notes' \"peer\")" in sol


def test_the_roofline_reading_is_chapter_9s(text):
    assert "compute-bound" not in text and "sit right of the ridge" in text


def test_the_free_wgmma_paragraph_draws_its_conclusion_from_the_data(ch, text):
    """Without a mask rung 0 is about level with SDPA's flash backend (the two come from two runs,
    so "beats" would claim more than the noise between runs allows); with the causal mask rung 2
    is the first rung that passes it by more than that noise."""
    from flashbook.bench.chapter10_ladder import _baseline

    fsteps, df = ch.frames["fsteps"], ch.frames["results"]
    level = []
    for _, r in fsteps.iterrows():
        flash = _baseline(df, "sdpa-flash", r)
        assert flash is not None
        ratio = r["tflops"] / flash
        if not r["causal"] and r["rung"] == 0:
            level.append(ratio)
            assert 1 - ch.noise_runs <= ratio < 1 + 2 * ch.noise_runs, (r["head_dim"], r["seq"])
        elif r["causal"] and r["rung"] in (0, 1):
            assert ratio < 1
        elif r["causal"] and r["rung"] == 2:
            assert ratio > 1 + ch.noise_runs
    assert level and any(abs(x - 1) <= ch.noise_runs for x in level)     # some within the noise: "matches"
    assert max(level) > 1 + ch.noise_runs and min(level) >= 1            # one beyond it: "or beats"
    assert "even rung 0 beats" not in text
    assert ("Without a mask, rung 0 already matches or beats SDPA's flash backend (figure below); with the "
            "causal mask, rung 2 is the first rung to pass it by more than the noise.") in text


def test_the_preference_list_is_read_as_the_library_reads_it(text):
    """The first sm_90 forward entry serves the sliding window only; full and causal attention
    get the first entry that fits, 128 x 64 with 8 warps and 3 stages."""
    from flashbook.kernels import configs

    first = configs._PREFERRED["sm_90"]["forward"][0]
    assert first[2:] == ("window",)
    for d in (64, 128):
        for causal in (False, True):
            chosen = configs.default("forward", cc=90, block_d=configs.block_d(d), elem_bytes=2, causal=causal)
            assert chosen == configs._PREFERRED["sm_90"]["forward"][1][1] != first[1]
    assert "the first entry of a short preference list that fits in its shared memory" not in text
    assert ("An entry is (largest head_dim, `Config(B_r, B_c, warps, stages)`[, the one mask it serves]); "
            "the first serves only chapter 12's sliding window.") in text


def test_the_host_check_names_the_call_it_measured(ch, text):
    """1.2% is chapter 7's forward called directly; through autograd the shortest shape showed
    the host (exercise 5), which the prose now says."""
    from flashbook import bench

    _, timed = bench.host_overhead_tables()
    direct = timed[timed["impl"] == "flashbook forward"]
    assert ch.values["host_lib_agree"] == f"{100 * (direct['inflation'] - 1).abs().max():.1f}"
    auto = timed[(timed["impl"] == "flashbook (autograd)") & (timed["seq"] == 1024) & (timed["head_dim"] == 64)
                 & timed["causal"]]
    assert float(auto["inflation"].iloc[0]) > 1 + ch.noise
    assert "chapter 7's forward called directly agreed within {glue:text}`host_lib_agree`%; through autograd, at the shortest shape, it did not" in text


def test_the_notes_sit_under_the_tables_they_explain():
    """The live note right below the timing table it explains; the exactness paragraph below
    the exactness table."""
    nb = notebook(CH10)
    ids, text = cell_ids(nb), sources_by_id(nb)
    at = ids.index("6041c7eb")
    assert ids[at + 1:at + 5] == ["c10-live-note", "26110378", "38a7f663", "c10-exact-md"]
    assert text["26110378"].strip() == "{glue:text}`live_note`"
    assert "Every rung computes the same attention" in text["c10-exact-md"]
    assert "live_note" not in text["c10-exact-md"]


def test_the_cudnn_exceptions_say_what_the_figure_shows(text):
    assert "compare two runs (the lines come from the full comparison)" not in text
    assert "it stands above cuDNN's line, but the two come from different runs" in text


def test_small_wordings(ch, text):
    v = ch.values
    # the noise ranges read as one range per sample
    assert "differed by up to {glue:text}`noop_lo` to" not in text
    spread = ch.tables["noise_samples"].loc[("within one run", "no-op rungs (ladder)"), "in each recorded run (%)"]
    assert spread == f"{v['noop_lo']} to {v['noop_hi']} ({v['n_ladders']} runs)"
    # rung 2 met its prediction at 16K (d = 64: slightly above it): the shortfall names its shapes,
    # and the range shows the one above 100% (not rounded down to "100")
    assert "short of it by {glue:text}`skip_short`" in text
    assert "short of it by more than the noise at" not in text      # 3.8% is a hint, not beyond noise
    assert "already counts the diagonal tiles whole, so they do not explain it" in " ".join(text.split())
    assert float(ch.tables["skip_gains"]["measured / predicted"].max()) > 1
    assert float(v["skip_of_pred_hi"]) > 100
    # each shortfall with its size and its tier of the noise rule, in the noise's convention (predicted
    # over measured, minus one): 7.9% is beyond 5.3%, 4.0% only a hint
    assert v["skip_short"] == "7.9% at d = 128, N = 4K (beyond the noise) and 4.0% at d = 64, N = 4K (a hint)"
    assert "By the noise's measure (predicted over measured, minus one), the gain fell short of it by" in text
    # the Gluon kernel's waits, joined for prose
    assert '" or ".join(map(str, glu["wgmma_waits"]' in sources_by_id(notebook(CH10))["c10-ptx-waits"]
    assert "once $N$ reaches {glue:text}`wide_from_full` without a mask, or {glue:text}`wide_from_causal` with the causal mask" in text
    assert "`HEAVY_LAST` serves chapter 12's sliding windows" in text
    assert "tile 0 of each, then tile 1 of each" in text and "`launch_position`'s `HEAD_GROUP`" in text
    assert "the ranges cover float16 too" not in text           # the ranges are the table's bfloat16 runs
    assert "{glue:text}`producer_bf16_lo`" in text and "{glue:text}`pp_bf16_hi`" in text
    assert "(here `fsteps`, with columns `name`, `head_dim`, `seq`, `causal` and `vs_prev`" in text
    # the tables label their numbers
    assert list(ch.tables["split_prediction"].index.names) == ["d", "N", "causal"]
    assert all("TFLOP/s (#" in cell for col in ("first kernel's", "library's") for cell in ch.tables["sweep"][col])
    assert v["first_rank"] == "#4 at d = 64 and #6 at d = 128"       # the ranks still read from those cells


def test_the_hbm_bandwidth_is_the_one_the_bytes_table_used(ch, text):
    dq = ch.tables["dq_bytes"]
    rate = dq["atomic GB moved"] / dq["that at HBM speed, ms"]        # GB per ms = TB/s
    assert float(ch.values["hbm_tb_s"]) == pytest.approx(float(rate.median()), rel=0.02)
    # round 13: the page no longer quotes an HBM time for the atomics (no bound: they resolve in L2)
    assert "cross HBM at full bandwidth" not in text and "{glue:text}`hbm_tb_s`" not in text


def live_note_names():
    """What the chapter's cells before the note define that it reads."""
    import math

    import pandas as pd

    from flashbook.bench import chapter10
    from flashbook.kernels.ladder import RUNGS

    ch = chapter10.build()
    return dict(CPU=True, ch=ch, fsteps=ch.frames["fsteps"], pd=pd, math=math, RUNGS=RUNGS)


def test_the_live_note_compares_the_recorded_steps_with_the_ladder():
    """The recorded live table times the ladder's shape; the note's range of step differences is
    the recorded steps minus the ladder's, computed here from the recording's text and ladder.csv."""
    import re

    from flashbook.bench.runs import recorded_output

    names = live_note_names()
    glued, _ = run_glued(sources_by_id(notebook(CH10))["c10-live-note"], **names)
    note = glued["live_note"]
    table = recorded_output("10_making_it_fast", "6041c7eb", displays=True).strip().splitlines()
    assert "B=8, H=16, N=4096, d=128" in table[0] and f"recorded run ({table[0]}) at the ladder's shape" in note
    live = [float(line.split()[-1]) for line in table if re.search(r"\d (exp2|skip|unmasked|tuned|heaviest)", line)]
    f = names["fsteps"]
    at = f[(f["batch"] == 8) & (f["heads"] == 16) & (f["seq"] == 4096) & (f["head_dim"] == 128)]
    want = [x for x in at.sort_values(["causal", "rung"])["vs_prev"] if x == x]
    assert len(live) == len(want) == 10
    gaps = [a - b for a, b in zip(live, want)]
    assert f"by {min(gaps):+.2f} to {max(gaps):+.2f}" in note
    assert f"x{live[0]:.2f} here, x{want[0]:.2f} in the ladder" in note
    assert "the ladder ran on NVIDIA H200" in note and '"x previous"' in note


def test_the_gpu_cells_match_their_recordings():
    """The prose moved around the two recorded GPU cells; their sources did not change."""
    import hashlib
    import os

    from conftest import ROOT

    path = os.path.join(ROOT, "benchmarks", "results", "gpu_outputs", "10_making_it_fast.json")
    recorded = json.load(open(path, encoding="utf-8"))
    by_id = {c["id"]: c for c in recorded["cells"]}
    text = sources_by_id(notebook(CH10))
    for cell_id in ("6041c7eb", "407b1adc"):
        digest = hashlib.sha256(text[cell_id].encode("utf-8")).hexdigest()
        assert by_id[cell_id]["source_sha256"] == digest, cell_id
