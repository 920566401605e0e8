"""Chapter 11's recorded decoding runs read back: the table's repeats and Nsight Compute's steps.

* ``repeat_ratios(folders)``: the ``decode.csv`` of runs repeated in one call
  (``benchmarks/decode_bench.py``), as per-shape ratios with their spread over the repeats:
  flash_decode's time over SDPA cuDNN's, the paged cache's over the dense one's, called from
  Python (``ms``) and replayed in a CUDA graph (``graph_ms``).
* ``paged_pages(folders)``: the page size and key tile those runs' paged cache had.
* ``ncu_steps(folder)``: a folder ``ncu`` wrote over ``benchmarks/decode_ncu.py``
  (``raw.csv``, and ``steps.json``: the steps in the order profiled): one row per profiled decoding step, its main kernel's
  time, DRAM traffic and how busy the SMs were, and the time of the kernel that merges
  the splits.
* ``step_split(step, graph_us)``: a profiled step's main kernel, its bandwidth and the share of
  the graph-timed step outside it.
* ``graph_spread(folders)``: how far repeated runs of the table agree, in CUDA-graph time.
"""
from __future__ import annotations

import json
from pathlib import Path

from .profiles import ncu_csv

#: the kernels that merge a step's splits (flash_decode's, cuDNN's); any other starts a step
MERGE_KERNELS = ("_decode_combine", "lean_reduction")


def repeat_ratios(folders):
    """A DataFrame indexed by (batch, seq) with, for each ratio, its median, min and max over
    the repeats: ``fd_cudnn_ms``, ``paged_dense_ms``, ``fd_cudnn_graph``, ``paged_dense_graph``
    (columns ``<ratio>``, ``<ratio>_min``, ``<ratio>_max``), and ``copy_fraction_graph``
    (flash_decode's, median), ``repeats``."""
    import pandas as pd

    folders = [Path(f) for f in folders]
    if not folders:
        raise ValueError("repeat_ratios needs at least one run folder")
    per_run = []
    for i, folder in enumerate(folders):
        df = pd.read_csv(folder / "decode.csv")
        df = df[df["status"] == "ok"]
        t = {key: df.pivot_table(index=["batch", "seq"], columns="impl", values=key) for key in ("ms", "graph_ms")}
        frac = df[df["impl"] == "flash_decode"].set_index(["batch", "seq"])["copy_fraction_graph"]
        per_run.append(pd.DataFrame({
            "fd_cudnn_ms": t["ms"]["flash_decode"] / t["ms"]["sdpa-cudnn"],
            "paged_dense_ms": t["ms"]["flash_decode-paged"] / t["ms"]["flash_decode"],
            "fd_cudnn_graph": t["graph_ms"]["flash_decode"] / t["graph_ms"]["sdpa-cudnn"],
            "paged_dense_graph": t["graph_ms"]["flash_decode-paged"] / t["graph_ms"]["flash_decode"],
            "copy_fraction_graph": frac}).assign(run=i))
    every = pd.concat(per_run).reset_index()
    groups = every.groupby(["batch", "seq"])
    out = groups[["fd_cudnn_ms", "paged_dense_ms", "fd_cudnn_graph", "paged_dense_graph",
                  "copy_fraction_graph"]].median()
    for name in ("fd_cudnn_ms", "paged_dense_ms", "fd_cudnn_graph", "paged_dense_graph"):
        out[f"{name}_min"], out[f"{name}_max"] = groups[name].min(), groups[name].max()
    out["repeats"] = groups["run"].nunique()
    return out


def paged_pages(folders) -> dict:
    """How the paged cache of runs' ``decode.csv`` was cut and read: ``page_size``, the tokens
    per page (each ``flash_decode-paged`` row's ``gqa`` column, which says how the call was
    prepared: "pages of P, shuffled"; one P in every run, or a ValueError), and ``block_n``
    and ``head_dim``, the keys per tile and the head size the runs record in their
    provenance (``decode_tiles``), the same in every run."""
    import re

    import pandas as pd

    from .readback import provenance_for

    folders = [Path(f) for f in folders]
    pages, tiles = set(), set()
    for folder in folders:
        df = pd.read_csv(folder / "decode.csv")
        notes = df.loc[df["impl"] == "flash_decode-paged", "gqa"].dropna()
        pages |= {int(m.group(1)) for m in (re.search(r"pages of (\d+)", n) for n in notes) if m}
        settings = provenance_for(folder / "decode.csv")["settings"]
        tiles.add((settings["decode_tiles"][1], settings["head_dim"]))
    if len(pages) != 1 or len(tiles) != 1:
        raise ValueError(f"the runs' paged caches differ: pages of {sorted(pages)}, (block_n, head_dim) "
                         f"{sorted(tiles)}")
    (block_n, head_dim), = tiles
    return {"page_size": pages.pop(), "block_n": block_n, "head_dim": head_dim}



def ncu_steps(folder) -> list[dict]:
    """One dict per decoding step ``decode_ncu.py`` profiled, in its order: ``impl`` (dense,
    paged, sdpa-cudnn), ``batch``, ``seq``, ``kernel_us`` (the main kernel), ``merge_us``
    (0 without one), ``dram_bytes`` and ``dram_pct`` (of peak, the main kernel's),
    ``sm_busy`` (its SMs' active cycles over elapsed), ``waves`` and ``per_sm`` (programs one
    SM holds, by shared memory)."""
    folder = Path(folder)
    kernels = ncu_csv(folder / "raw.csv")
    steps = json.loads((folder / "steps.json").read_text())["steps"]
    out = []
    for r in kernels:
        name = r["Kernel Name"]
        if any(m in name for m in MERGE_KERNELS):
            if not out:
                raise ValueError(f"{folder}: a merge kernel before any step's kernel")
            out[-1]["merge_us"] += r["gpu__time_duration.sum"] / 1e3
            continue
        out.append({"kernel": name, "kernel_us": r["gpu__time_duration.sum"] / 1e3, "merge_us": 0.0,
                    "dram_bytes": r["dram__bytes_read.sum"],
                    "dram_pct": r["dram__throughput.avg.pct_of_peak_sustained_elapsed"],
                    "sm_busy": r["sm__cycles_active.avg"] / r["sm__cycles_elapsed.avg"],
                    "waves": r["launch__waves_per_multiprocessor"],
                    "per_sm": int(r["launch__occupancy_limit_shared_mem"])})
    if len(out) != len(steps):
        raise ValueError(f"{folder}: {len(out)} profiled steps in raw.csv, {len(steps)} in steps.json")
    for row, step in zip(out, steps):
        row.update(impl=step["impl"], batch=int(step["batch"]), seq=int(step["seq"]))
    return out


def step_split(step: dict, graph_us: float) -> dict:
    """Where a profiled step's time goes (``step``: one of ``ncu_steps``' dicts), against the same
    step timed as a replayed CUDA graph, ``graph_us``: ``split_tb_s``, the main kernel's DRAM
    reads per second in TB/s; ``outside_pct``, the share of ``graph_us`` outside the main kernel
    (the merge and the gap between the two launches)."""
    if not 0 < step["kernel_us"] <= graph_us:
        raise ValueError(f"the main kernel's {step['kernel_us']} us does not fit the step's {graph_us} us")
    return {"split_tb_s": step["dram_bytes"] / step["kernel_us"] / 1e6,
            "outside_pct": 100 * (1 - step["kernel_us"] / graph_us)}


def launch_fit(short: dict, long: dict) -> dict:
    """Fit ``time = fixed_us + bytes / rate`` through two profiled steps of one kernel with the
    same grid (two of ``ncu_steps``' dicts, the same ``waves`` and ``per_sm``, ``long`` reading more
    bytes): ``fixed_us``, the time that does not grow with the bytes, and ``tb_s``, the streaming
    rate (marginal DRAM bytes per second, TB/s)."""
    if (short["waves"], short["per_sm"]) != (long["waves"], long["per_sm"]):
        raise ValueError("the two steps ran different grids")
    extra_bytes, extra_us = long["dram_bytes"] - short["dram_bytes"], long["kernel_us"] - short["kernel_us"]
    if extra_bytes <= 0 or extra_us <= 0:
        raise ValueError("the longer step must read more bytes and take longer")
    rate = extra_bytes / extra_us                     # bytes per microsecond
    return {"fixed_us": short["kernel_us"] - short["dram_bytes"] / rate, "tb_s": rate / 1e6}


def graph_spread(folders, impl: str = "flash_decode") -> float:
    """How far runs of one table (``decode.csv`` in each of ``folders``) agree: the largest, over
    the (batch, seq) shapes ``impl`` ran, of (slowest / fastest - 1) of its CUDA-graph times, in %."""
    import pandas as pd

    df = pd.concat(pd.read_csv(Path(f) / "decode.csv") for f in folders)
    times = df[(df["status"] == "ok") & (df["impl"] == impl)].groupby(["batch", "seq"])["graph_ms"]
    if times.size().min() < 2:
        raise ValueError(f"{impl}: a shape ran in fewer than two of the runs")
    return float(100 * (times.max() / times.min() - 1).max())


def write_timings(folder, trees=("old", "new")):
    """``benchmarks/decode_bench.py``'s runs of two trees in one call (``<tree>_r<i>/decode.csv``
    under ``folder``): a DataFrame indexed by (batch, seq, impl) with each tree's median ``ms`` and
    ``graph_ms`` over its repeats (columns ``<tree>_ms``, ``<tree>_graph_ms``) and ``repeats``.
    Rows that did not run (out of memory) are left out; every row that ran passed its check."""
    import pandas as pd

    folder = Path(folder)
    runs = []
    for tree in trees:
        for path in sorted(folder.glob(f"{tree}_r*/decode.csv")):
            df = pd.read_csv(path)
            df = df[df["status"] == "ok"]
            if not (df["check"] == "pass").all():
                raise ValueError(f"{path}: a timed output failed its correctness check")
            runs.append(df.assign(tree=tree))
    if not runs:
        raise ValueError(f"no {'/'.join(trees)} runs under {folder}")
    every = pd.concat(runs)
    med = every.pivot_table(index=["batch", "seq", "impl"], columns="tree", values=["ms", "graph_ms"],
                            aggfunc="median")
    med.columns = [f"{tree}_{key}" for key, tree in med.columns]
    med["repeats"] = every.groupby(["batch", "seq", "impl", "tree"]).size().groupby(["batch", "seq", "impl"]).min()
    return med
