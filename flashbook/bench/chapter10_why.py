"""Chapter 10's evidence for *why* its timings come out as they do, beside the timings: Nsight
Compute's readings of the forwards (``profile``: bytes, the tensor pipe's busy cycles, and the
instructions each issues), the Gluon sweep's own controls (``gluon_controls``: schedule against
tile width), what the two recorded runs that timed the same kernels did differently
(``run_settings``, ``between_runs``), and counts compiled for sm_90 without a GPU
(``loop_growth`` from benchmarks/loop_sass.py's loops; ``dkdv_spills`` and ``ptx_recorded`` from
benchmarks/dkdv_registers.py and benchmarks/ptx_counts.py, run with the Triton that timed the
kernels). ``chapter10.build`` calls ``run_settings`` while it reads the runs and ``build_into``
at the end.
"""
from __future__ import annotations

from .noise import slower_over_faster
from .runs import load_recorded_json, run_path

#: the index's names (benchmarks/results/index.json) of the compiled counts
DKDV_RUN, PTX_RUN = "dkdv_registers", "ptx_compare"
#: the profile table's implementations, as it names them
PROFILED = {"triton": "chapters 7-8 (Triton)", "gluon": "Gluon forward", "sdpa-cudnn": "SDPA cuDNN",
            "sdpa-flash": "SDPA flash (FlashAttention-2)"}
#: the noise table's row for the separate backward timed in the ladder and in the full comparison
BACKWARD_ROW = ("in two runs", "separate backward: ladder and full comparison")
#: the glued names' keys of the three wgmma forwards the profile compares, and their implementations
COMPARED = (("ours", "triton"), ("cudnn", "sdpa-cudnn"), ("gluon", "gluon"))
#: the provenance table's rows ``run_settings`` adds
TIMER, COMMIT = "timer (ms): calls, warm-up", "commit"


# ---------------------------------------------------------------- the profile

def _forwards(rows, dim: int, causal: bool) -> dict:
    """{impl: its one profiled forward kernel among ``rows`` (``profiles.kernel_rows``)} at head
    dimension ``dim``, with or without the causal mask (the library's own mask and tile runs left out)."""
    out = {}
    for k in rows:
        if (k["pass_"] != "forward" or k["dim"] != dim or bool(k["causal"]) != causal or "mask" in k
                or "config_dkdv" in k):
            continue
        if k["impl"] in out:
            raise ValueError(f"one forward kernel per implementation, and {k['impl']} has several")
        out[k["impl"]] = k
    return out


def issue_counts(rows, dim: int = 128, causal: bool = False) -> dict:
    """{impl: (warp instructions per 32 scores, wgmma instructions executed, issue slots used)}
    for each profiled forward among ``rows`` (``profiles.kernel_rows``) at head dimension ``dim``.
    Per 32 scores: what the warps issue for every 32 scores the forward computes (B·H·N², half
    under the causal mask). Issue slots used: the instructions over one a cycle for each of an
    SM's four schedulers, over all SMs and the kernel's active cycles."""
    from .profiles import ACTIVE, INST, SMS, WGMMA

    out = {}
    for impl, k in _forwards(rows, dim, causal).items():
        scores = k["batch"] * k["heads"] * k["seq"] ** 2 / (2 if causal else 1)
        out[impl] = (32 * k[INST] / scores, k[WGMMA], k[INST] / (4 * k[SMS] * k[ACTIVE]))
    return out


def tensor_cycles(rows, dim: int = 128, causal: bool = False) -> dict:
    """{impl: (cycles the tensor pipe was busy, active cycles)}, each per SM (the mean over SMs),
    of each profiled forward: the busy share Nsight reports times the active cycles it is a share of."""
    from .profiles import ACTIVE, TENSOR_BUSY

    return {impl: (k[TENSOR_BUSY] / 100 * k[ACTIVE], k[ACTIVE]) for impl, k in _forwards(rows, dim, causal).items()}


#: Nsight Compute's stall reasons: warps stalled for that reason per instruction issued
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def stall_reasons(rows, dim: int = 128, causal: bool = False) -> dict:
    """{impl: {reason: warps stalled for it per issued instruction}} of each profiled forward
    among ``rows`` (``profiles.kernel_rows``): Nsight's ``smsp__average_warps_issue_stalled_*``."""
    head, tail = STALL.split("{}")
    return {impl: {c[len(head):-len(tail)]: k[c] for c in k if c.startswith(head) and c.endswith(tail)}
            for impl, k in _forwards(rows, dim, causal).items()}


def _stalls(ch, rows) -> None:
    """The stall reasons the profile records: MIO throttle (a full queue to the unit of shared-memory,
    special-function and dynamic-branch instructions) per forward, without (``ncu_mio_*``) and with
    the causal mask (``ncu_mio_causal``, ours, cuDNN's, Gluon's), and barrier stalls (``ncu_bar_*``)."""
    full, causal = stall_reasons(rows), stall_reasons(rows, causal=True)
    for key, impl in COMPARED:
        ch.put(f"ncu_mio_{key}", full[impl]["mio_throttle"], ".2f")
        ch.put(f"ncu_bar_{key}", full[impl]["barrier"], ".2f")
    m = [f"{causal[impl]['mio_throttle']:.2f}" for _, impl in COMPARED]
    ch.put("ncu_mio_causal", f"{m[0]}, {m[1]} and {m[2]}")


def _tensor_time(ch, counts, cycles) -> None:
    """The busy share restated as cycles: the same busy cycles in the three wgmma forwards
    (``ncu_busy_m``, millions per SM), ours over more active cycles (``ncu_active_x``), SDPA
    flash's mma.sync needing more (``ncu_flash_busy_x``); and the most of ours's extra active
    cycles over cuDNN's its extra instructions could fill at one issue a cycle per scheduler,
    had none overlapped (``ncu_inst_share``, %), beside the issue slots each used."""
    from ..display import span

    wgmma = [impl for _, impl in COMPARED]
    ch.put("ncu_busy_m", span([cycles[i][0] / 1e6 for i in wgmma], ".2f", collapse=True))
    (_, ours), (_, cud) = cycles["triton"], cycles["sdpa-cudnn"]
    ch.put("ncu_active_x", ours / cud, ".2f")
    ch.put("ncu_flash_busy_x", cycles["sdpa-flash"][0] / cycles["sdpa-cudnn"][0], ".1f")
    used = {i: counts[i][2] for i in wgmma}          # issue slots used; times active cycles: issue cycles
    ch.put("ncu_inst_share", 100 * (used["triton"] * ours - used["sdpa-cudnn"] * cud) / (ours - cud), ".0f")
    for key, impl in COMPARED:
        ch.put(f"ncu_issue_{key}", used[impl], ".2f")


def profile(ch) -> None:
    """Nsight Compute's readings of the library's forward beside cuDNN's, Gluon's and SDPA flash's
    (run ``kernel_ncu``): DRAM bytes, the tensor pipe's busy share, and the instructions issued."""
    from .profiles import forward_wgmma, kernel_rows, one, pass_table, tensor_mb

    run = run_path("kernel_ncu", ch.root) if ch.root is not None else None
    names = ("ncu_dram", "ncu_qkv", "ncu_l2", "ncu_l2_causal", "ncu_busy_m", "ncu_active_x", "ncu_flash_busy_x",
             "ncu_inst_share", "ncu_issue_ours", "ncu_issue_cudnn", "ncu_issue_gluon", "ncu_tc_ours", "ncu_tc_cudnn",
             "ncu_tc_gluon", "ncu_flash_wgmma",
             "ncu_bwd_ops", "ncu_dkdv_ops", "ncu_dq_ops", "ncu_cudnn_bwd_ops", "ncu_inst_ours", "ncu_inst_cudnn",
             "ncu_inst_gluon", "ncu_inst_more", "ncu_gluon_fewer", "ncu_wgmma_ratio", "ncu_mio_ours", "ncu_mio_cudnn",
             "ncu_mio_gluon", "ncu_mio_causal", "ncu_bar_ours", "ncu_bar_cudnn", "ncu_bar_gluon")
    if run is None or not run.exists():
        ch.say("profile", "No recorded Nsight Compute run (run 'kernel_ncu' in benchmarks/results/index.json).", missing=True)
        return ch.nothing(*names)
    t = pass_table(run)
    t = t[(t["dim"] == 128) & ("mask" not in t or t["mask"].isna()) & ("config_dkdv" not in t or
                                                                        t["config_dkdv"].isna())]
    rows = kernel_rows(run)
    counts = issue_counts(rows)
    # the forward only: the section compares forwards (chapter 9 profiles whole backward passes)
    shown = t[t["impl"].isin(list(PROFILED)) & ~t["causal"] & (t["pass_"] == "forward")]
    shown = shown.assign(kernel=shown["impl"].map(PROFILED), inst=[counts[i][0] for i in shown["impl"]],
                         wgmma=[counts[i][1] / 1e6 for i in shown["impl"]])
    ch.table("profile", "profile", shown.set_index("kernel")[["dram_mb", "tensor_pct", "inst", "wgmma"]].rename(columns={
        "dram_mb": "forward: DRAM read (MB)", "tensor_pct": "tensor pipe busy (%)",
        "inst": "warp instructions per 32 scores", "wgmma": "wgmma executed (M)"}).round(1))
    at = t.set_index(["impl", "pass_", "causal"]).sort_index()
    ours = at.loc[("triton", "forward")]
    ch.put("ncu_dram", ours["dram_mb"].max(), ".1f"); ch.put("ncu_qkv", tensor_mb(t.iloc[0]), ".1f")
    for name, causal in (("ncu_l2", False), ("ncu_l2_causal", True)):    # the hit rate of L2 sectors
        ch.put(name, f"{one(at, ('triton', 'forward', causal), 'l2_hit'):.0f}%")
    for key, impl in COMPARED:
        ch.put(f"ncu_tc_{key}", one(at, (impl, "forward", False), "tensor_pct"), ".0f")
        ch.put(f"ncu_inst_{key}", counts[impl][0], ".1f")
    ch.put("ncu_inst_more", 100 * (counts["triton"][0] / counts["sdpa-cudnn"][0] - 1), ".0f")   # % more than cuDNN's
    ch.put("ncu_gluon_fewer", 100 * (1 - counts["gluon"][0] / counts["triton"][0]), ".0f")     # % fewer than ours
    ch.put("ncu_wgmma_ratio", counts["triton"][1] / counts["sdpa-cudnn"][1], ".1f")
    ch.put("ncu_flash_wgmma", forward_wgmma(rows))
    _tensor_time(ch, counts, tensor_cycles(rows))
    _stalls(ch, rows)
    bwd_ops = one(at, ("triton", "backward", False), "ops_ratio")
    ch.put("ncu_bwd_ops", bwd_ops, ".2f")
    ch.put("ncu_cudnn_bwd_ops", one(at, ("sdpa-cudnn", "backward", False), "ops_ratio"), ".2f")
    _backward_ops(ch, rows, bwd_ops)


def _backward_ops(ch, rows, ops_ratio) -> None:
    """The library backward's tensor ops over the forward's credited FLOPs, split between its
    dK/dV and dQ kernels (``ncu_dkdv_ops``, ``ncu_dq_ops``)."""
    from .profiles import TENSOR_OPS

    kernels = [k for k in rows if k["impl"] == "triton" and k["pass_"] == "backward" and k["dim"] == 128
               and not k["causal"] and "mask" not in k and "config_dkdv" not in k]
    credited = ops_ratio / sum(sum(k.get(m, 0.0) for m in TENSOR_OPS) for k in kernels)
    for key, name in (("dkdv", "_bwd_dkdv"), ("dq", "_bwd_dq")):
        ops = sum(sum(k.get(m, 0.0) for m in TENSOR_OPS) for k in kernels if k["Kernel Name"] == name)
        ch.put(f"ncu_{key}_ops", ops * credited, ".2f")


# ---------------------------------------------------------------- two runs, one kernel

def _timer(prov: dict, short: bool = False) -> str:
    """How long a run timed calls after how long a warm-up ("30 ms after 10 ms"; ``short``: "30, 10",
    as the provenance table's ``TIMER`` row says it)."""
    t = prov.get("timing") or {}
    if t.get("rep_ms") is None or t.get("warmup_ms") is None:
        return "not recorded"
    return f"{t['rep_ms']:g}, {t['warmup_ms']:g}" if short else f"{t['rep_ms']:g} ms after {t['warmup_ms']:g} ms"


def run_settings(ch, recorded: dict):
    """The provenance table's rows for what each run ran and how it timed (``COMMIT``, ``TIMER``)
    for ``recorded`` (file name -> provenance), as a frame, or None; glues the ladder's and the
    full comparison's timer settings (``timer_ladder``, ``timer_full``)."""
    import pandas as pd

    for name, csv in (("timer_ladder", "ladder.csv"), ("timer_full", "results.csv")):
        ch.put(name, _timer(recorded[csv]) if csv in recorded else None)
    if not recorded:
        return None
    return pd.DataFrame({name: {COMMIT: str(p["git_commit"])[:7] if p.get("git_commit") else "not recorded", TIMER: _timer(p, short=True)}
                         for name, p in recorded.items()})


def _slower(ratios) -> str:
    """Times of one run over another's as the prose says them ("5.2 to 11.5% slower")."""
    lo, hi = 100 * (min(ratios) - 1), 100 * (max(ratios) - 1)
    return (f"{lo:.1f} to {hi:.1f}% slower" if lo >= 0.05 else f"{-lo:.1f}% faster to {hi:.1f}% slower"
            if hi >= 0.05 else f"{-hi:.1f} to {-lo:.1f}% faster")


def between_runs(ch) -> None:
    """The ladder's two backward rungs timed again in the full comparison (its ``flashbook`` and
    ``flashbook-atomic``, the same kernels): each time there over the ladder's. Adds the separate
    backward's row to the noise table and glues how far each moved, and the full comparison's own
    atomic-over-separate ratio where the ladder's is highest."""
    names = ("xrun_bwd", "xrun_bwd_long", "xrun_acq", "dq_full_separate_ms", "dq_full_ratio", "dq_full_within")
    ladder, df = ch.frames.get("ladder"), ch.frames.get("results")
    if ladder is None or df is None:
        return ch.nothing(*names)
    keys = ["batch", "heads", "seq", "head_dim", "causal"]

    def again(name, impl):
        rows = ladder[(ladder["pass_"] == "bwd") & (ladder["name"] == name)].merge(df[df["impl"] == impl], on=keys)
        return rows.assign(ratio=rows["bwd_ms"] / rows["ms"]).set_index(keys[2:])

    sep, acq = again("dQ separate", "flashbook"), again("dQ atomic", "flashbook-atomic")
    short = sep.index.get_level_values("seq") == sep.index.get_level_values("seq").min()
    ch.put("xrun_bwd", _slower(sep["ratio"][short]))
    ch.put("xrun_bwd_long", 100 * float(slower_over_faster(sep["ratio"][~short]).max()), ".1f")
    ch.put("xrun_acq", 100 * float(slower_over_faster(acq["ratio"]).max()), ".1f")
    table = ch.tables.get("noise_samples")
    if table is not None:
        table.loc[BACKWARD_ROW, :] = [len(sep), f"{100 * float(slower_over_faster(sep['ratio']).max()):.1f}",
                                      "not used by the rule (two runs)"]
    top = (acq["ms"] / sep["ms"]).idxmax()          # the ladder's highest atomic-over-separate ratio
    ratio = acq.loc[top, "bwd_ms"] / sep.loc[top, "bwd_ms"]
    ch.put("dq_full_separate_ms", sep.loc[top, "bwd_ms"], ".2f"); ch.put("dq_full_ratio", ratio, ".2f")
    try:
        lo, hi = float(ch.values["at10_fence_lo"]), float(ch.values["at10_fence_hi"])
    except (KeyError, ValueError):
        return ch.nothing("dq_full_within")
    ch.put("dq_full_within", "inside" if lo <= ratio <= hi else "outside")


# ---------------------------------------------------------------- compiled for sm_90, no GPU

def loop_growth(ch) -> None:
    """Where rung 2's compiled loop (skipping tiles, every tile masked) issues more per score than
    rung 1's (the same loop, every tile visited): by how much, at the largest change."""
    names = ("skip_loop_where", "skip_loop_grew", "skip_loop_before", "skip_loop_after")
    loops = ch.frames.get("loops")
    if loops is None:
        return ch.nothing(*names)
    r1, r2 = (loops.xs((r, "masked"), level=("rung", "stage"))["per_score"] for r in (1, 2))
    grew = r2 / r1 - 1
    d, causal = grew.abs().idxmax()
    ch.put("skip_loop_where", f"at d = {d} " + ("with the mask" if causal else "without a mask"))
    ch.put("skip_loop_grew", 100 * grew[(d, causal)], ".1f")
    ch.put("skip_loop_before", r1[(d, causal)], ".2f"); ch.put("skip_loop_after", r2[(d, causal)], ".2f")


def dkdv_registers(root=None):
    """benchmarks/dkdv_registers.py's recording: {(head_dim, causal, atomic_dq): its kernel's
    row} for the default tiles, {(head_dim, causal, atomic_dq, (block_m, block_n, warps,
    stages)): row} for the script's ``--extra`` tiles, and the file's provenance, or (None, {})
    where none is recorded."""
    rec = load_recorded_json(DKDV_RUN, root)
    if rec is None:
        return None, {}
    rows = {}
    for r in rec.pop("kernels"):
        extra = () if r.get("default_tiles", True) else (tuple(r["config"]),)
        rows[(r["head_dim"], r["causal"], r["atomic_dq"]) + extra] = r
    return rows, rec


#: the atomic-dQ experiment's other dK/dV tiles ("64x128" variants): 64 x 128, 8 warps, 3 stages
WIDE_DKDV = (64, 128, 8, 3)


def dkdv_spills(ch) -> None:
    """The dK/dV kernel without a mask, atomic dQ off and on, compiled for sm_90: its spill stores
    at d = 128 (bytes per thread, ptxas), and whether it spills at d = 64; the atomic kernel's at
    d = 128 with the experiment's 64 x 128 tiles (``dkdv_spill_wide``) and under the causal mask,
    whose default tiles they are (``dkdv_spill_causal``; the separate kernel's there,
    ``dkdv_spill_causal_separate``)."""
    names = ("dkdv_spill_separate", "dkdv_spill_atomic", "dkdv_spills_64", "dkdv_spill_wide", "dkdv_spill_causal",
             "dkdv_spill_causal_separate")
    rows, _ = dkdv_registers(ch.root)
    if rows is None:
        return ch.nothing(*names)
    ch.put("dkdv_spill_separate", rows[(128, False, False)]["spill_store_bytes"])
    ch.put("dkdv_spill_atomic", rows[(128, False, True)]["spill_store_bytes"])
    wide = rows.get((128, False, True, WIDE_DKDV))
    ch.put("dkdv_spill_wide", None if wide is None else wide["spill_store_bytes"])
    for name, atomic in (("dkdv_spill_causal", True), ("dkdv_spill_causal_separate", False)):
        causal = rows[(128, True, atomic)]      # quoted only where the causal default is the wide tile
        ch.put(name, causal["spill_store_bytes"] if tuple(causal["config"]) == WIDE_DKDV else None)
    spills = [rows[(64, False, a)]["spill_store_bytes"] for a in (False, True)]
    ch.put("dkdv_spills_64", "neither spills" if not any(spills) else f"they spill {spills[0]} and {spills[1]} bytes")


def ptx_recorded(root=None):
    """benchmarks/ptx_counts.py's recording, as ``chapter10_beyond.ptx_compare`` returns its
    own compile: (its table, headed by the Triton version that compiled it; the two compile
    records). Unrecorded: the table says so and the records' counts are None."""
    from .chapter10_beyond import ptx_table

    rec = load_recorded_json(PTX_RUN, root)
    if rec is None:
        none = {"tensor_core_ops": None, "wgmma_waits": None, "tma_copies": None, "error": "not recorded"}
        compiled = [dict(none), dict(none, schedule="producer")]
        return ptx_table(compiled), tuple(compiled)
    return ptx_table(rec["compiled"], rec["triton"]), tuple(rec["compiled"])


# ---------------------------------------------------------------- the Gluon sweep's own controls

def gluon_controls(ch) -> None:
    """The Gluon sweep (``gluon_d128``, bf16, d = 128) split by its own controls: the producer
    schedule at chapter 7's tiles (128 x 64, 3 stages) over chapter 7's kernel (``gl_sched``),
    then at 128-key tiles (same stages) over that (``gl_width``); and ping-pong's largest loss to
    the producer schedule (each its fastest configuration, as the schedules table shows them:
    ``pp_worst``, % longer), its shape and its verdict by the noise rule."""
    import pandas as pd

    from ..display import span
    from .experiments import GLUON_EXPERIMENTS

    names = ("gl_sched", "gl_width", "gl_overlap_lo", "gl_overlap_hi", "pp_worst", "pp_worst_shape", "pp_worst_verdict")
    run, table = load_recorded_json(GLUON_EXPERIMENTS[128], ch.root), ch.frames.get("gluon128")
    if run is None or table is None:
        return ch.nothing(*names)
    t = pd.DataFrame(run["rows"]).query("dtype == 'bf16'").pivot_table(index=["seq", "causal"], columns="variant",
                                                                          values="tflops")
    narrow = t["gluon producer m128 n64 s3"]
    ch.put("gl_sched", span(narrow / t["flashbook"], ".2f"))
    ch.put("gl_width", span(t["gluon producer m128 n128 s3"] / narrow, ".2f"))
    # the issue order and TMA loads without a producer warp, at 128 x 128 x 3, where the goals are set
    long = t[t.index.get_level_values("seq") >= 4096]
    over = long["gluon overlap m128 n128 s3"] / long["flashbook"]
    ch.put("gl_overlap_lo", over.min(), ".2f"); ch.put("gl_overlap_hi", over.max(), ".2f")
    bf16 = table[table["dtype"] == "bf16"]
    worst = (bf16["pingpong"] / bf16["producer"]).idxmin()
    slower = bf16.loc[worst, "producer"] / bf16.loc[worst, "pingpong"]       # its time over the producer's
    ch.put("pp_worst", 100 * (slower - 1), ".0f")
    ch.put("pp_worst_shape", f"{bf16.loc[worst, 'seq'] // 1024}K " + ("with the causal mask" if bf16.loc[worst, "causal"]
                                                                      else "without a mask"))
    ch.put("pp_worst_verdict", ch.verdict(slower))


def loop_waits(ch) -> None:
    """The waits rung 3's unmasked loop issues per trip (``score_ops.load_loops``, as
    ``ch.frames["loops"]``): for the products (``WARPGROUP.DEPBAR``), for the copies
    (``DEPBAR.LE``) and at a barrier (``BAR.SYNC``), each the same at d = 64 and 128, with and
    without the mask; None where it differs or nothing is recorded."""
    names = {"loop_wait_mma": "WARPGROUP.DEPBAR", "loop_wait_copy": "DEPBAR.LE", "loop_wait_bar": "BAR.SYNC"}
    loops = ch.frames.get("loops")
    if loops is None:
        return ch.nothing(*names)
    main = loops.xs((3, "main"), level=("rung", "stage"))["ops"]
    for name, op in names.items():
        counts = {ops.get(op, 0) for ops in main}
        ch.put(name, counts.pop() if len(counts) == 1 else None)


def build_into(ch) -> None:
    """The sections of this module that read what ``chapter10.build`` has read, into ``ch``."""
    profile(ch)
    gluon_controls(ch)
    loop_waits(ch)
    between_runs(ch)
    loop_growth(ch)
    dkdv_spills(ch)
