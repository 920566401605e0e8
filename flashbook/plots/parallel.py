"""Chapter 11's figures: the keys cut into splits (split-K, ``split_grid``), a paged KV
cache and which program reads which page (``paged_cache``), and the ring's schedule over
several GPUs (``ring_schedule``), drawn from ``flashbook.split`` and ``flashbook.ring``.
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle

from .. import ring
from ..reference import causal_mask
from ..split import split_bounds, tile_split_bounds

SPLIT_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#CCB974"]


def split_grid(ax, n_q: int, n_k: int, num_splits: int, *, causal: bool = False, title: str = ""):
    """The score matrix cut into key splits (``flashbook.split.split_bounds``), one colour
    per split; masked scores are white and hatched. Under each split: which rows see
    none of its keys (those get (o_s, lse_s) = (0, -inf), merge's identity). Splits with
    no key at all (the last ones, when there are more splits than keys) have no width:
    one label beside the grid names them together ("splits 5–7\nno keys")."""
    bounds = split_bounds(n_k, num_splits)
    allowed = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)
    empty = [s for s, keys in enumerate(bounds) if not len(keys)]
    for s, keys in enumerate(bounds):
        if not len(keys):
            continue
        ax.add_patch(Rectangle((keys.start, 0), len(keys), n_q, facecolor=SPLIT_COLORS[s % len(SPLIT_COLORS)],
                               alpha=0.8, edgecolor="white", lw=2))
        blind = int((~allowed[:, keys.start:keys.stop].any(axis=1)).sum())
        label = f"split {s}\n{len(keys)} keys" + (f"\n{blind} rows see none" if blind else "")
        ax.text(keys.start + len(keys) / 2, n_q + 0.4, label, ha="center", va="top", fontsize=7)
    if empty:       # split_bounds puts the empty splits last, after every key
        names = f"split {empty[0]}" if len(empty) == 1 else f"splits {empty[0]}–{empty[-1]}"
        ax.text(n_k + 0.25, n_q + 0.4, f"{names}\nno keys", ha="left", va="top", fontsize=7)
    masked = ~allowed
    for i, j in zip(*np.nonzero(masked)):
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor="white", edgecolor="#BBBBBB", hatch="///", lw=0.3))
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q + 3.2, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    ax.set_title(title or f"{num_splits} splits of {n_k} keys" + (" (causal)" if causal else ""), fontsize=9)
    return ax


def paged_reads(block_table, lengths, page_size: int, num_splits: int, block_n: int) -> list[list]:
    """For each sequence b and logical page p of ``block_table``: (physical page, {split:
    keys of the page it reads}), as ``flash_decode`` cuts sequence b's ``lengths[b]`` keys
    into ``num_splits`` ranges of whole tiles (``split.tile_split_bounds``). A page past the
    sequence's length is read by no split (an empty dict)."""
    table = np.asarray(block_table)
    out = []
    for b, n in enumerate(lengths):
        bounds = tile_split_bounds(int(n), num_splits, block_n)
        row = []
        for p, page in enumerate(table[b]):
            lo, hi = p * page_size, (p + 1) * page_size
            reads = {s: min(r.stop, hi) - max(r.start, lo) for s, r in enumerate(bounds)
                     if len(r) and r.start < hi and r.stop > lo}
            row.append((int(page), reads))
        out.append(row)
    return out


def paged_cache(ax_table, ax_pages, block_table, lengths, page_size: int, num_splits: int, block_n: int,
                num_pages: int | None = None):
    """Two panels of a paged KV cache. Left, the block table: one row per sequence, one box
    per logical page holding the physical page's number, filled from the left by the
    split (program) that reads each part of it, grey where the sequence has no keys yet.
    Right, the pool of physical pages in memory order, each labelled with the (sequence,
    logical page) that points at it; hatched where two sequences share it (a common
    prefix), white where it is free."""
    reads = paged_reads(block_table, lengths, page_size, num_splits, block_n)
    n_pages = num_pages if num_pages is not None else int(np.asarray(block_table).max()) + 1
    owners: dict = {}
    for b, row in enumerate(reads):
        for p, (page, by_split) in enumerate(row):
            ax_table.add_patch(Rectangle((p, b), 1, 1, facecolor="#DDDDDD", edgecolor="white", lw=2))
            x = p
            for split, keys in by_split.items():
                ax_table.add_patch(Rectangle((x, b), keys / page_size, 1, lw=0, alpha=0.85,
                                             facecolor=SPLIT_COLORS[split % len(SPLIT_COLORS)]))
                x += keys / page_size
            ax_table.add_patch(Rectangle((p, b), 1, 1, facecolor="none", edgecolor="white", lw=2))
            filled = sum(by_split.values())
            ax_table.text(p + 0.5, b + 0.5, f"page {page}" + ("" if filled else "\nno keys yet"),
                          ha="center", va="center", fontsize=8, color="black" if filled else "#555555")
            owners.setdefault(page, []).append((b, p, bool(filled)))
    width = max(len(r) for r in reads)
    ax_table.set_xlim(0, width)
    ax_table.set_ylim(len(reads), 0)
    ax_table.set_xticks([p + 0.5 for p in range(width)],
                        [f"{p * page_size}-{(p + 1) * page_size - 1}" for p in range(width)], fontsize=7)
    ax_table.set_yticks([b + 0.5 for b in range(len(reads))],
                        [f"seq {b}: {int(n)} keys" for b, n in enumerate(lengths)], fontsize=8)
    ax_table.set_xlabel("logical page (its key positions); colour: the split that reads it", fontsize=8)
    ax_table.set_title(f"block_table, {num_splits} splits of whole {block_n}-key tiles", fontsize=9)
    cols = min(n_pages, 8)
    for page in range(n_pages):
        x, y = page % cols, page // cols
        users = owners.get(page, [])
        used = any(filled for _, _, filled in users)
        ax_pages.add_patch(Rectangle((x, y), 1, 1, facecolor="#8DA0CB" if used else "white", edgecolor="#888888",
                                     lw=1, hatch="//" if len(users) > 1 else None))
        who = "\n".join(f"seq {b} p{p}" for b, p, _ in users) or "free"
        ax_pages.text(x + 0.5, y + 0.5, f"{page}\n{who}", ha="center", va="center", fontsize=7,
                      color="black" if used else "#555555")
    ax_pages.set_xlim(0, cols)
    ax_pages.set_ylim(-(-n_pages // cols), 0)
    ax_pages.set_title(f"the cache in memory: {n_pages} pages of {page_size} tokens (hatched: shared)",
                       fontsize=9)
    for ax in (ax_table, ax_pages):
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    ax_pages.set_xticks([])
    ax_pages.set_yticks([])
    return ax_table, ax_pages


def ring_schedule(ax, world_size: int, layout: str = "contiguous", *, causal: bool = True, title: str = ""):
    """Who holds which K/V shard at each ring step (rows: ranks, columns: steps), shaded by
    the causal work of that step (``ring.causal_work``: chunk pairs, a diagonal pair
    counting one half); the total per rank at the right."""
    work = np.array(ring.causal_work(world_size, layout, causal))
    top = max(work.max(), 1)
    for r in range(world_size):
        for t in range(world_size):
            s = (r - t) % world_size
            w = work[r, t]
            shade = "#E6E6E6" if w == 0 else _mix("#FFFFFF", "#4C72B0", 0.25 + 0.75 * w / top)
            ax.add_patch(Rectangle((t, r), 1, 1, facecolor=shade, edgecolor="white", lw=2))
            chunks = ",".join(map(str, ring.chunk_ids(s, world_size, layout)))
            ax.text(t + 0.5, r + 0.5, f"K/V {chunks}\n{w:g}" if w else f"K/V {chunks}\nskip",
                    ha="center", va="center", fontsize=7, color="white" if w / top > 0.6 else "black")
        ax.text(world_size + 0.1, r + 0.5, f"total {work[r].sum():g}", va="center", fontsize=8)
    ax.set_xlim(0, world_size + 1.1)
    ax.set_ylim(world_size, 0)
    ax.set_xticks([t + 0.5 for t in range(world_size)], [f"step {t}" for t in range(world_size)], fontsize=8)
    ax.set_yticks([r + 0.5 for r in range(world_size)],
                  [f"rank {r}: Q {','.join(map(str, ring.chunk_ids(r, world_size, layout)))}"
                   for r in range(world_size)], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title or f"{layout} layout, {world_size} ranks" + (", causal" if causal else ""), fontsize=9)
    return ax


def _mix(a: str, b: str, t: float) -> tuple:
    """The colour a fraction t of the way from hex colour a to b."""
    ca, cb = (np.array([int(c[i:i + 2], 16) for i in (1, 3, 5)]) / 255 for c in (a, b))
    return tuple((1 - t) * ca + t * cb)
