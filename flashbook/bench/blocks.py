"""The recorded block-size sweep read back (chapters 9 and 10): the shared memory each
forward-kernel configuration used, whether it fits each chip of ``runtime.CHIPS``, the
fastest configurations, and the state the chapter-9 explorer shows for one of them.

The frames are ``load_results`` of a ``blocks.csv`` (``python -m flashbook.bench
--sweep-blocks``). These functions need pandas, and no GPU.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .. import runtime


def block_shared_bytes(row) -> float:
    """Shared memory a swept config used, bytes: the compiled kernel's number, or
    for a config that did not fit, the number the compiler's error gives. NaN if
    neither was recorded."""
    try:
        value = float(row.get("shared_bytes"))
    except (TypeError, ValueError):
        value = float("nan")
    if math.isfinite(value):
        return value
    found = re.search(r"Required:\s*(\d+)", str(row.get("note") or ""))
    return float(found.group(1)) if found else float("nan")


def block_fits(block_m: int, block_n: int, num_warps: int, num_stages: int, head_dim: int, *,
               dtype_bytes: int = 2, shared_bytes=None, measured_arch: str | None = None) -> dict:
    """Whether one forward-kernel config fits each chip of ``runtime.CHIPS``.

    Per chip: ``bytes`` of shared memory one program needs, the chip's ``limit``
    per program, ``fits``, and ``how`` the bytes were found: "measured" (the
    compiled kernel's ``shared_bytes``, on a chip of ``measured_arch``) or
    "model" (``kernels.configs.smem_estimate`` for that chip's architecture).
    """
    from ..kernels import configs

    cfg = configs.Config(int(block_m), int(block_n), int(num_warps), int(num_stages))
    tile_d = configs.block_d(int(head_dim))
    have = shared_bytes is not None and math.isfinite(float(shared_bytes))
    out = {}
    for name, c in runtime.CHIPS.items():
        if have and c.arch == measured_arch:
            need, how = int(shared_bytes), "measured"
        else:
            cc = int(c.arch.split("_")[1])
            need, how = configs.smem_estimate("forward", cfg, tile_d, dtype_bytes, cc), "model"
        out[name] = {"bytes": need, "limit": c.smem_per_block_bytes,
                     "fits": need <= c.smem_per_block_bytes, "how": how}
    return out


def best_blocks(blocks):
    """For each shape and (B_r, B_c): the measured config with the most TFLOP/s
    (over warps and stages). Configs that did not run are left out."""
    ok = blocks[(blocks["status"] == "ok") & blocks["fwd_tflops"].notna()]
    keys = ["head_dim", "seq", "causal", "block_m", "block_n"]
    best = ok.loc[ok.groupby(keys)["fwd_tflops"].idxmax()]
    return best.sort_values(keys).reset_index(drop=True)


@dataclass(frozen=True)
class BlockState:
    """What the chapter-9 explorer shows for one config of the recorded sweep."""

    head_dim: int
    seq: int
    config: tuple               # (block_m, block_n, num_warps, num_stages)
    row: dict | None            # the measured row, None if the sweep lacks it
    rank: int | None            # 1 = fastest of the configs that ran
    n_ran: int                  # configs of this shape that ran
    n_configs: int              # configs of this shape in the sweep
    best: dict | None           # the fastest row
    shared_bytes: float         # measured (or from the compiler's error), NaN if unknown
    fits: dict                  # block_fits(...) per chip
    ranking: tuple = ()         # ((config, TFLOP/s), ...) fastest first

    @property
    def tflops(self):
        return None if self.row is None else self.row.get("fwd_tflops")

    def summary(self) -> str:
        bm, bn, w, s = self.config
        head = f"B_r={bm}, B_c={bn}, {w} warps, {s} stages (d={self.head_dim}, N={self.seq})"
        if self.row is None:
            return f"{head}: not in the recorded sweep"
        r = self.row
        if r["status"] != "ok":
            return f"{head}: {r['status']} ({r['note'][:90]})"
        best = self.best

        def count(value):
            return "?" if value is None or not math.isfinite(value) else f"{int(value)}"

        return (f"{head}: {r['fwd_tflops']:.0f} TFLOP/s, number {self.rank} of {self.n_ran} "
                f"(best {best['fwd_tflops']:.0f}: B_r={int(best['block_m'])}, "
                f"B_c={int(best['block_n'])}, {int(best['num_warps'])} warps, "
                f"{int(best['num_stages'])} stages); {count(r.get('n_regs'))} registers per "
                f"thread, {count(r.get('n_spills'))} spilled; "
                f"{count(self.shared_bytes / 1024)} KiB of shared memory")


def block_state(blocks, head_dim: int, block_m: int, block_n: int, num_warps: int,
                num_stages: int, *, seq: int | None = None, measured_arch: str | None = None,
                dtype_bytes: int = 2) -> BlockState:
    """The explorer's state for one config of a recorded block sweep (``blocks.csv``):
    its measured row, its rank, the best config, and whether it fits each chip.
    ``seq`` picks the shape when the sweep has several (default: the longest)."""
    rows = blocks[blocks["head_dim"] == head_dim]
    if rows.empty:
        raise ValueError(f"head_dim must be one of {sorted(set(blocks['head_dim']))}, "
                         f"got {head_dim!r}")
    seq = int(rows["seq"].max()) if seq is None else int(seq)
    rows = rows[rows["seq"] == seq]
    if rows["causal"].nunique() > 1:      # the sweep's default is without a mask
        rows = rows[~rows["causal"]]
    config = (int(block_m), int(block_n), int(num_warps), int(num_stages))
    mine = rows[(rows["block_m"] == block_m) & (rows["block_n"] == block_n)
                & (rows["num_warps"] == num_warps) & (rows["num_stages"] == num_stages)]
    ran = rows[(rows["status"] == "ok") & rows["fwd_tflops"].notna()].sort_values(
        "fwd_tflops", ascending=False)
    keys = ["block_m", "block_n", "num_warps", "num_stages"]
    ranking = tuple((tuple(int(x) for x in r[keys]), float(r["fwd_tflops"]))
                    for _, r in ran.iterrows())
    order = [c for c, _ in ranking]
    row = mine.iloc[0].to_dict() if not mine.empty else None
    shared = block_shared_bytes(row) if row is not None else float("nan")
    fits = block_fits(*config, head_dim, dtype_bytes=dtype_bytes,
                      shared_bytes=shared if math.isfinite(shared) else None,
                      measured_arch=measured_arch)
    return BlockState(head_dim=int(head_dim), seq=seq, config=config, row=row,
                      rank=order.index(config) + 1 if config in order else None,
                      n_ran=len(ran), n_configs=len(rows),
                      best=ran.iloc[0].to_dict() if not ran.empty else None,
                      shared_bytes=shared, fits=fits, ranking=ranking)
