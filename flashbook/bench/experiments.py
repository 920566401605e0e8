"""Chapter 10's recorded experiments read back: the forward on Hopper's tensor
descriptors, lazy rescaling, compiled-in lengths, the Gluon kernel's schedules and tiles,
exponentials on the FMA units, the host's share of a call, and the short sweeps timed
from CUDA graphs.

Each experiment is a run of the index (``runs``), named by a constant here; a function
that reads one returns None (``load_hopper_experiment``: ``(None, {})``) when it is not
recorded. They need pandas, and no GPU.
"""
from __future__ import annotations

import json

from ..display import span
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


# ------------------------------------------------------------------ appendix A3's notes from other chapters

#: The names ``moved_notes`` puts: the compile failures of the Hopper experiment, then what
#: chapters 7, 9, 10, 11 and 12 measured on the way and appendix A3 keeps (its last sections).
MOVED_NOTES = {
    "hopper": ("ws_failed_error", "ws_failed_variants"),
    "ch7": ("c7_batch", "c7_fb", "c7_fa2", "c7_fa2_full", "c9_runs", "c9_batch", "c9_fb", "c9_fa2",
            "c9_fa2_full", "c7_fa2_gain"),
    "ch9": ("c9_toolchain", "c9_clean_cfg", "c9_clean_ms", "c9_eq_cfg", "c9_eq_spill", "c9_eq_ms", "c9_eq_gap",
            "c9_default_cfg", "c9_default_spill", "c9_default_ms", "c9_cudnn_spill", "c9_cudnn_regs",
            "c9_cudnn_threads"),
    "ch10": ("heavy_16k",),
    "ch11": ("c11_first_lengths", "c11_first_called", "c11_first_gpu", "c11_first_cudnn", "c11_r1_call",
             "c11_r1_cudnn", "c11_r1_empty", "c11_r2_short", "c11_r2_checked", "c11_r2_cudnn", "c11_r3_checked",
             "c11_r3_cudnn", "c11_r3_empty", "c11_cudnn_called", "c11_cudnn_runs", "c11_old_cudnn",
             "c11_old_paged"),
    "ch12": ("c12_first_x", "c12_bwd_gap", "c12_stream", "c12_fused_4k", "c12_d64_keys", "c12_d64_queries",
             "c12_order_gains", "c12_order_spread", "c12_lw_ms", "c12_lw_causal_ms", "c12_ft64", "c12_ft128",
             "c12_ol_flex", "c12_st_failed", "c12_st_x"),
}


def _moved_hopper(ch) -> None:
    """Which descriptor variants did not compile, and the error each recorded."""
    rows, _ = load_hopper_experiment(ch.root)
    if rows is None or "error" not in rows:
        return ch.nothing(*MOVED_NOTES["hopper"])
    failed = rows[rows["error"].notna()]
    errors = sorted({str(e).split(": ", 1)[-1] for e in failed["error"]})
    ch.put("ws_failed_error", " and ".join(errors))
    names = sorted({v.removeprefix("tma ") for v in failed["variant"]}, key=lambda v: (len(v), v))
    ch.put("ws_failed_variants", " and ".join(names) if len(names) < 3 else ", ".join(names))


def _moved_ch7(ch) -> None:
    """Chapter 7's quick timing (batch 2, recorded GPU output) beside chapter 9's full runs, the
    causal forward at N = 4096, d = 128: TFLOP/s of ours and of SDPA's FlashAttention-2 backend."""
    import re

    from .readback import load_results
    from .runs import recorded_output, run_paths

    text = recorded_output("07_triton_forward", "cd762aa3", ch.root)
    sweeps = [load_results(p)[0] for p in run_paths("sweep", ch.root)]
    found = re.search(r"batch (\d+), \d+ heads, N=(\d+), d=(\d+)", text or "")
    if found is None or not sweeps:
        return ch.nothing(*MOVED_NOTES["ch7"])
    batch, n, d = (int(x) for x in found.groups())
    quick = {}
    for block in re.split(r"\n(?=(?:False|True)\s)", text.split("TFLOP/s", 1)[1]):
        causal = block.lstrip().startswith("True")
        for name, key in (("flashbook", "fb"), ("SDPA FlashAttention-2", "fa2")):
            m = re.search(rf"{re.escape(name)}\s+[\d.]+\s+([\d.]+)", block)
            if m:
                quick[key, causal] = float(m.group(1))
    full = []
    for s in sweeps:
        at = s[(s["status"] == "ok") & (s["seq"] == n) & (s["head_dim"] == d)]
        full.append(at.pivot_table(index="causal", columns="impl", values="fwd_tflops"))
    runs_batch = {int(b) for s in sweeps for b in s[(s["seq"] == n) & (s["head_dim"] == d)]["batch"]}
    fb, fa2 = [p.loc[True, "flashbook"] for p in full], [p.loc[True, "sdpa-flash"] for p in full]
    fa2_full = [p.loc[False, "sdpa-flash"] for p in full]
    ch.put("c7_batch", batch); ch.put("c7_fb", quick["fb", True], ".0f"); ch.put("c7_fa2", quick["fa2", True], ".0f")
    ch.put("c7_fa2_full", quick["fa2", False], ".0f")
    ch.put("c9_runs", len(sweeps)); ch.put("c9_batch", " and ".join(str(b) for b in sorted(runs_batch)))
    ch.put("c9_fb", span(fb, ".0f", collapse=True)); ch.put("c9_fa2", span(fa2, ".0f", collapse=True))
    ch.put("c9_fa2_full", span(fa2_full, ".0f", collapse=True))
    ch.put("c7_fa2_gain", span([100 * (x / quick["fa2", True] - 1) for x in fa2], ".0f", collapse=True))


def _moved_ch9(ch) -> None:
    """Chapter 9's profile of the causal dK/dV tiles at d = 128 (run ``kernel_ncu``): the default
    tile, the fastest tile that does the same tensor work without spilling (chapter 9's pair), the
    default's tile and warps at that tile's stages, and cuDNN's backward registers and spill."""
    from . import profiles
    from ..kernels import configs
    from .runs import run_path

    run = run_path("kernel_ncu", ch.root)
    if run is None or not run.exists():
        return ch.nothing(*MOVED_NOTES["ch9"])
    table = profiles.pass_table(run)
    tiles = profiles.causal_dkdv_tiles(table)
    by = {tuple(c): row for c, (_, row) in zip(tiles["config_dkdv"], tiles.iterrows())}
    d = configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=True)
    default = (d.block_m, d.block_n, d.num_warps, d.num_stages)
    same_work = {c: r for c, r in by.items()
                 if r["spill_mb"] == 0 and abs(r["ops_ratio"] - by[default]["ops_ratio"]) < 1e-6}
    clean = min(same_work, key=lambda c: same_work[c]["us"])
    equal = default[:3] + clean[3:]                       # the default's tile and warps, the clean tile's stages

    cfg = profiles.tile_label
    ch.put("c9_toolchain", profiles.toolchain(run))
    ch.put("c9_clean_cfg", cfg(clean)); ch.put("c9_clean_ms", by[clean]["us"] / 1000, ".2f")
    ch.put("c9_eq_cfg", cfg(equal)); ch.put("c9_eq_spill", by[equal]["spill_mb"], ".0f")
    ch.put("c9_eq_ms", by[equal]["us"] / 1000, ".2f")
    ch.put("c9_eq_gap", 100 * (by[equal]["us"] / by[clean]["us"] - 1), ".0f")
    ch.put("c9_default_cfg", cfg(default)); ch.put("c9_default_spill", by[default]["spill_mb"], ".0f")
    ch.put("c9_default_ms", by[default]["us"] / 1000, ".2f")
    cudnn = table[(table["impl"] == "sdpa-cudnn") & (table["pass_"] == "backward") & ~table["causal"]
                  & (table["dim"] == 128)].iloc[0]
    ch.put("c9_cudnn_spill", cudnn["spill_mb"], ".0f"); ch.put("c9_cudnn_regs", int(cudnn["regs"]))
    kernels = [k for k in profiles.kernel_rows(run) if k["impl"] == "sdpa-cudnn" and k["pass_"] == "backward"
               and k["dim"] == 128 and not k["causal"]]
    main = max(kernels, key=lambda k: k[profiles.TIME])
    ch.put("c9_cudnn_threads", profiles.launch_extent(main, "Block Size"))


def _moved_ch10(ch) -> None:
    """Heaviest first at 16K: the measured gain beside the schedule model's (chapter 10's table)."""
    heavy = ch.tables.get("heavy")
    if heavy is None:
        return ch.nothing(*MOVED_NOTES["ch10"])
    rows = heavy[heavy.index.str.contains("N=16384 causal")]
    ch.put("heavy_16k", "; ".join(f"{r['x previous']:.3f} against {r['predicted x']:.3f} at d = "
                                  f"{shape.split()[0].removeprefix('d=')}" for shape, r in rows.iterrows()))


def _moved_ch11(ch) -> None:
    """Chapter 11's decoding runs: the host's time per eager call run by run (``decode_paged``,
    ``decode_host``), SDPA cuDNN's called time at batch 1 and 2K over every decoding run, and the
    kernel before the floor of four splits (the newest ``decode_short_path``)."""
    import pandas as pd

    from .decoding import repeat_ratios
    from .readback import provenance_for
    from .runs import run_path, run_paths

    first, hosts, short = run_path("decode_paged", ch.root), run_paths("decode_host", ch.root), \
        run_path("decode_short_path", ch.root)
    if first is None or len(hosts) < 3 or short is None:
        return ch.nothing(*MOVED_NOTES["ch11"])
    df = pd.read_csv(first / "decode.csv")
    small = df[(df["batch"] == 1) & (df["seq"] <= 16384) & (df["status"] == "ok")]
    ours, cudnn = small[small["impl"] == "flash_decode"], small[small["impl"] == "sdpa-cudnn"]
    ch.put("c11_first_lengths", f"{ours['seq'].min() // 1024}K to {ours['seq'].max() // 1024}K")
    ch.put("c11_first_called", span(1000 * ours["ms"], ".0f", collapse=True))
    ch.put("c11_first_gpu", span(1000 * ours["graph_ms"], ".0f", collapse=True))
    ch.put("c11_first_cudnn", span(1000 * cudnn["ms"], ".0f", collapse=True))
    at = [json.loads((p / "host.json").read_text())["2048"] for p in hosts[:3]]

    def us(run, key):
        return at[run][key]["median_us"] if isinstance(at[run][key], dict) else at[run][key]

    ch.put("c11_r1_call", us(0, "call"), ".0f"); ch.put("c11_r1_cudnn", us(0, "sdpa_cudnn"), ".0f")
    ch.put("c11_r1_empty", us(0, "empty"), ".0f")
    ch.put("c11_r2_short", us(1, "call"), ".0f"); ch.put("c11_r2_checked", us(1, "checked_path"), ".0f")
    ch.put("c11_r2_cudnn", us(1, "sdpa_cudnn"), ".0f")
    ch.put("c11_r3_checked", us(2, "checked_path"), ".0f"); ch.put("c11_r3_cudnn", us(2, "sdpa_cudnn"), ".0f")
    ch.put("c11_r3_empty", us(2, "empty"), ".1f")
    # SDPA cuDNN called from Python, batch 1, 2K, in every recorded decoding table (one timer, one set of versions)
    files = []
    for name in ("decode", "decode_paged", "decode_short_path", "decode_repeats", "decode_table_before"):
        for p in run_paths(name, ch.root):
            f = (p if p.is_dir() else p.parent) / "decode.csv"
            if f.is_file() and f not in files:
                files.append(f)
    called, setups = [], set()
    for f in files:
        d = pd.read_csv(f)
        hit = d[(d["impl"] == "sdpa-cudnn") & (d["batch"] == 1) & (d["seq"] == 2048) & (d["status"] == "ok")]
        if len(hit):
            called.append(1000 * float(hit["ms"].iloc[0]))
            p = provenance_for(f)
            setups.add((p.get("torch"), p.get("triton"), p.get("cudnn"), (p.get("timing") or {}).get("method")))
    if len(setups) != 1:
        raise ValueError(f"the decoding runs differ in versions or timer: {sorted(setups)}")
    ch.put("c11_cudnn_called", span(called, ".1f", collapse=True)); ch.put("c11_cudnn_runs", len(called))
    old = repeat_ratios([short])
    ch.put("c11_old_cudnn", old.xs(64, level="batch")["fd_cudnn_ms"].max(), ".2f")
    ch.put("c11_old_paged", old["paged_dense_graph"].max(), ".2f")


def _moved_ch12(ch) -> None:
    """Chapter 12's masked kernels: how each change of its speed table was found (the runs its
    helpers in ``chapter12`` read, and the first comparison and profiles before them)."""
    import re
    import xml.etree.ElementTree as ET

    from . import chapter12
    from .runs import run_path, run_paths

    masks, profile, fused = run_paths("masks", ch.root), run_path("masks_profile", ch.root), \
        run_path("fused_bwd", ch.root)
    order, tiles, loop = chapter12.document_order(ch.root), chapter12.forward_tiles(ch.root), \
        chapter12.one_loop(ch.root)
    long_window, gains, stress = chapter12.long_window_tiles(ch.root), chapter12.fused_bwd(ch.root), \
        run_path("stress", ch.root)
    if not masks or profile is None or fused is None or None in (order, tiles, loop, long_window, gains, stress) \
            or loop["flex"] is None:
        return ch.nothing(*MOVED_NOTES["ch12"])
    first = json.loads((masks[0] / "masks.json").read_text())["rows"]
    (x,) = [r["flex_over_flashbook_fwd_bwd"] for r in first
            if r["mask"] == "window" and r["window"][0] == 1024 and r["seq"] == 4096]
    ch.put("c12_first_x", x, ".2f")
    before, after = (json.loads((profile / f).read_text())["profiles"]
                     for f in ("profile_1_before_plans.json", "profile_2_plans.json"))

    def gpu_bound(p):                 # the rows where the GPU, not the host, sets the time
        return p["name"] == "window" and (p["n"] >= 16384 or p["batch"] > 1)

    def label(p):
        return f"{p['n'] // 1024}K" + (f" with batch {p['batch']}" if p["batch"] > 1 else "")

    gaps = []
    for p in filter(gpu_bound, after):
        ours = sum(k["us_per_step"] for name, k in p["flashbook"]["kernels"].items() if name.startswith("_bwd"))
        flex = sum(k["us_per_step"] for name, k in p["flex"]["kernels"].items() if "backward" in name)
        gaps.append(f"{100 * (ours / flex - 1):.0f}% more at {label(p)}")
    ch.put("c12_bwd_gap", ", ".join(gaps))
    ch.put("c12_stream", ", ".join(f"{p['flashbook']['bwd_ms']:.3f} → {p['flashbook']['overlap']['bwd_ms']:.3f} ms "
                                   f"at {label(p)}" for p in filter(gpu_bound, before)))
    ch.put("c12_fused_4k", dict(gains["gains"]["documents"])[4096], ".1f")
    refused = [r["error"] for f in sorted(fused.glob("*.json")) for r in json.loads(f.read_text())["rows"]
               if "error" in r]
    found = [re.search(r"key tile (\d+), query tile (\d+)", e) for e in refused]
    if not found or not all(found):
        raise ValueError(f"the one-grid run's refusals no longer name their tiles: {refused}")
    ch.put("c12_d64_keys", found[0].group(1)); ch.put("c12_d64_queries", found[0].group(2))
    by_d = {}
    for n, d, gain in order["gains"]:
        by_d.setdefault(d, []).append(f"{gain:.1f}% ({n // 1024}K)")
    ch.put("c12_order_gains", "; ".join(f"d = {d}: {', '.join(g)}" for d, g in by_d.items()))
    ch.put("c12_order_spread", 100 * order["spread"], ".0f")
    ch.put("c12_lw_ms", long_window["window_ms"], ".3f"); ch.put("c12_lw_causal_ms", long_window["causal_ms"], ".3f")
    for d in (64, 128):
        (b_lo, b_hi), (a_lo, a_hi), lengths = tiles["flex"][d]
        ch.put(f"c12_ft{d}", f"{b_lo:.2f}–{b_hi:.2f} to {a_lo:.2f}–{a_hi:.2f} "
               f"(N = {lengths[0] // 1024}K–{lengths[-1] // 1024}K)")
    ch.put("c12_ol_flex", ", ".join(f"{b:.2f} → {a:.2f} ({n // 1024}K)" for n, b, a in loop["flex"]))
    runs = sorted(stress.glob("*classes_masks*.junit.xml"), key=lambda p: int(p.name.split("_")[0]))
    message = next((f.get("message") or "" for path in runs for f in ET.parse(path).iter("failure")), "")
    ran = re.search(r"(\d+) of (\d+) runs failed", message)
    error = re.search(r"max error ([\d.e+-]+) .* exceeds 2 x ([\d.e+-]+) \(yardstick\) \+ ([\d.e+-]+) \(floors\)",
                      message)
    if ran is None or error is None:
        raise ValueError("the stress run's failure message no longer gives its runs and its bound")
    ch.put("c12_st_failed", f"{ran.group(1)} of {ran.group(2)}")
    err, yard, floors = (float(v) for v in error.groups())
    ch.put("c12_st_x", err / (2 * yard + floors), ".2f")


def moved_notes(ch) -> None:
    """Put into ``ch`` (chapter 10's ``build``) the values appendix A3 quotes beyond chapter
    10's experiments: ``MOVED_NOTES``' names, "n/a" where a run is not recorded."""
    for part in (_moved_hopper, _moved_ch7, _moved_ch9, _moved_ch10, _moved_ch11, _moved_ch12):
        part(ch)
