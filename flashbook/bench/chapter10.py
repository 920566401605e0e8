"""Everything chapter 10 shows from the recorded runs, computed once: ``build(root)``.

The chapter's hidden cells call ``build()``, glue its values and show what it returns; its
tests call ``build(root)`` on a results root of their own. ``Chapter10`` holds

- ``values``:   every number the prose quotes from the recorded runs (``{glue:text}`name```),
  already formatted as ``flashbook.display.glue_text`` formats it ("n/a" where the data give
  none); the few the notebook glues itself are ``GLUED_BY_NOTEBOOK``;
- ``tables``:   the tables the chapter displays, by name, as they are displayed;
- ``figures``:  name -> a function that draws that figure (``flashbook.plots.ladder``);
- ``messages``: topic -> what that topic's cell says because something is not recorded;
- ``outputs``:  topic -> what that cell shows, in order (``Chapter10.show(topic)``);
- ``frames``:   the recorded frames the chapter's teaching cells and exercises read.

Missing data are handled here, once: with no results every quoted name still has a value, and
every cell that would show a measurement says why it cannot. This module has the ladder and its
predictions, ``chapter10_ladder`` the whole ladder beside SDPA and the goals, ``chapter10_why`` the
profile, the two runs' timers and the compiled counts, ``chapter10_beyond`` the rest (the tutorial,
the lab, Gluon).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field

from .. import runtime, tiled
from ..display import listed, show_figure, span   # show_figure: also the notebook's
from ..kernels import configs
from ..kernels.ladder import FIRST_CONFIG, RUNGS, Features
from . import chapter10_why
from .blocks import block_state
from .chapter10_ladder import HINT, NO_DATA, SHAPE, dq_lesson, goals, whole_ladder   # NO_DATA, SHAPE: also chapter10's
from .noise import slower_over_faster, twin_gaps
from .chapter_data import ChapterData
from .harness import TOLERANCE, shape_label
from .readback import (ladder_speedups, latest_blocks, latest_ladder, latest_results, load_results,
                       provenance_summary)
from .records import results_root
from .cli import DEFAULT_HEAD_DIMS
from .sweeps import LADDER_SEQS

#: What ``Chapter10.show`` shows, one topic per cell of the chapter, in its order.
TOPICS = ("rungs", "recorded", "provenance", "noise", "exp2", "skip", "split_prediction", "split", "tuning_prediction",
          "tuning", "heavy", "dq_lesson", "ladder_figure", "backward_figure", "profile", "schedules")
#: The names of ``Features``, in order: one switch each.
FEATURES = [f.name for f in dataclasses.fields(Features)]
#: The rungs that, without a mask, run the same kernel as the rung before them.
NO_OPS_UNMASKED = ("skip masked tiles", "heaviest first")
#: Names the prose quotes that the notebook glues itself, not ``values``: its teaching cells
#: compute them in front of the reader (the instruction count, heaviest-first's schedule
#: model, the atomics' bytes, the start-and-end fit), its live cells measure or compile
#: them here, and the lab (``benchmarks/gluon_lab.py``) computes the polynomial's error.
GLUED_BY_NOTEBOOK = {
    "1791dcf8": ("exp2_ops_full", "exp2_ops_causal"),
    "c10-live-note": ("live_note",),
    "38a7f663": ("exact_n", "exact_d", "exact_tol"),
    "c10-ptx-waits": ("ptx_tri_wgmma", "ptx_tri_waits", "ptx_gl_wgmma", "ptx_gl_tma",
                      "ptx_tri_tma", "ptx_gl_waits"),
}

from .score_ops import (CAUSAL_EXTRA, NATURAL_EXP, PER_SCORE, load_loops, ops_per_score,  # noqa: E402,F401
                        sfu_cycles_per_warp, throughput_bound)


@dataclass
class Chapter10(ChapterData):
    """Chapter 10's numbers, tables and figures for one results root (see the module)."""

    frames: dict = field(default_factory=dict)
    styles: dict = field(default_factory=dict)     # table -> (Styler -> Styler, pandas options)
    ladder_provenance: dict = field(default_factory=dict)
    noise: float | None = None                     # the floor every rung's verdict is judged against
    noise_runs: float | None = None                # the same comparison's largest gap over every recorded run
    cc: int = 90                                   # the compute capability the ladder ran on
    arch: str | None = None                        # the same as "sm_90", None when not recorded
    gpu_name: str = "the GPU"

    # -- what the sections record
    def table(self, topic: str, name: str, frame, style=None, **options) -> None:
        """``topic``'s cell displays the table ``name``: ``style`` (a function of its Styler)
        formats it, ``options`` are pandas display options (``max_colwidth=90``)."""
        if name in self.tables:
            raise ValueError(f"name must name one table, and {name!r} already does")
        self.tables[name] = frame
        self.styles[name] = (style, {f"display.{k}": v for k, v in options.items()})
        self.outputs.setdefault(topic, []).append(("table", name))

    def markdown(self, topic: str, text: str) -> None:
        """``topic``'s cell displays ``text`` as Markdown (a table's heading)."""
        self.outputs.setdefault(topic, []).append(("markdown", text))

    def styled(self, name: str):
        """The table ``name`` as it is displayed: its Styler, or the frame itself."""
        style, _ = self.styles.get(name, (None, {}))
        return style(self.tables[name].style) if style else self.tables[name]

    def rung_gains(self, name):
        """``x previous`` of one forward rung at every recorded shape, with a shape label."""
        fsteps = self.frames["fsteps"]
        r = fsteps[fsteps["name"] == name].copy()
        r["shape"] = [shape_label(d, n, c) for d, n, c in zip(r["head_dim"], r["seq"], r["causal"])]
        return r.set_index("shape")

    def verdict(self, gain) -> str:
        """A gain (``x previous``) against the noise rule: within this run's floor, within the
        largest gap between identical kernels in any recorded run, or beyond both."""
        off = abs(float(gain) - 1)
        if self.noise is None:
            return "n/a"
        if off <= self.noise:
            return "within noise"
        if self.noise_runs is not None and off <= self.noise_runs:
            return f"{HINT} ({100 * self.noise:.1f}-{100 * self.noise_runs:.1f}%)"   # the rule's middle tier
        return "beyond noise"

    # -- what the chapter calls
    def show(self, topic: str) -> None:
        """Show in a notebook what ``topic``'s cell shows (chapter 10's ``TOPICS``, the lab
        notes' ``LAB_TOPICS``): its texts, tables and figures."""
        import pandas as pd
        from IPython.display import Markdown, display

        from .chapter10_lab import LAB_TOPICS

        if topic not in TOPICS + LAB_TOPICS:
            raise ValueError(f"topic must be one of {TOPICS + LAB_TOPICS}, got {topic!r}")
        for kind, what in self.outputs.get(topic, []):
            if kind == "text":
                print(what)
            elif kind == "markdown":
                display(Markdown(what))
            elif kind == "table":
                options = [x for kv in self.styles[what][1].items() for x in kv]
                with pd.option_context(*options) if options else contextlib.nullcontext():
                    display(self.styled(what))
            elif kind == "figure":
                show_figure(self.figures[what]())


# ---------------------------------------------------------------- the rungs and the runs

def _rungs(ch: Chapter10) -> None:
    import pandas as pd

    rung_table = pd.DataFrame([
        {"rung": i, "name": r.name, **{f: "on" if getattr(r.features, f) else "off" for f in FEATURES},
         "tiles": str(r.config) if r.config else "library's"}      # rung 4 changes only this column
        for i, r in enumerate(RUNGS)]).set_index("rung")
    ch.put("n_rungs", len(RUNGS)); ch.put("first_config", str(FIRST_CONFIG))
    for name in ("block_m", "block_n", "num_warps", "num_stages"):       # first_bm, ..., first_stages
        ch.put("first_" + {"block_m": "bm", "block_n": "bn"}.get(name, name[4:]), getattr(FIRST_CONFIG, name))
    ch.table("rungs", "rungs", rung_table)


def _recorded(ch: Chapter10, root) -> None:
    """The newest ladder, full comparison and block sweep, read back, and their provenance."""
    import pandas as pd

    ch.root = results_root(root)
    paths = ((latest_ladder(ch.root), latest_results(ch.root), latest_blocks(ch.root)) if ch.root
             else (None, None, None))
    read = [load_results(p) if p else (None, {}) for p in paths]
    (ladder, ch.ladder_provenance), (df, prov), (blocks, blocks_prov) = read
    ch.frames.update(ladder=ladder, results=df, blocks=blocks)
    for label, path, frame in zip(("ladder", "full comparison", "block sweep"), paths, (ladder, df, blocks)):
        ch.say("recorded", f"{label}: " + (f"{path.relative_to(ch.root.parent)} ({len(frame)} rows)" if path
                                           else "none recorded"), missing=path is None)
    if ladder is None:
        ch.say("recorded", NO_DATA, missing=True)

    recorded = {name: p for name, p in (("ladder.csv", ch.ladder_provenance), ("results.csv", prov),
                                        ("blocks.csv", blocks_prov)) if p}
    settings = chapter10_why.run_settings(ch, recorded)       # each run's commit and timer, as rows
    if recorded:
        frame = pd.concat([pd.DataFrame({name: provenance_summary(p) for name, p in recorded.items()})
                           .drop(index="command"), settings])
        same = frame.nunique(axis=1).eq(1) & (len(frame.columns) > 1)   # one run: nothing to share
        if same.any():      # what every run shares, said once; the table keeps what differs
            ch.say("provenance", f"all {len(frame.columns)} runs: " + ", ".join(
                f"{key} {frame.loc[key].iloc[0]}" for key in frame.index[same]))
        ch.table("provenance", "provenance", frame[~same], max_colwidth=None)   # commands: each run's provenance.json
    else:
        ch.say("provenance", NO_DATA, missing=True)
    digests = {name: p.get("source_sha256") for name, p in recorded.items()}
    ch.put("same_sources", None if not recorded else "the same library sources" if len(set(digests.values())) == 1
           else "library sources that differ between the runs (their SHA-256 digests differ)")
    gpu = ch.ladder_provenance.get("gpu") or {}
    ch.gpu_name = gpu.get("name", "the GPU")
    ch.put("gpu_name", ch.gpu_name)
    ch.put("hbm_tb_s", runtime.chip(gpu.get("datasheet", {}).get("chip", "H200")).hbm_tb_s, "g")   # as dq_bytes reads it
    ch.arch = gpu.get("capability")
    ch.cc = int(ch.arch.split("_")[1]) if ch.arch else 90


def _noise(ch: Chapter10) -> None:
    """How large a gain must be to mean anything: identical kernels timed twice."""
    ladder, df = ch.frames["ladder"], ch.frames["results"]
    if ladder is None:
        ch.frames.update(steps=None, fsteps=None, bsteps=None)
        ch.nothing("noise", "noise_n", "noise_ladder", "noise_twin", "noise_twin_n", "xrun_lo", "xrun_hi",
                   "xrun_slower", "n_checked_ladder")
        return
    if not (ladder["status"] == "ok").all():
        raise ValueError(f"every rung of the ladder must have run:\n{ladder[ladder['status'] != 'ok']}")
    if not (ladder["err_out"] < TOLERANCE["out"]).all():     # every rung was checked, and exact
        raise ValueError(f"every rung must be exact:\n{ladder[ladder['err_out'] >= TOLERANCE['out']]}")
    steps = ladder_speedups(ladder)
    fsteps, bsteps = steps[steps["pass_"] == "fwd"], steps[steps["pass_"] == "bwd"]
    ch.frames.update(steps=steps, fsteps=fsteps, bsteps=bsteps)
    same = fsteps[~fsteps["causal"] & fsteps["name"].isin(NO_OPS_UNMASKED)]
    noise_ladder = float(slower_over_faster(same["vs_prev"]).max())   # as gains are quoted
    ch.put("noise_ladder", 100 * noise_ladder, ".1f"); ch.put("noise_n", len(same))
    ch.put("n_checked_ladder", len(ladder))
    ch.frames["noise_pairs"] = same[["name"] + SHAPE + ["tflops", "vs_prev"]]   # the repeats table shows its span
    # one forward kernel timed under two names in one run: flashbook and flashbook-atomic
    # differ only in their backward (chapter 9), so their forward times are a second noise sample
    twin = twin_gaps(df)
    keys = ["batch", "heads", "seq", "head_dim", "causal"]
    noise_twin = float(twin.max()) if twin is not None and len(twin) else 0.0
    ch.put("noise_twin", 100 * noise_twin, ".1f"); ch.put("noise_twin_n", 0 if twin is None else len(twin))
    NOISE = max(noise_ladder, noise_twin)   # the floor every verdict below is judged against
    ch.noise = NOISE
    ch.put("noise", 100 * NOISE, ".1f")
    # the same (last-rung) kernel, measured in the separate full-comparison run
    if df is not None:
        last = fsteps[fsteps["name"] == RUNGS[-1].name]
        both = last.merge(df[df["impl"] == "flashbook"], on=keys)
        xrun = both["fwd_tflops"] / both["tflops"]
        ch.frames["xrun"] = xrun            # the noise table's between-run row
        ch.put("xrun_lo", 100 * (xrun.min() - 1), "+.0f"); ch.put("xrun_hi", 100 * (xrun.max() - 1), "+.0f")
        # how much longer the full comparison timed it, as the noise table's row: times, not speeds
        lo, hi = 100 * (1 / xrun.max() - 1), 100 * (1 / xrun.min() - 1)
        ch.put("xrun_slower", f"{lo:.1f} to {hi:.1f}% slower than" if lo >= 0.05 else
               f"{-hi:.1f}% faster to {lo:.1f}% slower than" if hi >= 0.05 else f"{-hi:.1f} to {-lo:.1f}% faster than")
    else:
        ch.nothing("xrun_lo", "xrun_hi", "xrun_slower")


# ---------------------------------------------------------------- the rungs, one by one

def _compiled(ch: Chapter10, rung: int, d: int, causal: bool, stage: str = "masked", column: str = "per_score") -> float:
    """What a rung's loop issues per score, compiled for sm_90 (``score_ops.load_loops``)."""
    return float(ch.frames["loops"].loc[(rung, int(d), bool(causal), stage), column])


def _exp2(ch: Chapter10) -> None:
    import pandas as pd

    ch.frames["loops"], loops_prov = load_loops(ch.root)     # benchmarks/loop_sass.py's recording
    ch.put("loops_triton", loops_prov.get("triton"))
    if ch.frames["loops"] is None:
        ch.nothing("exp2_exp_lo", "exp2_exp_hi", "exp2_removed", "exp2_saved_lo", "exp2_saved_hi", "exp2_bound_lo",
                   "exp2_bound_hi")
    else:   # the listed steps beside the compiled loops, rung 0 (exp) and rung 1 (exp2), per score
        rows = pd.MultiIndex.from_product([_seqs(ch, "head_dim"), ["full", "causal"]], names=["d", "mask"])
        model = pd.DataFrame([{"listed, exp": ops_per_score("masked", m == "causal", False),
                               "listed, exp2": ops_per_score("masked", m == "causal", True),
                               "compiled, exp": _compiled(ch, 0, d, m == "causal"),
                               "compiled, exp2": _compiled(ch, 1, d, m == "causal")} for d, m in rows], index=rows)
        saved = model["instructions saved"] = 1 - model["compiled, exp2"] / model["compiled, exp"]
        bound = model["gain if bound by them"] = model["compiled, exp"] / model["compiled, exp2"]
        ch.tables["exp2_model"] = model.round(3)    # the chapter's counting cell shows it
        ch.put("exp2_exp_lo", model["compiled, exp"].min(), ".1f"); ch.put("exp2_exp_hi", model["compiled, exp"].max(), ".1f")
        ch.put("exp2_removed", span(model["compiled, exp"] - model["compiled, exp2"], ".2f", collapse=True))
        ch.put("exp2_saved_lo", 100 * saved.min(), ".0f"); ch.put("exp2_saved_hi", 100 * saved.max(), ".0f")
        ch.put("exp2_bound_lo", bound.min(), ".2f"); ch.put("exp2_bound_hi", bound.max(), ".2f")
    if ch.frames["steps"] is None or ch.frames["loops"] is None:
        return ch.nothing("exp2_lo", "exp2_hi", "exp2_above", "exp2_n", "exp2_noise", "exp2_verdict",
                          "exp2_share_lo", "exp2_share_hi")
    gains = ch.rung_gains("exp2")
    # the compiled loops' bound: rung 0's instructions per score (natural exp) over rung 1's (exp2)
    bound = pd.Series([_compiled(ch, 0, d, c) / _compiled(ch, 1, d, c) for d, c in zip(gains["head_dim"], gains["causal"])],
                      index=gains.index)
    saved = 1 - 1 / bound                   # the share of the loop's instructions exp2 removes
    # if a share s of the time is issuing them, saving a fraction f of them gives 1 / (1 - s f)
    share = (1 - 1 / gains["vs_prev"]) / saved
    ch.table("exp2", "exp2_gains", pd.DataFrame({"TFLOP/s": gains["tflops"], "x previous": gains["vs_prev"],
                                                 "bound from the count": bound, "implied share of time": share,
                                                 "verdict": gains["vs_prev"].map(ch.verdict)}).round(3))
    ch.put("exp2_share_lo", 100 * share.min(), ".0f"); ch.put("exp2_share_hi", 100 * share.max(), ".0f")
    ch.put("exp2_lo", gains["vs_prev"].min(), ".2f"); ch.put("exp2_hi", gains["vs_prev"].max(), ".2f")
    n_above = int((gains["vs_prev"] > bound).sum())
    ch.put("exp2_above", n_above); ch.put("exp2_n", len(gains))
    low = gains["vs_prev"].min() - 1
    ch.put("exp2_noise", "far beyond the noise" if low > 2 * ch.noise
           else "beyond the noise" if low > ch.noise else "partly within the noise")
    ch.put("exp2_verdict", "The gain is above the count's bound, so the count leaves out work that natural "
           "exp does" if n_above else
           "Every gain is below the count's bound, as it must be if the count is right (a necessary check, "
           "not a proof)")


def _seqs(ch: Chapter10, column="seq") -> list:
    """The ladder's lengths (``column`` "head_dim": its head sizes), recorded or by default."""
    ladder = ch.frames["ladder"]
    return sorted(ladder[column].unique()) if ladder is not None else list(LADDER_SEQS if column == "seq" else DEFAULT_HEAD_DIMS)


def _skip(ch: Chapter10) -> None:
    import pandas as pd

    bm, bn = FIRST_CONFIG.block_m, FIRST_CONFIG.block_n

    def skip_prediction(n, causal):
        every = math.ceil(n / bm) * math.ceil(n / bn)
        return every / sum(tiled.visible_key_tiles(n, n, bm, bn, causal))

    skip_pred = pd.DataFrame([{"N": n, "causal": c, "tiles without skipping": math.ceil(n / bm) * math.ceil(n / bn),
                               "tiles visited": sum(tiled.visible_key_tiles(n, n, bm, bn, c)),
                               "predicted x": skip_prediction(n, c)}
                              for n in _seqs(ch) for c in (False, True)])
    pred_skip = {(r["N"], r["causal"]): r["predicted x"] for r in skip_pred.to_dict("records")}
    causal_pred = skip_pred[skip_pred["causal"]]["predicted x"]
    ch.put("skip_pred_lo", causal_pred.min(), ".2f"); ch.put("skip_pred_hi", causal_pred.max(), ".2f")
    ch.frames["skip_prediction"] = skip_pred          # its "predicted x" is a column of the measured table

    if ch.frames["steps"] is None:
        return ch.nothing("skip_lo", "skip_hi", "skip_of_pred_lo", "skip_of_pred_hi", "skip_short",
                          "skip_full_dev", "skip_full_within")
    gains = ch.rung_gains("skip masked tiles")
    pred = [pred_skip[(n, c)] for n, c in zip(gains["seq"], gains["causal"])]
    table = pd.DataFrame({"TFLOP/s": gains["tflops"], "x previous": gains["vs_prev"], "predicted x": pred})
    table["measured / predicted"] = table["x previous"] / table["predicted x"]
    table["verdict"] = table["x previous"].map(ch.verdict)
    ch.table("skip", "skip_gains", table.round(3))
    causal, full = table[gains["causal"].values], table[~gains["causal"].values]
    ch.put("skip_lo", causal["x previous"].min(), ".2f"); ch.put("skip_hi", causal["x previous"].max(), ".2f")
    ch.put("skip_of_pred_lo", 100 * causal["measured / predicted"].min(), ".1f")
    ch.put("skip_of_pred_hi", 100 * causal["measured / predicted"].max(), ".1f")
    # each causal shortfall against the noise rule's tiers, in the noise's own convention (the
    # larger over the smaller, minus one: here predicted over measured), so a hint is not beyond noise
    shortfalls = []
    for r, ratio in zip(gains[gains["causal"].values].itertuples(), causal["measured / predicted"]):
        tier = ch.verdict(1 / ratio)
        if ratio < 1 and tier != "within noise":
            shortfalls.append(f"{100 * (1 / ratio - 1):.1f}% at d = {r.head_dim}, N = {r.seq // 1024}K ("
                              + ("a hint" if tier.startswith(HINT) else "beyond the noise") + ")")
    ch.put("skip_short", listed(shortfalls) if shortfalls else "no more than the noise anywhere")
    dev = float((full["x previous"] - 1).abs().max())
    ch.put("skip_full_dev", 100 * dev, ".1f")
    ch.put("skip_full_within", "within" if dev <= ch.noise else "outside")


def _split(ch: Chapter10) -> None:
    import pandas as pd

    names = ("split_masked_pct", "split_bound_lo", "split_bound_hi", "sfu_cycles", "split_main_lo", "split_main_hi",
             "split_main_ex2", "split_sfu_per_warp", "split_tighter", "split_full_bound_lo", "split_full_bound_hi")
    later = ("split_full_lo", "split_full_hi", "split_causal_lo", "split_causal_hi", "split_share_lo",
             "split_share_hi", "split_below")
    if ch.frames["loops"] is None:
        return ch.nothing(*names, *later)
    rows = []
    for d in _seqs(ch, "head_dim"):
        for n in _seqs(ch):
            for causal in (False, True):
                kinds = tiled.tile_kinds(n, n, FIRST_CONFIG.block_m, FIRST_CONFIG.block_n, causal=causal)
                visited = int((kinds != "skipped").sum())
                # a ragged last tile would be masked too: N is a multiple of the tiles here
                masked = int((kinds == "partial").sum()) / visited
                # compiled for sm_90: rung 2's loop (every tile masked), rung 3's two loops mixed by their tiles
                before = _compiled(ch, 2, d, causal)
                after, ex2_after = (masked * _compiled(ch, 3, d, causal, "masked", col)
                                    + (1 - masked) * _compiled(ch, 3, d, causal, "main", col)
                                    for col in ("per_score", "mufu_ex2_per_score"))
                rows.append({"d": d, "N": n, "causal": causal, "masked tiles after the split": masked,
                             "instructions per score before": before, "after": after,
                             "bound x (issue slots)": before / after,
                             "sfu": throughput_bound(before, after, _compiled(ch, 2, d, causal, column="mufu_ex2_per_score"),
                                                     ex2_after)})
    split_pred = pd.DataFrame(rows)
    saved_by = {(r["d"], r["N"], r["causal"]): 1 - r["after"] / r["instructions per score before"] for r in rows}
    ch.put("split_masked_pct", 100 * split_pred[split_pred["causal"]]["masked tiles after the split"].max(), ".1f")
    ch.put("split_bound_lo", split_pred["bound x (issue slots)"].min(), ".2f")
    ch.put("split_bound_hi", split_pred["bound x (issue slots)"].max(), ".2f")
    full = split_pred[~split_pred["causal"]]
    ch.put("split_full_bound_lo", full["bound x (issue slots)"].min(), ".2f")
    ch.put("split_full_bound_hi", full["bound x (issue slots)"].max(), ".2f")
    # the special-function unit as a second rate: a warp's 32 ex2 take it sfu_cycles_per_warp cycles
    main = ch.frames["loops"].xs((3, "main"), level=("rung", "stage"))
    ex2 = main["mufu_ex2_per_score"]
    ch.put("sfu_cycles", sfu_cycles_per_warp(), "g")
    ch.put("split_main_lo", main["per_score"].min(), ".1f"); ch.put("split_main_hi", main["per_score"].max(), ".1f")
    ch.put("split_main_ex2", f"{ex2.min():.2f}" if ex2.nunique() == 1 else f"{ex2.min():.2f} to {ex2.max():.2f}")
    ch.put("split_sfu_per_warp", sfu_cycles_per_warp() * ex2.max(), ".1f")
    issue_binds = bool((split_pred["sfu"] == split_pred["bound x (issue slots)"]).all())
    ch.put("split_tighter", "issue, not the exponential unit," if issue_binds else "not always issue")
    ch.table("split_prediction", "split_prediction", split_pred.drop(columns="sfu").set_index(["d", "N", "causal"]).round(3))

    if ch.frames["steps"] is None:
        return ch.nothing(*later)
    gains = ch.rung_gains("unmasked main loop")
    saved = [saved_by[(d, n, c)] for d, n, c in zip(gains["head_dim"], gains["seq"], gains["causal"])]
    table = pd.DataFrame({"TFLOP/s": gains["tflops"], "x previous": gains["vs_prev"], "instructions saved": saved})
    # if a share s of the time is issuing them, saving a fraction f of them gives 1 / (1 - s f)
    table["implied share of time"] = (1 - 1 / table["x previous"]) / table["instructions saved"]
    table["verdict"] = table["x previous"].map(ch.verdict)
    ch.table("split", "split_gains", table.round(3))
    is_causal = gains["causal"].values
    ch.put("split_full_lo", table["x previous"][~is_causal].min(), ".2f")
    ch.put("split_full_hi", table["x previous"][~is_causal].max(), ".2f")
    ch.put("split_causal_lo", table["x previous"][is_causal].min(), ".2f")
    ch.put("split_causal_hi", table["x previous"][is_causal].max(), ".2f")
    ch.put("split_share_lo", 100 * table["implied share of time"].min(), ".0f")
    ch.put("split_share_hi", 100 * table["implied share of time"].max(), ".0f")
    bound = split_pred.set_index(["d", "N", "causal"])
    below = int((table["x previous"] < [bound.loc[(d, n, c), "bound x (issue slots)"]
                                        for d, n, c in zip(gains["head_dim"], gains["seq"], gains["causal"])]).sum())
    ch.put("split_below", "smaller than the bound at every shape" if below == len(table)
           else f"smaller than the bound at {below} of {len(table)} shapes")


def _as_text(cfg):
    return "{} x {}, {} warps, {} stages".format(*cfg)


def _tuning(ch: Chapter10) -> None:
    """The block-size sweep's prediction for the tuned tiles, and what the ladder measured."""
    import pandas as pd

    blocks = ch.frames["blocks"]
    pred_tune = {}
    if blocks is None:
        ch.nothing("sweep_seq", "tune_best_64", "tune_worst_64", "tune_best_128", "tune_worst_128", "tune_spread",
                   "lib_rank", "first_rank", "tune_pred_lo", "tune_pred_hi", "n_ran")
    else:
        rows = []
        for d in sorted(blocks["head_dim"].unique()):
            lib = configs.default("forward", cc=ch.cc, block_d=configs.block_d(int(d)), elem_bytes=2)
            first = block_state(blocks, int(d), *dataclasses.astuple(FIRST_CONFIG), measured_arch=ch.arch)
            mine = block_state(blocks, int(d), *dataclasses.astuple(lib), measured_arch=ch.arch)
            (best_cfg, best), (worst_cfg, worst) = mine.ranking[0], mine.ranking[-1]
            pred_tune[int(d)] = mine.tflops / first.tflops
            rows.append({"d": int(d), "N": mine.seq, "configs that ran": f"{mine.n_ran} of {mine.n_configs}",
                         "first kernel's": f"{_as_text(first.config)}: {first.tflops:.0f} TFLOP/s (#{first.rank})",
                         "library's": f"{_as_text(mine.config)}: {mine.tflops:.0f} TFLOP/s (#{mine.rank})",
                         "predicted x": pred_tune[int(d)]})
            ch.put(f"tune_best_{d}", f"{_as_text(best_cfg)} at {best:.0f} TFLOP/s")
            ch.put(f"tune_worst_{d}", f"{_as_text(worst_cfg)} at {worst:.0f}")
        sweep = pd.DataFrame(rows).set_index("d")
        ch.table("tuning_prediction", "sweep", sweep.drop(columns=["N", "configs that ran"]).round(3), max_colwidth=60)
        ch.put("sweep_seq", int(sweep["N"].iloc[0]))
        ranks = {k: [f"#{s.split('#')[1][:-1]}" for s in sweep[k]] for k in ("library's", "first kernel's")}
        ch.put("lib_rank", "the fastest at both" if set(ranks["library's"]) == {"#1"}
               else "ranked " + " and ".join(ranks["library's"]))
        ch.put("first_rank", " and ".join(f"{r} at d = {d}" for d, r in zip(sweep.index, ranks["first kernel's"])))
        ran_of = {d: r.split(" of ") for d, r in sweep["configs that ran"].items()}     # d -> [ran, of]
        ch.put("n_ran", " and ".join(f"{'all ' + n if k == n else k + ' of ' + n}{' ran' if i == 0 else ''} at d = {d}"
                                     for i, (d, (k, n)) in enumerate(ran_of.items())))
        ch.put("tune_pred_lo", min(pred_tune.values()), ".2f"); ch.put("tune_pred_hi", max(pred_tune.values()), ".2f")
        ran = blocks[blocks["status"] == "ok"]
        spread = ran.groupby("head_dim")["fwd_tflops"].agg(lambda x: x.max() / x.min())
        ch.put("tune_spread", f"{spread.min():.1f} to {spread.max():.1f}")

    if ch.frames["steps"] is None or not pred_tune:
        return ch.nothing("tune_at_sweep", "tune_lo", "tune_hi", "tune_beyond", "tune_n")
    gains = ch.rung_gains("tuned tiles")
    pred = [pred_tune.get(int(d), float("nan")) for d in gains["head_dim"]]
    ch.table("tuning", "tuning_gains", pd.DataFrame({
        "TFLOP/s": gains["tflops"], "x previous": gains["vs_prev"],
        "predicted x (sweep, N = 4096, no mask)": pred, "verdict": gains["vs_prev"].map(ch.verdict)}).round(3))
    at = gains[(gains["seq"] == int(sweep["N"].iloc[0])) & ~gains["causal"]]
    ch.put("tune_at_sweep", " and ".join(f"{x:.2f} at d = {d}" for d, x in zip(at["head_dim"], at["vs_prev"])))
    ch.put("tune_lo", gains["vs_prev"].min(), ".2f"); ch.put("tune_hi", gains["vs_prev"].max(), ".2f")
    ch.put("tune_beyond", int((gains["vs_prev"].map(ch.verdict) == "beyond noise").sum())); ch.put("tune_n", len(gains))


def _noise_table(ch: Chapter10) -> None:
    """The noise samples in one table, told apart by how they were timed: identical kernels
    within one run (the floor, ``noise``, and its largest over every recorded run, ``noise_runs``)
    and one kernel in two runs (the last rung in the ladder and the full comparison; the Gluon
    sweep run twice is quoted in the noise rule's dropdown, ``rerun_max``). It shows in place of the lab notes' run-by-run table (``repeats``)."""
    import pandas as pd

    ch.outputs["noise"] = [o for o in ch.outputs.get("noise", []) if o != ("table", "repeats")]
    repeats = ch.tables.get("repeats")
    if ch.noise is None or repeats is None:
        return
    every = repeats.groupby("what is compared", sort=False)["largest %"].agg(["min", "max", "size"])
    pairs = repeats.groupby("what is compared", sort=False)["pairs"].max()
    rows = []
    for name, sample, here in (("no-op rungs", "no-op rungs (ladder)", float(ch.values["noise_ladder"])),
                               ("twin forward", "twin forward (full comparison)", float(ch.values["noise_twin"]))):
        lo, hi, n = every.loc[name]
        rows.append({"timed": "within one run", "compared": sample, "pairs": int(pairs[name]),
                     "largest gap here (%)": f"{here:.1f}",
                     "in each recorded run (%)": f"{lo:.1f} to {hi:.1f} ({int(n)} runs)"})
    xrun = ch.frames.get("xrun")
    if xrun is not None and len(xrun):
        rows.append({"timed": "in two runs", "compared": "last rung: ladder and full comparison", "pairs": len(xrun),
                     "largest gap here (%)": f"{100 * float(slower_over_faster(xrun).max()):.1f}",
                     "in each recorded run (%)": "not used by the rule (two runs)"})
    ch.table("noise", "noise_samples", pd.DataFrame(rows).set_index(["timed", "compared"]))


def _bought(ch: Chapter10) -> None:
    """What each forward rung bought: its gain over the rung before, lowest to highest over the
    shapes (over the causal ones only for the two rungs that change nothing without a mask)."""
    fsteps = ch.frames.get("fsteps")
    if fsteps is None:
        return ch.nothing("rungs_bought")
    parts = []
    for r in RUNGS[1:]:
        gains = fsteps[fsteps["name"] == r.name]
        if r.name in NO_OPS_UNMASKED:
            gains = gains[gains["causal"]]
        x = gains["vs_prev"]
        parts.append(f"{r.name} {x.min():.2f} to {x.max():.2f}" + (" (causal)" if r.name in NO_OPS_UNMASKED else ""))
    ch.put("rungs_bought", "; ".join(parts))


def build(root=None) -> Chapter10:
    """Chapter 10's numbers, tables and figures from the results root ``root`` (default:
    ``bench.results_root()``, as the chapter finds it). Raises ValueError where the
    recorded ladder contradicts itself (a rung that did not run, or was not exact)."""
    from . import chapter10_beyond, chapter10_lab

    ch = Chapter10()
    _rungs(ch)
    _recorded(ch, root)
    _noise(ch)
    chapter10_lab.repeats(ch)
    _noise_table(ch)
    _exp2(ch)
    _skip(ch)
    _split(ch)
    _tuning(ch)
    whole_ladder(ch)
    goals(ch)
    chapter10_beyond.build_into(ch)
    chapter10_lab.build_into(ch)
    _host_vs_ladder(ch)
    _rung_host(ch)
    dq_lesson(ch)
    chapter10_why.build_into(ch)     # the profile, the two runs' backward, compiled counts
    _bought(ch)
    return ch


def _host_vs_ladder(ch: Chapter10) -> None:
    """How many times longer the shortest ladder forward keeps the GPU than chapter 7's kernel
    needs of the CPU per call: far above 1, the host is unlikely to show in the ladder's timings."""
    try:
        ratio = 1000 * float(ch.values["ladder_min_ms"]) / float(ch.values["host_lib"])
    except (KeyError, ValueError):
        return ch.nothing("host_ladder_ratio")
    ch.put("host_ladder_ratio", ratio, ".0f")


def _rung_host(ch: Chapter10) -> None:
    """``run_rung``'s own CPU time per call, from benchmarks/ladder_shapes.py's newest run
    (today's tree, every rung and shape): the ladder's calls go through it; and what the first
    run found (the rungs compiled with unspecialised lengths) against the fix, the last run."""
    from .runs import run_path

    try:
        folder = run_path("ladder_shapes")
    except ValueError:
        folder = None
    runs = sorted(p for p in folder.iterdir() if p.is_dir()) if folder is not None and folder.is_dir() else []
    first, last = (_shape_rows(runs[0]), _shape_rows(runs[-1])) if runs else ([], [])
    rows = [r for tree, r in last if tree == "new"]
    if not rows:
        return ch.nothing("rung_host_lo", "rung_host_hi", "rung_host_gpu_lo", "spec_slow_lo", "spec_slow_hi",
                          "spec_fixed_lo", "spec_fixed_hi")
    ch.put("rung_host_lo", min(r["host_us"] for r in rows), ".0f")
    ch.put("rung_host_hi", max(r["host_us"] for r in rows), ".0f")
    ch.put("rung_host_gpu_lo", min(r["ms"] for r in rows), ".2f")   # the shortest call's GPU time there, ms
    slow, fixed = _tree_ratios(first), _tree_ratios(last)
    ch.put("spec_slow_lo", 100 * (min(slow[0]) - 1), ".0f"); ch.put("spec_slow_hi", 100 * (max(slow[0]) - 1), ".0f")
    every = [x for ratios in fixed.values() for x in ratios]
    ch.put("spec_fixed_lo", min(every), ".2f"); ch.put("spec_fixed_hi", max(every), ".2f")


def _shape_rows(folder) -> list:
    """(tree, row) for every row of one ladder_shapes run folder: its old_r*.json (the ladder's
    commit) and new_r*.json (today's) repeats, each file read once."""
    import json

    return [(f.name.split("_")[0], r) for f in sorted(folder.glob("*_r*.json")) for r in json.loads(f.read_text())["rows"]]


def _tree_ratios(rows) -> dict:
    """{rung: [today's median time / the ladder commit's, one per batch and mask]} from
    ``_shape_rows``."""
    import statistics

    times: dict = {}
    for tree, r in rows:
        times.setdefault((tree, r["batch"], r["causal"], r["rung"]), []).append(r["ms"])
    ratios: dict = {}
    for (tree, batch, causal, rung), ms in sorted(times.items()):
        if tree == "new":
            ratios.setdefault(rung, []).append(statistics.median(ms) / statistics.median(times[("old", batch, causal, rung)]))
    return ratios
