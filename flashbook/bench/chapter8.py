"""The counts chapter 8 (the backward pass in Triton) sets side by side for its two dQ modes.

``dq_mode_counts`` gives, for one head, the matrix-product FLOPs, the dQ elements written and
the K and V elements read by ``dq_mode="atomic"`` and ``dq_mode="separate"``, from chapter 5's
counters (``tiled.io_flash_backward``), each kernel counted with its own tiles;
``ncu_ops_ratios`` reads the tensor pipe's executed operations from the recorded Nsight
Compute run (``kernel_ncu``), in units of the forward's credited FLOPs.
"""
from __future__ import annotations

from .. import tiled
from .runs import run_path


def dq_mode_counts(tiles: dict, n: int, d: int) -> dict:
    """{(mode, causal): (matmul FLOPs, dQ elements written, K and V elements read)} for one
    head of a square problem, ``tiles[(kernel, causal)]`` being the config of kernel "dkdv"
    or "dq" (its ``block_m`` and ``block_n`` are used)."""
    def counted(causal, kernel, strategy):
        cfg = tiles[(kernel, causal)]
        return tiled.io_flash_backward(n, n, d, cfg.block_m, cfg.block_n, causal=causal, dq_strategy=strategy)

    out = {}
    for causal in (False, True):
        atomic = counted(causal, "dkdv", "atomic")           # the dK/dV kernel, adding dQ as it goes
        area_kv = atomic.matmul_flops / (2 * 5 * d)           # score-tile area it visits (5 products of d)
        area_q = counted(causal, "dq", "atomic").matmul_flops / (2 * 5 * d)   # ... with the dQ kernel's tiles
        second = counted(causal, "dq", "second_pass")         # K, V read once, then once per dQ tile
        separate_flops = 2 * area_kv * 4 * d + 2 * area_q * 3 * d   # 4 products there, 3 in the dQ kernel
        out[("atomic", causal)] = (atomic.matmul_flops, atomic.writes["dQ"], atomic.reads["K"] + atomic.reads["V"])
        out[("separate", causal)] = (separate_flops, n * d, second.reads["K"] + second.reads["V"])
    return out


def dq_mode_table(counts: dict):
    """``dq_mode_counts``'s result as the table the chapter prints."""
    import pandas as pd

    return (pd.DataFrame({key: {"matmul GFLOP": f"{flops / 1e9:,.1f}", "dQ elements written": f"{dq:,}",
                                "K, V elements read": f"{kv:,}"} for key, (flops, dq, kv) in counts.items()})
            .T.rename_axis(["dq_mode", "causal"]))


def ncu_ops_ratios(d: int, root=None) -> dict:
    """{impl: the tensor pipe's executed operations of its backward over the forward's credited
    FLOPs}, no mask, head dimension ``d``, from the recorded Nsight Compute run on an H200;
    {} when that run is not recorded."""
    from . import profiles

    run = run_path("kernel_ncu", root)
    if run is None:
        return {}
    ncu = profiles.pass_table(run)
    ops = ncu[(ncu["pass_"] == "backward") & ~ncu["causal"] & (ncu["dim"] == d)].set_index("impl")
    return ops["ops_ratio"].to_dict()


def ncu_dkdv_registers(d: int, root=None) -> dict:
    """The dK/dV kernel's registers per thread and its stores to local memory (MB), without a
    mask and under the causal mask, at head dimension ``d``, from the recorded Nsight Compute
    run on an H200: {"regs": ..., "spill_full_mb": ..., "spill_causal_mb": ..., "warps_full": ...,
    "warps_causal": ..., "batch": ..., "heads": ..., "seq": ...} (the warps from each launch's
    block size, the shape the profile ran); {} when that run is not recorded."""
    from . import profiles

    run = run_path("kernel_ncu", root)
    if run is None:
        return {}
    rows = [r for r in profiles.kernel_rows(run) if r["impl"] == "triton" and r["pass_"] == "backward"
            and r["dim"] == d and "_bwd_dkdv" in r["Kernel Name"]]
    by_mask = {bool(r["causal"]): r for r in rows}
    if set(by_mask) != {False, True}:
        return {}
    def warps(r):
        return profiles.launch_extent(r, "Block Size") // 32

    return {"regs": int(by_mask[False][profiles.REGS]),
            "spill_full_mb": by_mask[False][profiles.SPILL_ST] / 1e6,
            "spill_causal_mb": by_mask[True][profiles.SPILL_ST] / 1e6,
            "warps_full": warps(by_mask[False]), "warps_causal": warps(by_mask[True]),
            **{key: int(by_mask[False][key]) for key in ("batch", "heads", "seq")}}
