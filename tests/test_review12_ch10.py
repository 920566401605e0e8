"""Review rounds 12 and 13, chapter 10. Round 12: the profile's instruction counts, Triton's own
Hopper options (appendix A3's run), the ladder and the full comparison timed one way apart with
different timer settings, the atomic dK/dV kernel's spills and rung 2's longer loop from compiled
counts, and the PTX table read from a Triton 3.6.0 recording. Round 13 (at the end): the tensor
pipe's busy share as the run time restated and the bound on what the extra instructions explain,
the Gluon sweep's own tile-width control, the atomic mode's cost with 64 x 128 tiles against the
spill bytes, the bytes argument from the same adds in both orderings, ping-pong's loss beyond
noise, and the profile's caption and L2 hit rate. Every number is recomputed here from the
recorded files, apart from ``flashbook.bench.chapter10_why``."""
import csv
import json
import os
import re
import subprocess

import pytest

from conftest import RESULTS, ROOT, require
from notebook_text import cell_source, flat, notebook

CH10 = "10_making_it_fast.ipynb"
NCU = os.path.join(RESULTS, "kernel_ncu_h200")
COMPILED = os.path.join(RESULTS, "compiled_sm90_t36")


@pytest.fixture(scope="module")
def ch(recorded_chapter10):
    return recorded_chapter10


def _prose(cell_id: str) -> str:
    return flat(cell_source(notebook(CH10), cell_id))


def _index() -> dict:
    return json.load(open(os.path.join(RESULTS, "index.json")))["runs"]


def _ncu_forwards(causal: bool = False, full: bool = False) -> dict:
    """impl -> (warp instructions, wgmma instructions, active cycles, SMs, scores) of each d = 128
    forward in kernel_ncu_h200, read with the csv module and steps.json alone (``full``: impl ->
    (its raw.csv row, the cell parser))."""
    rows = list(csv.reader(open(os.path.join(NCU, "raw.csv"))))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    head, kernels = rows[start], [dict(zip(rows[start], r)) for r in rows[start + 2:]]
    num = lambda x: float(x.replace(",", ""))                     # noqa: E731
    steps = json.load(open(os.path.join(NCU, "steps.json")))["steps"]
    assert "smsp__inst_executed.sum" in head
    out, i = {}, 0
    for step in steps:
        ks = kernels[i:i + step["kernels"]]
        i += step["kernels"]
        if (step["pass_"] == "forward" and step["dim"] == 128 and step["causal"] == causal
                and "mask" not in step and "config_dkdv" not in step):
            (k,) = ks
            scores = step["batch"] * step["heads"] * step["seq"] ** 2 / (2 if causal else 1)
            out[step["impl"]] = (num(k["smsp__inst_executed.sum"]), num(k["sm__inst_executed_pipe_tensor_op_gmma.sum"]),
                                 num(k["sm__cycles_active.avg"]), num(k["device__attribute_multiprocessor_count"]), scores)
            if full:
                out[step["impl"]] = (k, num)
    assert i == len(kernels)
    return out


# --- item 1: instructions, the second measured cause -------------------------------------------

def test_the_profile_shows_the_instructions_each_forward_issues(ch):
    f = _ncu_forwards()
    per32 = {impl: 32 * inst / scores for impl, (inst, _, _, _, scores) in f.items()}
    table = ch.tables["profile"]
    names = {"triton": "chapters 7-8 (Triton)", "gluon": "Gluon forward", "sdpa-cudnn": "SDPA cuDNN",
             "sdpa-flash": "SDPA flash (FlashAttention-2)"}
    for impl, kernel in names.items():
        assert table.loc[kernel, "warp instructions per 32 scores"] == pytest.approx(per32[impl], abs=0.051)
        assert table.loc[kernel, "wgmma executed (M)"] == pytest.approx(f[impl][1] / 1e6, abs=0.051)
    # 11.3, 9.3 and 7.5 per 32 scores; 25.2 M wgmma for ours, 16.8 M for cuDNN's and Gluon's
    v = ch.values
    assert (v["ncu_inst_ours"], v["ncu_inst_cudnn"], v["ncu_inst_gluon"]) == ("11.3", "9.3", "7.5")
    assert v["ncu_inst_more"] == f"{100 * (per32['triton'] / per32['sdpa-cudnn'] - 1):.0f}" == "22"
    assert v["ncu_gluon_fewer"] == f"{100 * (1 - per32['gluon'] / per32['triton']):.0f}" == "34"
    assert f["gluon"][1] == f["sdpa-cudnn"][1]                      # the same wgmma count
    assert v["ncu_wgmma_ratio"] == f"{f['triton'][1] / f['sdpa-cudnn'][1]:.1f}" == "1.5"
    # under the causal mask the order is the same (12.5, 9.7, 8.3)
    fc = _ncu_forwards(causal=True)
    c32 = {impl: 32 * inst / scores for impl, (inst, _, _, _, scores) in fc.items()}
    assert c32["triton"] > c32["sdpa-cudnn"] > c32["gluon"]


def test_the_wgmma_ratio_is_the_tile_widths():
    """Per warpgroup of 64 query rows and B_c keys a forward issues d/16 wgmma for S (each B_c
    wide) and B_c/16 for PV: per key, d/(16 B_c) + 1/16. With d = 128: 64-key tiles (ours)
    against 128-key tiles (Gluon's) is 1.5, the profile's ratio, and each count is the tile pairs
    times the instructions a pair takes, counted per warp (4 a warpgroup instruction)."""
    from flashbook.kernels import configs, hopper

    f = _ncu_forwards()
    per_key = lambda d, bc: d / (16 * bc) + 1 / 16                          # noqa: E731
    ours = configs.default("forward", cc=90, block_d=128, elem_bytes=2)
    g_m, g_n, _, _ = hopper.default_config(128, 4096, False)
    assert (ours.block_n, g_n) == (64, 128)
    assert f["triton"][1] / f["gluon"][1] == pytest.approx(per_key(128, ours.block_n) / per_key(128, g_n))
    b, h, n = 8, 16, 4096
    for impl, (bm, bn) in (("triton", (ours.block_m, ours.block_n)), ("gluon", (g_m, g_n))):
        pairs = b * h * (n // bm) * (n // bn)
        per_pair = (bm // 64) * (128 // 16 + bn // 16) * 4          # warpgroups x instructions x warps
        assert f[impl][1] == pairs * per_pair


def test_the_prose_names_the_instructions_and_the_wgmma():
    said = _prose("c10-profile-md")
    for name in ("ncu_inst_more", "ncu_wgmma_ratio"):
        assert "{glue:text}`" + name + "`" in said, name
    assert "its 64-key tiles make each `wgmma` of $S = QK^\\top$ 64 keys wide" in said
    summary = _prose("next-rungs")
    assert "a producer warp ({glue:text}`ws_same_lo` to" in summary and "and 128 × 128 tiles ({glue:text}`gl_width`)" in summary
    # round 13: the 34% is the profiled shape's count, beside the sweep's own control
    assert ("the profiled Gluon forward, producer warp and 128-key tiles together, issued "
            "{glue:text}`ncu_gluon_fewer`% fewer instructions than ours") in _prose("d400881c")


def test_the_profile_moved_out_of_the_lab_module():
    from flashbook.bench import chapter10_lab, chapter10_why

    assert not hasattr(chapter10_lab, "_profile") and callable(chapter10_why.profile)
    for name in ("chapter10.py", "chapter10_beyond.py", "chapter10_lab.py", "chapter10_why.py", "score_ops.py",
                 "profiles.py"):
        assert sum(1 for _ in open(os.path.join(ROOT, "flashbook", "bench", name))) < 600, name


# --- item 2: Triton's own Hopper options, from appendix A3's run -------------------------------

def test_the_section_cites_tritons_own_hopper_options(ch):
    said = _prose("c10-profile-md")
    assert ("Triton offers two of these itself, tensor descriptors (TMA) and automatic warp specialisation "
            "(`tl.range(..., warp_specialize=True)`)") in said
    for name in ("hopper_lo", "hopper_hi", "ws_failed", "ws_tried"):
        assert "{glue:text}`" + name + "`" in said, name
    assert "appendix {doc}`A3 <A3_lab_notes>`" in said
    # the values appendix A3 glues, recomputed from hopper_fwd_h200.json
    rows = json.load(open(os.path.join(RESULTS, _index()["hopper_fwd"]["path"])))
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert (ch.values["ws_failed"], ch.values["ws_tried"]) == ("12", "72")
    assert (ch.values["hopper_lo"], ch.values["hopper_hi"]) == ("0.98", "1.03")
    assert rows                                                      # the run is recorded
    a3 = flat(cell_source(notebook("A3_lab_notes.ipynb"), "a3-hopper-verdict"))
    assert "{glue:text}`ws_failed` of the {glue:text}`ws_tried` variants" in a3


# --- item 3: two runs, one kernel, different timers --------------------------------------------

def _csv(path):
    return list(csv.DictReader(open(path)))


def _two_runs():
    from flashbook import bench

    ladder = _csv(bench.latest_ladder(RESULTS))
    full = _csv(bench.latest_results(RESULTS))
    key = lambda r: (r["batch"], r["heads"], r["seq"], r["head_dim"], r["causal"])   # noqa: E731
    out = {}
    for name, impl in (("dQ separate", "flashbook"), ("dQ atomic", "flashbook-atomic")):
        there = {key(r): float(r["bwd_ms"]) for r in full if r["impl"] == impl}
        out[name] = {key(r): (float(r["ms"]), there[key(r)]) for r in ladder if r["pass_"] == "bwd" and r["name"] == name}
    return out


def test_the_backward_moved_one_way_between_the_two_runs(ch):
    runs = _two_runs()
    sep = runs["dQ separate"]
    short = [b / a for (_, _, seq, _, _), (a, b) in sep.items() if seq == "4096"]
    long = [b / a for (_, _, seq, _, _), (a, b) in sep.items() if seq != "4096"]
    assert len(short) == len(long) == 4 and min(short) > 1            # slower at every 4K shape
    v = ch.values
    assert v["xrun_bwd"] == f"{100 * (min(short) - 1):.1f} to {100 * (max(short) - 1):.1f}% slower" == "5.2 to 11.5% slower"
    assert v["xrun_bwd_long"] == f"{100 * max(max(x, 1 / x) - 1 for x in long):.1f}" == "1.0"
    acq = [max(b / a, a / b) - 1 for a, b in runs["dQ atomic"].values()]
    assert v["xrun_acq"] == f"{100 * max(acq):.1f}" and max(acq) < 0.005
    # the forward's last rung: slower in the full comparison at every shape
    assert re.fullmatch(r"[\d.]+ to [\d.]+% slower than", v["xrun_slower"])
    table = ch.tables["noise_samples"]
    row = table.loc[("in two runs", "separate backward: ladder and full comparison")]
    every = [max(b / a, a / b) - 1 for a, b in sep.values()]
    assert row["largest gap here (%)"] == f"{100 * max(every):.1f}" == "11.5" and int(row["pairs"]) == 8


def test_the_full_comparisons_own_ratio_lies_inside_the_experiments_range(ch):
    runs = _two_runs()
    top = max(runs["dQ atomic"], key=lambda k: runs["dQ atomic"][k][0] / runs["dQ separate"][k][0])
    sep, acq = runs["dQ separate"][top][1], runs["dQ atomic"][top][1]
    v = ch.values
    assert (v["dq_full_separate_ms"], v["dq_full_ratio"]) == (f"{sep:.2f}", f"{acq / sep:.2f}") == ("6.61", "6.79")
    assert float(v["at10_fence_lo"]) <= acq / sep <= float(v["at10_fence_hi"]) and v["dq_full_within"] == "inside"


def test_the_timer_settings_and_commits_are_named(ch):
    from flashbook import bench

    provs = [json.load(open(os.path.join(os.path.dirname(p), "provenance.json")))
             for p in (bench.latest_ladder(RESULTS), bench.latest_results(RESULTS))]
    (lw, lr), (fw, fr) = ((p["timing"]["warmup_ms"], p["timing"]["rep_ms"]) for p in provs)
    assert (lw, lr, fw, fr) == (10.0, 30.0, 25.0, 100.0)
    assert "--rep-ms 30 --warmup-ms 10" in provs[0]["command"]
    v = ch.values
    assert (v["timer_ladder"], v["timer_full"]) == ("30 ms after 10 ms", "100 ms after 25 ms")
    said = _prose("a9a89247")
    assert ("the ladder timed calls for {glue:text}`timer_ladder` of warm-up, the full comparison "
            "{glue:text}`timer_full`") in said
    assert "{glue:text}`xrun_bwd`" in said and "The last two rows, one kernel in two runs" in said
    prov = ch.tables["provenance"]
    assert list(prov.loc["commit", ["ladder.csv", "results.csv"]]) == ["5ab6d81", "699732e"]
    assert list(prov.loc["timer (ms): calls, warm-up", ["ladder.csv", "results.csv"]]) == ["30, 10", "100, 25"]


def test_the_two_commits_run_the_same_kernels():
    """"The two runs timed the same kernels": between the full comparison's commit and the
    ladder's, the library changed only how the ladder builds its lower rungs (kernels/ladder.py;
    the last rung is _attn_fwd itself) and the command line's exit status (bench/cli.py)."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "diff", "--name-only", "699732e", "5ab6d81", "--", "flashbook"],
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return require(False, "no git history with both commits")
    assert sorted(out) == ["flashbook/bench/cli.py", "flashbook/kernels/ladder.py"]


# --- item 4: the atomic dK/dV kernel's spills, compiled -----------------------------------------

def _dkdv():
    """The recording and its default-tile rows by (head_dim, causal, atomic_dq); the ``--extra``
    rows (round 13) by (head_dim, causal, atomic_dq, config)."""
    rec = json.load(open(os.path.join(RESULTS, _index()["dkdv_registers"]["path"])))
    return rec, {(r["head_dim"], r["causal"], r["atomic_dq"]) + (() if r.get("default_tiles", True) else (tuple(r["config"]),)): r
                 for r in rec["kernels"]}


def test_the_dkdv_recording_is_triton_360_and_matches_the_h200_profile():
    rec, rows = _dkdv()
    assert rec["triton"] == "3.6.0" and rec["target"] == "sm_90" and len(rows) == len(rec["kernels"]) == 10
    assert sum(1 for r in rec["kernels"] if r["default_tiles"]) == 8
    assert not re.search(r"/(tmp|work|root)\b", rec["command"]) and "--source SRC" in rec["command"]
    readme = open(os.path.join(COMPILED, "README.md")).read()
    assert "git archive 310aa22" in readme and not re.search(r"/(tmp|work|root)/", readme)
    # the separate mode's registers, as Nsight Compute read them on the H200 (c3d4dfb's kernel)
    steps = json.load(open(os.path.join(NCU, "steps.json")))["steps"]
    rows_csv = list(csv.reader(open(os.path.join(NCU, "raw.csv"))))
    start = next(i for i, r in enumerate(rows_csv) if r and r[0] == "ID")
    kernels = [dict(zip(rows_csv[start], r)) for r in rows_csv[start + 2:]]
    i, seen = 0, 0
    for step in steps:
        ks = kernels[i:i + step["kernels"]]
        i += step["kernels"]
        if step["impl"] == "triton" and step["pass_"] == "backward":
            (k,) = [k for k in ks if k["Kernel Name"] == "_bwd_dkdv"]
            assert int(float(k["launch__registers_per_thread"])) == rows[(step["dim"], step["causal"], False)]["n_regs"]
            seen += 1
    assert seen == 4
    # this checkout's kernels compile to the same counts
    here = json.load(open(os.path.join(COMPILED, "dkdv_registers_this_checkout.json")))["kernels"]
    assert [{k: r[k] for k in r if k != "shared_bytes"} for r in here] == \
        [{k: r[k] for k in r if k != "shared_bytes"} for r in rec["kernels"]]


def test_the_atomic_mode_spills_at_d_128_only(ch):
    _, rows = _dkdv()
    for causal in (False, True):
        assert rows[(128, causal, True)]["spill_store_bytes"] > 2 * rows[(128, causal, False)]["spill_store_bytes"] > 0
        assert rows[(64, causal, True)]["spill_store_bytes"] == rows[(64, causal, False)]["spill_store_bytes"] == 0
    v = ch.values
    assert (v["dkdv_spill_atomic"], v["dkdv_spill_separate"], v["dkdv_spills_64"]) == ("444", "44", "neither spills")
    said = _prose("c10-dq-lesson-md")
    assert "and, at $d$ = 128, more {term}`register spilling <register spill>`. Nothing here separates them." in said
    assert ("holds {glue:text}`dkdv_spill_atomic` bytes of spill stores a thread with 64 × 64 tiles (the separate one "
            "{glue:text}`dkdv_spill_separate`; at $d$ = 64 {glue:text}`dkdv_spills_64`)") in said


# --- item 5: rung 2's loop grew at d = 128 with the mask ---------------------------------------

def test_rung_2s_loop_grew_only_at_d_128_with_the_mask(ch):
    loops = json.load(open(os.path.join(RESULTS, _index()["loop_sass"]["path"])))["loops"]
    at = {(r["rung"], r["head_dim"], r["causal"]): r for r in loops if r["stage"] == "masked"}
    grew = {(d, c): at[(2, d, c)]["instructions"] - at[(1, d, c)]["instructions"] for d in (64, 128) for c in (False, True)}
    assert grew == {(64, False): 0, (64, True): 0, (128, False): 0, (128, True): 22}
    r1, r2 = at[(1, 128, True)]["per_score"], at[(2, 128, True)]["per_score"]
    v = ch.values
    assert (v["skip_loop_before"], v["skip_loop_after"]) == (f"{r1:.2f}", f"{r2:.2f}") == ("16.47", "17.16")
    assert v["skip_loop_grew"] == f"{100 * (r2 / r1 - 1):.1f}" == "4.2"
    assert v["skip_loop_where"] == "at d = 128 with the mask"
    assert ("It also leaves out that rung 2's compiled loop issues {glue:text}`skip_loop_grew`% more per score "
            "than rung 1's {glue:text}`skip_loop_where`") in _prose("6f4b8582")


# --- item 6: the PTX table, recorded with Triton 3.6.0 -----------------------------------------

def test_the_ptx_table_is_read_from_the_triton_360_recording():
    from flashbook import bench
    from flashbook.bench import chapter10_why

    rec = json.load(open(os.path.join(RESULTS, _index()["ptx_compare"]["path"])))
    timed = json.load(open(os.path.join(os.path.dirname(bench.latest_ladder(RESULTS)), "provenance.json")))["triton"]
    assert rec["triton"] == timed == "3.6.0"
    tri, glu = rec["compiled"]
    assert (tri["tensor_core_ops"], tri["wgmma_waits"], tri["tma_copies"]) == (24, [0], 0)
    assert (glu["tensor_core_ops"], glu["wgmma_waits"], glu["tma_copies"]) == (64, [0, 1], 10)
    table, (t, g) = chapter10_why.ptx_recorded(RESULTS)
    assert table.index.name == "PTX for sm_90, Triton 3.6.0" and (t, g) == (tri, glu)
    code = cell_source(notebook(CH10), "c10-ptx-waits")
    assert "chapter10_why.ptx_recorded()" in code and "ptx_compare()\n" not in code


# ================================================================= round 13

# --- item 1: the busy share is the run time restated; what the extra instructions can explain ---

TENSOR_BUSY = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"


def test_r13_the_wgmma_forwards_keep_the_tensor_pipe_busy_the_same_cycles(ch):
    v = ch.values
    for causal in (False, True):
        f = _ncu_forwards(causal=causal, full=True)
        busy = {impl: num(k[TENSOR_BUSY]) / 100 * num(k["sm__cycles_active.avg"]) for impl, (k, num) in f.items()}
        wgmma = [busy[i] for i in ("triton", "sdpa-cudnn", "gluon")]
        assert max(wgmma) / min(wgmma) < 1.001                       # the same busy cycles, within 0.1%
        assert busy["sdpa-flash"] / busy["sdpa-cudnn"] > 1.4          # mma.sync: more busy cycles, same work
        if not causal:
            assert v["ncu_busy_m"] == f"{wgmma[0] / 1e6:.2f}" == "2.03"
            assert v["ncu_flash_busy_x"] == f"{busy['sdpa-flash'] / busy['sdpa-cudnn']:.1f}" == "1.5"
    said = _prose("c10-profile-md")
    assert "Two things differ" not in said and "Busy cycles are not work done" not in said
    assert ("The {term}`tensor pipe` was busy {glue:text}`ncu_tc_ours`% of our forward's active cycles against "
            "{glue:text}`ncu_tc_cudnn`% of cuDNN's, but that is the longer run restated") in said
    assert "ours over {glue:text}`ncu_active_x` times the active cycles" in said


def test_r13_the_extra_instructions_fill_at_most_a_quarter_of_the_extra_cycles(ch):
    f = _ncu_forwards()
    (ti, _, ta, sms, _), (ci, _, ca, _, _), (gi, _, ga, _, _) = f["triton"], f["sdpa-cudnn"], f["gluon"]
    schedulers = 4 * sms
    assert schedulers == 528
    v = ch.values
    assert v["ncu_active_x"] == f"{ta / ca:.2f}" == "1.41"
    share = (ti - ci) / schedulers / (ta - ca)       # one issue a cycle per scheduler, none overlapped
    assert v["ncu_inst_share"] == f"{100 * share:.0f}" == "24"
    issue = {name: inst / (schedulers * active) for name, inst, active in
             (("ours", ti, ta), ("cudnn", ci, ca), ("gluon", gi, ga))}
    assert (v["ncu_issue_ours"], v["ncu_issue_cudnn"], v["ncu_issue_gluon"]) == \
        tuple(f"{issue[k]:.2f}" for k in ("ours", "cudnn", "gluon")) == ("0.38", "0.44", "0.36")
    said = _prose("c10-profile-md")
    assert ("An SM's four schedulers issue at most one instruction a cycle each: even if none overlapped, the extra "
            "instructions would fill at most {glue:text}`ncu_inst_share`% of the extra cycles (ours used "
            "{glue:text}`ncu_issue_ours` of its issue slots, cuDNN's {glue:text}`ncu_issue_cudnn`). In the rest no "
            "warp could issue.") in said
    assert "does not say which wait held them" not in said       # round 15: the stall reasons say more
    summary = _prose("next-rungs")
    assert ("does the same tensor-pipe work, in {glue:text}`ncu_active_x` times the cycles; its "
            "{glue:text}`ncu_inst_more`% more instructions fill at most {glue:text}`ncu_inst_share`% of the extra ones") in summary
    assert "tensor pipe is less busy" not in summary


# --- item 6: the profile's caption and the L2 hit rate ------------------------------------------

def test_r13_the_caption_says_no_mask_and_the_l2_rate_is_of_sectors(ch):
    assert "$N$ = 4096, $d$ = 128, no mask; clocks not locked" in _prose("4427b76d")
    for causal, name, want in ((False, "ncu_l2", "90%"), (True, "ncu_l2_causal", "85%")):
        (k, num), = [x for impl, x in _ncu_forwards(causal=causal, full=True).items() if impl == "triton"]
        assert ch.values[name] == f"{num(k['lts__t_sector_hit_rate.pct']):.0f}%" == want
    assert ("the L2 hit rate is {glue:text}`ncu_l2` of sectors, {glue:text}`ncu_l2_causal` under the causal mask"
            in _prose("c10-profile-md"))
    assert "of the requests" not in _prose("c10-profile-md")


# --- item 2: the Gluon sweep's own control for tile width ----------------------------------------

def _gluon_bf16(name: str) -> dict:
    """(seq, causal) -> {variant: TFLOP/s} of a recorded Gluon sweep's bf16 rows."""
    out = {}
    for r in json.load(open(os.path.join(RESULTS, _index()[name]["path"])))["rows"]:
        if r["dtype"] == "bf16":
            out.setdefault((r["seq"], r["causal"]), {})[r["variant"]] = r["tflops"]
    return out


def test_r13_the_gluon_gain_splits_into_schedule_and_tile_width(ch):
    from flashbook.kernels import configs

    ours = configs.default("forward", cc=90, block_d=128, elem_bytes=2)
    assert (ours.block_m, ours.block_n, ours.num_stages) == (128, 64, 3)      # chapter 7's own tiles
    narrow, wide = "gluon producer m128 n64 s3", "gluon producer m128 n128 s3"
    for name in ("gluon_d128", "gluon_d128_run2"):
        t = _gluon_bf16(name)
        sched = [x[narrow] / x["flashbook"] for x in t.values()]
        width = [x[wide] / x[narrow] for x in t.values()]
        assert len(sched) == 6 and min(sched) > 1 and min(width) > 1       # both parts gain, in both runs
        if name == "gluon_d128":
            assert ch.values["gl_sched"] == f"{min(sched):.2f} to {max(sched):.2f}" == "1.07 to 1.24"
            assert ch.values["gl_width"] == f"{min(width):.2f} to {max(width):.2f}" == "1.07 to 1.16"
    said = _prose("d400881c")
    assert ("At chapter 7's own tiles (128 × 64, 3 stages) the producer schedule ran {glue:text}`gl_sched` times as "
            "fast as that kernel, and 128-key tiles added {glue:text}`gl_width` (same run;") in said
    assert "with 128 × 128 tiles that issue" not in said


# --- item 3: the atomic mode with 64 x 128 tiles, and the spill bytes -----------------------------

def _atomic_runs() -> list:
    """Both atomic-dQ runs' rows, each with its time over the separate kernel's (``x``)."""
    rows = []
    for name in ("atomic_dq", "atomic_dq_repeat"):
        for r in json.load(open(os.path.join(RESULTS, _index()[name]["path"])))["rows"]:
            rows.append(dict(r, x=1 / r["vs_separate"], run=name))
    return rows


def _span_of(xs) -> str:
    return f"{min(xs):.2f} to {max(xs):.2f}"


def test_r13_wider_tiles_cut_the_cost_and_spill_bytes_do_not_order_it(ch):
    rows = _atomic_runs()
    def pick(variant, d, causal):
        return [r["x"] for r in rows if (r["variant"], r["d"], r["causal"]) == (variant, d, causal)]

    v = ch.values
    assert v["relaxed_wide_128"] == _span_of(pick("relaxed 64x128", 128, False)) == "1.13 to 1.16"
    assert v["relaxed_causal_128"] == _span_of(pick("relaxed", 128, True)) == "1.21 to 1.27"
    wide = {tuple(r["dkdv_config"]) for r in rows if r["variant"] == "relaxed 64x128"}
    assert wide == {(64, 128, 8, 3)}
    # the better of the two tile shapes at each shape, run by run
    best = [min(r["x"] for r in rows if (r["run"], r["n"], r["d"], r["causal"]) == key
                and r["variant"] in ("relaxed", "relaxed 64x128"))
            for key in {(r["run"], r["n"], r["d"], r["causal"]) for r in rows}]
    assert v["relaxed_best"] == _span_of(best) == "1.08 to 1.27"
    # the compiled record: the experiment's 64 x 128 tiles at d = 128 without a mask, and the causal default
    _, dk = _dkdv()
    spill = {"64x64 full": dk[(128, False, True)]["spill_store_bytes"],
             "64x128 full": dk[(128, False, True, (64, 128, 8, 3))]["spill_store_bytes"],
             "64x128 causal": dk[(128, True, True)]["spill_store_bytes"]}
    assert tuple(dk[(128, True, True)]["config"]) == (64, 128, 8, 3)
    assert (v["dkdv_spill_wide"], v["dkdv_spill_causal"]) == (str(spill["64x128 full"]), str(spill["64x128 causal"])) \
        == ("88", "672")
    cost = {"64x64 full": max(pick("relaxed", 128, False)), "64x128 full": max(pick("relaxed 64x128", 128, False)),
            "64x128 causal": max(pick("relaxed", 128, True))}
    by_spill, by_cost = sorted(spill, key=spill.get), sorted(cost, key=cost.get)
    assert by_spill != by_cost                                   # the bytes do not order the costs
    said = _prose("c10-dq-lesson-md")
    assert ("and with 64 × 128 tiles (8 warps) {glue:text}`relaxed_wide_128` there: the large cost goes with the "
            "64 × 64 tiles, not with $d$ = 128 alone. Spilling is one candidate, but its bytes do not order the "
            "costs") in said
    assert ("{glue:text}`dkdv_spill_wide` with 64 × 128, and {glue:text}`dkdv_spill_causal` under the causal mask "
            "(the separate one {glue:text}`dkdv_spill_causal_separate`), whose default 64 × 128 tiles cost only {glue:text}`relaxed_causal_128`.") in said
    assert ("({glue:text}`relaxed_best` with the better recorded tiles at each size)") in _prose("next-rungs")
    readme = open(os.path.join(COMPILED, "README.md")).read()
    assert "--extra 128,full,64,128,8,3" in readme
    assert "| 128, full (`--extra`) | 64 x 128, 8 warps, 3 stages | 255, 0 | 255, 88 |" in readme


# --- item 4: the bytes ruled out by the same adds in both orderings -------------------------------

def test_r13_the_bytes_argument_is_the_measured_one(ch):
    rows = _atomic_runs()
    at = lambda variant: [r for r in rows if (r["variant"], r["d"], r["causal"]) == (variant, 128, False)]  # noqa: E731
    relaxed, acq = at("relaxed"), at("atomic")
    assert {r["dkdv_config"] is None for r in relaxed + acq} == {True}      # the same tiles: the same adds
    assert ch.values["acq_full_128"] == _span_of([r["x"] for r in acq]) == "6.72 to 6.93"
    assert ch.values["relaxed_full_128"] == _span_of([r["x"] for r in relaxed]) == "1.82 to 1.90"
    said = _prose("c10-dq-lesson-md")
    assert ("Relaxed adds move the same bytes: at $d$ = 128 without a mask they took {glue:text}`relaxed_full_128` "
            "times the separate mode's backward, `acq_rel` adds {glue:text}`acq_full_128`.") in said
    for gone in ("{glue:text}`hbm_tb_s`", "atomic_floor_share", "stay in the L2"):
        assert gone not in said, gone


# --- item 5: ping-pong's loss beyond the noise ----------------------------------------------------

def test_r13_pingpongs_largest_loss_is_named_with_its_verdict(ch):
    t = _gluon_bf16("gluon_d128")
    best = lambda x, sched: max(tf for name, tf in x.items() if name.startswith(f"gluon {sched} "))  # noqa: E731
    ratio = {key: best(x, "pingpong") / best(x, "producer") for key, x in t.items()}
    (seq, causal), worst = min(ratio.items(), key=lambda kv: kv[1])
    slower = 1 / worst - 1
    v = ch.values
    assert (seq, causal) == (4096, False) and v["pp_worst_shape"] == "4K without a mask"
    assert v["pp_worst"] == f"{100 * slower:.0f}" == "6"
    assert slower > float(v["noise_runs"]) / 100 and v["pp_worst_verdict"] == "beyond noise"
    assert max(ratio.values()) < 1.005                                       # never faster beyond rounding
    said = _prose("d400881c")
    assert "added nothing" not in said
    assert ("Ping-pong's turns gained nothing: {glue:text}`pp_bf16_lo` to {glue:text}`pp_bf16_hi` times the "
            "producer's speed, {glue:text}`pp_worst`% slower at {glue:text}`pp_worst_shape` "
            "({glue:text}`pp_worst_verdict`).") in said


def test_r13_library_files_stay_short():
    for name in ("chapter10.py", "chapter10_beyond.py", "chapter10_lab.py", "chapter10_ladder.py", "chapter10_why.py",
                 "score_ops.py", "profiles.py"):
        assert sum(1 for _ in open(os.path.join(ROOT, "flashbook", "bench", name))) < 600, name


# --- round 14 -----------------------------------------------------------------------------------
# item 1: the overlap schedule (issue order and TMA loads, no producer warp) at 128 x 128 x 3 gained
# almost nothing at N >= 4K; the Summary credits the measured parts and names the Triton

def test_r14_overlap_without_a_producer_gains_little_from_4k(ch):
    t = _gluon_bf16("gluon_d128")
    over = [x["gluon overlap m128 n128 s3"] / x["flashbook"] for (n, _), x in t.items() if n >= 4096]
    assert len(over) == 4
    v = ch.values
    assert (v["gl_overlap_lo"], v["gl_overlap_hi"]) == (f"{min(over):.2f}", f"{max(over):.2f}") == ("0.98", "1.05")
    said = _prose("d400881c")
    assert ("The overlap schedule at 128 × 128, 3 stages (no producer warp) ran {glue:text}`gl_overlap_lo` to "
            "{glue:text}`gl_overlap_hi` times chapter 7's speed at $N \\geq$ 4K: the gain came from the producer "
            "warp and the wider tiles.") in said
    assert "overlap_bf16_lo" not in said
    summary = _prose("next-rungs")
    assert ("Chapter 7's kernel, as Triton {glue:text}`loops_triton` compiles it, waits for all of a warpgroup's "
            "products") in summary and ch.values["loops_triton"] == "3.6.0"
    assert ("with a producer warp ({glue:text}`ws_same_lo` to {glue:text}`ws_same_hi` times at the same tiles) "
            "and 128 × 128 tiles ({glue:text}`gl_width`)") in summary
    assert "Triton issues Hopper's" not in summary
    assert json.load(open(os.path.join(RESULTS, "loop_sass_sm90_t36", "loops.json")))["triton"] == "3.6.0"


# item 2: rung 3's loop waits for products, copies and barriers; the page names no single cause

def test_r14_rung_3s_loop_waits_per_trip_are_read_from_loops_json(ch):
    loops = json.load(open(os.path.join(RESULTS, "loop_sass_sm90_t36", "loops.json")))["loops"]
    main = [lp["ops"] for lp in loops if lp["rung"] == 3 and lp["stage"] == "main"]
    assert len(main) == 4
    v = ch.values
    for name, op, n in (("loop_wait_mma", "WARPGROUP.DEPBAR", 1), ("loop_wait_copy", "DEPBAR.LE", 1),
                        ("loop_wait_bar", "BAR.SYNC", 2)):
        assert {ops[op] for ops in main} == {n} and v[name] == str(n), name
    said = _prose("1ece3c20")
    assert "waits for the tensor cores between the softmaxes" not in said
    assert ("Each trip also waits for its products, for its copies and at a barrier ({glue:text}`loop_wait_mma` "
            "`WARPGROUP.DEPBAR`, {glue:text}`loop_wait_copy` `DEPBAR.LE`, {glue:text}`loop_wait_bar` `BAR.SYNC`); "
            "the counts do not say which costs the time.") in said


# item 4: the noise rule points to the Gluon sweep, which comes later on the page

def test_r14_the_rerun_sweep_is_named_where_it_is():
    said = _prose("a9a89247")
    assert "one configuration of the Gluon sweep at the chapter's end moved {glue:text}`rerun_max`%" in said
    assert "last section's sweep" not in said


# --- round 15 -----------------------------------------------------------------------------------
# item 1: the recorded stall reasons, recomputed from raw.csv with the csv module

def test_r15_mio_throttle_and_barrier_stalls_are_read_from_raw_csv(ch):
    reason = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    stalls = {}
    for causal in (False, True):
        for impl, (k, num) in _ncu_forwards(causal, full=True).items():
            stalls[impl, causal] = {r: num(k[reason.format(r)]) for r in ("mio_throttle", "barrier", "wait")}
    mio = {key: f"{stalls[key]['mio_throttle']:.2f}" for key in stalls}
    assert (mio["triton", False], mio["sdpa-cudnn", False], mio["gluon", False]) == ("0.49", "0.02", "0.18")
    assert (mio["triton", True], mio["sdpa-cudnn", True], mio["gluon", True]) == ("0.51", "0.11", "0.18")
    # ours stalls least of the three on barriers, and below cuDNN's
    assert stalls["triton", False]["barrier"] < stalls["sdpa-cudnn", False]["barrier"]
    v = ch.values
    assert (v["ncu_mio_ours"], v["ncu_mio_cudnn"], v["ncu_mio_gluon"]) == ("0.49", "0.02", "0.18")
    assert v["ncu_mio_causal"] == "0.51, 0.11 and 0.18"
    assert (v["ncu_bar_ours"], v["ncu_bar_cudnn"]) == (f"{stalls['triton', False]['barrier']:.2f}",
                                                       f"{stalls['sdpa-cudnn', False]['barrier']:.2f}") == ("1.08", "1.37")
    said = _prose("c10-profile-md")
    for name in ("ncu_mio_ours", "ncu_mio_cudnn", "ncu_mio_gluon", "ncu_mio_causal", "ncu_bar_ours", "ncu_bar_cudnn"):
        assert "{glue:text}`" + name + "`" in said, name
    assert "*MIO throttle*, a full queue for shared-memory, special-function and\nbranch".replace("\n", " ") in said
    assert "Our barrier stalls are lower than cuDNN's" in said
    assert "does not say which of our instructions fill that queue" in said
    summary = _prose("next-rungs")
    assert "full MIO queue ({glue:text}`ncu_mio_ours` against {glue:text}`ncu_mio_cudnn`)" in summary


# item 2: the atomic mode's cost is not pinned on the add instruction

def test_r15_the_atomic_result_is_about_the_mode_not_the_add():
    said = _prose("c10-dq-lesson-md")
    assert "result about Triton's `tl.atomic_add`" not in said
    assert "That is a result about this atomic mode as Triton compiles it, not about fp32 atomic adds:" in said


# item 3: the ladder's acq_rel ratios at d = 64, N = 4K lie above the experiment's d = 64 range,
# and the ladder's separate backward was the faster one there

def test_r15_the_d64_ladder_ratios_above_the_range(ch):
    from flashbook.bench.experiments import atomic_dq_both

    b = ch.frames["bsteps"]
    ms = b.set_index(["head_dim", "seq", "causal", "name"])["ms"]
    runs = atomic_dq_both(ch.root)
    exp = runs[(runs["variant"] == "atomic") & (runs["d"] == 64)]
    top = exp["x_separate"].max()
    above = [(c, ms[64, n, c, "dQ atomic"] / ms[64, n, c, "dQ separate"]) for n in (4096, 16384) for c in (False, True)
             if ms[64, n, c, "dQ atomic"] / ms[64, n, c, "dQ separate"] > top]
    assert [(c, f"{x:.2f}") for c, x in above] == [(False, "3.66"), (True, "3.41")]
    v = ch.values
    assert v["dq_above_64"] == "3.66 and 3.41" and v["dq_range_64"] == f"{exp['x_separate'].min():.2f} to {top:.2f}"
    faster = []
    for c in (False, True):
        sep = runs[(runs["variant"] == "separate") & (runs["d"] == 64) & (runs["n"] == 4096)
                   & (runs["causal"].astype(bool) == c)]["ms"]
        assert len(sep) == 2
        faster += [100 * (1 - ms[64, 4096, c, "dQ separate"] / x) for x in sep]
        atom = runs[(runs["variant"] == "atomic") & (runs["d"] == 64) & (runs["n"] == 4096)
                    & (runs["causal"].astype(bool) == c)]["ms"]
        assert max(abs(x / ms[64, 4096, c, "dQ atomic"] - 1) for x in atom) < 0.02    # the atomics agree
    assert min(faster) > 5 and v["dq_faster_64"] == f"{min(faster):.0f} to {max(faster):.0f}" == "7 to 11"
    said = _prose("c10-dq-lesson-md")
    assert "(as are its {glue:text}`dq_above_64` at $d$ = 64, $N$ = 4K), because of its separate backward" in said
    assert "(at $d$ = 64, {glue:text}`dq_faster_64`%)" in said


# items 4 to 6: the Summary's overlap control, the untested producer-warp reason, the rungs

def test_r15_summary_overlap_control_hypothesis_and_rungs(ch):
    summary = _prose("next-rungs")
    assert ("Without the producer warp (the overlap schedule, same tiles): {glue:text}`gl_overlap_lo` to "
            "{glue:text}`gl_overlap_hi` times chapter 7's speed at $N \\geq$ 4K.") in summary
    assert (ch.values["gl_overlap_lo"], ch.values["gl_overlap_hi"]) == ("0.98", "1.05")
    solution = _prose("31127f0c")
    assert "likely pays" not in solution
    assert ("An untested hypothesis (only the producer schedule was profiled): with few key tiles per row the "
            "producer warp has little to run ahead of, and elsewhere it pays") in solution
    reading = _prose("b53ef4b1")
    assert "issuing instructions faster" not in reading
    assert ("so the rungs are about doing less work and issuing fewer instructions per score, not about reaching "
            "more bandwidth") in reading


# --- round 16: what each measurement isolates -----------------------------------------------------

def test_r16_the_wgmma_are_a_small_part_of_the_extra_instructions():
    f = _ncu_forwards()
    extra_inst = f["triton"][0] - f["sdpa-cudnn"][0]
    extra_wgmma = f["triton"][1] - f["sdpa-cudnn"][1]
    assert 0 < extra_wgmma / extra_inst < 0.1                      # about 6% of the 139 M extra
    said = _prose("c10-profile-md")
    assert "A small part of the extra is `wgmma` ({glue:text}`ncu_wgmma_ratio` times cuDNN's)" in said
    assert "The profile does not say what the rest are." in said


def test_r16_the_cross_run_shift_is_not_put_on_the_timer(ch):
    said = _prose("a9a89247")
    assert "also used different timer settings" in said and "timed the same kernels with different" not in said
    assert "The cause was not measured: the `acq_rel` backward moved at most {glue:text}`xrun_acq`%." in said
    assert float(ch.values["xrun_acq"]) < 0.5


def test_r16_spill_bytes_are_of_the_code_and_the_causal_separate_kernel_spills(ch):
    _, dk = _dkdv()
    sep = dk[(128, True, False)]
    assert tuple(sep["config"]) == (64, 128, 8, 3)
    assert ch.values["dkdv_spill_causal_separate"] == str(sep["spill_store_bytes"]) == "248"
    # the extra spill of the atomic kernel still does not order the costs: +424 causal, +400 with 64 x 64
    extra = {k: dk[(128, c, True) + t]["spill_store_bytes"] - dk[(128, c, False) + t]["spill_store_bytes"]
             for k, c, t in (("64x64", False, ()), ("64x128", False, ((64, 128, 8, 3),)), ("causal", True, ()))}
    assert extra == {"64x64": 400, "64x128": 88, "causal": 424}
    said = _prose("c10-dq-lesson-md")
    assert "They count the sm_90 code, not how often it runs (the atomic kernels were not profiled)" in said


def test_r16_the_dq_ratios_divide_by_the_whole_separate_backward(ch):
    assert "as long as the separate mode's whole backward:" in _prose("c10-dq-lesson-md")
    assert "as long as the separate mode's backward" in _prose("next-rungs")
    assert "time over the separate mode's backward," in _prose("6b385699")
    assert ch.tables["dq_lesson"].columns.name == "time over the separate mode's backward"


def test_r16_the_untested_label_comes_before_the_cause():
    said = _prose("31127f0c")
    assert "tie with the producer. An untested hypothesis (only the producer schedule was profiled): with few key" in said
    assert said.index("untested") < said.index("little to run ahead")
