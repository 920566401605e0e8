"""Review round 12, chapter 10: the profile's instruction counts as a second cause of the gap to
cuDNN, Triton's own Hopper options (appendix A3's run), the ladder and the full comparison timed
one way apart with different timer settings, the atomic dK/dV kernel's spills and rung 2's longer
loop from compiled counts, and the PTX table read from a Triton 3.6.0 recording. Every number is
recomputed here from the recorded files, apart from ``flashbook.bench.chapter10_why``."""
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


def _ncu_forwards(causal: bool = False) -> dict:
    """impl -> (warp instructions, wgmma instructions, active cycles, SMs, scores) of each d = 128
    forward in kernel_ncu_h200, read with the csv module and steps.json alone."""
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


def test_the_prose_names_both_causes_and_does_not_separate_them():
    said = _prose("c10-profile-md")
    assert "Two things differ, and this profile does not separate them." in said
    for name in ("ncu_inst_more", "ncu_wgmma_ratio"):
        assert "{glue:text}`" + name + "`" in said, name
    assert "its 64-key tiles make each `wgmma` of $S = QK^\\top$ 64 keys wide" in said
    summary = _prose("next-rungs")
    assert ("its tensor pipe is less busy, and it issues {glue:text}`ncu_inst_more`% more instructions and "
            "{glue:text}`ncu_wgmma_ratio` times the (narrower) `wgmma`") in summary
    assert "a producer warp and 128 × 128 tiles, ran" in summary
    assert "{glue:text}`ncu_gluon_fewer`% fewer instructions" in _prose("d400881c")


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
    rec = json.load(open(os.path.join(RESULTS, _index()["dkdv_registers"]["path"])))
    return rec, {(r["head_dim"], r["causal"], r["atomic_dq"]): r for r in rec["kernels"]}


def test_the_dkdv_recording_is_triton_360_and_matches_the_h200_profile():
    rec, rows = _dkdv()
    assert rec["triton"] == "3.6.0" and rec["target"] == "sm_90" and len(rows) == 8
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
    assert ("holds {glue:text}`dkdv_spill_atomic` bytes of spill stores a thread, the separate one "
            "{glue:text}`dkdv_spill_separate`; at $d$ = 64 {glue:text}`dkdv_spills_64`.") in said


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
