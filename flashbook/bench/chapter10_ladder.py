"""Chapter 10's whole ladder (every rung at every recorded shape, beside SDPA's backends in the
full comparison) and the book's goals against cuDNN: the tables, figures and glued values of the
chapter's last measured sections. ``chapter10.build`` calls ``whole_ladder`` and ``goals``."""
from __future__ import annotations

from ..kernels.ladder import RUNGS
from .chapter_data import ChapterData
from .harness import shape_label
from .readback import PERFORMANCE_TARGETS, target_table, target_verdict

#: What a cell that shows the measured ladder says when none is recorded.
NO_DATA = ("No recorded ladder was found (no benchmarks/results/ directory with a "
           "ladder.csv), so there is nothing measured to show here.")
#: The columns that name one shape of the ladder (a pass aside).
SHAPE = ["head_dim", "seq", "causal"]

#: The full comparison's implementations drawn beside the ladder.
BASELINES = ("sdpa-flash", "sdpa-cudnn")


def _baseline(df, impl, r, column="fwd_tflops"):
    """``column`` of ``impl`` at row ``r``'s shape (batch, heads, seq, head_dim, mask) in the
    full comparison, or None."""
    if df is None:
        return None
    hit = df[(df["impl"] == impl) & (df["status"] == "ok") & (df["batch"] == r["batch"])
             & (df["heads"] == r["heads"]) & (df["seq"] == r["seq"])
             & (df["head_dim"] == r["head_dim"]) & (df["causal"] == r["causal"])]
    return float(hit[column].iloc[0]) if len(hit) else None


def _baselines(df, frame, column):
    """One row per shape of ``frame`` and baseline the full comparison measured there."""
    import pandas as pd

    rows = []
    for _, r in frame.sort_values("rung").drop_duplicates(SHAPE).iterrows():
        for impl in BASELINES:
            value = _baseline(df, impl, r, column)
            if value is not None:
                rows.append({"impl": impl, **{k: r[k] for k in SHAPE}, "tflops": value})
    return pd.DataFrame(rows, columns=["impl", *SHAPE, "tflops"])


#: The backward figure's legend for the ladder's atomic rung: it was timed with Triton's default
#: ordering, where the library's atomic mode now asks for relaxed adds (chapter 8).
ATOMIC_AS_RECORDED = "dQ atomic (acq_rel adds, as recorded)"


def _as_recorded(fig):
    """``fig`` (``plots.ladder.backward_figure``) with its "dQ atomic" legend entry saying which
    atomic adds the ladder timed."""
    for ax in fig.axes:
        legend = ax.get_legend()
        for text in legend.get_texts() if legend is not None else []:
            if text.get_text() == "dQ atomic":
                text.set_text(ATOMIC_AS_RECORDED)
    return fig


def whole_ladder(ch: ChapterData) -> None:
    import pandas as pd

    from ..plots import ladder as figures

    fsteps, bsteps, df = ch.frames["fsteps"], ch.frames["bsteps"], ch.frames["results"]
    if fsteps is None:
        for topic in ("ladder_figure", "backward_figure"):
            ch.say(topic, NO_DATA, missing=True)
        return ch.nothing("best_rung_by_shape", "first_to_last_lo", "first_to_last_hi", "flash_beaten",
                          "flash_pairs", "cudnn_below", "cudnn_pairs", "cudnn_above_shapes", "cudnn_above_within")
    # every rung at every shape: the staircase figure (the rung-by-rung tables give the numbers)
    names = [r.name for r in RUNGS]
    forward_refs, backward_refs = _baselines(df, fsteps, "fwd_tflops"), _baselines(df, bsteps, "bwd_tflops")
    ceiling = max(fsteps["tflops"].max(), df["fwd_tflops"].max() if df is not None else 0)
    ch.figure("ladder_figure", "ladder", lambda: figures.ladder_figure(
        fsteps, forward_refs, rung_names=names, gpu_name=ch.gpu_name, ceiling=ceiling))
    labelled = bsteps.assign(label=[shape_label(d, n, c) for d, n, c in
                                    zip(bsteps["head_dim"], bsteps["seq"], bsteps["causal"])])
    ch.figure("backward_figure", "backward", lambda: _as_recorded(figures.backward_figure(
        labelled, backward_refs, gpu_name=ch.gpu_name)))

    winners = []            # per shape: the rung with the largest gain, or a tie within the noise
    for shape, rows in fsteps.groupby(SHAPE):
        ranked = rows.sort_values("vs_prev", ascending=False)
        close = ranked[ranked["vs_prev"] >= ranked["vs_prev"].iloc[0] / (1 + ch.noise)]
        winners.append((ranked["name"].iloc[0] if len(close) == 1 else None, shape, list(close["name"])))
    counts = pd.Series([w for w, _, _ in winners if w is not None], dtype=object).value_counts()
    tied = [names for w, _, names in winners if w is None]
    ch.put("best_rung_by_shape", "; ".join([f"{name} at {k} shapes" for name, k in counts.items()] + (
        [f"a tie within the noise at {len(tied)} shapes (between "
         f"{', '.join(sorted({n for names in tied for n in names}))})"] if tied else [])))
    last = fsteps[fsteps["name"] == RUNGS[-1].name]
    ch.put("first_to_last_lo", last["vs_first"].min(), ".2f"); ch.put("first_to_last_hi", last["vs_first"].max(), ".2f")
    beats = [(t, b) for t, b in ((r["tflops"], _baseline(df, "sdpa-flash", r)) for _, r in last.iterrows())
             if b is not None]
    ch.put("flash_beaten", sum(t > b for t, b in beats)); ch.put("flash_pairs", len(beats))
    below = [(t, b) for t, b in ((r["tflops"], _baseline(df, "sdpa-cudnn", r)) for _, r in last.iterrows())
             if b is not None]
    ch.put("cudnn_below", sum(t < b for t, b in below)); ch.put("cudnn_pairs", len(below))
    above = [shape_label(r["head_dim"], r["seq"], r["causal"]) for _, r in last.iterrows()
             if (b := _baseline(df, "sdpa-cudnn", r)) is not None and r["tflops"] >= b]
    ch.put("cudnn_above_shapes", " and ".join(above) if above else "none")
    # those shapes within the full comparison alone: the same kernel over cuDNN, one run
    within = [(_baseline(df, "flashbook", r), _baseline(df, "sdpa-cudnn", r)) for _, r in last.iterrows()
              if shape_label(r["head_dim"], r["seq"], r["causal"]) in above]
    ratios = [a / b for a, b in within if a and b]
    ch.put("cudnn_above_within", "n/a" if not ratios else " and ".join(f"{x:.2f}" for x in ratios)
           + " times cuDNN's speed there" + (": ties within the noise" if all(abs(x - 1) <= ch.noise for x in ratios)
                                             else ""))


#: The noise rule's middle tier, as a target's verdict: off the threshold by more than this
#: run's noise but by no more than ``noise_runs``, the largest gap between identical kernels in
#: any recorded run (``chapter10_lab.noise_runs``).
HINT = "hint"


def target_tier(ratio, threshold, met, noise, noise_runs):
    """``target_verdict`` by the noise rule's three tiers: "within noise", then ``HINT``, then
    "met" or "missed" (None when not measured). Chapters 9 and 10 judge their targets by it."""
    verdict = target_verdict(ratio, threshold, met, noise)
    if verdict in ("met", "missed") and noise_runs is not None and abs(ratio / threshold - 1) <= noise_runs:
        return HINT
    return verdict


def goals(ch: ChapterData) -> None:
    """The kernel against cuDNN, judged by the book's goals, within the full comparison."""
    df = ch.frames["results"]
    goals = [t for t in PERFORMANCE_TARGETS if t.kind == "goal"]
    for t in goals:
        ch.put(f"goal_{t.metric}", t.threshold, "g")
    if df is None:
        return ch.nothing("goal_fwd_met", "goal_bwd_met", "goal_fwd_n", "goal_bwd_n", "goal_fwd_lo", "goal_fwd_hi",
                          "goal_bwd_lo", "goal_bwd_hi", "goal_fwd_gap", "goal_bwd_gap", "goal_fwd_need",
                          "goal_bwd_need", "goal_verdict", "goal_fwd_vs_noise", "goal_bwd_vs_noise")
    table = target_table(df, targets=goals)
    # within this run's noise of the goal: neither met nor missed, by the measurement; within
    # the largest recorded gap, a hint (the "goal met" column says which way it leans)
    table["vs noise"] = [target_tier(r.ratio, r.threshold, r.met, ch.noise, ch.noise_runs) or "n/a"
                         for r in table.itertuples()]
    # d = 128 at every row (the goals' shapes); "vs noise" says met, missed, a hint or within noise
    table["goal met"] = table["met"].map({True: "yes", False: "no"}).fillna("n/a")
    ch.table("goals", "goals", table.set_index(["target", "seq", "causal"])[["ratio", "goal met", "vs noise"]].round(3))
    for t in goals:
        rows = table[(table["target"] == t.label) & table["met"].notna()]
        ch.put(f"goal_{t.metric}_met", int((rows["met"] == True).sum()))        # noqa: E712
        ch.put(f"goal_{t.metric}_n", len(rows))
        ch.put(f"goal_{t.metric}_lo", rows["ratio"].min(), ".2f")
        ch.put(f"goal_{t.metric}_hi", rows["ratio"].max(), ".2f")
        best = rows["ratio"].max()
        ch.put(f"goal_{t.metric}_gap", f"short by at least {t.threshold - best:.2f}" if best < t.threshold
               else f"its best shape clears it by {best - t.threshold:.2f}")
        # the speed-up still needed at the worst shape to reach the goal
        ch.put(f"goal_{t.metric}_need", 100 * (t.threshold / rows["ratio"].min() - 1), ".0f")
        said = rows["vs noise"].value_counts()
        ch.put(f"goal_{t.metric}_vs_noise", ", ".join(("a " if word == HINT else "") + f"{word} at {said[word]}"
                                                      for word in ("missed", HINT, "within noise", "met")
                                                      if word in said))
    judged = table[table["met"].notna()]
    met = int((judged["met"] == True).sum())                                   # noqa: E712
    met_rows = judged[judged["met"] == True]                                  # noqa: E712
    close = met > 0 and (met_rows["vs noise"] == "within noise").all()       # met, but by less than the noise
    ch.put("goal_verdict", "not met" if met == 0 else "met" if met == len(judged)
           else f"met at only {met} of {len(judged)} shape-goal pairs" + (
               (", and that one by less than the noise" if met == 1 else ", each by less than the noise")
               if close else ""))


#: The names ``dq_lesson`` puts: the ladder's highest atomic-over-separate ratio, its shape, and
#: the two backwards' times there in the ladder and in the atomic-dQ experiment (both runs); every
#: ladder ratio above the experiment's range; how much faster the ladder's separate backward ran
#: there; the relaxed adds' cost without a mask at d = 64 and 128, at d = 128 with the experiment's
#: 64 x 128 dK/dV tiles and under the causal mask (where they are the default), and acq_rel's
#: without a mask; the relaxed adds' cost with the better of the two tile shapes at each shape.
DQ_TOP = ("dq_top", "dq_top_shape", "dq_top_atomic_ms", "dq_exp_atomic_ms", "dq_top_separate_ms",
          "dq_exp_separate_ms", "dq_above", "dq_next", "dq_next_n", "dq_next_exp", "dq_next_verdict", "dq_superset_faster", "relaxed_full_64", "relaxed_full_128",
          "relaxed_wide_128", "relaxed_causal_128", "acq_full_128", "relaxed_best", "dq_above_64", "dq_range_64",
          "dq_faster_64")


def dq_lesson(ch: ChapterData) -> None:
    """The backward's numbers in one table (``dq_lesson``): each way of adding dQ as its time over
    the separate mode's whole backward (both kernels), per head dimension, with what was timed. The atomic-dQ experiment
    (chapter 8; both runs, ``experiments.atomic_dq_both``, as chapter 8 reads them) timed the
    backward kernels alone, with relaxed and with acq_rel adds; the ladder timed the whole
    backward through autograd, acq_rel. ``DQ_TOP``: why the ladder's highest ratio lies above the
    experiment's range, from both runs' times at its shape."""
    import pandas as pd

    from ..display import span
    from .experiments import atomic_dq_both

    bsteps = ch.frames.get("bsteps")
    runs = atomic_dq_both(ch.root) if ch.root is not None else None
    if bsteps is None or runs is None:
        ch.nothing(*DQ_TOP)
        return ch.say("dq_lesson", "No recorded ladder or atomic-dQ runs (benchmarks/results/).", missing=True)
    dims = sorted(bsteps["head_dim"].unique())
    fenced = bsteps[bsteps["name"] == "dQ separate"]             # vs_prev: the atomic rung's time over this one's
    atomic, separate = int(ch.values["mm_atomic"]), int(ch.values["mm_separate"])

    def experiment(variant):
        these = runs[runs["variant"] == variant]
        return {d: span(these[these["d"] == d]["x_separate"], ".2f") for d in dims}

    alone, whole = "kernels alone, 2 runs", "whole backward, 1 run"
    rows = [("atomic, relaxed adds (experiment; the code shown)", alone, atomic, experiment("relaxed")),
            ("atomic, acq_rel adds (experiment)", alone, atomic, experiment("atomic")),
            ("atomic, acq_rel adds (the ladder)", whole, atomic,
             {d: span(fenced[fenced["head_dim"] == d]["vs_prev"], ".2f") for d in dims}),
            ("separate dQ kernel (the default)", "-", separate, {d: "1" for d in dims})]
    table = pd.DataFrame([{"dQ added by": label, "timed": timed, "products per tile pair": n,
                           **{f"d = {d}": x[d] for d in dims}} for label, timed, n, x in rows]).set_index("dQ added by")
    ch.table("dq_lesson", "dq_lesson", table.rename_axis(columns="time over the separate mode's backward"))
    # the ladder's highest ratio, and both backwards' times at its shape in the two recordings
    top = fenced.loc[fenced["vs_prev"].idxmax()]
    at, there = _steps_at(bsteps, top), _runs_at(runs, top)

    def both_runs(variant):
        return " and ".join(f"{ms:.2f}" for ms in there[there["variant"] == variant].sort_values("run")["ms"])

    ch.put("dq_top", top["vs_prev"], ".2f"); ch.put("dq_top_shape", shape_label(top["head_dim"], top["seq"], top["causal"]))
    ch.put("dq_top_atomic_ms", at["dQ atomic"], ".2f"); ch.put("dq_exp_atomic_ms", both_runs("atomic"))
    ch.put("dq_top_separate_ms", at["dQ separate"], ".2f"); ch.put("dq_exp_separate_ms", both_runs("separate"))
    # every ladder ratio above the experiment's acq_rel range, and how much faster the ladder's whole
    # separate backward (a superset of the experiment's kernels) was timed at the top shape
    above = fenced[fenced["vs_prev"] > runs[runs["variant"] == "atomic"]["x_separate"].max()].sort_values("vs_prev")[::-1]
    ch.put("dq_above", " and ".join(f"{x:.2f}" for x in above["vs_prev"]))
    # the next one against the experiment's highest acq_rel ratio at its own shape, by the noise rule
    if len(above) > 1:
        nxt = above.iloc[1]
        own = _runs_at(runs, nxt).query("variant == 'atomic'")["x_separate"].max()
        ch.put("dq_next", nxt["vs_prev"], ".2f"); ch.put("dq_next_n", f"{int(nxt['seq']) // 1024}K")
        ch.put("dq_next_exp", own, ".2f"); ch.put("dq_next_verdict", ch.verdict(nxt["vs_prev"] / own))
    else:
        ch.nothing("dq_next", "dq_next_n", "dq_next_exp", "dq_next_verdict")
    sep = there[there["variant"] == "separate"]["ms"]
    ch.put("dq_superset_faster", span(100 * (1 - at["dQ separate"] / sep), ".0f"))
    # chapter 8's relaxed adds without a mask, where every head size's dK/dV tiles have 64 keys
    relaxed = runs[(runs["variant"] == "relaxed") & ~runs["causal"].astype(bool)]
    for d in (64, 128):
        ch.put(f"relaxed_full_{d}", span(relaxed[relaxed["d"] == d]["x_separate"], ".2f"))
    at128 = runs[runs["d"] == 128]
    for name, variant, causal in (("relaxed_wide_128", "relaxed 64x128", False),
                                  ("relaxed_causal_128", "relaxed", True), ("acq_full_128", "atomic", False)):
        ch.put(name, span(at128[(at128["variant"] == variant) & (at128["causal"].astype(bool) == causal)]["x_separate"], ".2f"))
    # the relaxed adds with the better of the default and the 64 x 128 tiles, shape by shape and run by run
    best = runs[runs["variant"].isin(["relaxed", "relaxed 64x128"])].groupby(["run", "n", "d", "causal"])["x_separate"].min()
    ch.put("relaxed_best", span(best, ".2f"))
    _above_at(ch, fenced, bsteps, runs, 64)


def _steps_at(bsteps, row):
    """The ladder's backward steps' times (ms, by step name) at a ladder ``row``'s shape."""
    return bsteps[(bsteps[SHAPE] == row[SHAPE]).all(axis=1)].set_index("name")["ms"]


def _runs_at(runs, row):
    """The atomic-dQ experiment's rows (both runs, every variant) at a ladder ``row``'s shape."""
    return runs[(runs["n"] == row["seq"]) & (runs["d"] == row["head_dim"])
                & (runs["causal"].astype(bool) == bool(row["causal"]))]


def _above_at(ch: ChapterData, fenced, bsteps, runs, d: int) -> None:
    """The ladder's acq_rel ratios at head dimension ``d`` above the experiment's acq_rel range at
    that ``d`` (``dq_above_64``, without the mask first; ``dq_range_64``), and how much faster the
    ladder's separate backward ran there than the experiment's, over both runs (``dq_faster_64``, %)."""
    from ..display import span

    exp = runs[(runs["variant"] == "atomic") & (runs["d"] == d)]["x_separate"]
    above = fenced[(fenced["head_dim"] == d) & (fenced["vs_prev"] > exp.max())].sort_values("causal")
    ch.put(f"dq_above_{d}", " and ".join(f"{x:.2f}" for x in above["vs_prev"]))
    ch.put(f"dq_range_{d}", span(exp, ".2f"))
    faster = []
    for _, row in above.iterrows():
        mine = _steps_at(bsteps, row)["dQ separate"]
        theirs = _runs_at(runs, row).query("variant == 'separate'")["ms"]
        faster += [100 * (1 - mine / ms) for ms in theirs]
    ch.put(f"dq_faster_{d}", span(faster, ".0f") if faster else None)
