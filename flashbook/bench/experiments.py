"""Chapter 10's recorded experiments read back: the forward on Hopper's tensor
descriptors, lazy rescaling, compiled-in lengths, the Gluon kernel's schedules and tiles,
exponentials on the FMA units, the host's share of a call, and the short sweeps timed
from CUDA graphs.

Each experiment is a run of the index (``runs``), named by a constant here; a function
that reads one returns None (``load_hopper_experiment``: ``(None, {})``) when it is not
recorded. They need pandas, and no GPU.
"""
from __future__ import annotations

from .runs import load_recorded_json

#: ``benchmarks/hopper_fwd_experiment.py``'s recorded run.
HOPPER_EXPERIMENT = "hopper_fwd"


#: ``benchmarks/gpu_check.py --autotune``'s recorded run.
AUTOTUNE_RUN = "autotune"


def load_hopper_experiment(root=None):
    """``(DataFrame, environment dict)`` of the recorded Hopper forward experiment
    (tensor descriptors and automatic warp specialisation; chapter 10), or
    ``(None, {})`` when none is recorded. One row per shape and variant, with
    ``tma`` and ``ws`` flags and ``tflops`` (NaN where the variant failed)."""
    import pandas as pd

    data = load_recorded_json(HOPPER_EXPERIMENT, root)
    if data is None:
        return None, {}
    df = pd.DataFrame(data["rows"])
    if "tflops" not in df:  # no variant ran at all
        df["tflops"] = float("nan")
    df["tma"] = df["variant"].str.startswith("tma ")
    df["ws"] = df["variant"].str.endswith(" ws")
    return df, data.get("environment", {})


def hopper_experiment_table(rows):
    """Per shape: the library kernel's and cuDNN's TFLOP/s, the best descriptor (TMA)
    variant without and with warp specialisation, each over the library kernel, and how
    many variants failed to compile. ``rows`` is ``load_hopper_experiment``'s frame."""
    import pandas as pd

    out = []
    for (seq, d, causal), g in rows.groupby(["seq", "head_dim", "causal"], sort=True):
        lib = g.loc[g["variant"] == "flashbook", "tflops"]
        cudnn = g.loc[g["variant"] == "cudnn", "tflops"]
        if lib.empty or not lib.notna().all():
            raise ValueError(f"rows must hold a timed 'flashbook' variant for every shape; "
                             f"none at seq={seq}, head_dim={d}, causal={causal}")
        lib = float(lib.iloc[0])
        row = {"seq": int(seq), "head_dim": int(d), "causal": bool(causal), "flashbook": lib,
               "cudnn": float(cudnn.iloc[0]) if len(cudnn) else float("nan")}
        for key, pick in (("tma", g["tma"] & ~g["ws"]), ("tma_ws", g["tma"] & g["ws"])):
            ran = g[pick & g["tflops"].notna()]
            if ran.empty:
                row[f"best_{key}"], row[f"best_{key}_tflops"], row[f"{key}_vs_flashbook"] = None, float("nan"), float("nan")
            else:
                best = ran.loc[ran["tflops"].idxmax()]
                row[f"best_{key}"] = best["variant"]
                row[f"best_{key}_tflops"] = float(best["tflops"])
                row[f"{key}_vs_flashbook"] = float(best["tflops"]) / lib
        row["failed"] = int((g["tma"] & g["tflops"].isna()).sum())
        row["tried"] = int(g["tma"].sum())
        out.append(row)
    return pd.DataFrame(out)


#: ``benchmarks/lazy_rescale_experiment.py``'s and ``static_shape_experiment.py``'s recorded
#: runs (chapter 10 reads them with ``variant_table``).
LAZY_EXPERIMENT = "lazy_rescale"
STATIC_SHAPE_EXPERIMENT = "static_shape"
#: benchmarks/gluon_experiment.py's runs on the H200, by head_dim (chapter 10's Gluon kernel)
GLUON_EXPERIMENTS = {128: "gluon_d128", 64: "gluon_d64"}
GLUON_SCHEDULES = ("overlap", "producer", "pingpong")
#: benchmarks/gluon_exp2_experiment.py's runs on the H200, by head_dim: part of the exponentials on the FMA units
GLUON_EXP2_EXPERIMENTS = {64: "gluon_exp2_d64", 128: "gluon_exp2_d128"}
#: benchmarks/host_overhead.py's run on the H200
HOST_OVERHEAD_RUN = "host_overhead"
#: benchmarks/gluon_experiment.py --graph at d=64, fp16: every configuration at 1K-3K, then
#: 1K, 2K and 4K with the persistent schedule beside the others (chapter 10)
GLUON_SHORT_SWEEPS = ("gluon_d64_short_graph", "gluon_d64_persistent_graph")
#: the kinds of configuration ``short_sweep_table`` compares: (column, variant-name prefix)
SHORT_FAMILIES = (("old default", "gluon overlap m64 n128 s2"), ("64 rows", "gluon overlap m64 "),
                  ("192 rows", "gluon producer m192 "), ("persistent", "gluon persistent "))


def variant_table(name: str, prefix: str, root=None):
    """Per dtype, length and mask of a recorded forward experiment (``name``, e.g.
    ``LAZY_EXPERIMENT``, as ``load_recorded_json`` takes it): the library kernel's and cuDNN's TFLOP/s, the fastest variant
    whose name starts with ``prefix`` and its speed over the library kernel, and its
    largest error against float64 beside the library's. None when nothing is recorded."""
    data = load_recorded_json(name, root)
    return None if data is None else best_variants(data["rows"], prefix, name)


def best_variants(rows, prefix: str, name: str = "the run"):
    """``variant_table`` for rows already read (a recorded experiment's ``"rows"``)."""
    import pandas as pd

    rows = pd.DataFrame(rows)
    out = []
    for (dtype, seq, causal), g in rows.groupby(["dtype", "seq", "causal"], sort=True):
        by = g.set_index("variant")
        mine = g[g["variant"].str.startswith(prefix)]
        if mine.empty:
            raise ValueError(f"prefix must start a variant's name in {name}, got {prefix!r}")
        best = mine.sort_values("tflops", ascending=False).iloc[0]
        out.append({"dtype": dtype, "seq": int(seq), "causal": bool(causal),
                    "flashbook": float(by.loc["flashbook", "tflops"]), "cudnn": float(by.loc["cudnn", "tflops"]),
                    "best": best["variant"], "best_tflops": float(best["tflops"]),
                    "best_vs_flashbook": float(best["tflops"]) / float(by.loc["flashbook", "tflops"]),
                    "best_err": float(best["max_abs_err_head0_vs_float64"]),
                    "flashbook_err": float(by.loc["flashbook", "max_abs_err_head0_vs_float64"])})
    return pd.DataFrame(out)


def short_sweep_table(root=None):
    """The two ``GLUON_SHORT_SWEEPS``, one row per run (1, 2), length and mask: cuDNN's and
    the chapter-7 kernel's TFLOP/s and, per ``SHORT_FAMILIES`` column, the fastest such
    configuration's TFLOP/s and its name (``<column> config``); NaN where a run did not
    time that kind. None when either run is not recorded."""
    import pandas as pd

    out = []
    for run, name in enumerate(GLUON_SHORT_SWEEPS, start=1):
        data = load_recorded_json(name, root)
        if data is None:
            return None
        keys = ["dtype", "seq", "causal"]
        table = None
        for column, prefix in SHORT_FAMILIES:
            if not any(r["variant"].startswith(prefix) for r in data["rows"]):
                continue
            best = best_variants(data["rows"], prefix, name)
            best = best[keys + ["flashbook", "cudnn", "best", "best_tflops"]].rename(
                columns={"best": f"{column} config", "best_tflops": column})
            table = best if table is None else table.merge(best.drop(columns=["flashbook", "cudnn"]), on=keys)
        out.append(table.assign(run=run))
    table = pd.concat(out, ignore_index=True)
    for column, _ in SHORT_FAMILIES:   # a kind one run did not time
        if column not in table:
            table[column] = float("nan")
    return table


def schedule_pairs(name: str, first: str, second: str, root=None):
    """Configurations a recorded experiment (``name``) timed under two schedules: per length,
    mask and tiles (``m64 n128 s2``), the TFLOP/s under ``first`` and ``second`` and their
    ratio (``first_over_second``). None when the run is not recorded."""
    import pandas as pd

    data = load_recorded_json(name, root)
    if data is None:
        return None
    rows = pd.DataFrame(data["rows"])
    keys = ["dtype", "seq", "causal", "tiles"]
    picked = []
    for schedule in (first, second):
        part = rows[rows["variant"].str.startswith(f"gluon {schedule} ")]
        picked.append(part.assign(tiles=part["variant"].str.split(f"gluon {schedule} ").str[1])[keys + ["tflops"]]
                      .rename(columns={"tflops": schedule}))
    both = picked[0].merge(picked[1], on=keys)
    if both.empty:
        raise ValueError(f"{name} has no configuration timed under both {first!r} and {second!r}")
    return both.assign(first_over_second=both[first] / both[second]).reset_index(drop=True)


def fma_share_table(head_dim: int, root=None):
    """Chapter 10's exponentials on the FMA units at one head_dim: per dtype, length and
    mask, the kernel's TFLOP/s with none there (``share0``, its first timing), the same
    kernel timed again at the end of the shape's variants (``again``, over ``share0``: the
    run's noise), and each ``fma{share} deg{degree}`` variant's TFLOP/s over ``share0``.
    Errors against float64 are ``*_err`` columns. None when the run is not recorded."""
    import pandas as pd

    data = load_recorded_json(GLUON_EXP2_EXPERIMENTS[head_dim], root)
    if data is None:
        return None
    rows = pd.DataFrame(data["rows"])
    rows = rows[rows["variant"].str.startswith("gluon ")]
    out = []
    for (dtype, seq, causal), g in rows.groupby(["dtype", "seq", "causal"], sort=True):
        tail = g["variant"].str.split(" fma").str[1]
        by = dict(zip(tail, g["tflops"]))
        err = dict(zip(tail, g["max_abs_err_head0_vs_float64"]))
        row = {"dtype": dtype, "seq": int(seq), "causal": bool(causal), "share0": float(by["0"]),
               "again": float(by["0 again"]) / float(by["0"]), "share0_err": float(err["0"])}
        for name in tail:
            if not name.startswith("0"):
                row[f"fma{name}"] = float(by[name]) / float(by["0"])
                row[f"fma{name}_err"] = float(err[name])
        out.append(row)
    return pd.DataFrame(out)


def host_overhead_tables(root=None):
    """``benchmarks/host_overhead.py``'s recorded run: (``host``: CPU microseconds per call
    of each implementation and of the Gluon wrapper's parts, ``shapes``: per implementation
    and shape, the benchmark's timer on the call and on its CUDA graph, in ms and TFLOP/s,
    and ``inflation``, timer over graph), or None when it is not recorded."""
    import pandas as pd

    data = load_recorded_json(HOST_OVERHEAD_RUN, root)
    if data is None:
        return None
    shapes = pd.DataFrame(data["shapes"])
    return pd.DataFrame(data["host"]), shapes.assign(inflation=shapes["timer_ms"] / shapes["graph_ms"])


def gluon_schedule_table(head_dim: int, root=None):
    """Chapter 10's Gluon kernel at one head_dim: per dtype, length and mask, the library
    kernel's and cuDNN's TFLOP/s and, for each schedule, its fastest configuration's
    TFLOP/s (columns ``overlap``, ``producer``, ``pingpong``), that configuration's name
    (``*_config``) and its largest error against float64 (``*_err``). None when the run
    is not recorded."""
    data = load_recorded_json(GLUON_EXPERIMENTS[head_dim], root)
    if data is None:
        return None
    tables = [best_variants(data["rows"], f"gluon {schedule} ", GLUON_EXPERIMENTS[head_dim])
              for schedule in GLUON_SCHEDULES]
    keys = ["dtype", "seq", "causal"]
    out = tables[0][keys + ["flashbook", "cudnn", "flashbook_err"]].copy()
    for schedule, t in zip(GLUON_SCHEDULES, tables):
        out = out.merge(t[keys + ["best", "best_tflops", "best_err"]].rename(columns={
            "best": f"{schedule}_config", "best_tflops": schedule, "best_err": f"{schedule}_err"}), on=keys)
    return out


#: ``benchmarks/atomic_dq_experiment.py``'s recorded runs, in the order run.
ATOMIC_DQ_EXPERIMENT = "atomic_dq"
ATOMIC_DQ_RUNS = (ATOMIC_DQ_EXPERIMENT, "atomic_dq_repeat")


def atomic_dq_table(root=None, run: str = ATOMIC_DQ_EXPERIMENT):
    """One recorded run of the atomic-dQ experiment (chapter 8) as a DataFrame, one row per
    shape, mask and variant: ``ms`` (median), ``x_separate`` (its time over the separate dQ
    kernel's), ``spread`` ((slowest - fastest) / median of the repeats) and ``dq_err`` (dQ's
    largest error against float64 over its largest value); None when it is not recorded."""
    import pandas as pd

    data = load_recorded_json(run, root)
    if data is None:
        return None
    df = pd.DataFrame([{"batch": r["batch"], "heads": r["heads"], "n": r["n"], "d": r["d"], "causal": r["causal"],
                        "variant": r["variant"], "ms": r["median_ms"], "x_separate": 1.0 / r["vs_separate"],
                        "spread": (max(r["ms"]) - min(r["ms"])) / r["median_ms"],
                        "dq_err": r["errors"]["dq_vs_float64"]} for r in data["rows"]])
    df.attrs["environment"] = data.get("environment", {})
    return df


def atomic_dq_both(root=None):
    """Both recorded runs (``ATOMIC_DQ_RUNS``) as one DataFrame with a ``run`` column (1, 2),
    the first run's environment in ``attrs``; None unless both are recorded. Chapters 8 and 10
    quote their ranges from it, so the two give the same numbers."""
    import pandas as pd

    runs = [atomic_dq_table(root, name) for name in ATOMIC_DQ_RUNS]
    if any(r is None for r in runs):
        return None
    both = pd.concat([r.assign(run=i + 1) for i, r in enumerate(runs)], ignore_index=True)
    both.attrs["environment"] = runs[0].attrs["environment"]
    return both


def atomic_dq_ranges(df) -> dict:
    """variant -> (fewest, most) times as long as the separate dQ kernel, over the shapes."""
    spans = df.groupby("variant", sort=False)["x_separate"].agg(["min", "max"])
    return {name: (row["min"], row["max"]) for name, row in spans.iterrows()}
