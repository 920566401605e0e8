"""Nsight Compute's readings of the attention kernels, read back: why each is as fast as it is.

``ncu --csv --page raw`` writes one row per profiled kernel (``raw.csv``); the benchmark that
ran under it (``benchmarks/kernel_ncu.py``) writes ``steps.json``: the passes it profiled, in
order, each with how many kernels it launched. ``kernel_rows(folder)`` gives every kernel its
pass; ``pass_table(folder)`` sums each pass:

* ``us``: the GPU time of its kernels (ncu's ``gpu__time_duration``, clocks not locked);
* ``ops_ratio``: the tensor pipe's executed math ops (2 per multiply-add, bf16 inputs; wgmma
  and mma.sync alike) over the forward's credited ``4·B·H·N²·d`` (half of it under the causal
  mask): what a pass really computes, against the convention that credits a backward 2.5;
* ``dram_mb`` (read), ``l2_hit`` (the main kernel's, %), ``tensor_pct`` (the tensor pipe's busy
  share of the main kernel's active cycles), ``regs`` and ``spill_mb`` (the main kernel's
  registers per thread and its local-memory stores: registers spilled).

The main kernel of a pass is the one that runs longest.
"""
from __future__ import annotations

import csv
import functools
import json
import os
from pathlib import Path

from .costs import attention_flops

#: ncu's names for what pass_table reads
TIME, DRAM_READ, L2_HIT = "gpu__time_duration.sum", "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct"
TENSOR_BUSY = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_OPS = ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
              "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum")
REGS, SPILL_ST = "launch__registers_per_thread", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
#: Hopper's asynchronous matrix instructions issued (the older mma.sync counts under ..._hmma.sum)
WGMMA = "sm__inst_executed_pipe_tensor_op_gmma.sum"
#: warp instructions issued (all of them), an SM's active cycles (mean over SMs), the SMs
INST, ACTIVE, SMS = "smsp__inst_executed.sum", "sm__cycles_active.avg", "device__attribute_multiprocessor_count"


def one(table, key, column=None):
    """The one row of ``table`` at ``key``, a full key of its (Multi)Index, as a Series, or that
    row's ``column``. Where the index repeats other keys, pandas 2 (Colab's 2.2) returns a
    one-row frame for ``table.loc[key]`` and pandas 3 the row; this gives the row in both and
    raises KeyError unless exactly one row has the key."""
    rows = table.loc[[key]]
    if len(rows) != 1:
        raise KeyError(f"{key!r}: {len(rows)} rows, want exactly 1")
    return rows.iloc[0] if column is None else rows.iloc[0][column]


def tensor_mb(row) -> float:
    """One of Q, K, V of a profiled pass (a ``pass_table`` row: bf16, B x H x N x d), in MB: the
    least a forward reads from HBM is three of them, each once."""
    return row["batch"] * row["heads"] * row["seq"] * row["dim"] * 2 / 1e6


def number(text: str):
    """ncu's CSV cell as a number ("1,234.5" -> 1234.5); a cell that is not one (an "n/a" of a
    metric the chip lacks, a device attribute's name) stays text, never a silent 0."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def ncu_csv(path) -> list[dict]:
    """The kernels of an ``ncu --csv --page raw`` file, in launch order: one dict each with
    "Kernel Name" and every metric column as a number (as text where the cell holds none).
    A file is parsed once per version (its size and time): ``pass_table`` and ``kernel_rows``
    both read it, and a chapter calls both; each call gets its own dicts."""
    stat = os.stat(path)
    return [dict(row) for row in _parsed(str(path), stat.st_mtime_ns, stat.st_size)]


@functools.lru_cache(maxsize=16)
def _parsed(path: str, _mtime_ns: int, _size: int) -> tuple:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    try:
        start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    except StopIteration:
        raise ValueError(f"{path}: not ncu's raw CSV (no header row starting with ID)") from None
    head = rows[start]
    # the row after the header holds the units
    return tuple({h: number(x) if "__" in h else x for h, x in zip(head, r)} for r in rows[start + 2:])


def kernel_rows(folder) -> list[dict]:
    """Every profiled kernel of ``folder`` (raw.csv, steps.json) with its pass's labels."""
    folder = Path(folder)
    kernels = ncu_csv(folder / "raw.csv")
    steps = json.loads((folder / "steps.json").read_text())["steps"]
    if sum(s["kernels"] for s in steps) != len(kernels):
        raise ValueError(f"{folder}: {len(kernels)} kernels in raw.csv, "
                         f"{sum(s['kernels'] for s in steps)} in steps.json's passes")
    out, i = [], 0
    for n, step in enumerate(steps):
        labels = {k: v for k, v in step.items() if k not in ("kernels", "names")}
        for row in kernels[i:i + step["kernels"]]:
            out.append(dict(row, step=n, **labels))
        i += step["kernels"]
    return out


def pass_table(folder):
    """One row per profiled pass (a DataFrame in the order profiled): its labels (``impl``,
    ``batch``, ``heads``, ``seq``, ``dim``, ``causal``, ``pass_``, and ``mask``,
    ``config_dkdv`` where the pass had them) and the sums and main-kernel readings of the
    module docstring, with ``kernel`` (the main kernel's name) and ``kernels`` (how many)."""
    import pandas as pd

    rows = kernel_rows(folder)
    out = []
    for step in sorted({r["step"] for r in rows}):
        ks = [r for r in rows if r["step"] == step]
        main = max(ks, key=lambda r: r[TIME])
        first = ks[0]
        labels = {k: first[k] for k in ("impl", "batch", "heads", "seq", "dim", "causal", "pass_")}
        for k in ("mask", "config_dkdv"):
            if k in first:
                labels[k] = tuple(first[k]) if isinstance(first[k], list) else first[k]
        ops = sum(r.get(m, 0.0) for r in ks for m in TENSOR_OPS)
        credited = attention_flops(labels["batch"], labels["heads"], labels["seq"], labels["seq"], labels["dim"],
                                   causal=labels["causal"])
        out.append(dict(labels, kernel=main["Kernel Name"], kernels=len(ks),
                        us=sum(r[TIME] for r in ks) / 1e3, ops_ratio=ops / credited,
                        dram_mb=main[DRAM_READ] / 1e6, l2_hit=main[L2_HIT], tensor_pct=main[TENSOR_BUSY],
                        regs=int(main[REGS]), spill_mb=main[SPILL_ST] / 1e6))
    return pd.DataFrame(out)


def causal_dkdv_tiles(table, dim: int = 128):
    """The causal dK/dV tiles the profile ran one by one at head dimension ``dim``: the rows of
    ``pass_table`` whose ``config_dkdv`` names each tile (chapters 8 and 9, appendix A3)."""
    return table[(table["impl"] == "triton-dkdv") & (table["mask"] == "causal") & (table["dim"] == dim)]


def tile_label(config) -> str:
    """A dK/dV ``config_dkdv`` (block_m, block_n, warps, stages) as the prose names it."""
    return f"{config[0]} × {config[1]}, {config[2]} warps, {config[3]} stages"


def toolchain(folder) -> str | None:
    """The Triton version that compiled the profiled kernels (the run's ``provenance.txt``): whether
    a tile spills depends on it. None where the run does not record it."""
    import re

    prov = Path(folder) / "provenance.txt"
    found = re.search(r"\btriton (\S+)", prov.read_text()) if prov.exists() else None
    return found[1] if found else None


def forward_wgmma(rows, impl: str = "sdpa-flash", dim: int = 128) -> int:
    """How many ``wgmma`` instructions ``impl``'s forward issued (no mask, head dimension ``dim``),
    summed over its kernels among ``rows`` (``kernel_rows``'s): 0 for code of mma.sync only."""
    return int(sum(k[WGMMA] for k in rows if k["impl"] == impl and k["pass_"] == "forward"
                   and k["dim"] == dim and not k["causal"]))


def launch_extent(row, column: str = "Block Size") -> int:
    """The first extent of a launch dimension as ncu writes it, "(256, 1, 1)" -> 256
    (``column``: "Block Size" for threads per program, "Grid Size" for programs)."""
    return int(str(row[column]).strip("()").split(",")[0])
