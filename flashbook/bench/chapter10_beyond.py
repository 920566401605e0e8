"""Chapter 10 beyond the ladder, from the recorded runs: Triton's tutorial kernel and cuDNN
beside ours, what did not help (tensor descriptors, lazy rescaling, compiled-in lengths,
autotuning), and the Gluon kernel (its schedules, the host's share of a call, the graph-timed
runs, three tries at d = 64, short sequences, a persistent kernel, today's defaults).

``build_into(ch)`` adds these sections to a ``chapter10.Chapter10`` (``chapter10.build``
calls it); every section says, once, what it shows when its runs are not recorded.
"""
from __future__ import annotations

import numpy as np

from ..kernels import hopper
from ..kernels.ladder import FIRST_CONFIG
from .experiments import (AUTOTUNE_RUN, GLUON_EXP2_EXPERIMENTS, GLUON_EXPERIMENTS, GLUON_SCHEDULES,
                          GLUON_SHORT_SWEEPS, HOST_OVERHEAD_RUN, LAZY_EXPERIMENT, SHORT_FAMILIES,
                          STATIC_SHAPE_EXPERIMENT, HOPPER_EXPERIMENT, fma_share_table, gluon_schedule_table,
                          host_overhead_tables, hopper_experiment_table, load_hopper_experiment,
                          schedule_pairs, short_sweep_table, variant_table)
from .peer import (GLUON_DEFAULT_GRAPH_RUNS, GLUON_GRAPH_RUNS, GLUON_PEER_RUNS, GLUON_WIDE_GRAPH_RUN, PEER_RUNS,
                   load_peer_run, peer_ratio_table, peer_runs_table)
from .noise import slower_over_faster
from .runs import load_recorded_json

#: The masks as the tables name them.
MASKS = {True: "causal", False: "full"}


def _where(env) -> str:
    """"GPU, date, commit abc1234" of a recorded environment or provenance."""
    gpu = env["gpu"]["name"] if isinstance(env["gpu"], dict) else env["gpu"]
    return f"{gpu}, {env['date_utc'][:10]}, commit {env['git_commit'][:7]}"


def _tutorial(ch, root) -> None:
    """Our kernel beside Triton's fused-attention tutorial and cuDNN (``--peer``)."""
    import pandas as pd

    tut, _ = load_peer_run("tutorial", root)
    tut_early, _ = load_peer_run("tutorial-d128", root)   # an earlier run, d = 128 only
    cud, _ = load_peer_run("cudnn", root)
    if tut is None or cud is None or tut_early is None:
        ch.say("tutorial", "No recorded peer runs (benchmarks/results/" + ", ".join(PEER_RUNS.values()) + ").",
               missing=True)
        return ch.nothing("tut_fwd_lo", "tut_fwd_hi", "tut_bwd_lo", "tut_bwd_hi", "tut_bwd_fail", "cud_fwd_lo",
                          "cud_fwd_hi", "tut_drift", "tut_d64_lo", "tut_d64_hi")
    keys = ["head_dim", "seq", "causal", "pass"]
    both = peer_ratio_table(tut).merge(
        peer_ratio_table(cud)[keys + ["peer", "flashbook_over_peer"]], on=keys, suffixes=("", "_cudnn"))
    early = peer_ratio_table(tut_early)
    both = both.merge(early[keys + ["flashbook_over_peer"]], on=keys, how="left", suffixes=("", "_earlier"))
    d128 = both[both["head_dim"] == 128]
    shown = d128.assign(mask=d128["causal"].map(MASKS))[
        ["seq", "mask", "pass", "peer", "peer_check", "flashbook", "flashbook_over_peer_earlier",
         "flashbook_over_peer", "peer_cudnn", "flashbook_over_peer_cudnn"]]
    shown.columns = ["N", "mask", "pass", "tutorial", "its check", "ours", "x tutorial (run 1)", "x tutorial (run 2)",
                     "cuDNN", "x cuDNN"]
    ch.table("tutorial", "tutorial", shown, lambda s: s.hide(axis="index").format(precision=2, na_rep="-")
             .format("{:.0f}", subset=["tutorial", "ours", "cuDNN"]))   # TFLOP/s; "-": the tutorial failed its check
    fwd, bwd = d128[d128["pass"] == "fwd"], d128[d128["pass"] == "bwd"]
    ratios = pd.concat([fwd["flashbook_over_peer"], fwd["flashbook_over_peer_earlier"]])
    ch.put("tut_fwd_lo", ratios.min(), ".2f"); ch.put("tut_fwd_hi", ratios.max(), ".2f")
    ch.put("tut_bwd_lo", bwd["flashbook_over_peer"].min(), ".1f")
    ch.put("tut_bwd_hi", bwd["flashbook_over_peer"].max(), ".1f")
    ch.put("tut_bwd_fail", int((bwd["peer_check"] == "FAIL").sum()))
    ch.put("cud_fwd_lo", fwd["flashbook_over_peer_cudnn"].min(), ".2f")
    ch.put("cud_fwd_hi", fwd["flashbook_over_peer_cudnn"].max(), ".2f")
    now = fwd.set_index(["seq", "causal"])["peer"]
    then = early[early["pass"] == "fwd"].set_index(["seq", "causal"])["peer"]
    ch.put("tut_drift", 100 * float(((now - then).abs() / then).max()), ".0f")
    d64 = both[(both["head_dim"] == 64) & (both["pass"] == "fwd")]["flashbook_over_peer"]
    ch.put("tut_d64_lo", d64.min(), ".2f"); ch.put("tut_d64_hi", d64.max(), ".2f")


# ---------------------------------------------------------------- what did not help

def _descriptors(ch, root) -> None:
    """Tensor descriptors (TMA) and Triton's automatic warp specialisation."""
    import pandas as pd

    tma_runs, env = load_hopper_experiment(root)
    if tma_runs is None:
        ch.say("descriptors", "No recorded Hopper experiment (benchmarks/results/" + HOPPER_EXPERIMENT + ").",
               missing=True)
        return ch.nothing("tma_lo", "tma_hi", "tma_ws_lo", "tma_ws_hi", "ws_failed", "ws_tried", "hopper_where",
                          "hopper_lo", "hopper_hi", "tma_mean")
    ht = hopper_experiment_table(tma_runs)
    shown = ht.rename(columns={"flashbook": "library TFLOP/s", "cudnn": "cuDNN TFLOP/s",
                               "best_tma": "best descriptor variant", "tma_vs_flashbook": "x library",
                               "best_tma_ws": "best with warp spec.", "tma_ws_vs_flashbook": "x library (ws)",
                               "failed": "did not compile", "tried": "variants"})
    ch.table("descriptors", "descriptors", shown.drop(columns=["head_dim", "best_tma_tflops", "best_tma_ws_tflops"]),
             lambda s: s.hide(axis="index").format(precision=3))
    ch.put("tma_mean", ht["tma_vs_flashbook"].mean(), ".2f")
    ch.put("tma_lo", ht["tma_vs_flashbook"].min(), ".2f"); ch.put("tma_hi", ht["tma_vs_flashbook"].max(), ".2f")
    ch.put("tma_ws_lo", ht["tma_ws_vs_flashbook"].min(), ".2f")
    ch.put("tma_ws_hi", ht["tma_ws_vs_flashbook"].max(), ".2f")
    both = pd.concat([ht["tma_vs_flashbook"], ht["tma_ws_vs_flashbook"]])
    ch.put("hopper_lo", both.min(), ".2f"); ch.put("hopper_hi", both.max(), ".2f")
    ch.put("ws_failed", int(ht["failed"].sum())); ch.put("ws_tried", int(ht["tried"].sum()))
    ch.put("hopper_where", f"{env.get('gpu')}, Triton {env.get('triton')}, {env.get('date_utc', '')[:10]}")


#: the compiled loop lazy rescaling would thin (``score_ops.load_loops``): chapter 10's rung 3,
#: its unmasked main loop, at d = 128 without a mask
LAZY_LOOP = (3, 128, False, "main")


def _rescale_multiplies(loop) -> int:
    """O's rescale multiplies a thread issues per trip of ``loop``: B_r x d over its threads."""
    block_m, _, warps, _ = loop["config"]
    return block_m * loop.name[1] // (32 * warps)


def _rescale_share(loop, block_n: int | None = None) -> float:
    """The most lazy rescaling can save, in %, of a compiled loop's instructions (a row of
    ``load_loops``): O's rescale (``_rescale_multiplies``, d / B_c per score) over all the loop
    issues per score. With wider key tiles (``block_n``) the rescale per score shrinks by
    B_c / block_n and the rest of the loop per score stays as compiled: an estimate, not a
    compiled count."""
    bc, spt = loop["config"][1], loop["scores_per_thread"]
    compiled = _rescale_multiplies(loop) / spt
    rest = loop["instructions"] / spt - compiled
    rescale = compiled * bc / (block_n or bc)
    return 100 * rescale / (rest + rescale)


def _lazy(ch, root) -> None:
    """Lazy rescaling: the compiled loop's bound, and what the recorded run measured."""
    loops = ch.frames.get("loops")
    loop = loops.loc[LAZY_LOOP] if loops is not None and LAZY_LOOP in loops.index else None
    if loop is None:
        ch.nothing("lazy_saved", "lazy_loop", "lazy_fmul")
    else:
        fmul, mine = loop["ops"].get("FMUL", 0), _rescale_multiplies(loop)
        ch.put("lazy_loop", loop["instructions"] / loop["scores_per_thread"], ".1f")
        ch.put("lazy_fmul", f"the loop's {fmul} FMUL instructions a tile per thread include these {mine}"
               if fmul >= mine else f"yet the loop has only {fmul} FMUL instructions a tile per thread")
        ch.put("lazy_saved", _rescale_share(loop), ".0f")
    lazy = variant_table(LAZY_EXPERIMENT, "lazy", root)
    if lazy is None:
        ch.say("lazy", "No recorded lazy-rescaling run (benchmarks/results/" + LAZY_EXPERIMENT + ").", missing=True)
        return ch.nothing("lazy_lo", "lazy_hi", "lazy_err_same", "lazy_saved_best", "lazy_best_bn")
    shown = lazy.assign(mask=lazy["causal"].map(MASKS),
                        best=lazy["best"].str.replace("lazy", "").str.strip().replace("", "library's tiles"))[
        ["dtype", "seq", "mask", "flashbook", "best", "best_tflops", "best_vs_flashbook", "cudnn",
         "best_err", "flashbook_err"]]
    shown.columns = ["dtype", "N", "mask", "library", "lazy, tiles", "lazy", "x library", "cuDNN",
                     "lazy's error", "library's error"]
    ch.table("lazy", "lazy", shown, lambda s: s.hide(axis="index").format(precision=2)
             .format("{:.0f}", subset=["library", "lazy", "cuDNN"])            # TFLOP/s
             .format("{:.1e}", subset=["lazy's error", "library's error"]))   # max |O - float64|, head 0
    ch.put("lazy_lo", lazy["best_vs_flashbook"].min(), ".2f"); ch.put("lazy_hi", lazy["best_vs_flashbook"].max(), ".2f")
    # the same share estimated for the key tiles the best lazy variants used ("BN128 s3": B_c = 128)
    widths = {int(w) for w in lazy["best"].str.extract(r"BN(\d+)")[0].dropna()} or {FIRST_CONFIG.block_n}
    bn = max(widths)
    ch.put("lazy_best_bn", bn)
    ch.put("lazy_saved_best", None if loop is None else _rescale_share(loop, bn), ".0f")
    ch.put("lazy_err_same", "the same" if (lazy["best_err"] <= 1.01 * lazy["flashbook_err"] + 1e-6).all()
           else "not always the same")


def _static(ch, root) -> None:
    """Sequence lengths compiled in."""
    static = variant_table(STATIC_SHAPE_EXPERIMENT, "constexpr", root)
    if static is None:
        ch.say("static", "No recorded static-shape run (benchmarks/results/" + STATIC_SHAPE_EXPERIMENT + ").",
               missing=True)
        return ch.nothing("static_lo", "static_hi", "static_1k")
    shown = static.assign(mask=static["causal"].map(MASKS))[
        ["seq", "mask", "flashbook", "best", "best_tflops", "best_vs_flashbook", "cudnn"]]
    shown.columns = ["N", "mask", "library", "best variant", "its TFLOP/s", "x library", "cuDNN"]
    ch.table("static", "static", shown, lambda s: s.hide(axis="index").format(precision=2)
             .format("{:.0f}", subset=["library", "its TFLOP/s", "cuDNN"]))
    ch.put("static_lo", static["best_vs_flashbook"].min(), ".2f")
    ch.put("static_hi", static["best_vs_flashbook"].max(), ".2f")
    ch.put("static_1k", static[static["seq"] == 1024]["best_tflops"].max(), ".0f")


def _autotune(ch, root) -> None:
    import pandas as pd

    from ..kernels import configs

    for mask in MASKS.values():   # the dK/dV kernel's first fitting preference at d = 128, per mask
        c = configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=mask == "causal")
        ch.put(f"dkdv_{mask}", f"{c.block_m} x {c.block_n}, {c.num_warps} warps, {c.num_stages} stages")
    tune = load_recorded_json(AUTOTUNE_RUN, root)
    runs = [r for r in (tune or {}).get("autotune", []) if "error" not in r]
    if not runs:
        ch.say("autotune", "No recorded autotuning run (benchmarks/results/" + AUTOTUNE_RUN + ").", missing=True)
        return ch.nothing("tune_s_lo", "tune_s_hi", "tuned_fwd", "default_fwd", "tuned_bwd", "default_bwd",
                          "tune_agree")
    ch.table("autotune", "autotune", pd.DataFrame([
        {"mask": MASKS[r["causal"]], "tuning s": r["tuned_first_call_s"],
         "default fwd": r["default_fwd_tflops"], "tuned fwd": r["tuned_fwd_tflops"],
         "default bwd": r["default_bwd_tflops"], "tuned bwd": r["tuned_bwd_tflops"],
         "same results": r["agree"]} for r in runs]).set_index("mask").rename_axis(index=None, columns="mask"))
    full = next(r for r in runs if not r["causal"])
    ch.put("tune_s_lo", min(r["tuned_first_call_s"] for r in runs), ".0f")
    ch.put("tune_s_hi", max(r["tuned_first_call_s"] for r in runs), ".0f")
    for key in ("tuned_fwd", "default_fwd", "tuned_bwd", "default_bwd"):
        ch.put(key, full[key + "_tflops"], ".0f")
    ch.put("tune_agree", "agreed" if all(r["agree"] for r in runs) else "did not agree")


# ---------------------------------------------------------------- the Gluon kernel

def _schedules(ch, root) -> None:
    """Each schedule's fastest configuration beside the chapter-7 kernel and cuDNN."""
    import pandas as pd

    from ..plots import ladder as figures

    gluon128, gluon64 = gluon_schedule_table(128, root), gluon_schedule_table(64, root)
    ch.frames.update(gluon128=gluon128, gluon64=gluon64)
    sched = list(GLUON_SCHEDULES)
    if gluon128 is None or gluon64 is None:
        ch.say("schedules", "No recorded Gluon runs (nothing under benchmarks/results/).", missing=True)
        return ch.nothing("gluon_where", "producer_lo", "producer_hi", "producer_cud_lo", "producer_cud_hi",
                          "overlap_lo", "overlap_hi", "pp_lo", "pp_hi", "gluon_drift_median", "gluon_drift",
                          *(f"{n}_bf16_{e}" for n in ("producer", "producer_cud", "overlap", "pp") for e in ("lo", "hi")),
                          "d64_best", "d64_lo", "d64_hi", "gluon_err", "ws_same_lo", "ws_same_hi")
    gluon_run = load_recorded_json(GLUON_EXPERIMENTS[128], root) or {}
    # warp specialisation itself: both schedules at the same tiles (128 x 128, 3 stages, 8 warps), bf16
    same = pd.DataFrame(gluon_run.get("rows", [])).query("dtype == 'bf16'").pivot_table(
        index=["seq", "causal"], columns="variant", values="tflops")
    ws = same["gluon producer m128 n128 s3"] / same["gluon overlap m128 n128 s3"]
    ch.put("ws_same_lo", ws.min(), ".2f"); ch.put("ws_same_hi", ws.max(), ".2f")
    shape = (gluon128["dtype"] + " " + (gluon128["seq"] // 1024).astype(str) + "K "
             + gluon128["causal"].map(MASKS))
    shown = gluon128.assign(shape=shape)[gluon128["dtype"] == "bf16"][["shape", "flashbook", *sched, "cudnn"]]
    shown.columns = ["shape", "ch. 7", *sched, "cuDNN"]
    ch.table("schedules", "schedules", shown, lambda s: s.hide(axis="index")
             .format("{:.0f}", subset=["ch. 7", *sched, "cuDNN"]))
    ch.figure("schedules", "schedules", lambda: figures.schedules_figure(gluon128[gluon128["dtype"] == "bf16"]))   # as the table
    ch.put("gluon_where", _where(gluon_run.get("environment", {})))
    for name, num, den in (("producer", "producer", "flashbook"), ("producer_cud", "producer", "cudnn"),
                           ("overlap", "overlap", "flashbook"), ("pp", "pingpong", "producer")):
        ratio = gluon128[num] / gluon128[den]
        ch.put(f"{name}_lo", ratio.min(), ".2f"); ch.put(f"{name}_hi", ratio.max(), ".2f")
        bf16 = ratio[gluon128["dtype"] == "bf16"]      # the prose quotes the runs the table shows
        ch.put(f"{name}_bf16_lo", bf16.min(), ".2f"); ch.put(f"{name}_bf16_hi", bf16.max(), ".2f")
    run2 = load_recorded_json("gluon_d128_run2", root)
    if run2 is not None:   # the same sweep, run again later: how far the same variant moved
        index = ["dtype", "seq", "causal", "variant"]
        again = pd.DataFrame(run2["rows"]).set_index(index)["tflops"]
        first = pd.DataFrame(gluon_run["rows"]).set_index(index)["tflops"]
        common = first.index.intersection(again.index)
        moved = 100 * (again[common] - first[common]).abs() / first[common]
        ch.put("gluon_drift_median", float(moved.median()), ".0f"); ch.put("gluon_drift", float(moved.max()), ".0f")
    else:
        ch.nothing("gluon_drift_median", "gluon_drift")
    best64 = gluon64[[*sched]].idxmax(axis=1)
    ch.put("d64_best", ", ".join(sorted(set(best64))))
    ch.put("d64_lo", (gluon64["overlap"] / gluon64["flashbook"]).min(), ".2f")
    ch.put("d64_hi", (gluon64["overlap"] / gluon64["flashbook"]).max(), ".2f")
    errs = pd.concat([gluon128[[f"{s}_err" for s in sched]].max(axis=1) / gluon128["flashbook_err"],
                      gluon64[[f"{s}_err" for s in sched]].max(axis=1) / gluon64["flashbook_err"]])
    ch.put("gluon_err", errs.max(), ".2f")


def _peer_table(ch, topic, frame, columns, ratio_names) -> None:
    """A side-by-side table of recorded ``--peer`` runs (``peer_runs_table``), formatted."""
    shown = frame.assign(mask=frame["causal"].map(MASKS))[["head_dim", "seq", "mask", *columns]]
    shown.columns = ["d", "N", "mask", "tutorial, slowest", "tutorial, fastest", *ratio_names]
    ch.table(topic, topic, shown, lambda s: s.hide(axis="index").format(precision=2)
             .format("{:.0f}", subset=["tutorial, slowest", "tutorial, fastest"]))


def _gluon_peers(ch, root) -> None:
    """The Gluon forward beside the tutorial (five runs, eager) and cuDNN (bf16)."""
    runs = peer_runs_table(GLUON_PEER_RUNS, root=root)
    ch.frames["gluon_peer_runs"] = runs
    cud_gluon, _ = load_peer_run("cudnn-bf16-gluon", root)
    if runs is None or cud_gluon is None:
        ch.say("gluon_peers", "No recorded peer runs with flashbook-gluon (nothing under benchmarks/results/).",
               missing=True)
        return ch.nothing("gl_d128_lo", "gl_d128_hi", "gl_d64_lo", "gl_d64_hi", "gl_below", "gl_first_lo",
                          "gl_first_hi", "tut_first_lo", "tut_first_hi", "gl_cud_lo", "gl_cud_hi", "gl_cud4k_lo",
                          "gl_bwd_lo", "gl_bwd_hi", "gl_runs")
    _peer_table(ch, "gluon_peers", runs, ["peer_lo", "peer_hi", "min", "median", "max"],
                ["x tutorial, min", "median", "max"])
    ch.put("gl_runs", len(GLUON_PEER_RUNS))
    later = runs[runs["seq"] > 1024]
    d128, d64 = runs[runs["head_dim"] == 128], later[later["head_dim"] == 64]
    ch.put("gl_d128_lo", d128["min"].min(), ".2f"); ch.put("gl_d128_hi", d128["max"].max(), ".2f")
    ch.put("gl_d64_lo", d64["min"].min(), ".2f"); ch.put("gl_d64_hi", d64["max"].max(), ".2f")
    ch.put("gl_below", int((runs[list(GLUON_PEER_RUNS)] < 1.05).to_numpy().sum()))
    first = runs[(runs["head_dim"] == 64) & (runs["seq"] == 1024)]
    ch.put("gl_first_lo", first["min"].min(), ".2f"); ch.put("gl_first_hi", first["max"].max(), ".2f")
    causal_1k = first[first["causal"]]   # the tutorial's own speed scatters most on this one
    ch.put("tut_first_lo", causal_1k["peer_lo"].min(), ".0f"); ch.put("tut_first_hi", causal_1k["peer_hi"].max(), ".0f")
    c = peer_ratio_table(cud_gluon)
    fwd, bwd = c[c["pass"] == "fwd"], c[c["pass"] == "bwd"]
    ch.put("gl_cud_lo", fwd["gluon_over_peer"].min(), ".2f"); ch.put("gl_cud_hi", fwd["gluon_over_peer"].max(), ".2f")
    ch.put("gl_cud4k_lo", fwd[fwd["seq"] >= 4096]["gluon_over_peer"].min(), ".2f")
    ch.put("gl_bwd_lo", bwd["gluon_over_peer"].min(), ".2f"); ch.put("gl_bwd_hi", bwd["gluon_over_peer"].max(), ".2f")


def _host(ch, root) -> None:
    """The CPU's microseconds per call, and the timer against a CUDA graph of the call."""
    overhead = host_overhead_tables(root)
    ch.frames["host_timed"] = None if overhead is None else overhead[1]
    if overhead is None:
        ch.say("host", "No recorded host-overhead run (nothing under benchmarks/results/).", missing=True)
        return ch.nothing("host_where", "host_lib", "host_gluon", "host_peer", "host_parts", "host_infl",
                          "host_infl_peer", "host_long", "host_long_impl", "host_long_rest", "host_lib_agree",
                          "host_long_graph", "host_long_ratio")
    host, timed = overhead
    calls = host[host["requires_grad"].eq(False)].set_index("impl")["host_us"]
    parts = host[host["requires_grad"].isna()].set_index("impl")["host_us"]
    shown = host.assign(inputs=host["requires_grad"].map({True: "require grad", False: "plain"}).fillna("-"))
    ch.table("host", "host_calls", shown[["impl", "inputs", "host_us"]].rename(
        columns={"host_us": "CPU microseconds per call"}),
        lambda s: s.hide(axis="index").format("{:.0f}", subset=["CPU microseconds per call"]))
    short = timed.assign(shape=("d=" + timed["head_dim"].astype(str) + " N=" + (timed["seq"] // 1024).astype(str)
                                + "K " + timed["causal"].map(MASKS)))
    ch.table("host", "host_inflation", short.pivot(index="impl", columns="shape", values="inflation").round(2)
             .rename_axis(index=None, columns="impl"),
             lambda s: s.format("{:.2f}").set_caption("timer over CUDA graph (1.00: the host did not show)"))
    ch.put("host_where", _where(load_recorded_json(HOST_OVERHEAD_RUN, root)["environment"]))
    ch.put("host_lib", calls["flashbook forward"], ".0f"); ch.put("host_gluon", calls["gluon forward"], ".0f")
    ch.put("host_peer", calls["peer"], ".0f"); ch.put("host_parts", parts.sum(), ".0f")
    first = short[(short["head_dim"] == 64) & (short["seq"] == 1024) & short["causal"]].set_index("impl")
    ch.put("host_infl", 100 * (first.loc["gluon forward", "inflation"] - 1), ".0f")
    ch.put("host_infl_peer", 100 * (first.loc["peer", "inflation"] - 1), ".0f")
    long = short[short["seq"] == 16384]
    off = (long["inflation"] - 1).abs()
    ch.put("host_long", 100 * off.max(), ".0f")
    ch.put("host_long_impl", long.loc[off.idxmax(), "impl"])                 # the one outlier
    ch.put("host_long_rest", 100 * off.drop(off.idxmax()).max(), ".1f")       # every other 16K pair
    outlier = long.loc[off.idxmax(), "inflation"]                            # timer over graph
    ch.put("host_long_ratio", outlier, ".2f"); ch.put("host_long_graph", 100 * (1 / outlier - 1), ".0f")
    lib = short[short["impl"] == "flashbook forward"]
    ch.put("host_lib_agree", 100 * (lib["inflation"] - 1).abs().max(), ".1f")  # chapter 7's kernel, four shapes


def _graphs(ch, root) -> None:
    """The tutorial comparison again, every forward replayed from a CUDA graph."""
    runs = ch.frames["gluon_peer_runs"]
    graph_runs = peer_runs_table(GLUON_GRAPH_RUNS, root=root)
    if graph_runs is None or runs is None:
        ch.say("graphs", "No recorded --graph peer runs (nothing under benchmarks/results/).",
               missing=True)
        return ch.nothing("gr_where", "gr_n", "gr_d128_verdict", "gr_d128_lo", "gr_d128_hi", "gr_d64_lo",
                          "gr_d64_hi", "gr_below", "gr_peer_1k", "gr_peer_1k_eager")
    graph_prov = load_peer_run(GLUON_GRAPH_RUNS[0], root)[1]
    gr = graph_runs.merge(runs[["head_dim", "seq", "causal", "median"]].rename(columns={"median": "eager"}),
                          on=["head_dim", "seq", "causal"])
    _peer_table(ch, "graphs", gr, ["peer_lo", "peer_hi", "min", "max", "eager"],
                ["x tutorial (graph), min", "max", "x tutorial (eager runs, median)"])
    ch.put("gr_where", f"{graph_prov['gpu']['name']}, {graph_prov['date_utc'][:10]}")
    ch.put("gr_n", len(GLUON_GRAPH_RUNS))
    d128, d64 = gr[gr["head_dim"] == 128], gr[gr["head_dim"] == 64]
    ch.put("gr_d128_lo", d128["min"].min(), ".2f"); ch.put("gr_d128_hi", d128["max"].max(), ".2f")
    ch.put("gr_d64_lo", d64["min"].min(), ".2f"); ch.put("gr_d64_hi", d64["max"].max(), ".2f")
    ch.put("gr_below", int((d64["min"] < 1.05).sum()))
    short128 = int((d128["min"] < 1.05).sum())
    ch.put("gr_d128_verdict", "above 1.05 at every shape" if short128 == 0
           else f"below 1.05 at {short128} of the six shapes")
    one_k = gr[(gr["head_dim"] == 64) & (gr["seq"] == 1024) & gr["causal"]].iloc[0]
    ch.put("gr_peer_1k", one_k["peer_lo"], ".0f")
    ch.put("gr_peer_1k_eager",
           runs[(runs["head_dim"] == 64) & (runs["seq"] == 1024) & runs["causal"]]["peer_lo"].iloc[0], ".0f")


def _fma(ch, root) -> None:
    """Part of the exponentials on the FMA units; two warpgroups per program at d = 64."""
    import pandas as pd

    ch.put("fp16_half_ulp", float(np.finfo(np.float16).eps) / 2, ".1e")
    shares = {d: fma_share_table(d, root) for d in (64, 128)}
    if any(t is None for t in shares.values()):
        ch.say("fma", "No recorded runs of benchmarks/gluon_exp2_experiment.py (nothing under benchmarks/results/).",
               missing=True)
        return ch.nothing("fma_where", "fma2_lo", "fma2_hi", "fma4_lo", "fma4_hi", "fma_noise", "fma_err",
                          "fma_long_n", "fma_1k_noise",
                          "m128_lo", "m128_hi", "m64_lo", "m64_hi")
    variants = ["fma2 deg4", "fma4 deg4", "fma2 deg3", "fma4 deg3"]
    table = pd.concat([t.assign(d=d) for d, t in shares.items()])
    long = table[table["seq"] >= 4096]     # the 1K rows are the host-bound ones
    shown = table.assign(shape=table["dtype"] + " " + (table["seq"] // 1024).astype(str) + "K "
                         + table["causal"].map(MASKS))
    ch.table("fma", "fma", shown[["d", "shape", "share0", *variants, "again"]].rename(
        columns={"share0": "none (TFLOP/s)"}),
        lambda s: s.hide(axis="index").format(precision=2).format("{:.0f}", subset=["none (TFLOP/s)"]))
    ch.put("fma_where", _where(load_recorded_json(GLUON_EXP2_EXPERIMENTS[64], root)["environment"]))
    half, quarter = long[["fma2 deg4", "fma2 deg3"]].to_numpy(), long[["fma4 deg4", "fma4 deg3"]].to_numpy()
    ch.put("fma2_lo", half.min(), ".2f"); ch.put("fma2_hi", half.max(), ".2f")
    ch.put("fma4_lo", quarter.min(), ".2f"); ch.put("fma4_hi", quarter.max(), ".2f")
    ch.put("fma_noise", 100 * (1 - long["again"]).abs().max(), ".0f")
    ch.put("fma_long_n", len(long))                                          # shapes at N >= 4K
    ch.put("fma_1k_noise", 100 * (1 - table[table["seq"] < 4096]["again"]).abs().max(), ".0f")
    errs = table[[f"{v}_err" for v in variants]].max(axis=1) / table["share0_err"]
    ch.put("fma_err", errs.max(), ".2f")
    wide = variant_table("gluon_d64_run2", "gluon overlap m128", root)
    narrow = variant_table("gluon_d64_run2", "gluon overlap m64", root)
    ch.put("m128_lo", wide["best_tflops"].min(), ".0f"); ch.put("m128_hi", wide["best_tflops"].max(), ".0f")
    ch.put("m64_lo", narrow["best_tflops"].min(), ".0f"); ch.put("m64_hi", narrow["best_tflops"].max(), ".0f")


def _wide(ch, root) -> None:
    """Three consumer warpgroups (192-row tiles) at d = 64."""
    import pandas as pd

    ch.put("wide_regs", hopper.CONSUMER_REGS[3])
    wide_runs = ("gluon_d64_wg3", "gluon_d64_run3")
    tables = [(variant_table(f, "gluon producer m192", root), variant_table(f, "gluon overlap m64 n128 s2", root))
              for f in wide_runs]
    wide_graph, _ = load_peer_run(GLUON_WIDE_GRAPH_RUN, root)
    if any(w is None for pair in tables for w in pair) or wide_graph is None or ch.frames["gluon_peer_runs"] is None:
        ch.say("wide", "No recorded runs of the 192-row tiles (nothing under benchmarks/results/).",
               missing=True)
        return ch.nothing("wide_full_lo", "wide_full_hi", "wide_peak", "wide_peak_cudnn", "wide_causal_lo",
                          "wide_causal_hi", "wide_short_causal", "wide_1k_full", "wide_1k_causal")
    both = pd.concat([w.assign(one=o["best_tflops"], gain=w["best_tflops"] / o["best_tflops"])
                      for w, o in tables]).sort_values(["causal", "seq"]).reset_index(drop=True)
    shown = both.assign(mask=both["causal"].map(MASKS))[["seq", "mask", "best", "best_tflops", "one", "gain", "cudnn"]]
    shown.columns = ["N", "mask", "fastest 192-row configuration", "TFLOP/s", "one warpgroup (64 x 128, 2 slots)",
                     "gain", "cuDNN"]
    ch.table("wide", "wide", shown, lambda s: s.hide(axis="index").format(precision=2)
             .format("{:.0f}", subset=["TFLOP/s", "one warpgroup (64 x 128, 2 slots)", "cuDNN"]))
    long = both[both["seq"] >= 3072]      # the 1K rows of these runs are host-bound
    full, causal_rows = long[~long["causal"]], long[long["causal"]]
    ch.put("wide_full_lo", full["gain"].min(), ".2f"); ch.put("wide_full_hi", full["gain"].max(), ".2f")
    peak = long.loc[long["best_tflops"].idxmax()]
    ch.put("wide_peak", peak["best_tflops"], ".0f"); ch.put("wide_peak_cudnn", peak["cudnn"], ".0f")
    from_6k = causal_rows[causal_rows["seq"] >= 6144]["gain"]
    ch.put("wide_causal_lo", from_6k.min(), ".2f"); ch.put("wide_causal_hi", from_6k.max(), ".2f")
    ch.put("wide_short_causal", ", ".join(f"{x:.2f}" for x in causal_rows[causal_rows["seq"] < 6144]["gain"]))
    wide = peer_ratio_table(wide_graph)
    wide = wide[wide["pass"] == "fwd"].set_index(["head_dim", "seq", "causal"])["gluon_over_peer"]
    ch.put("wide_1k_full", wide[(64, 1024, False)], ".2f"); ch.put("wide_1k_causal", wide[(64, 1024, True)], ".2f")


def _short(ch, root) -> None:
    """The graph-timed d = 64 sweeps at short lengths: the fastest configuration of each kind."""
    ch.put("wide_from_full", f"{hopper.WIDE_FROM[False] // 1024}K")
    ch.put("wide_from_causal", f"{hopper.WIDE_FROM[True] // 1024}K")
    ch.put("short_causal_below", f"{hopper.SHORT_CAUSAL_BELOW // 1024}K")
    short = short_sweep_table(root)
    ch.frames["short"] = short
    kinds = [kind for kind, _ in SHORT_FAMILIES]
    if short is None:
        ch.say("short", "No recorded graph-timed d = 64 sweeps (nothing under benchmarks/results/).",
               missing=True)
        return ch.nothing("sh_where", "sh_2k", "sh_1k_wide", "sh_causal", "sh_causal_2k")
    shown = short.assign(N=short["seq"] // 1024, mask=short["causal"].map(MASKS),
                         tiles=short["64 rows config"].str.split("m64 ").str[1])
    ch.table("short", "short", shown[["run", "N", "mask", *kinds, "tiles", "cudnn"]].rename(
        columns={"N": "N (K)", "tiles": "fastest 64-row: keys, slots", "cudnn": "cuDNN"}),
        lambda s: s.hide(axis="index").format("{:.0f}", subset=[*kinds, "cuDNN"], na_rep="-"))
    env = load_recorded_json(GLUON_SHORT_SWEEPS[0], root)["environment"]
    ch.put("sh_where", f"{env['gpu']['name']}, {env['date_utc'][:10]}")
    at = short.set_index(["seq", "causal"])

    def over_old(kind, seq, causal):   # one ratio per run, as "x" or "x to y"
        rows = at.loc[[(seq, causal)]]
        ratio = rows[kind] / rows["old default"]
        lo, hi = f"{ratio.min():.2f}", f"{ratio.max():.2f}"
        return lo if lo == hi else f"{lo} to {hi}"

    ch.put("sh_2k", over_old("192 rows", 2048, False))
    ch.put("sh_1k_wide", over_old("192 rows", 1024, False))
    ch.put("sh_causal", over_old("64 rows", 1024, True))
    ch.put("sh_causal_2k", " and ".join(sorted(set(at.loc[[(2048, True)], "64 rows config"].str.split("m64 ").str[1]))))


def _persistent(ch, root) -> None:
    """The persistent schedule over the same tiles launched one program per query tile."""
    pairs = schedule_pairs(GLUON_SHORT_SWEEPS[1], "persistent", "overlap", root)
    if pairs is None:
        ch.say("persistent", "No recorded persistent run "
                             "(nothing under benchmarks/results/).", missing=True)
        return ch.nothing("pers_lo", "pers_hi", "pers_full_lo", "pers_full_hi", "pers_causal_lo", "pers_causal_hi",
                          "pers_full_n64")
    shape = (pairs["seq"] // 1024).astype(str) + "K " + pairs["causal"].map(MASKS)
    ch.table("persistent", "persistent", pairs.assign(shape=shape).pivot(
        index="tiles", columns="shape", values="first_over_second").rename_axis(index=None, columns="tiles"),
        lambda s: s.format("{:.2f}"))
    ratio = pairs["first_over_second"]
    ch.put("pers_lo", ratio.min(), ".2f"); ch.put("pers_hi", ratio.max(), ".2f")
    old_tiles = ratio[~pairs["causal"] & (pairs["tiles"] == "m64 n128 s2")]   # the old default's, full
    ch.put("pers_full_lo", old_tiles.min(), ".2f"); ch.put("pers_full_hi", old_tiles.max(), ".2f")
    ch.put("pers_full_n64", ratio[~pairs["causal"] & pairs["tiles"].str.contains(" n64 ")].min(), ".2f")
    ch.put("pers_causal_lo", ratio[pairs["causal"]].min(), ".2f")
    ch.put("pers_causal_hi", ratio[pairs["causal"]].max(), ".2f")


def _defaults(ch, root) -> None:
    """Two --graph runs of the tutorial comparison with today's defaults."""
    final = peer_runs_table(GLUON_DEFAULT_GRAPH_RUNS, root=root)
    if final is None:
        ch.say("defaults", "No recorded --graph runs of the current defaults "
                           "(nothing under benchmarks/results/).", missing=True)
        return ch.nothing("fin_where", "fin_lo", "fin_hi", "fin_d64_lo", "fin_d64_hi", "fin_short", "fin_close",
                          "fin_close_ms")
    chosen = [hopper.default_config(d, n, c) for d, n, c in zip(final["head_dim"], final["seq"], final["causal"])]
    shown = final.assign(mask=final["causal"].map(MASKS),
                         default=[f"{s}, {m} x {n}, {st} slots" for m, n, st, s in chosen])
    shown = shown[["head_dim", "seq", "mask", "default", "peer_lo", "peer_hi", "min", "max"]]
    shown.columns = ["d", "N", "mask", "default kernel", "tutorial, slowest", "tutorial, fastest",
                     "x tutorial, min", "max"]
    ch.table("defaults", "defaults", shown, lambda s: s.hide(axis="index").format(precision=2)
             .format("{:.0f}", subset=["tutorial, slowest", "tutorial, fastest"]))
    frame, prov = load_peer_run(GLUON_DEFAULT_GRAPH_RUNS[0], root)
    ch.put("fin_where", _where(prov))
    ch.put("fin_lo", final["min"].min(), ".2f"); ch.put("fin_hi", final["max"].max(), ".2f")
    d64 = final[final["head_dim"] == 64]
    ch.put("fin_d64_lo", d64["min"].min(), ".2f"); ch.put("fin_d64_hi", d64["max"].max(), ".2f")
    short_of = int((final["min"] < 1.05).sum())
    ch.put("fin_short", "none" if short_of == 0 else short_of)
    closest = final.loc[final["min"].idxmin()]
    at = frame[(frame["impl"] == "flashbook-gluon") & (frame["head_dim"] == closest["head_dim"])
               & (frame["seq"] == closest["seq"]) & (frame["causal"] == closest["causal"])]
    ch.put("fin_close", f"{MASKS[bool(closest['causal'])]} attention at d = {closest['head_dim']} "
                        f"and {closest['seq'] // 1024}K ({closest['min']:.2f})")
    ch.put("fin_close_ms", float(at["fwd_ms"].iloc[0]), ".2f")


def build_into(ch) -> None:
    """Add the sections beyond the ladder to ``ch`` (a ``chapter10.Chapter10``), reading the
    results root ``ch.root``."""
    root = ch.root
    for section in (_tutorial, _descriptors, _lazy, _static, _autotune, _schedules, _gluon_peers, _host,
                    _graphs, _fma, _wide, _short, _persistent, _defaults):
        section(ch, root)


def ptx_jobs() -> list[dict]:
    """The two compile jobs of ``ptx_compare`` (``targets.run_job``'s): chapter 7's forward and the
    Gluon kernel for sm_90, bf16, d = 128, causal, each with its default configuration."""
    from ..kernels import configs

    cfg7 = configs.default("forward", cc=90, block_d=128, elem_bytes=2)
    g_m, g_n, g_stages, g_schedule = hopper.default_config(128, 4096, True)
    return [dict(kernel="forward", cc=90, head_dim=128, dtype="bf16", causal=True,
                 config=[cfg7.block_m, cfg7.block_n, cfg7.num_warps, cfg7.num_stages]),
            dict(kernel="gluon_forward", cc=90, head_dim=128, dtype="bf16", causal=True,
                 config=[g_m, g_n, 4, g_stages], schedule=g_schedule)]


def ptx_table(compiled, triton: str | None = None):
    """The table of two compile records (``ptx_jobs``' results): their wgmma instructions in the
    code, the products a wait leaves running and the TMA copy instructions; ``triton``: the
    version that compiled them, named in the table's heading."""
    import pandas as pd

    return pd.DataFrame(
        {"wgmma instructions": [r["tensor_core_ops"] for r in compiled],
         "products a wait leaves running": [", ".join(map(str, r["wgmma_waits"] or [])) or "-" for r in compiled],
         "TMA copy instructions": [r["tma_copies"] for r in compiled],
         "compiled": ["ok" if r["error"] is None else r["error"][:80] for r in compiled]},
        index=pd.Index(["chapter 7 (Triton)", f"Gluon, {compiled[1].get('schedule')}"],
                       name="PTX for sm_90" + (f", Triton {triton}" if triton else "")))


def ptx_compare(workers: int = 2):
    """Chapter 7's forward and the Gluon kernel compiled for sm_90 here (no GPU needed) by
    ``targets.compile_elsewhere`` with the Triton installed: (``ptx_table``, the two compile
    records). Counts are of instructions in the code, not of instructions executed. The chapter
    reads the recorded counts instead (``chapter10_why.ptx_recorded``)."""
    from ..kernels import targets

    compiled = targets.compile_elsewhere(ptx_jobs(), workers=workers)
    return ptx_table(compiled), compiled


FRONT_DOOR_VS_SWEEP = ("fd128_lo", "fd128_hi", "sweep128_lo", "sweep128_hi", "fd_cudnn_moved", "fd_gluon_moved")


def front_door_vs_sweep(ch, rows) -> None:
    """The Gluon forward over cuDNN's at d = 128, N >= 4K (bf16) in the front-door run ("auto") and
    the schedule sweep (producer), and how far each kernel's TFLOP/s moved between the two runs."""
    sweep = ch.frames.get("gluon128")
    at = [r for r in rows if r["head_dim"] == 128 and r["seq"] >= 4096 and r["dtype"] == "bf16"]
    if sweep is None or not at:
        return ch.nothing(*FRONT_DOOR_VS_SWEEP)
    fd, sw, cud, glu = [], [], [], []      # the last two: how far each moved, slower over faster minus one
    for r in at:
        m = sweep[(sweep["dtype"] == "bf16") & (sweep["seq"] == r["seq"]) & (sweep["causal"] == r["causal"])].iloc[0]
        fd.append(r["sdpa-cudnn"]["fwd_ms"] / r["auto"]["fwd_ms"]); sw.append(m["producer"] / m["cudnn"])
        cud.append(slower_over_faster(r["sdpa-cudnn"]["fwd_tflops"] / m["cudnn"]))
        glu.append(slower_over_faster(r["auto"]["fwd_tflops"] / m["producer"]))
    ch.put("fd128_lo", min(fd), ".2f"); ch.put("fd128_hi", max(fd), ".2f")
    ch.put("sweep128_lo", min(sw), ".2f"); ch.put("sweep128_hi", max(sw), ".2f")
    ch.put("fd_cudnn_moved", 100 * max(cud), ".0f"); ch.put("fd_gluon_moved", 100 * max(glu), ".0f")
