"""The measured sections of chapter 9 (``chapter9.build`` calls them in the chapter's
order): speed, memory, the roofline, the targets and the seed's shape
measured (Nsight's counts are ``chapter9_ncu``, the block-size sweep ``chapter9_blocks``, the recorded live cell
``chapter9_live``). Each reads the run ``chapter9`` located, records its
values, tables and figures on the ``Chapter9`` it is given, and says so where the run
lacks what it needs.
"""
from __future__ import annotations

from .costs import GB, attention_flops, attention_hbm_bytes, naive_memory_estimate, roofline_ms
from .harness import shape_label
from .impls import IMPLEMENTATIONS
from .noise import twin_spread   # noqa: F401  (chapter 9 judges by it: measured.twin_spread)
from .chapter9_causal import (CAUSAL_COST_KEYS, CAUSAL_COST_MEASURES, causal_cost,  # noqa: F401  (measured.*)
                              fixed_tiles)
from .readback import (
    PERFORMANCE_TARGETS, SHAPE_KEYS, roofline_ceilings, roofline_points, seed_shape_rows,
    target_summary, target_table, target_verdict,
)
from ..display import span as _span
from ..display import listed, verdict_text
from .chapter10_ladder import HINT, target_tier   # chapter 10's noise rule, its three tiers
from ..plots import benchmarks as plots

#: What a cell that shows a measurement says when no run is recorded.
NO_DATA = ("No recorded results were found (no benchmarks/results/ directory with a "
           "results.csv), so there is nothing measured to show here.")
#: The fused kernels whose patterns the speed section counts.
FUSED = ["sdpa-flash", "sdpa-cudnn", "flashbook"]
#: The implementations the roofline shows.
ROOF_IMPLS = ["naive", "sdpa-flash", "sdpa-cudnn", "flashbook"]
#: Each target of ``PERFORMANCE_TARGETS`` and the name the prose quotes it by.
TARGET_KEYS = {"forward >= 1.15x SDPA-flash": "t_fwd_flash", "backward >= 1.0x SDPA-flash": "t_bwd_flash",
               "peak memory <= 1.1x SDPA-flash": "t_mem_flash", "forward >= 0.9x SDPA-cuDNN": "t_fwd_cudnn",
               "backward >= 0.8x SDPA-cuDNN": "t_bwd_cudnn"}
#: How the figures and tables name ``flashbook-atomic``: its recorded backward added with
#: Triton's default acq_rel ordering; the library's atomic mode now uses relaxed adds (chapter 8).
ATOMIC_LABEL = "flashbook-atomic (acq_rel adds, as recorded)"
#: The same in a figure's legend, on two lines.
ATOMIC_LEGEND = "flashbook-atomic\n(acq_rel adds, as recorded)"


def relabel_legends(fig, label=ATOMIC_LEGEND):
    """``fig`` with ``flashbook-atomic``'s legend entries (and line labels) read ``label``."""
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() == "flashbook-atomic":
                line.set_label(label)
    for legend in list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        for text in legend.get_texts():
            if text.get_text() == "flashbook-atomic":
                text.set_text(label)
    return fig


#: The names of the causal diagonal's numbers (the speed section's last paragraph).
DIAG_KEYS = ("diag_n", "diag_d", "diag_visited", "diag_masked", "diag_excess", "diag_loss",
             "diag_measured", "diag_short_loss", "diag_short_measured", "diag_above", "diag_shapes")


def ceilings(ch):
    """The roof of the GPU that ran the results (``roofline_ceilings``), or None."""
    if not ch.provenance:
        return None
    try:
        return roofline_ceilings(ch.provenance, dtype=ch.dtype if ch.dtype in ("bf16", "fp16") else "bf16")
    except ValueError:           # a GPU the book has no datasheet for
        return None


# ---------------------------------------------------------------- speed

def speed(ch, ceil, noise) -> None:
    """TFLOP/s against N (the figure), the fastest implementations and three patterns;
    ``noise``: ``twin_spread`` of the run (noise.py)."""
    import pandas as pd

    from .. import tiled
    from ..kernels import configs

    df, prov = ch.results, ch.provenance
    if df is None:
        ch.say("fig-tflops", NO_DATA, missing=True)
        ch.nothing("win_fwd", "win_bwd", "win_fwd_close", "fb_fwd_max", "fb_bwd_max", "naive_fwd_max", "peak",
                   "fb_fwd_pct", "peak_source", "bwd_below", "bwd_pairs", "causal_below",
                   "causal_pairs", "fb_gain", "fb_gain_full", "fb_gain_causal", "n_min", "n_max", "naive_bwd_above", "naive_pairs",
                   "bwd_credited", "bwd_executed", "fb_bwd_exec", "fb_exec_above",
                   "fb_exec_pairs", "atomic_fwd_noise", "atomic_wins_note",
                   "naive_bwd_above_exec", "causal_beyond_noise", "diag_measured_half")
        ch.nothing(*DIAG_KEYS)
        return
    # the atomic twin (an old ordering, kept in the run to measure noise) is left out of the figure
    ch.figure("fig-tflops", "tflops", lambda: relabel_legends(plots.tflops_figure(
        df[df["impl"] != "flashbook-atomic"], order=IMPLEMENTATIONS, ceilings=ceil, gpu_name=ch.gpu_name, dtype=ch.dtype)))

    ok = df[df["status"] == "ok"]
    keys = ["head_dim", "seq", "causal"]
    phrases, close = {}, {}
    for p in ("fwd", "bwd"):
        # flashbook-atomic runs flashbook's forward kernel: in the forward the two are one
        # kernel, counted once, by the timing taken under its own name
        runs = ok[ok["impl"] != "flashbook-atomic"] if p == "fwd" else ok
        best = runs.loc[runs.groupby(keys)[f"{p}_tflops"].idxmax()]
        winners = best["impl"].value_counts()
        total = int(winners.sum())
        phrases[p] = ", ".join(f"{impl} at {n} of {total}" for impl, n in winners.items())
        # a win by less than the spread of identical kernels is no win: count those apart
        n_close = 0
        if noise is not None:
            for r in best.itertuples():
                rest = runs[(runs["head_dim"] == r.head_dim) & (runs["seq"] == r.seq)
                            & (runs["causal"] == r.causal) & (runs["impl"] != r.impl)]
                if len(rest) and getattr(r, f"{p}_tflops") / rest[f"{p}_tflops"].max() - 1 <= noise:
                    n_close += 1
        close[p] = n_close
        ch.put(f"win_{p}", phrases[p])
    ch.put("win_fwd_close", close["fwd"])
    ours = ok[ok["impl"] == "flashbook"]
    ch.put("fb_fwd_max", ours["fwd_tflops"].max(), ".0f"); ch.put("fb_bwd_max", ours["bwd_tflops"].max(), ".0f")
    naive = ok[ok["impl"] == "naive"]
    ch.put("naive_fwd_max", naive["fwd_tflops"].max() if len(naive) else None, ".1f")
    ch.put("peak", ceil["peak_tflops"] if ceil else None, "g")
    ch.put("fb_fwd_pct", 100 * ours["fwd_tflops"].max() / ceil["peak_tflops"] if ceil and len(ours) else None,
           ".0f")
    ch.put("peak_source", ceil["peak_source"] if ceil else None)
    # three patterns, counted rather than asserted
    fused = ok[ok["impl"].isin(FUSED)]
    ch.put("bwd_below", int((fused["bwd_tflops"] < fused["fwd_tflops"]).sum())); ch.put("bwd_pairs", len(fused))
    twins = fused.pivot_table(index=["impl", "head_dim", "seq"], columns="causal",
                              values="fwd_tflops").dropna()
    if {False, True} <= set(twins.columns):
        ch.put("causal_below", int((twins[True] < twins[False]).sum())); ch.put("causal_pairs", len(twins))
        ch.put("causal_beyond_noise", int((twins[True] < twins[False] * (1 - noise)).sum())
               if noise is not None else None)
    else:
        ch.nothing("causal_below", "causal_pairs", "causal_beyond_noise")
    n_min, n_max = int(ours["seq"].min()), int(ours["seq"].max())
    ends = ours.pivot_table(index=["head_dim", "causal"], columns="seq", values="fwd_tflops")
    ch.put("fb_gain", 100 * float((ends[n_max] / ends[n_min]).median() - 1), ".0f")
    gain = 100 * (ends[n_max] / ends[n_min] - 1)          # per panel: the mask splits them in two
    for causal, name in ((False, "fb_gain_full"), (True, "fb_gain_causal")):
        g = gain[gain.index.get_level_values("causal") == causal]
        ch.put(name, f"{g.min():.0f} to {g.max():.0f}" if len(g) else None)
    ch.put("n_min", n_min); ch.put("n_max", n_max)
    ch.put("naive_bwd_above", int((naive["bwd_tflops"] > naive["fwd_tflops"]).sum()))
    ch.put("naive_pairs", len(naive))
    # naive autograd keeps P: its backward executes 4 products, not the 5 it is credited
    ch.put("naive_bwd_above_exec", int((naive["bwd_tflops"] * 4 / 5 > naive["fwd_tflops"]).sum()))
    # The backward's credit: the convention counts 5 matrix products per tile pair (2.5 times
    # the forward's 2); our kernels execute 4 in the dK/dV kernel (S, dP, dV, dK) and 3 in
    # the dQ kernel (S and dP again, then dQ), chapter 8.
    products = {"credited": 2 * attention_flops(1, 1, 1, 1, 1, pass_="bwd")
                            // attention_flops(1, 1, 1, 1, 1), "executed": 4 + 3}
    ch.put("bwd_credited", products["credited"]); ch.put("bwd_executed", products["executed"])
    executed = ours["bwd_tflops"] * products["executed"] / products["credited"]
    ch.put("fb_bwd_exec", executed.max(), ".0f")
    ch.put("fb_exec_above", int((executed > ours["fwd_tflops"]).sum())); ch.put("fb_exec_pairs", len(ours))
    # flashbook-atomic runs flashbook's forward kernel: their forward times differ by noise
    fwd_ms = ok.pivot_table(index=keys, columns="impl", values="fwd_ms")
    if noise is not None:
        ch.put("atomic_fwd_noise", 100 * noise, ".1f")
        won = fwd_ms[fwd_ms.idxmin(axis=1) == "flashbook-atomic"]
        others = won.drop(columns=[c for c in won.columns if c.startswith("flashbook")])
        behind = (others.min(axis=1) / won["flashbook-atomic"] - 1).max() if len(won) else None
        ch.put("atomic_wins_note", f"so its {len(won)} fastest forwards mean only that at those "
               f"shapes our forward kernel and the next fastest, {', '.join(sorted(set(others.idxmin(axis=1))))}, "
               f"are within noise of each other (at most {100 * behind:.1f}% apart)" if len(won)
               else "and it is the fastest forward nowhere")
    else:
        ch.put("atomic_fwd_noise", None); ch.put("atomic_wins_note", "not measured in this run")
    # The causal diagonal, counted as chapter 7 counts it: the tiles our forward visits per
    # head (chapter 4's tile_kinds, which chapter 7 checks against the kernel) against the
    # N^2 / 2 pairs the convention credits. If time followed the visited tiles alone, the
    # causal forward would reach 1 / (1 + excess) of the unmasked one's TFLOP/s.
    cc = int(str((prov.get("gpu") or {}).get("capability") or "sm_90").split("_")[1])
    diag = []
    pairs = ours.pivot_table(index=["head_dim", "seq"], columns="causal", values="fwd_tflops")
    for (d, n), r in pairs.dropna().iterrows():
        cfg = configs.default("forward", cc=cc, block_d=configs.block_d(int(d)), elem_bytes=2)
        kinds = tiled.tile_kinds(int(n), int(n), cfg.block_m, cfg.block_n, causal=True)
        visited = int((kinds != "skipped").sum())
        excess = visited * cfg.block_m * cfg.block_n / (n * n / 2) - 1
        diag.append({"head_dim": int(d), "seq": int(n), "visited": visited,
                     "masked": int((kinds == "partial").sum()), "excess": excess,
                     "diagonal loss": 1 - 1 / (1 + excess), "measured loss": 1 - r[True] / r[False]})
    diag = pd.DataFrame(diag)
    ch.tables["causal_diagonal"] = diag
    if len(diag):
        at = diag[(diag["seq"] == 4096) & (diag["head_dim"] == 128)]   # chapter 7's shape
        at = (at if len(at) else diag).iloc[0]
        short = diag[diag["seq"] == diag["seq"].min()]
        ch.put("diag_n", int(at["seq"])); ch.put("diag_d", int(at["head_dim"]))
        ch.put("diag_visited", int(at["visited"]), ","); ch.put("diag_masked", int(at["masked"]))
        ch.put("diag_excess", 100 * at["excess"], ".1f"); ch.put("diag_loss", 100 * at["diagonal loss"], ".1f")
        ch.put("diag_measured", 100 * at["measured loss"], ".1f")
        # the same measurement as the causal-cost split states it: time over half the unmasked time
        ch.put("diag_measured_half", 100 * (1 / (1 - at["measured loss"]) - 1), ".1f")
        ch.put("diag_short_loss", 100 * short["diagonal loss"].max(), ".0f")
        ch.put("diag_short_measured", f"{100 * short['measured loss'].min():.0f} to "
                                      f"{100 * short['measured loss'].max():.0f}")
        ch.put("diag_above", int((diag["measured loss"] > diag["diagonal loss"]).sum()))
        ch.put("diag_shapes", len(diag))
    else:
        ch.nothing(*DIAG_KEYS, "diag_measured_half")

    def headline(p):
        if noise is None or not close[p]:
            return phrases[p]
        return f"{phrases[p]} ({close[p]} of these by less than the {100 * noise:.1f}% noise: within noise)"

    ch.say("speed-numbers", "fastest forward (flashbook-atomic left out: it runs flashbook's "
                            f"forward kernel): {headline('fwd')}")
    ch.say("speed-numbers", f"fastest backward: {headline('bwd')}")



# ---------------------------------------------------------------- memory

def memory(ch) -> None:
    """Peak memory against N (the figure), the shapes that did not run, and how memory grows."""
    import numpy as np
    import pandas as pd

    df, prov = ch.results, ch.provenance
    if df is None:
        ch.say("fig-memory", NO_DATA, missing=True)
        ch.say("memory-status", NO_DATA, missing=True)
        ch.nothing("naive_missing", "naive_where", "naive_oom_from", "naive_max_n", "naive_max_d", "naive_max_gb", "fb_same_gb",
                   "mem_ratio", "others_ran", "fused_mem_spread", "fused_mem_text", "mem_dq_gb",
                   "mem_atomic_bufs", "mem_cudnn_bufs", "mem_flash_bufs", "mem_shape")
        return
    # where a run did not fit, the memory the harness estimated it would need
    frame = df.assign(estimate_bytes=[
        naive_memory_estimate(int(r.batch), int(r.heads), int(r.seq), int(r.seq), int(r.head_dim),
                              elem_bytes=4 if r.impl == "sdpa-math" else 2)
        if r.status in plots.MISSING else np.nan for r in df.itertuples()])
    gpu_memory = (prov.get("gpu") or {}).get("memory_bytes") if prov else None
    ch.figure("fig-memory", "memory", lambda: relabel_legends(plots.memory_figure(
        frame, order=IMPLEMENTATIONS, gpu_name=ch.gpu_name, gpu_memory_bytes=gpu_memory)))

    # one row per (implementation, d, N) that did not run, its masks together: the estimate
    # does not depend on the mask
    not_ok = frame[frame["status"] != "ok"].assign(mask=lambda f: f["causal"].map({False: "full", True: "causal"}))
    if len(not_ok):
        rows = (not_ok.groupby(["head_dim", "seq", "impl", "status"], sort=True)
                .agg(masks=("mask", lambda m: " and ".join(sorted(set(m), key=["full", "causal"].index))),
                     needs_gb=("estimate_bytes", "max")).reset_index())
        rows["needs (GB, estimated)"] = (rows.pop("needs_gb") / GB).round(1)
        rows = rows.rename(columns={"head_dim": "d", "seq": "N"})[
            ["impl", "d", "N", "masks", "status", "needs (GB, estimated)"]]
    else:
        rows = pd.DataFrame({"status": ["every implementation ran at every shape"]})
    ch.table("memory-status", "not_ran", rows)
    naive = df[df["impl"] == "naive"]
    missing = naive[naive["status"] != "ok"]
    first = missing.groupby("head_dim")["seq"].min()
    ch.put("naive_oom_from", " and ".join(f"N = {n // 1024}K at d = {d}" for d, n in first.items())
           or "no shape measured")
    ch.put("naive_missing", ", ".join(shape_label(r.head_dim, r.seq, r.causal)
                                      for r in missing.itertuples()) or "none")
    # did every fused implementation run where naive did not?
    fused = df[~df["impl"].isin(["naive", "sdpa-math"])]
    at = fused.merge(missing[list(SHAPE_KEYS)], on=list(SHAPE_KEYS))
    ch.put("others_ran", "it ran at every shape measured" if missing.empty else
           "every fused implementation ran at those shapes" if (at["status"] == "ok").all() else
           f"{int((at['status'] != 'ok').sum())} fused results are missing there too")
    ch.put("naive_where", "Naive attention ran at every shape measured." if missing.empty else
           "Every fused implementation ran at the shapes where naive attention did not."
           if (at["status"] == "ok").all() else
           f"Where naive attention did not run, {int((at['status'] != 'ok').sum())} fused results are missing too.")
    ran = naive[(naive["status"] == "ok") & ~naive["causal"]]
    if len(ran):
        top = ran.sort_values(["seq", "head_dim"]).iloc[-1]
        ours = df[(df["impl"] == "flashbook") & (df["seq"] == top["seq"])
                  & (df["head_dim"] == top["head_dim"]) & ~df["causal"]].iloc[0]
        ch.put("naive_max_n", int(top["seq"])); ch.put("naive_max_d", int(top["head_dim"]))
        ch.put("naive_max_gb", top["peak_fwd_bwd_bytes"] / GB, ".1f")
        ch.put("fb_same_gb", ours["peak_fwd_bwd_bytes"] / GB, ".2f")
        ch.put("mem_ratio", top["peak_fwd_bwd_bytes"] / ours["peak_fwd_bwd_bytes"], ".0f")
    else:
        ch.nothing("naive_max_n", "naive_max_d", "naive_max_gb", "fb_same_gb", "mem_ratio")
    flat = df[df["impl"].isin(["sdpa-flash", "sdpa-cudnn", "flashbook"]) & (df["status"] == "ok")]
    spread = flat.groupby(["impl", "head_dim", "causal"])["peak_fwd_bwd_bytes"].agg(
        lambda x: x.max() / x.min() - 1)
    ch.put("fused_mem_spread", 100 * float(spread.max()) if len(spread) else None, ".1f")
    ch.put("fused_mem_text", None if not len(spread) else "is the same at every length"
           if 100 * float(spread.max()) < 0.05 else
           f"stays within {100 * float(spread.max()):.1f}% of its value at the shortest length")
    # the fused backends' peaks over ours, in fp32 buffers of dQ's shape (d = 128, N = 4096, no mask)
    at = df[(df["status"] == "ok") & (df["head_dim"] == 128) & (df["seq"] == 4096) & ~df["causal"]].set_index("impl")
    if {"flashbook", "flashbook-atomic", "sdpa-cudnn", "sdpa-flash"} <= set(at.index):
        r = at.loc["flashbook"]
        dq32 = r["batch"] * r["heads"] * r["seq"] * r["head_dim"] * 4
        ch.put("mem_shape", f"B = {int(r['batch'])}, H = {int(r['heads'])}, N = {int(r['seq'])}, d = 128")
        ch.put("mem_dq_gb", dq32 / GB, ".2f")
        for impl, key in (("flashbook-atomic", "atomic"), ("sdpa-cudnn", "cudnn"), ("sdpa-flash", "flash")):
            ch.put(f"mem_{key}_bufs", (at.loc[impl, "peak_fwd_bwd_bytes"] - r["peak_fwd_bwd_bytes"]) / dq32, ".2f")
    else:
        ch.nothing("mem_dq_gb", "mem_atomic_bufs", "mem_cudnn_bufs", "mem_flash_bufs", "mem_shape")


# ---------------------------------------------------------------- the roofline

def roofline(ch, ceil):
    """Every measured time as a point under the chip's roof (the figure); the points."""
    import numpy as np

    df = ch.results
    if df is None or ceil is None:
        ch.say("fig-roofline", NO_DATA if df is None else
               "The GPU is not in runtime.CHIPS: no datasheet roof to draw.", missing=True)
        return None
    points = roofline_points(df, ROOF_IMPLS)
    attainable = np.minimum(ceil["peak_tflops"], points["intensity"] * ceil["hbm_tb_s"])
    points["of roof"] = points["tflops"] / attainable
    ch.tables["roofline_points"] = points
    ch.figure("fig-roofline", "roofline", lambda: plots.roofline_figure(points, ceil, impls=ROOF_IMPLS))
    return points


def roofline_numbers(ch, points, ceil) -> None:
    """Where naive attention and our kernel sit on the roofline, in words."""
    if points is None:
        ch.nothing("ridge", "roof_source", "bw_source", "roof_chip", "naive_ai", "fb_ai",
                   "naive_roof_pct", "fb_roof_pct", "all_below", "roof_why", "naive_side",
                   "fb_side", "fb_ai_fwd", "fb_ai_bwd")
        return
    naive_pts = points[points["impl"] == "naive"]
    ours_pts = points[points["impl"] == "flashbook"]
    ch.put("ridge", ceil["ridge"], ".0f"); ch.put("roof_source", ceil["peak_source"])
    ch.put("bw_source", ceil["hbm_source"]); ch.put("roof_chip", ceil["chip"])
    ch.put("naive_ai", _span(naive_pts["intensity"], ",.0f")); ch.put("fb_ai", _span(ours_pts["intensity"], ",.0f"))
    per_pass = ours_pts.groupby("pass")["intensity"].median()
    ch.put("fb_ai_fwd", per_pass.get("fwd"), ".0f"); ch.put("fb_ai_bwd", per_pass.get("bwd"), ".0f")
    ch.put("naive_roof_pct", _span(100 * naive_pts["of roof"]))
    ch.put("fb_roof_pct", _span(100 * ours_pts["of roof"]))
    below = bool((points["of roof"] <= 1 + 1e-9).all())
    ch.put("roof_why", "the provenance records no measured ceilings"
           if {ceil["peak_source"], ceil["hbm_source"]} == {"datasheet"}
           else "as the provenance records them")

    def side(pts):
        left, right = (pts["intensity"] < ceil["ridge"]), (pts["intensity"] >= ceil["ridge"])
        return ("left of the ridge at every shape: memory-bound" if left.all() else
                "right of the ridge at every shape: HBM bandwidth is not what limits it"
                if right.all() else f"left of the ridge at {int(left.sum())} of {len(pts)} points")

    ch.put("naive_side", side(naive_pts) if len(naive_pts) else None)
    ch.put("fb_side", side(ours_pts) if len(ours_pts) else None)
    ch.put("all_below", "every point lies under the roof" if below
           else "some points lie above the roof, so a ceiling is wrong")
    if not below:
        raise ValueError(f"measured points must lie under the roof:\n{points[points['of roof'] > 1]}")
    ch.table("roofline-numbers", "roofline_medians",
             points.groupby(["impl", "pass"])[["intensity", "tflops", "of roof"]].median().round(2),
             printed=True)


# ---------------------------------------------------------------- the targets

def _cell(r) -> str:
    """One target's cell: the ratio to three digits (more where fewer would read as the other
    side of the threshold) and a tick, a cross, or "≈" within the noise."""
    if r["verdict"] is None:
        return "not measured"
    if r["verdict"] == "within noise":
        return f"{r['ratio']:.3f} \u2248"
    shown = verdict_text(r["ratio"], r["threshold"], bool(r["met"]), digits=3)
    return shown + " (hint)" if r["verdict"] == HINT else shown


def _target_cells(table):
    text = table.apply(_cell, axis=1)
    wide = (table.assign(cell=text)
            .pivot_table(index=["head_dim", "seq", "causal"], columns="target", values="cell",
                         aggfunc="first"))
    order = [t.label for t in PERFORMANCE_TARGETS if t.label in wide.columns]
    wide = wide[order].fillna("")
    wide.index = wide.index.set_names(["d", "N", "causal"])
    return wide


def default_call(ch) -> None:
    """The default call's forward (on Hopper, chapter 10's Gluon kernel) against cuDNN's, from
    the separate front-door run that book/which_kernel.md reads: at the cuDNN forward goal's
    shapes, and over the whole run; beside it the Triton forward of the same run.
    ``auto_over_cudnn_fwd`` is cuDNN's time over ours (above 1, ours is faster)."""
    from .runs import load_recorded_json

    names = ("fd_fwd_goal", "fd_triton_goal", "fd_fwd_all", "fd_shapes")
    run = load_recorded_json("front_door", ch.root)
    goal = {x.label: x for x in PERFORMANCE_TARGETS}["forward >= 0.9x SDPA-cuDNN"]
    rows = [] if run is None else run["rows"]
    at = [r for r in rows if r["head_dim"] in goal.head_dims and r["seq"] >= goal.min_seq]
    if not at:
        ch.nothing(*names, "fd_goal_shapes", "fd_sweep_goal")
        return
    ch.put("fd_goal_shapes", " and ".join(f"{n // 1024}K" for n in sorted({r["seq"] for r in at})))
    ch.put("fd_fwd_goal", _span([r["auto_over_cudnn_fwd"] for r in at], ".2f"))
    ch.put("fd_triton_goal", _span([r["triton_over_cudnn_fwd"] for r in at], ".2f"))
    ch.put("fd_fwd_all", _span([r["auto_over_cudnn_fwd"] for r in rows], ".2f"))
    ch.put("fd_shapes", len(rows))
    # chapter 10's Gluon sweep, another run of the same forward, at the same goal's shapes
    from .experiments import gluon_schedule_table

    sweep = gluon_schedule_table(goal.head_dims[0], ch.root)
    if sweep is not None:
        sweep = sweep[(sweep["dtype"] == "bf16") & (sweep["seq"] >= goal.min_seq)]
    ch.put("fd_sweep_goal", _span(list(sweep["producer"] / sweep["cudnn"]), ".2f")
           if sweep is not None and len(sweep) else None)


def targets(ch, noise, noise_runs=None) -> None:
    """The targets' thresholds, then each shape's ratio and verdict (``noise``:
    ``twin_spread`` of the run; ``noise_runs``: chapter 10's hint bound, its
    ``chapter10_lab.noise_runs``), and the counts."""
    t = {x.label: x for x in PERFORMANCE_TARGETS}
    if set(TARGET_KEYS) != set(t):
        raise ValueError(f"the prose names every target once: {sorted(set(TARGET_KEYS) ^ set(t))}")
    for label, key in TARGET_KEYS.items():
        ch.put(key + "_thr", t[label].threshold)
    goal = t["forward >= 0.9x SDPA-cuDNN"]
    ch.put("goal_d", goal.head_dims[0]); ch.put("goal_n", f"{goal.min_seq // 1024}K")
    df = ch.results
    if df is None:
        ch.say("target-table", NO_DATA, missing=True)
        ch.say("target-summary", NO_DATA, missing=True)
        for key in TARGET_KEYS.values():
            ch.nothing(key, key + "_missed", key + "_close", key + "_met", key + "_hint", key + "_n", key + "_span")
        ch.nothing("t_noise", "t_noise_runs", "t_mem_ratio", "cudnn_bwd_span", "t_cudnn_hints")
        return
    # exercise 2's backward: cuDNN's time over ours at the goals' head dimension, every length
    bwd = df[(df["status"] == "ok") & (df["head_dim"] == goal.head_dims[0])].pivot_table(
        index=["seq", "causal"], columns="impl", values="bwd_ms")
    ch.put("cudnn_bwd_span", _span(list((bwd["sdpa-cudnn"] / bwd["flashbook"]).dropna()), ".2f")
           if {"flashbook", "sdpa-cudnn"} <= set(bwd.columns) else None)
    table = target_table(df, impl="flashbook")
    table["verdict"] = [target_tier(r.ratio, r.threshold, r.met, noise, noise_runs) for r in table.itertuples()]
    summary = target_summary(table)
    ch.tables["target_rows"] = table
    ch.put("t_noise", 100 * noise if noise is not None else None, ".1f")
    ch.put("t_noise_runs", 100 * noise_runs if noise_runs is not None else None, ".1f")
    mem = table[table["target"] == "peak memory <= 1.1x SDPA-flash"]["ratio"].dropna()
    ch.put("t_mem_ratio", (f"{mem.min():.2f}" if f"{mem.min():.2f}" == f"{mem.max():.2f}"
                           else _span(list(mem), ".2f")) if len(mem) else None)
    ch.table("target-table", "targets", _target_cells(table))
    # each target's ratios over the shapes it applies to, as the summary quotes them
    for label, key in TARGET_KEYS.items():
        ratios = table[table["target"] == label]["ratio"].dropna()
        ch.put(key + "_span", _span(list(ratios), ".2f") if len(ratios) else None)
    counts = (table.groupby("target")["verdict"].value_counts().unstack(fill_value=0)
              .reindex(index=[t.label for t in PERFORMANCE_TARGETS],
                       columns=["met", "within noise", HINT, "missed"], fill_value=0))
    counts.index.name = None
    ch.table("target-summary", "target_counts", counts)
    for label, key in TARGET_KEYS.items():
        s = summary.loc[label]
        said = (f"at {s['met']} of the {s['measured']} shapes measured"
                + (f" ({s['shapes'] - s['measured']} not measured)" if s["shapes"] > s["measured"] else ""))
        ch.put(key, said)
        rows = table[table["target"] == label]
        for name, which in (("_missed", "missed"), ("_close", "within noise"), ("_met", "met"), ("_hint", HINT)):
            ch.put(key + name, "; ".join(f"{shape_label(r.head_dim, r.seq, r.causal)} ({r.ratio:.3f})"
                                         for r in rows[rows["verdict"] == which].itertuples()) or "none")
        ch.put(key + "_n", ", ".join(("a " if which == HINT else "") + f"{which} at {int(counts.loc[label, which])}"
                                    for which in ("met", "missed", HINT, "within noise") if counts.loc[label, which]))
    # the hints against cuDNN, named: which way each leans is its cell's tick or cross
    hints = [f"the {t.split()[0]} at {r.seq // 1024}K{' causal' if r.causal else ''} ({r.ratio:.3f})"
             for t in ("forward >= 0.9x SDPA-cuDNN", "backward >= 0.8x SDPA-cuDNN")
             for r in table[(table["target"] == t) & (table["verdict"] == HINT)].itertuples()]
    ch.put("t_cudnn_hints", listed(hints))


# ---------------------------------------------------------------- the seed's shape, measured

def _seed_rows_table(rows):
    import pandas as pd

    return pd.DataFrame([
        {"implementation": ATOMIC_LABEL if r.impl == "flashbook-atomic" else r.impl, "status": r.status,
         "forward memory (GB)": r.peak_fwd_bytes / GB,
         "fwd + bwd memory (GB)": r.peak_fwd_bwd_bytes / GB,
         "forward (ms)": r.fwd_ms, "backward (ms)": r.bwd_ms,
         "forward TFLOP/s": r.fwd_tflops, "backward TFLOP/s": r.bwd_tflops}
        for r in rows.itertuples() if r.impl != "flashbook-atomic"]).set_index("implementation")


def seed_measured(ch, check, ceil) -> None:
    """The measured shapes nearest the seed article's: first the nearest with its d (the shape
    ``_seed_compare`` sets beside the article's times), then the nearest in B, H and N, with the
    first section's floor at it."""
    df = ch.results
    if df is None:
        ch.say("seed-measured", NO_DATA, missing=True)
        ch.nothing("seed_why", "seed_why_128", "seed_naive", "seed_fb", "seed_floor_ms", "seed_floor_ok",
                   "seed_near", "seed_near_128", "seed_atomic_bwd", "atomic_bwd_span")
        return
    seed_rows, seed_why = seed_shape_rows(df)
    d128 = df[df["head_dim"] == check.d]
    nearest = "Nearest measured shape"
    if len(d128) and seed_rows["head_dim"].iloc[0] != check.d:
        rows128, why128 = seed_shape_rows(d128)
        ch.say("seed-measured", f"Nearest with the seed's d = {check.d}: {_near(why128)}")
        ch.table("seed-measured", "seed_measured_d", _seed_rows_table(rows128).round(3))
        ch.put("seed_why_128", why128)
        ch.put("seed_near_128", _near(why128))
        _seed_compare(ch, check, rows128)
        nearest = "Nearest in B, H and N"
    else:
        ch.put("seed_why_128", "the same shape"); ch.put("seed_near_128", "the same shape")
    ch.say("seed-measured", f"{nearest}: {_near(seed_why)}")
    ch.table("seed-measured", "seed_measured", _seed_rows_table(seed_rows).round(3))
    ch.put("seed_why", seed_why)
    ch.put("seed_near", _near(seed_why))
    by = seed_rows.set_index("impl")
    r0 = seed_rows.iloc[0]
    inputs_gb = 3 * r0["batch"] * r0["heads"] * r0["seq"] * r0["head_dim"] * 2 / GB
    said_inputs = False
    for impl, key, name in (("naive", "naive", "naive attention's"), ("flashbook", "fb", "our kernel's")):
        if impl not in by.index:
            ch.put(f"seed_{key}", f"{name} forward was not measured")
        elif by.loc[impl, "status"] != "ok":
            ch.put(f"seed_{key}", f"{name} forward did not run ({by.loc[impl, 'status']}: "
                                  f"{by.loc[impl, 'note']})")
        else:
            # the inputs' size is said once, after naive attention's
            ch.put(f"seed_{key}", f"{name} forward took {by.loc[impl, 'fwd_ms']:.2f} ms and held "
                                  f"{by.loc[impl, 'peak_fwd_bytes'] / GB:.2f} GB beyond "
                                  + ("the inputs" if impl != "naive" and said_inputs else f"the {inputs_gb:.2f} GB of Q, K and V"))
            said_inputs = True
    # the arithmetic of the first section, applied to these measurements
    b, h, n, d = (int(r0[k]) for k in ("batch", "heads", "seq", "head_dim"))
    chip = ceil["chip"] if ceil else "H200"
    floor = roofline_ms(attention_flops(b, h, n, n, d), attention_hbm_bytes(b, h, n, n, d), chip,
                        ch.dtype if ch.dtype in ("bf16", "fp16") else "bf16")["floor_ms"]
    ch.put("seed_floor_ms", floor, ".2f")
    # every fused forward is held to the floor, flashbook-atomic's too; the prose counts the table's rows
    fused_fwd = seed_rows[(seed_rows["status"] == "ok") & ~seed_rows["impl"].isin(["naive", "sdpa-math"])]
    above = bool((fused_fwd["fwd_ms"] >= floor).all())
    shown = int((fused_fwd["impl"] != "flashbook-atomic").sum())
    ch.put("seed_floor_ok", f"all {shown} fused forward times in that table are above it" if above
           else "a measured time is below it, so something is wrong")
    if not above:
        raise ValueError(f"measured times must not be below the floor:\n{fused_fwd[fused_fwd['fwd_ms'] < floor]}")
    # flashbook-atomic's backward against flashbook's at the first of these shapes
    if {"flashbook", "flashbook-atomic"} <= set(by.index) and (by.loc[["flashbook", "flashbook-atomic"], "status"] == "ok").all():
        ch.put("seed_atomic_bwd", by.loc["flashbook-atomic", "bwd_ms"] / by.loc["flashbook", "bwd_ms"], ".1f")
    else:
        ch.put("seed_atomic_bwd", None)
    bwd = df[df["status"] == "ok"].pivot_table(index=list(SHAPE_KEYS), columns="impl", values="bwd_ms")
    ch.put("atomic_bwd_span", _span(list((bwd["flashbook-atomic"] / bwd["flashbook"]).dropna()), ".1f")
           if {"flashbook", "flashbook-atomic"} <= set(bwd.columns) else None)


def _seed_compare(ch, check, rows) -> None:
    """The article's claimed A100 times beside the A100's floor at the seed's shape and the
    times measured at the nearest shape with the seed's d (naive attention and ours)."""
    import pandas as pd

    by = rows.set_index("impl")
    r0 = rows.iloc[0]
    measured = f"{ch.gpu_name or 'GPU'} measured (ms), H = {int(r0['heads'])}"
    table = []
    for impl, ours, name in (("naive", "naive", "naive attention"), ("flash", "flashbook", "FlashAttention")):
        for p, pass_name in (("fwd", "forward"), ("bwd", "backward")):
            ok = ours in by.index and by.loc[ours, "status"] == "ok"
            table.append({"": f"{name}, {pass_name}",
                          "article, A100 (ms)": check.claims[f"{impl}_{p}_time"].claimed,
                          "A100 floor (ms)": check.floor_ms[(impl, p, False)],
                          measured: by.loc[ours, f"{p}_ms"] if ok else float("nan")})
    ch.say("seed-compare", f"The article's times, the A100's floor at its shape (H = {check.heads}), "
                           f"and the times measured at the nearest shape with its d = {check.d}:")
    ch.table("seed-compare", "seed_compare", pd.DataFrame(table).set_index("").round(2))


def _near(why: str) -> str:
    """``seed_shape_rows``' phrase as the prose quotes it: "B=8, H=32, N=4096, d=64 (the
    seed's B, H and N, but d=64 instead of 128)"."""
    shape, sep, rest = why.partition(", the closest measured shape: ")
    return f"{shape} ({rest})" if sep else why
