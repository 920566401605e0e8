"""Chapter 10's noise over repeated runs and the front door's choice, and the entries of the lab
notes (appendix A3) that the other modules do not hold: the atomic-dQ experiment and the lab's
Gluon backward (the profiler readings are ``chapter10_why``'s).

``repeats(ch)`` runs right after the ladder's own noise (``chapter10._noise``): later verdicts read
``ch.noise_runs``. ``build_into(ch)`` adds the rest; each section says what it shows unrecorded.
"""
from __future__ import annotations

import json

from ..display import listed
from .chapter10_beyond import FRONT_DOOR_VS_SWEEP, front_door_vs_sweep
from .noise import slower_over_faster, twin_gaps
from .experiments import moved_notes
from .readback import find_runs, ladder_speedups, load_results
from .runs import load_recorded_json, run_path

#: What the lab notes page (notebooks/A3_lab_notes.ipynb) shows, one topic per cell, in its order.
LAB_TOPICS = ("lab_noise", "descriptors", "lazy", "static", "autotune", "launch_order", "fma", "wide", "short", "persistent",
              "atomic_dq", "gluon_bwd", "gluon_bwd_ncu", "gluon_bwd_rows", "tutorial", "gluon_peers", "host", "graphs",
              "defaults")
#: The two rungs that, without a mask, run the kernel of the rung before them.
NO_OPS = ("skip masked tiles", "heaviest first")


#: The noise table's row for the Gluon kernel (its section comes later in the chapter) timed twice.
GLUON_RERUN = "Gluon kernel (later section), rerun"

def _pct(series) -> tuple:
    return 100 * float(series.median()), 100 * float(series.max())


def _repeat_rows(root) -> list:
    """(what, run, pairs, median %, largest %) per recorded run under ``root``: the ladder's no-op rungs,
    the forward under two names in each full comparison, the Gluon sweep twice (``GLUON_RERUN``)."""
    import pandas as pd

    rows = []
    for path in reversed(find_runs(root, "ladder.csv")):      # oldest first
        steps = ladder_speedups(load_results(path)[0])
        same = steps[(steps["pass_"] == "fwd") & ~steps["causal"] & steps["name"].isin(NO_OPS)]
        rows.append(("no-op rungs", path.parent.name, len(same), *_pct(slower_over_faster(same["vs_prev"]))))
    for path in reversed(find_runs(root, "results.csv")):
        twin = twin_gaps(load_results(path)[0])
        if twin is not None:
            rows.append(("twin forward", path.parent.name, len(twin), *_pct(twin)))
    first, again = load_recorded_json("gluon_d128", root), load_recorded_json("gluon_d128_run2", root)
    if first and again:
        index = ["dtype", "seq", "causal", "variant"]
        a, b = (pd.DataFrame(r["rows"]).set_index(index)["tflops"] for r in (first, again))
        common = a.index.intersection(b.index)
        rows.append((GLUON_RERUN, "gluon_d128, gluon_d128_run2", len(common),
                     *_pct(slower_over_faster(b[common] / a[common]))))
    return rows


def repeats(ch) -> None:
    """``_repeat_rows``' table and the noise rule's hint bound ``ch.noise_runs`` (largest gap in one run)."""
    import pandas as pd

    rows = _repeat_rows(ch.root)
    within = [r for r in rows if r[0] != GLUON_RERUN]
    if not within:
        ch.noise_runs = None
        for topic in ("noise", "lab_noise"):
            ch.say(topic, "No recorded repeated runs (benchmarks/results/).", missing=True)
        return ch.nothing("noise_runs", "noop_lo", "noop_hi", "twin_lo", "twin_hi", "n_ladders", "n_sweeps",
                          "rerun_median", "rerun_max", "ladder_min_ms", "noise_read")
    table = pd.DataFrame(rows, columns=["what is compared", "run", "pairs", "median %", "largest %"])
    ch.table("noise", "repeats", table.round(1), lambda s: s.hide(axis="index").format(precision=1))
    ch.outputs.setdefault("lab_noise", []).append(("table", "repeats"))
    ch.noise_runs = max(r[4] for r in within) / 100
    read = [find_runs(ch.root, name) for name in ("ladder.csv", "results.csv")]   # newest first
    ch.put("noise_read", " and ".join(runs[0].parent.name for runs in read if runs))   # the runs chapter 10 reads
    ch.put("noise_runs", 100 * ch.noise_runs, ".1f")
    noop = [r[4] for r in rows if r[0] == "no-op rungs"]
    twin = [r[4] for r in rows if r[0] == "twin forward"]
    ch.put("noop_lo", min(noop) if noop else None, ".1f"); ch.put("noop_hi", max(noop) if noop else None, ".1f")
    ch.put("n_ladders", len(noop))
    ch.put("twin_lo", min(twin), ".1f") if twin else ch.nothing("twin_lo")
    ch.put("twin_hi", max(twin), ".1f") if twin else ch.nothing("twin_hi")
    ch.put("n_sweeps", len(twin))
    fsteps = ch.frames.get("fsteps")
    ch.put("ladder_min_ms", None if fsteps is None else fsteps["ms"].min(), ".2f")   # the shortest timed forward
    rerun = [r for r in rows if r[0] == GLUON_RERUN]
    ch.put("rerun_median", rerun[0][3] if rerun else None, ".0f")
    ch.put("rerun_max", rerun[0][4] if rerun else None, ".0f")


def noise_runs(root) -> float | None:
    """``ch.noise_runs`` of ``repeats`` (a fraction) for another chapter; None when nothing is recorded."""
    within = [r[4] for r in _repeat_rows(root) if r[0] != GLUON_RERUN] if root is not None else []
    return max(within) / 100 if within else None


def _ops():
    from .profiles import TENSOR_OPS
    return TENSOR_OPS


def _front_door(ch) -> None:
    """Which forward ``backend="auto"`` took at each recorded shape, and how fast (run ``front_door``)."""
    from ..kernels import hopper_choices

    run, lengths = load_recorded_json("front_door", ch.root), load_recorded_json("gluon_lengths", ch.root)
    names = ("auto_backends", "auto_n", "auto_fwd_lo", "auto_fwd_hi", "auto_bwd_lo", "auto_bwd_hi",
             "len_taken_lo", "len_taken_hi", "len_left_lo", "len_left_hi")
    if run is None or lengths is None:
        ch.say("schedules", "No recorded front-door run (run 'front_door' in benchmarks/results/index.json).", missing=True)
        return ch.nothing(*names, *FRONT_DOOR_VS_SWEEP)
    rows = run["rows"]
    ch.put("auto_backends", " and ".join(sorted({r["backend"] for r in rows}))); ch.put("auto_n", len(rows))
    for p in ("fwd", "bwd"):
        x = [r[f"auto_over_cudnn_{p}"] for r in rows]
        ch.put(f"auto_{p}_lo", min(x), ".2f"); ch.put(f"auto_{p}_hi", max(x), ".2f")
    ragged = [r for r in lengths["rows"] if r["ragged"]]
    left = [hopper_choices.slower_than_triton(r["head_dim"], r["seq"], r["seq"], r["causal"]) for r in ragged]
    taken = [r["gluon_over_triton"] for r, x in zip(ragged, left) if not x]
    slow = [r["gluon_over_triton"] for r, x in zip(ragged, left) if x]
    ch.put("len_taken_lo", min(taken), ".2f"); ch.put("len_taken_hi", max(taken), ".2f")
    ch.put("len_left_lo", min(slow), ".2f"); ch.put("len_left_hi", max(slow), ".2f")
    front_door_vs_sweep(ch, rows)


def _atomic_dq(ch) -> None:
    """benchmarks/atomic_dq_experiment.py, run twice: each dQ variant's time over the separate
    kernel's; the plain acq_rel and relaxed ranges over both runs, as chapter 8 quotes them."""
    import pandas as pd

    from .experiments import atomic_dq_both, atomic_dq_ranges

    names = ("at10_fence_lo", "at10_fence_hi", "at10_relaxed_lo", "at10_relaxed_hi", "at10_stagger_lo",
             "at10_stagger_hi", "at10_spread", "at10_where")
    both = atomic_dq_both(ch.root)
    if both is None:
        ch.say("atomic_dq", "No recorded atomic-dQ runs (runs 'atomic_dq' and 'atomic_dq_repeat' in benchmarks/results/index.json).", missing=True)
        return ch.nothing(*names)
    atomic = both[both["variant"] != "separate"]
    spans = pd.concat([f.groupby("variant", sort=False)["x_separate"].agg(lambda s: f"{s.min():.2f} to {s.max():.2f}")
                       .rename(f"run {run}") for run, f in atomic.groupby("run")], axis=1)
    ch.table("atomic_dq", "atomic_dq", spans.rename_axis(index=None, columns="dQ variant (time over the separate kernel's)"))
    ranges = atomic_dq_ranges(both)
    ch.put("at10_fence_lo", ranges["atomic"][0], ".2f"); ch.put("at10_fence_hi", ranges["atomic"][1], ".2f")
    ch.put("at10_relaxed_lo", ranges["relaxed"][0], ".2f"); ch.put("at10_relaxed_hi", ranges["relaxed"][1], ".2f")
    stagger = []
    for _, f in both.groupby("run"):
        ms = f.pivot_table(index=["n", "d", "causal"], columns="variant", values="ms")
        stagger += list(ms["relaxed+stagger"] / ms["relaxed"] - 1) + list(ms["relaxed+stagger 64x128"]
                                                                        / ms["relaxed 64x128"] - 1)
    ch.put("at10_stagger_lo", 100 * min(stagger), "+.1f"); ch.put("at10_stagger_hi", 100 * max(stagger), "+.1f")
    ch.put("at10_spread", 100 * both["spread"].max(), ".1f")
    env = both.attrs["environment"]
    ch.put("at10_where", f"{env['gpu']['name']}, {env['date_utc'][:10]}")


#: The lab backward's recorded runs (run 'gluon_bwd' in benchmarks/results/index.json), in the order run.
GLUON_BWD_RUNS = ("run1_red_atomic", "run2_tma", "run3_stagger", "run4_pipe")
GLUON_BWD_SHOWN = ("triton", "gluon_none", "gluon_atomic", "gluon_red4", "gluon_tma", "gluon_red4_pipe")


def _profiled_mains(folder) -> tuple[list, dict]:
    """A ``gluon_bwd_ncu.py`` profile (``ncu/raw.csv`` in ``order.json``'s order; each profiled
    call starts with the delta kernel): ([(label, row)] for every backward kernel, a Gluon
    kernel labelled by its variant and chapter 8's two as "triton dK/dV" and "triton dQ"),
    {variant: ms of its other kernels (zeroing, converting dQ)}."""
    from .profiles import TIME, ncu_csv

    order = json.loads((folder / "ncu" / "order.json").read_text())["profiled"]
    calls = []
    for k in ncu_csv(folder / "ncu" / "raw.csv"):
        if k["Kernel Name"] == "_bwd_delta" or not calls:
            calls.append([])
        calls[-1].append(k)
    if len(calls) != len(order):
        raise ValueError(f"{folder}: {len(calls)} profiled calls in raw.csv, {len(order)} in order.json")
    mains, extra = [], {}
    for name, call in zip(order, calls):
        ours = [k for k in call if k["Kernel Name"].startswith(("_gluon_attn_bwd", "_bwd_dkdv", "_bwd_dq"))]
        extra[name] = sum(k[TIME] for k in call if k not in ours and k["Kernel Name"] != "_bwd_delta") / 1e6
        mains += [({"_bwd_dkdv": "triton dK/dV", "_bwd_dq": "triton dQ"}.get(k["Kernel Name"], name), k)
                  for k in ours]
    return mains, extra


def _gluon_bwd(ch) -> None:
    """The lab's Gluon backward over cuDNN's, every run, and where its time goes (ncu)."""
    import pandas as pd

    from .profiles import REGS, SPILL_ST, TENSOR_BUSY, TIME

    folder = run_path("gluon_bwd", ch.root) if ch.root is not None else None
    names = ("gb_triton_lo", "gb_triton_hi", "gb_best_lo", "gb_best_hi", "gb_none_lo", "gb_none_hi",
             "gb_local_lo", "gb_local_hi", "gb_tc_none", "gb_tc_written", "gb_regs", "gb_where")
    if folder is None or not (folder / "ncu" / "raw.csv").is_file():
        for topic in ("gluon_bwd", "gluon_bwd_ncu"):
            ch.say(topic, "No recorded lab Gluon backward (run 'gluon_bwd' in benchmarks/results/index.json).", missing=True)
        return ch.nothing(*names)
    rows = []
    for name in GLUON_BWD_RUNS:
        data = json.loads((folder / f"{name}.json").read_text())
        for r in data["speed"]:
            rows += [{"d": r["d"], "variant": v.removeprefix("gluon_"), "x cuDNN": t / r["tflops"]["cudnn"]}
                     for v, t in r["tflops"].items() if v in GLUON_BWD_SHOWN]
    df = pd.DataFrame(rows)
    span = df.groupby(["variant", "d"], sort=False)["x cuDNN"].agg(lambda s: f"{s.min():.2f} to {s.max():.2f}")
    ch.table("gluon_bwd", "gluon_bwd", _by_d(span))
    at = df.groupby(["variant", "d"])["x cuDNN"].agg(["min", "max"])
    written = at.drop(index=["triton", "none"], level="variant").xs(128, level="d")
    ch.put("gb_triton_lo", at.loc[("triton", 128), "min"], ".2f"); ch.put("gb_triton_hi", at.loc[("triton", 128), "max"], ".2f")
    ch.put("gb_best_lo", written["min"].min(), ".2f"); ch.put("gb_best_hi", written["max"].max(), ".2f")
    ch.put("gb_none_lo", at.loc[("none", 128), "min"], ".2f"); ch.put("gb_none_hi", at.loc[("none", 128), "max"], ".2f")
    local = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
    ncu = pd.DataFrame([{"kernel": name, "time (ms)": k[TIME] / 1e6, "local-memory loads (GB)": k[local] / 1e9,
                         "local stores (GB)": k[SPILL_ST] / 1e9, "tensor pipe busy (%)": k[TENSOR_BUSY],
                         "registers": int(k[REGS])} for name, k in _profiled_mains(folder)[0]]).set_index("kernel")
    ch.table("gluon_bwd_ncu", "gluon_bwd_ncu", ncu.round(2).rename_axis(index=None, columns="kernel"))
    spilled = ncu.drop(index=["none", "triton dK/dV", "triton dQ"])["local-memory loads (GB)"]
    ch.put("gb_local_lo", spilled.min(), ".1f"); ch.put("gb_local_hi", spilled.max(), ".1f")
    ch.put("gb_tc_none", ncu.loc["none", "tensor pipe busy (%)"], ".0f")
    written_tc = ncu.drop(index=["none", "triton dK/dV", "triton dQ"])["tensor pipe busy (%)"]
    ch.put("gb_tc_written", f"{written_tc.min():.0f} to {written_tc.max():.0f}")
    ch.put("gb_regs", int(ncu["registers"].max()))
    prov = json.loads((folder / f"{GLUON_BWD_RUNS[-1]}.json").read_text())["provenance"]
    ch.put("gb_where", f"{prov['gpu']['name']}, {prov['date_utc'][:10]}")


def _by_d(span):
    """A (variant, d) series as a table: a row per variant, a column per head_dim."""
    table = span.unstack("d")
    return table.set_axis([f"d = {d}" for d in table.columns], axis=1).rename_axis(index=None, columns="variant")


#: The second try's variants (run 'gluon_bwd_rows'): FA3's register plan, the old plan's red4, chapter 8's kernels.
GLUON_ROWS_SHOWN = ("rows_split_red4", "rows_split_tma", "rows_none", "red4", "triton")
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def _gluon_bwd_rows(ch) -> None:
    """The lab backward again on FlashAttention-3's register plan (``rows``, ``dq_split``): its
    speed over chapter 8's kernels, cuDNN and the old plan, and Nsight Compute's readings,
    wgmma instructions counted (the ``none`` variant drops the dQ products)."""
    import pandas as pd

    from .profiles import SPILL_ST, TENSOR_BUSY, TIME, WGMMA

    folder = run_path("gluon_bwd_rows", ch.root) if ch.root is not None else None
    names = ("gbr_where", "gbr_checks", "gbr_err_hi", "gbr_triton_lo", "gbr_triton_hi", "gbr_cudnn_lo", "gbr_cudnn_hi",
             "gbr_gain_lo", "gbr_gain_hi", "gbr_gain64_lo", "gbr_gain64_hi", "gbr_triton64_lo", "gbr_triton64_hi",
             "gbr_spread", "gbr_n", "gbr_slower",
             "gbr_faster", "gbr_wgmma_none", "gbr_wgmma_written", "gbr_wgmma_old", "gbr_ops_none", "gbr_local",
             "gbr_local_old", "gbr_ms", "gbr_old_ms", "gbr_tri_dkdv_ms", "gbr_tri_dq_ms", "gbr_extra_ms", "gbr_tc",
             "gbr_tc_tma", "gbr_tc_dkdv", "gbr_tc_dq", "gbr_bar", "gbr_bar_tma")
    if folder is None or not (folder / "hopper_bwd.json").is_file() or not (folder / "ncu" / "raw.csv").is_file():
        ch.say("gluon_bwd_rows", "No recorded second lab Gluon backward (run 'gluon_bwd_rows' in "
               "benchmarks/results/index.json).", missing=True)
        return ch.nothing(*names)
    data = json.loads((folder / "hopper_bwd.json").read_text())
    errors = [(m / t if t else 1.0 if m == t else float("inf")) for c in data["checks"] for mode in data["modes"]
              for m, t in zip(c[mode], c["triton"])]
    rows = [{"d": r["d"], "n": r["n"], "causal": r["causal"], "variant": v.removeprefix("gluon_"), "tflops": t,
             "x cuDNN": t / r["tflops"]["cudnn"], "spread": max(max(ms) / min(ms) - 1 for ms in r["ms"].values())}
            for r in data["speed"] for v, t in r["tflops"].items()]
    df = pd.DataFrame(rows)
    tf = df.pivot_table(index=["d", "n", "causal"], columns="variant", values="tflops")
    best = tf["rows_split_red4"]
    span = lambda s: f"{s.min():.2f} to {s.max():.2f}"          # noqa: E731
    shown = df[df["variant"].isin(GLUON_ROWS_SHOWN)]
    speed = _by_d(shown.groupby(["variant", "d"], sort=False)["x cuDNN"].agg(span))
    ch.markdown("gluon_bwd_rows", "**Speed over SDPA cuDNN's backward** (bf16, min to max over the shapes)")
    ch.table("gluon_bwd_rows", "gluon_bwd_rows", speed.reindex(list(GLUON_ROWS_SHOWN)))
    spread = float(df["spread"].max())
    at128, at64 = tf.xs(128, level="d"), tf.xs(64, level="d")
    for key, ratio in (("triton", at128["rows_split_red4"] / at128["triton"]),
                       ("cudnn", at128["rows_split_red4"] / at128["cudnn"]),
                       ("gain", at128["rows_split_red4"] / at128["red4"]),
                       ("gain64", at64["rows_split_red4"] / at64["red4"]),
                       ("triton64", at64["rows_split_red4"] / at64["triton"])):
        ch.put(f"gbr_{key}_lo", ratio.min(), ".2f"); ch.put(f"gbr_{key}_hi", ratio.max(), ".2f")
    vs_triton = best / tf["triton"]
    ch.put("gbr_spread", 100 * spread, ".1f"); ch.put("gbr_n", len(vs_triton))
    ch.put("gbr_slower", int((vs_triton < 1 - spread).sum()))         # slower, and faster, beyond the spread
    ch.put("gbr_faster", int((vs_triton > 1 + spread).sum()))
    ch.put("gbr_checks", len(data["checks"])); ch.put("gbr_err_hi", max(errors), ".2f")
    ch.put("gbr_where", f"{data['provenance']['gpu']['name']}, {data['provenance']['date_utc'][:10]}")
    mains, extra = _profiled_mains(folder)
    local = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
    ncu = pd.DataFrame([{"kernel": label, "time (ms)": k[TIME] / 1e6, "local-memory loads (GB)": k[local] / 1e9,
                         "local stores (GB)": k[SPILL_ST] / 1e9, "wgmma instructions (M)": k[WGMMA] / 1e6,
                         "tensor ops (T)": sum(k.get(m, 0.0) for m in _ops()) / 1e12,
                         "tensor pipe busy (%)": k[TENSOR_BUSY],
                         "long-scoreboard stalls": k[STALL.format("long_scoreboard")],
                         "barrier stalls": k[STALL.format("barrier")]} for label, k in mains]).set_index("kernel")
    ch.markdown("gluon_bwd_rows", "**Nsight Compute, one call each** (tensor ops (T): tensor-core "
                "operations, in trillions; stalls: per issued instruction)")
    ch.table("gluon_bwd_rows", "gluon_bwd_rows_ncu", ncu.round(2).rename_axis(index=None, columns="kernel"))
    ch.put("gbr_wgmma_none", ncu.loc["rows_none", "wgmma instructions (M)"], ".1f")
    ch.put("gbr_wgmma_written", ncu.loc["rows_split_red4", "wgmma instructions (M)"], ".1f")
    ch.put("gbr_wgmma_old", ncu.loc["red4", "wgmma instructions (M)"], ".1f")
    ops = ncu["tensor ops (T)"]
    ch.put("gbr_ops_none", ops["rows_none"] / ops["rows_split_red4"], ".2f")      # 0.80: four products of five
    ch.put("gbr_local", ncu.loc["rows_split_red4", "local-memory loads (GB)"], ".1f")
    ch.put("gbr_local_old", ncu.loc["red4", "local-memory loads (GB)"], ".1f")
    for key, kernel in (("ms", "rows_split_red4"), ("old_ms", "red4"), ("tri_dkdv_ms", "triton dK/dV"),
                        ("tri_dq_ms", "triton dQ")):
        ch.put(f"gbr_{key}", ncu.loc[kernel, "time (ms)"], ".2f")
    ch.put("gbr_extra_ms", extra["rows_split_red4"], ".2f")
    for key, kernel in (("tc", "rows_split_red4"), ("tc_tma", "rows_split_tma"), ("tc_dkdv", "triton dK/dV"),
                        ("tc_dq", "triton dQ")):
        ch.put(f"gbr_{key}", ncu.loc[kernel, "tensor pipe busy (%)"], ".0f")
    ch.put("gbr_bar", ncu.loc["rows_split_red4", "barrier stalls"], ".2f")
    ch.put("gbr_bar_tma", ncu.loc["rows_split_tma", "barrier stalls"], ".2f")


def _start_and_end(ch) -> None:
    """A program's fixed cost, fitted as a + b t over the key tiles t it visits (the old
    default's full-attention speed at three lengths, first graph-timed run)."""
    import numpy as np

    short = ch.frames.get("short")
    if short is None:
        return ch.nothing("fixed_tiles", "fixed_gain_1k", "fixed_gain_2k")
    full = short[(short["run"] == 1) & ~short["causal"]]
    tiles = full["seq"].to_numpy() / 128                  # key tiles per query tile
    b, a = np.polyfit(tiles, tiles / full["old default"].to_numpy(), 1)
    ch.put("fixed_tiles", a / b, ".2f")
    ch.put("fixed_gain_1k", 100 * a / (8 * b), ".0f"); ch.put("fixed_gain_2k", 100 * a / (16 * b), ".0f")


def dq_bytes(ch) -> None:
    """The ladder's two dQ rungs: the products each does per tile pair, and the bytes the
    atomic rung's fp32 read-modify-writes move, against the extra time it measured (the table
    ``dq_bytes``, which chapter 10 quotes but does not show)."""
    import pandas as pd

    from .. import runtime, tiled
    from ..kernels import configs
    from .costs import GB
    from .harness import shape_label

    matmuls = {"atomic": 5, "separate": 4 + 3}      # S, dV, dP, dK (+ dQ); the dQ kernel: S, dP, dQ again
    ch.put("mm_atomic", matmuls["atomic"]); ch.put("mm_separate", matmuls["separate"])
    ch.put("mm_ratio", matmuls["separate"] / matmuls["atomic"], ".1f")
    bsteps = ch.frames.get("bsteps")
    if bsteps is None:
        ch.say("dq_lesson", "No recorded ladder (benchmarks/results/).", missing=True)   # the page's dQ cell
        return ch.nothing("atomic_gb_lo", "atomic_gb_hi", "atomic_floor_share_lo", "atomic_floor_share_hi",
                          "dq_lo", "dq_hi")
    chip = runtime.chip((ch.ladder_provenance.get("gpu") or {}).get("datasheet", {}).get("chip", "H200"))
    rows = []
    for r in bsteps[bsteps["name"] == "dQ separate"].itertuples():
        atomic = bsteps[(bsteps["name"] == "dQ atomic") & (bsteps["seq"] == r.seq)
                        & (bsteps["head_dim"] == r.head_dim) & (bsteps["causal"] == r.causal)].iloc[0]
        cfg = configs.default("backward_dkdv", cc=ch.cc, block_d=configs.block_d(r.head_dim), elem_bytes=2,
                              causal=bool(r.causal))
        pairs = sum(tiled.visible_key_tiles(r.seq, r.seq, cfg.block_m, cfg.block_n, r.causal))
        added = r.batch * r.heads * pairs * cfg.block_m * r.head_dim * 4 * 2     # fp32, read and write
        rows.append({"shape": shape_label(r.head_dim, r.seq, r.causal), "atomic ms": atomic["ms"],
                     "separate ms": r.ms, "separate x": r.vs_prev, "atomic GB moved": added / GB,
                     "that at HBM speed, ms": added / (chip.hbm_tb_s * 1e12) * 1e3,
                     "extra ms measured": atomic["ms"] - r.ms})
    dq = pd.DataFrame(rows).set_index("shape")
    dq["floor / extra"] = dq["that at HBM speed, ms"] / dq["extra ms measured"]
    # not shown on the page (its numbers are quoted in the note on acq_rel adds): kept as a table
    ch.tables["dq_bytes"] = dq.drop(columns=["atomic ms", "separate ms"]).rename(
        columns={"separate x": "separate's speed-up over atomic"}).round(2)
    ch.put("atomic_gb_lo", dq["atomic GB moved"].min(), ".0f"); ch.put("atomic_gb_hi", dq["atomic GB moved"].max(), ".0f")
    ch.put("atomic_floor_share_lo", 100 * dq["floor / extra"].min(), ".0f")
    ch.put("atomic_floor_share_hi", 100 * dq["floor / extra"].max(), ".0f")
    ch.put("dq_lo", dq["separate x"].min(), ".1f"); ch.put("dq_hi", dq["separate x"].max(), ".1f")


def slots_per_sm(row, chip, num_warps):
    """Programs one SM holds at once: limited by registers, shared memory and warps."""
    regs = chip.regs_per_sm_kib * 1024 // 4
    by_regs = regs // (int(row["n_regs"]) * 32 * num_warps)
    by_smem = chip.smem_per_sm_kib * 1024 // int(row["shared_bytes"])
    return max(1, min(by_regs, by_smem, chip.max_warps_per_sm // num_warps))


def finish_time(work, slots):
    """Greedy list schedule: programs in launch order, each on the slot that frees first."""
    import numpy as np

    free = np.zeros(slots)
    for w in work:
        i = int(np.argmin(free))
        free[i] += w
    return free.max()


def heavy_first(ch) -> None:
    """Heaviest query tiles first: the schedule model's predicted gain beside the measured one.
    A program takes the key tiles it visits plus one (loading Q, writing O); ``heavy_fixed_shift``
    is how far the prediction moves when that fixed cost is chapter 9's measured one instead."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from .. import runtime, tiled
    from ..kernels import configs
    from .blocks import block_state

    from .chapter9_causal import fixed_tiles

    names = ("heavy_pred_lo", "heavy_pred_hi", "heavy_lo", "heavy_hi", "heavy_sig", "heavy_n", "heavy_full_dev",
             "heavy_slots", "heavy_fixed", "heavy_fixed_shift", "heavy_long")
    blocks = ch.frames.get("blocks")
    if ch.frames.get("steps") is None or blocks is None:
        ch.say("heavy", "No recorded ladder or block sweep (benchmarks/results/).", missing=True)
        return ch.nothing(*names)
    gpu = ch.ladder_provenance.get("gpu") or {}
    chip = runtime.chip(gpu.get("datasheet", {}).get("chip", "H200"))
    sms = int(gpu.get("sms") or chip.sms)
    gains = ch.rung_gains("heaviest first")
    measured_fixed = fixed_tiles(ch.root)
    preds, slots_used, shift = [], {}, 0.0
    for r in gains.itertuples():
        p = 1.0                                                    # no mask: the same kernel
        if r.causal:
            cfg = configs.default("forward", cc=ch.cc, block_d=configs.block_d(r.head_dim), elem_bytes=2)
            state = block_state(blocks, r.head_dim, *dataclasses.astuple(cfg), measured_arch=ch.arch)
            slots = sms * slots_per_sm(state.row, chip, cfg.num_warps)
            tiles = np.array(tiled.visible_key_tiles(r.seq, r.seq, cfg.block_m, cfg.block_n, True))

            def gain(fixed):
                light_first = np.tile(tiles + fixed, r.batch * r.heads)   # program_id 0 (the lightest) first
                return finish_time(light_first, slots) / finish_time(light_first[::-1], slots)

            p = gain(1.0)
            shift = max([shift] + [abs(gain(f) - p) for f in measured_fixed])
            slots_used[r.head_dim] = slots
        preds.append(p)
    table = pd.DataFrame({"TFLOP/s": gains["tflops"], "x previous": gains["vs_prev"], "predicted x": preds})
    table["verdict"] = table["x previous"].map(ch.verdict)
    ch.table("heavy", "heavy", table.round(3))
    causal = table[gains["causal"].values]
    ch.put("heavy_pred_lo", causal["predicted x"].min(), ".3f"); ch.put("heavy_pred_hi", causal["predicted x"].max(), ".3f")
    ch.put("heavy_lo", causal["x previous"].min(), ".3f"); ch.put("heavy_hi", causal["x previous"].max(), ".3f")
    ch.put("heavy_sig", int((causal["verdict"] == "beyond noise").sum())); ch.put("heavy_n", len(causal))
    if measured_fixed:
        ch.put("heavy_fixed", f"{min(measured_fixed):.1f} to {max(measured_fixed):.1f}")
        ch.put("heavy_fixed_shift", shift, ".3f")
    else:
        ch.nothing("heavy_fixed", "heavy_fixed_shift")
    ch.put("heavy_full_dev", 100 * float((table[~gains["causal"].values]["x previous"] - 1).abs().max()), ".1f")
    ch.put("heavy_slots", "; ".join(f"{s} at d = {d}, {s // sms} per SM" for d, s in sorted(slots_used.items())))
    # at the longest causal length (the largest measured gains), the model's prediction beside the measurement
    long = gains["causal"].values & (gains["seq"].values == gains["seq"].max())
    rows = [(int(d), m, p) for d, m, p in zip(gains["head_dim"][long], table["x previous"][long], table["predicted x"][long])]
    ch.put("heavy_long", ("under-predicts" if all(m > p for _, m, p in rows) else "does not always under-predict")
           + f" the gains at N = {gains['seq'].max() // 1024}K: "
           + "; ".join(f"{m:.3f} measured against {p:.3f} predicted at d = {d}" for d, m, p in rows))


def _documents_listed(rows, unit: str = "") -> str:
    """[(shape, programs)] of packed documents as "documents 8K and 16K (2,976 and 4,320)"."""
    if not rows:
        return "no documents row"
    sizes = listed(shape.removeprefix("documents ") for shape, _ in rows)
    return f"documents {sizes} ({listed(f'{n:,}' for _, n in rows)}{unit})"


def launched_today(row: dict, seed: int) -> int:
    """The programs the library's forward launches today at a row of run ``launch_order``, the
    count ``configs.head_group`` judges: ``autograd.launch_shape``'s grid with the forward's own
    tiles (a short window has its own, ``configs.tiles_for``), for packed documents over the
    documents the run drew (its ``seed``)."""
    import torch

    from ..kernels import autograd, configs
    from ..kernels.varlen import Packed
    from ..masks import random_documents

    block_d = configs.block_d(row["head_dim"])
    keys = None if row["mask"] != "window" else row["window"] + 1   # mask_args.window_keys: (window, 0), causal
    causal, window = configs.tiles_for(row["mask"] != "full", keys, block_d)
    tile = configs.default("forward", cc=90, block_d=block_d, elem_bytes=2, causal=causal, window=window).block_m
    packed = None
    if row["mask"] == "documents":
        cu = torch.as_tensor(random_documents(row["seq"], seed))
        longest = int((cu[1:] - cu[:-1]).max())
        packed = Packed(cu, cu, longest, longest)
    grid, _ = autograd.launch_shape(packed, "q", row["heads"], row["batch"], row["seq"], tile, {})
    return grid[0] * grid[1]


def launch_order(ch) -> None:
    """Rung 5 across heads: the programs dealt out a few heads at a time (run ``launch_order``;
    ``forward.launch_position``, ``configs.head_group``)."""
    import pandas as pd

    from ..kernels import configs

    names = ("lo_group", "lo_per_sm", "lo_small_fwd", "lo_small_fb", "lo_large_lo", "lo_large_hi", "lo_n_large",
             "lo_fwd_worst_shape", "lo_fwd_worst", "lo_fwd_worst_fb", "lo_small", "lo_small_programs", "lo_sms",
             "lo_small_max", "lo_rounds", "lo_docs_grouped", "lo_docs_plain", "lo_rule_grouped",
             "lo_fwd_worst_spread")
    run = load_recorded_json("launch_order", ch.root) if ch.root is not None else None
    if not run:
        ch.say("launch_order", "No recorded launch-order run (run 'launch_order' in benchmarks/results/index.json).",
               missing=True)
        return ch.nothing(*names)
    group = f"G={configs.SMALL_GRID_HEAD_GROUP}"
    gpu = run["provenance"]["gpu"]
    sms, cc = gpu["sms"], int(gpu["capability"].removeprefix("sm_"))
    rows, launched, spread = [], {}, {}
    # launch_order_experiment.py seeds each shape by its place in its SHAPES, the order of the rows
    for seed, r in enumerate(run["rows"]):
        tile = configs.default("forward", cc=90, block_d=configs.block_d(r["head_dim"]), elem_bytes=2,
                               causal=r["mask"] != "full").block_m
        t = r["times"]
        rows.append({"shape": r["shape"], "programs": -(-r["seq"] // tile) * r["batch"] * r["heads"],
                     "fwd+bwd, plain order (ms)": t["G=1"]["fwd_bwd_ms"],
                     f"fwd+bwd, {configs.SMALL_GRID_HEAD_GROUP} heads at a time (ms)": t[group]["fwd_bwd_ms"],
                     "x plain, fwd": t["G=1"]["fwd_ms"] / t[group]["fwd_ms"],
                     "x plain, fwd+bwd": t["G=1"]["fwd_bwd_ms"] / t[group]["fwd_bwd_ms"],
                     "bitwise equal": all(r["exact"].values())})
        spread[r["shape"]] = max(max(t[g][m]) / min(t[g][m]) - 1 for g in ("G=1", group) for m in ("fwd", "fwd_bwd"))
        launched[r["shape"]] = launched_today(r, seed)
    table = pd.DataFrame(rows).set_index("shape")
    ch.table("launch_order", "launch_order", table.round(3).rename_axis(index=None, columns="shape"))
    small = table.loc[table["programs"].idxmin()]
    # the page's split at 2,048 programs (tokens / tile x heads, every order forced); which rows
    # the library groups (the rule, on the grid it launches today) is said after it
    grouped = table[table["programs"] < 2048]
    large = table.drop(grouped.index)["x plain, fwd+bwd"]
    ch.put("lo_group", configs.SMALL_GRID_HEAD_GROUP); ch.put("lo_per_sm", configs.SMALL_GRID_PROGRAMS_PER_SM)
    ch.put("lo_sms", sms); ch.put("lo_small_max", configs.SMALL_GRID_PROGRAMS_PER_SM * sms, ",")
    rounds = sorted({len(t[m]) for r in run["rows"] for t in r["times"].values() for m in ("fwd", "fwd_bwd")})
    ch.put("lo_rounds", rounds[0] if len(rounds) == 1 else f"{rounds[0]} to {rounds[-1]}")
    by_rule = [s for s, n in launched.items() if configs.head_group(n, sms=sms, cc=cc) != 1]
    docs = [(s, n) for s, n in launched.items() if s.startswith("documents")]
    ch.put("lo_docs_grouped", _documents_listed([x for x in docs if x[0] in by_rule], " programs launched"))
    ch.put("lo_docs_plain", _documents_listed([x for x in docs if x[0] not in by_rule]))
    ch.put("lo_rule_grouped", listed(by_rule))
    ch.put("lo_small", small.name); ch.put("lo_small_programs", int(small["programs"]))
    ch.put("lo_small_fwd", small["x plain, fwd"], ".2f"); ch.put("lo_small_fb", small["x plain, fwd+bwd"], ".2f")
    ch.put("lo_large_lo", large.min(), ".2f"); ch.put("lo_large_hi", large.max(), ".2f")
    ch.put("lo_n_large", len(large))
    worst = grouped["x plain, fwd"].idxmin()
    ch.put("lo_fwd_worst_shape", worst); ch.put("lo_fwd_worst", grouped.loc[worst, "x plain, fwd"], ".2f")
    ch.put("lo_fwd_worst_fb", grouped.loc[worst, "x plain, fwd+bwd"], ".2f")
    ch.put("lo_fwd_worst_spread", 100 * spread[worst], ".0f")   # its rounds, both orders, fwd and fwd+bwd


def build_into(ch) -> None:
    """The front door and the lab entries of this module, into ``ch``."""
    heavy_first(ch)
    launch_order(ch)
    dq_bytes(ch)
    _front_door(ch)
    _atomic_dq(ch)
    _gluon_bwd(ch)
    _gluon_bwd_rows(ch)
    _start_and_end(ch)
    moved_notes(ch)          # appendix A3's notes from chapters 7, 9, 11 and 12 (experiments.MOVED_NOTES)
