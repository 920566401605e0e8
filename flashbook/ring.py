"""The ring's schedule, as plain arithmetic (chapter 11): who holds what, and what each step computes.

The sequence is cut into equal chunks; a *layout* says which chunks each of the W
ranks holds (``chunk_ids``): ``"contiguous"`` (W chunks, one each) or ``"zigzag"``
(2W chunks, rank r holding r and 2W - 1 - r, which balances the causal work). At ring
step t rank r holds the K/V shard of rank (r - t) mod W; ``step_blocks`` lists the
attention calls it makes on it, and ``causal_work`` what they cost.

No torch here: ``flashbook.distributed`` runs this schedule over ``torch.distributed``,
and the ring figure (``flashbook.plots.ring_schedule``) draws it.
"""
from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("contiguous", "zigzag")


# ----------------------------------------------------------------- layouts

def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def chunk_ids(rank: int, world_size: int, layout: str = "contiguous") -> tuple[int, ...]:
    """Which chunks of the sequence rank ``rank`` holds, in order.

    contiguous: W chunks, rank r holds chunk r.
    zigzag:     2W chunks, rank r holds chunks r and 2W - 1 - r.
    """
    check_layout(layout)
    if layout == "contiguous":
        return (rank,)
    return (rank, 2 * world_size - 1 - rank)


def num_chunks(world_size: int, layout: str) -> int:
    """How many equal chunks ``layout`` cuts the sequence into for ``world_size`` ranks."""
    return world_size if layout == "contiguous" else 2 * world_size

# ----------------------------------------------------------------- which blocks see what

FULL, DIAGONAL, SKIP = "full", "diagonal", "skip"


def pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """How a chunk of queries sees a chunk of keys (equal-sized chunks of one sequence).

    Without a mask every pair is full. Causal: earlier keys are fully visible, the
    same chunk is the usual lower triangle, later keys are invisible (skipped: no
    work, no contribution to the merge).
    """
    if not causal or k_chunk < q_chunk:
        return FULL
    return DIAGONAL if k_chunk == q_chunk else SKIP


@dataclass(frozen=True)
class Block:
    """One attention call of a ring step: local query rows against local key rows."""

    q_rows: slice
    k_rows: slice
    causal: bool


def step_blocks(rank: int, source: int, world_size: int, *, layout: str = "contiguous",
                causal: bool = False, chunk: int = 1) -> list[Block]:
    """The attention calls rank ``rank`` makes on the K/V shard of rank ``source``.

    Rows are counted in local shard coordinates with ``chunk`` rows per chunk.
    Query chunks that see the same run of key chunks share one call; the diagonal
    case (the rank's own shard) is one causal call, since a layout keeps the chunks
    of a shard in sequence order.
    """
    q_ids, k_ids = chunk_ids(rank, world_size, layout), chunk_ids(source, world_size, layout)
    if source == rank:
        return [Block(slice(0, len(q_ids) * chunk), slice(0, len(k_ids) * chunk), causal)]
    blocks = []
    for i, qc in enumerate(q_ids):
        seen = [j for j, kc in enumerate(k_ids) if pair_kind(qc, kc, causal) == FULL]
        if not seen:
            continue
        assert seen == list(range(seen[0], seen[-1] + 1))   # a layout keeps chunks in order
        k_rows = slice(seen[0] * chunk, (seen[-1] + 1) * chunk)
        if blocks and blocks[-1].k_rows == k_rows and blocks[-1].q_rows.stop == i * chunk:
            blocks[-1] = Block(slice(blocks[-1].q_rows.start, (i + 1) * chunk), k_rows, False)
        else:
            blocks.append(Block(slice(i * chunk, (i + 1) * chunk), k_rows, False))
    return blocks


def causal_work(world_size: int, layout: str = "contiguous", causal: bool = True) -> list[list[float]]:
    """work[r][t]: the attention rank r computes at ring step t, in units of one
    (N/W) x (N/W) block of scores (a zigzag chunk pair is a quarter of one; a
    diagonal pair, half masked, counts half)."""
    per_rank = len(chunk_ids(0, world_size, layout))
    weight = {FULL: 1.0, DIAGONAL: 0.5, SKIP: 0.0}
    rows = []
    for r in range(world_size):
        row = []
        for t in range(world_size):
            s = (r - t) % world_size
            pairs = sum(weight[pair_kind(i, j, causal)] for i in chunk_ids(r, world_size, layout)
                        for j in chunk_ids(s, world_size, layout))
            row.append(pairs / per_rank ** 2)
        rows.append(row)
    return rows
