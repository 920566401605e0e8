"""Figures that several chapters (and the explorers) share.

Each function draws on a matplotlib ``Axes`` that you pass in and returns it. None
of them touches pyplot's global state, so they work the same in a notebook, in a
widget callback and in a test.
"""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Polygon, Rectangle

from . import tiled

#: One colour per on-chip buffer, the same in every figure of the book.
BUFFER_COLORS = {
    "Q": "#4C72B0", "K": "#DD8452", "V": "#55A868", "dO": "#8172B3",
    "S/P": "#C44E52", "dP/dS": "#DA8BC3", "O": "#937860", "dQ": "#8C8C8C",
    "dK": "#CCB974", "dV": "#64B5CD", "m": "#2F2F2F", "l": "#6F6F6F",
    "lse": "#2F2F2F", "delta": "#6F6F6F",
}
ORDER_NAMES = {"fa2": "FlashAttention-2 order", "fa1": "FlashAttention-1 order"}
#: The kernels' loop stages (``flashbook.kernels.probes.STAGES``), the same in chapters 7 and 8.
STAGE_COLORS = {"main": "#55A868", "masked": "#DD8452", "skipped": "#E6E6E6"}
_SKIPPED = "#E6E6E6"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as the CUDA guide states shared memory)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _edges(n: int, block: int) -> np.ndarray:
    return np.array([0] + [s.stop for s in tiled.tile_slices(n, block)], dtype=float)


def visit_index(n_q: int, n_k: int, block_q: int, block_k: int, *, causal: bool = False,
                order: str = "fa2") -> np.ndarray:
    """A (T_r, T_c) array: the step at which each tile is visited, -1 if skipped."""
    schedule = tiled.tile_schedule(n_q, n_k, block_q, block_k, causal=causal, order=order)
    index = -np.ones((len(tiled.tile_slices(n_q, block_q)),
                      len(tiled.tile_slices(n_k, block_k))), dtype=int)
    for step, (i, j) in enumerate(schedule):
        index[i, j] = step
    return index


def _masked_region(n_q: int, n_k: int) -> np.ndarray:
    """Vertices of the causally masked region (above the bottom-right diagonal)."""
    offset = n_k - n_q
    pts = [(n_k, 0.0)]
    for i in range(n_q):                      # row i may see keys [0, i + offset]
        x = float(min(max(i + offset + 1, 0), n_k))
        pts += [(x, i), (x, i + 1)]
    pts.append((n_k, float(n_q)))
    return np.array(pts)


def tile_grid(ax, n_q: int, n_k: int, block_q: int, block_k: int, *, causal: bool = False,
              order: str = "fa2", step: int | None = None, row: int | None = None,
              numbers: bool | None = None, cmap: str = "viridis", title: str | None = None):
    """The N_q x N_k score matrix as a grid of B_r x B_c tiles, coloured by visiting order.

    Tiles are drawn at their true sizes, so ragged last tiles look thinner. With
    ``step``, tiles visited up to that step are solid, later ones faded, and the
    current tile is outlined in red. Wholly masked (skipped) tiles are grey; the
    hatched area is what the causal mask removes. ``row`` marks one query row.
    ``numbers`` writes the step into each tile (default: when there are <= 64 tiles).
    """
    index = visit_index(n_q, n_k, block_q, block_k, causal=causal, order=order)
    x, y = _edges(n_k, block_k), _edges(n_q, block_q)
    steps = int(index.max()) + 1
    norm = dict(vmin=0, vmax=max(steps - 1, 1), cmap=cmap)
    visible = np.ma.masked_less(index.astype(float), 0)
    ax.pcolormesh(x, y, np.ma.masked_greater_equal(index, 0), shading="flat",
                  cmap=ListedColormap([_SKIPPED]))                   # skipped tiles: grey
    if step is None:
        ax.pcolormesh(x, y, visible, shading="flat", **norm)
    else:
        step = int(np.clip(step, 0, max(steps - 1, 0)))
        ax.pcolormesh(x, y, visible, shading="flat", alpha=0.25, **norm)
        ax.pcolormesh(x, y, np.ma.masked_greater(visible, step), shading="flat", **norm)
    n_tiles = index.size
    line = 1.2 if n_tiles <= 256 else 0.4 if n_tiles <= 4096 else 0.0
    if line:
        ax.vlines(x, 0, n_q, color="white", lw=line)
        ax.hlines(y, 0, n_k, color="white", lw=line)
    if causal:
        ax.add_patch(Polygon(_masked_region(n_q, n_k), closed=True, facecolor="none",
                             edgecolor="black", hatch="///", lw=0.8, alpha=0.5))
    if numbers is None:
        numbers = n_tiles <= 64
    if numbers:
        for (i, j), s in np.ndenumerate(index):
            if s >= 0:
                ax.text((x[j] + x[j + 1]) / 2, (y[i] + y[i + 1]) / 2, str(s), ha="center",
                        va="center", fontsize=8,
                        color="white" if s < 0.6 * max(steps - 1, 1) else "black")
    if step is not None and steps:
        i, j = map(int, np.argwhere(index == step)[0])
        ax.add_patch(Rectangle((x[j], y[i]), x[j + 1] - x[j], y[i + 1] - y[i],
                               fill=False, edgecolor="red", lw=2.5, zorder=5))
    if row is not None:
        ax.axhline(row + 0.5, color="red", ls="--", lw=1.0, zorder=6)
        ax.text(n_k, row + 0.5, f" row {row}", color="red", va="center", fontsize=8,
                clip_on=False)
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)                            # row 0 at the top, as in a matrix
    ratio = n_q / max(n_k, 1)
    ax.set_aspect("equal" if 0.25 <= ratio <= 4 else "auto")
    ax.set_xlabel(f"key j  ({x.size - 1} K/V tiles of $B_c$={block_k})")
    ax.set_ylabel(f"query i  ({y.size - 1} Q tiles of $B_r$={block_q})")
    if title is None:
        skipped = int((index < 0).sum())
        title = f"{ORDER_NAMES.get(order, order)}: {steps} tiles visited"
        title += f", {skipped} skipped" if causal else ""
    ax.set_title(title, fontsize=10)
    return ax


def footprint_bar(ax, buffers: dict, limit_bytes: float, *, limit_label: str = "limit",
                  title: str | None = None):
    """One horizontal bar stacked by on-chip buffer (bytes), against a limit line.

    The bar is outlined in red, and its label says so, when it does not fit.
    """
    left = 0.0
    for name, nbytes in buffers.items():
        ax.barh(0, nbytes, left=left, color=BUFFER_COLORS.get(name, "#999999"),
                edgecolor="white", label=name)
        if nbytes > 0.06 * max(limit_bytes, sum(buffers.values())):
            ax.text(left + nbytes / 2, 0, name, ha="center", va="center", fontsize=8,
                    color="white")
        left += nbytes
    fits = left <= limit_bytes
    ax.barh(0, left, fill=False, edgecolor="black" if fits else "red", lw=1.5 if fits else 3)
    ax.axvline(limit_bytes, color="black", ls="--", lw=1.2)
    ax.text(limit_bytes, 0.5, f" {limit_label}: {human_bytes(limit_bytes)}", fontsize=8,
            va="bottom", ha="left" if left < limit_bytes * 0.7 else "right")
    ax.legend(ncol=len(buffers), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
              frameon=False, handlelength=1.0, columnspacing=0.8)
    ax.set_xlim(0, 1.12 * max(left, limit_bytes))
    ax.set_ylim(-0.6, 0.9)
    ax.set_yticks([])
    ax.set_xticks([])
    verdict = "fits" if fits else "does NOT fit"
    ax.set_title(title or f"on chip: {human_bytes(left)}, {verdict}", fontsize=10,
                 color="black" if fits else "red")
    return ax


def traffic_bars(ax, traffic: dict, *, highlight: str | None = None, title: str | None = None):
    """Horizontal bars of bytes moved between HBM and the chip, one per algorithm."""
    names = list(traffic)
    values = [traffic[n] for n in names]
    colors = ["#C44E52" if n == highlight else "#8C8C8C" for n in names]
    ax.barh(range(len(names)), values, color=colors)
    for k, v in enumerate(values):
        ax.text(v, k, f" {human_bytes(v)}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.35 * max(values))
    ax.set_xticks([])
    ax.set_title(title or "HBM traffic (reads + writes)", fontsize=10)
    return ax


def stage_grid(ax, kinds, n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool = True,
               per: str = "row", title: str = ""):
    """Tiles at their true sizes, coloured by stage (``STAGE_COLORS``); the hatched region
    is what the causal mask removes. ``kinds`` is a (T_r, T_c) array of stage names, as
    ``flashbook.kernels.probes.stage_map`` gives it. The counts "main+masked" are written
    per program: at the right of each row (``per="row"``: one program per query tile) or
    above each column (``per="column"``: one program per key tile)."""
    kinds = np.asarray(kinds, dtype=object)
    t_r, t_c = -(-n_q // block_m), -(-n_k // block_n)
    if kinds.shape != (t_r, t_c):
        raise ValueError(f"kinds must have shape (T_r, T_c) = ({t_r}, {t_c}) for these sizes, got {kinds.shape}")
    unknown = set(kinds.ravel()) - set(STAGE_COLORS)
    if unknown:
        raise ValueError(f"kinds must hold only {sorted(STAGE_COLORS)}, got {sorted(unknown)}")
    if per not in ("row", "column"):
        raise ValueError(f"per must be 'row' or 'column', got {per!r}")
    for (i, j), kind in np.ndenumerate(kinds):
        r0, c0 = i * block_m, j * block_n
        ax.add_patch(Rectangle((c0, r0), min(block_n, n_k - c0), min(block_m, n_q - r0),
                               facecolor=STAGE_COLORS[kind], edgecolor="white", lw=1))
    if causal:  # row i sees keys j <= i + (n_k - n_q): hatch everything right of that
        edge = [(min(max(i + n_k - n_q + 1, 0), n_k), y) for i in range(n_q) for y in (i, i + 1)]
        ax.add_patch(Polygon([(n_k, 0)] + edge + [(n_k, n_q)], closed=True, facecolor="none",
                             edgecolor="black", hatch="///", lw=0.6, alpha=0.45))
    if per == "column":
        for j in range(t_c):
            main, masked = ((kinds[:, j] == s).sum() for s in ("main", "masked"))
            ax.text(min(j * block_n + block_n / 2, n_k - 1), -2, f"{main}+{masked}", ha="center", fontsize=7)
    else:
        for i in range(t_r):
            main, masked = ((kinds[i] == s).sum() for s in ("main", "masked"))
            ax.text(n_k + 1, min(i * block_m + block_m / 2, n_q - 0.5), f"{main}+{masked}",
                    va="center", fontsize=7)
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)
    ax.set_aspect("equal")
    ax.set_xlabel(f"key ($B_c$ = {block_n})")
    ax.set_ylabel(f"query ($B_r$ = {block_m})")
    ax.set_title(title, fontsize=9, pad=18 if per == "column" else 6)
    return ax


def stage_legend(fig):
    """One legend for a figure of stage grids, below them."""
    from matplotlib.patches import Patch

    return fig.legend(handles=[Patch(color=c, label=s) for s, c in STAGE_COLORS.items()],
                      loc="lower center", ncol=len(STAGE_COLORS))


# ----------------------------------------------------------------- chapter 11: split-K and the ring

SPLIT_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#CCB974"]


def split_grid(ax, n_q: int, n_k: int, num_splits: int, *, causal: bool = False, title: str = ""):
    """The score matrix cut into key splits (``flashbook.split.split_bounds``), one colour
    per split; masked scores are white and hatched. Under each split: which rows see
    none of its keys (those get (o_s, lse_s) = (0, -inf), merge's identity)."""
    from .reference import causal_mask
    from .split import split_bounds

    bounds = split_bounds(n_k, num_splits)
    allowed = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)
    for s, keys in enumerate(bounds):
        color = SPLIT_COLORS[s % len(SPLIT_COLORS)]
        if len(keys):
            ax.add_patch(Rectangle((keys.start, 0), len(keys), n_q, facecolor=color, alpha=0.8,
                                   edgecolor="white", lw=2))
        blind = int((~allowed[:, keys.start:keys.stop].any(axis=1)).sum()) if len(keys) else n_q
        label = f"split {s}\n{len(keys)} keys" + (f"\n{blind} rows see none" if blind else "")
        ax.text(keys.start + max(len(keys), 1) / 2, n_q + 0.4, label, ha="center", va="top", fontsize=7)
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


def ring_schedule(ax, world_size: int, layout: str = "contiguous", *, causal: bool = True, title: str = ""):
    """Who holds which K/V shard at each ring step (rows: ranks, columns: steps), shaded by
    the causal work of that step (``ring.causal_work``: chunk pairs, a diagonal pair
    counting one half); the total per rank at the right."""
    from . import ring

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
# =============================================================================
# The pictures that make FlashAttention click (chapters 1, 3, 5, 6)
# =============================================================================

#: The three levels of memory, top to bottom, as every data-flow figure draws them.
LEVELS = ("HBM", "shared memory (SRAM)", "registers")
_LEVEL_Y = {"HBM": 2.0, "shared memory (SRAM)": 1.0, "registers": 0.0}
_LEVEL_SHADE = {"HBM": "#EDEDED", "shared memory (SRAM)": "#DCE9F5", "registers": "#F6E3D1"}


def _box(ax, x, level, name, note=""):
    y = _LEVEL_Y[level]
    ax.add_patch(Rectangle((x - 0.42, y - 0.22), 0.84, 0.44, facecolor=BUFFER_COLORS.get(
        name.split("_")[0], "#999999"), edgecolor="black", lw=0.8, alpha=0.85, label=name))
    ax.text(x, y + (0.05 if note else 0), name, ha="center", va="center", fontsize=9,
            color="white", weight="bold")
    if note:
        ax.text(x, y - 0.13, note, ha="center", va="center", fontsize=6.5, color="white")


def _arrow(ax, x0, lev0, x1, lev1, label, color="black", style="-|>"):
    y0, y1 = _LEVEL_Y[lev0], _LEVEL_Y[lev1]
    y0 += -0.22 if y1 < y0 else 0.22 if y1 > y0 else 0
    y1 += 0.22 if y1 < _LEVEL_Y[lev0] else -0.22 if y1 > _LEVEL_Y[lev0] else 0
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                arrowprops=dict(arrowstyle=style, color=color, lw=1.6))
    ax.text((x0 + x1) / 2 + 0.06, (y0 + y1) / 2, label, fontsize=7, color=color,
            ha="left", va="center")


def dataflow_counts(n: int, d: int, block_q: int, block_k: int, *, pass_: str = "forward",
                    dq: str = "separate") -> dict:
    """How many times each array crosses between HBM and the chip, from ``tiled``'s counts.

    Forward: ``tiled.io_flash`` (FA2 order). Backward: ``tiled.io_flash_backward`` with
    ``dq`` "separate" (a second pass with query tiles outside) or "atomic". Each entry
    is reads (or writes) of that array divided by its size: 1 means once.
    """
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    if dq not in ("separate", "atomic"):
        raise ValueError(f"dq must be 'separate' or 'atomic', got {dq!r}")
    size = {"Q": n * d, "K": n * d, "V": n * d, "O": n * d, "dO": n * d, "dQ": n * d,
            "dK": n * d, "dV": n * d, "lse": n, "delta": n}
    if pass_ == "forward":
        st = tiled.io_flash(n, n, d, block_q, block_k)
    else:
        st = tiled.io_flash_backward(n, n, d, block_q, block_k,
                                     dq_strategy="atomic" if dq == "atomic" else "second_pass")
    reads = {a: x / size[a] for a, x in st.reads.items() if a in size}
    writes = {a: x / size[a] for a, x in st.writes.items() if a in size}
    return {"reads": reads, "writes": writes, "tiles_q": len(tiled.tile_slices(n, block_q)),
            "tiles_k": len(tiled.tile_slices(n, block_k))}


def _times(x: float) -> str:
    return "once" if x == 1 else f"{x:g}\u00d7"


def dataflow(ax, pass_: str = "forward", *, n: int = 1024, d: int = 64, block_q: int = 128,
             block_k: int = 128, dq: str = "separate"):
    """Where each array lives and how often it crosses the HBM / chip boundary.

    Three bands, HBM on top, shared memory in the middle, registers below. Arrows
    down are loads, arrows up are stores, labelled with how many times the whole
    array crosses (``dataflow_counts``, i.e. ``tiled``'s I/O counts). Forward: Q_i
    stays, K_j and V_j stream, O and lse are written once. Backward: K_j and V_j stay,
    Q_i and dO_i stream; dQ goes back by atomic adds (``dq="atomic"``) or through a
    second kernel with query tiles outside (``dq="separate"``).
    """
    counts = dataflow_counts(n, d, block_q, block_k, pass_=pass_, dq=dq)
    r, w = counts["reads"], counts["writes"]
    for level, y in _LEVEL_Y.items():
        ax.add_patch(Rectangle((-0.6, y - 0.45), 9.2, 0.9, facecolor=_LEVEL_SHADE[level],
                               edgecolor="none", zorder=0))
        ax.text(-0.55, y + 0.38, level, fontsize=8, va="top", style="italic")
    H, S, R = LEVELS
    if pass_ == "forward":
        for x, name in enumerate(("Q", "K", "V")):
            _box(ax, 1 + 1.6 * x, H, name)
        _box(ax, 6.0, H, "O"); _box(ax, 7.4, H, "lse")
        _box(ax, 1.0, S, "Q_i", "stays")
        _box(ax, 2.6, S, "K_j", "streams"); _box(ax, 4.2, S, "V_j", "streams")
        _box(ax, 2.6, R, "S/P", "never leaves"); _box(ax, 6.0, R, "O_i", "accumulates")
        _box(ax, 7.4, R, "m, l")
        _arrow(ax, 1.0, H, 1.0, S, f"read {_times(r['Q'])}")
        _arrow(ax, 2.6, H, 2.6, S, f"read {_times(r['K'])}")
        _arrow(ax, 4.2, H, 4.2, S, f"read {_times(r['V'])}")
        _arrow(ax, 6.0, R, 6.0, H, f"written {_times(w['O'])}", color="#C44E52")
        _arrow(ax, 7.4, R, 7.4, H, f"lse written {_times(w['lse'])}", color="#C44E52")
        title = (f"Forward, N = {n}, d = {d}, $B_r$ = {block_q}: one program per query tile "
                 f"({counts['tiles_q']} of them)")
    elif pass_ == "backward":
        for x, name in enumerate(("Q", "dO", "K", "V")):
            _box(ax, 0.6 + 1.2 * x, H, name)
        _box(ax, 5.6, H, "dK"); _box(ax, 6.8, H, "dV"); _box(ax, 8.0, H, "dQ")
        _box(ax, 0.6, S, "Q_i", "streams"); _box(ax, 1.8, S, "dO_i", "streams")
        _box(ax, 3.0, S, "K_j", "stays"); _box(ax, 4.2, S, "V_j", "stays")
        _box(ax, 1.2, R, "S/P", "recomputed"); _box(ax, 2.6, R, "dP/dS")
        _box(ax, 5.6, R, "dK_j", "accumulates"); _box(ax, 6.8, R, "dV_j", "accumulates")
        _arrow(ax, 0.6, H, 0.6, S, f"{_times(r['Q'])}")
        _arrow(ax, 1.8, H, 1.8, S, f"{_times(r['dO'] - 1)}")  # one read of dO is the delta pass
        _arrow(ax, 3.0, H, 3.0, S, f"{_times(r['K'])}" if dq == "atomic" else "once here")
        _arrow(ax, 4.2, H, 4.2, S, f"{_times(r['V'])}" if dq == "atomic" else "once here")
        _arrow(ax, 5.6, R, 5.6, H, f"written {_times(w['dK'])}", color="#C44E52")
        _arrow(ax, 6.8, R, 6.8, H, f"written {_times(w['dV'])}", color="#C44E52")
        if dq == "atomic":
            _box(ax, 8.0, R, "dQ_i", "partial")
            _arrow(ax, 8.0, R, 8.0, H, f"atomic add: read {_times(r['dQ'])},\n"
                   f"written {_times(w['dQ'] - 1)} (+ zeroing)", color="#8172B3")
            how = "dQ by atomic adds into fp32 HBM, every tile"
        else:
            _box(ax, 8.0, R, "dQ_i", "2nd kernel")
            _arrow(ax, 8.0, R, 8.0, H, f"written {_times(w['dQ'])}\n(dQ kernel: Q_i stays,\n"
                   f"K, V read {_times(r['K'] - 1)})", color="#8172B3")
            how = "dQ by a second kernel with query tiles outside"
        title = (f"Backward, N = {n}, d = {d}, $B_c$ = {block_k}: one program per key tile "
                 f"({counts['tiles_k']}); {how}")
    else:
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    ax.set_xlim(-0.6, 8.6)
    ax.set_ylim(-0.5, 2.5)
    ax.set_xticks([]); ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)
    return ax


# ----------------------------------------------------------------- chapter 1

def _sync(device: str):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measure_naive_steps(n: int = 1024, d: int = 64, *, batch_heads: int = 4, device: str = "cpu",
                        dtype=None, repeats: int = 5) -> dict:
    """Time each step of naive attention, in milliseconds (best of ``repeats``: on a
    shared machine the fastest run is the one least disturbed by others).

    The steps of ``softmax(Q K^T * scale) V`` as separate operations, each writing its
    result to memory as a naive implementation does: the two matrix products, and the
    softmax split into the bytes it must move (a copy of S into a new N x N array:
    one read, one write, which the softmax also does) and the rest (max, exp, sum,
    divide). Works on "cpu" (torch's CPU kernels) and "cuda".
    """
    import time

    import torch

    dtype = dtype or torch.float32
    for name, value in (("n", n), ("d", d), ("batch_heads", batch_heads), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(batch_heads, n, d, generator=gen).to(device=device, dtype=dtype)
               for _ in range(3))
    q = q * d ** -0.5                          # the scale, folded into Q once
    s = torch.empty(batch_heads, n, n, device=device, dtype=dtype)
    p = torch.empty_like(s)
    o = torch.empty_like(q)
    steps = {
        "Q K^T (matmul)": lambda: torch.matmul(q, k.transpose(-1, -2), out=s),
        "softmax: moving S in and P out": lambda: p.copy_(s),
        "softmax: max, exp, sum": lambda: torch.softmax(s, dim=-1),   # a new P, as naive code
        "P V (matmul)": lambda: torch.matmul(p, v, out=o),
    }
    times = {}
    for name, fn in steps.items():
        fn(); _sync(device)                                  # warm-up
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(); _sync(device)
            runs.append(1e3 * (time.perf_counter() - t0))
        times[name] = float(min(runs))
    # the softmax as a whole moved S and P and did the arithmetic: split it
    whole = times.pop("softmax: max, exp, sum")
    times["softmax: max, exp, sum"] = max(whole - times["softmax: moving S in and P out"], 0.0)
    order = ["Q K^T (matmul)", "softmax: moving S in and P out", "softmax: max, exp, sum",
             "P V (matmul)"]
    return {"ms": {k2: times[k2] for k2 in order}, "softmax_ms": whole, "n": n, "d": d,
            "batch_heads": batch_heads, "device": device, "dtype": str(dtype).split(".")[-1],
            "repeats": repeats}


_STEP_COLORS = {"Q K^T (matmul)": "#4C72B0", "P V (matmul)": "#55A868",
                "softmax: moving S in and P out": "#C44E52", "softmax: max, exp, sum": "#DD8452"}


def time_breakdown(ax, measured: dict, *, title: str | None = None):
    """One stacked bar of ``measure_naive_steps``'s times, each step's share written on it."""
    ms = measured["ms"]
    total = sum(ms.values())
    left = 0.0
    for name, t in ms.items():
        ax.barh(0, t, left=left, color=_STEP_COLORS.get(name, "#999999"), edgecolor="white",
                label=f"{name}: {t:.2f} ms ({100 * t / total:.0f}%)")
        left += t
    ax.set_yticks([])
    ax.set_xlabel("milliseconds")
    ax.set_xlim(0, total * 1.02)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)
    ax.set_title(title or (f"Naive attention on {measured['device']}, {measured['dtype']}: "
                           f"N = {measured['n']}, d = {measured['d']}, "
                           f"{measured['batch_heads']} heads, {total:.1f} ms"), fontsize=9)
    return ax


def saturation_stats(dims, *, n_keys: int = 256, rows: int = 256, rng=None) -> dict:
    """Measured softmax saturation as the head dimension d grows.

    For each d: random q, k with unit-variance entries, scores q.k with and without
    the 1/sqrt(d) scale. Returns per d the standard deviation of the scores and the
    mean largest softmax weight of a row (1.0 means one key takes everything, so the
    gradient through the softmax, diag(p) - p p^T, is zero).
    """
    rng = rng if rng is not None else np.random.default_rng()
    dims = [int(x) for x in dims]
    if not dims or min(dims) < 1:
        raise ValueError(f"dims must be positive ints, got {dims}")
    out = {"d": np.array(dims), "std_raw": [], "std_scaled": [], "pmax_raw": [],
           "pmax_scaled": [], "n_keys": n_keys}
    from .reference import softmax_rows

    for d in dims:
        q = rng.standard_normal((rows, d))
        k = rng.standard_normal((n_keys, d))
        s = q @ k.T
        for tag, x in (("raw", s), ("scaled", s / np.sqrt(d))):
            out[f"std_{tag}"].append(float(x.std()))
            out[f"pmax_{tag}"].append(float(softmax_rows(x).max(axis=-1).mean()))
    return {key: np.asarray(val) if isinstance(val, list) else val for key, val in out.items()}


def saturation(axes, stats: dict):
    """Two panels from ``saturation_stats``: the scores' spread, and the largest weight."""
    ax_std, ax_p = axes
    d = stats["d"]
    ax_std.loglog(d, stats["std_raw"], "-o", color="#C44E52", label="$q\\cdot k$ (no scale)")
    ax_std.loglog(d, stats["std_scaled"], "-s", color="#4C72B0", label="$q\\cdot k/\\sqrt{d}$")
    ax_std.set_xlabel("head dimension d"); ax_std.set_ylabel("std of the scores")
    ax_std.set_title("The spread of the scores grows as $\\sqrt{d}$", fontsize=9)
    ax_p.semilogx(d, stats["pmax_raw"], "-o", color="#C44E52", label="no scale")
    ax_p.semilogx(d, stats["pmax_scaled"], "-s", color="#4C72B0", label="scale $1/\\sqrt{d}$")
    ax_p.axhline(1.0, color="gray", ls=":", lw=0.8)
    ax_p.set_ylim(0, 1.05)
    ax_p.set_xlabel("head dimension d"); ax_p.set_ylabel("mean largest weight in a row")
    ax_p.set_title(f"Softmax over {stats['n_keys']} keys saturates without the scale", fontsize=9)
    for ax in axes:
        ax.set_xticks(d, [str(x) for x in d]); ax.minorticks_off()
        ax.legend(fontsize=8)
    return axes


# ----------------------------------------------------------------- chapter 3

def online_merge(ax, scores, block: int):
    """One row of scores cut into blocks, each block's (m, l), and their merge, left to right.

    The states come from ``softmax.block_state`` and ``softmax.merge``; the last box
    holds the merged (m, l) and lse, which equal the whole row's max and logsumexp.
    """
    from . import softmax as sm

    x = np.asarray(scores, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {x.shape}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    cuts = tiled.tile_slices(x.size, block)
    palette = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#C44E52", "#937860"]
    top = x.max()
    bottom = min(x.min(), 0.0)
    height = top - bottom
    for b, cut in enumerate(cuts):                           # the scores, coloured by block
        idx = np.arange(cut.start, cut.stop)
        ax.bar(idx, x[cut] - bottom, bottom=bottom, color=palette[b % len(palette)], width=0.8)
        m_b = x[cut].max()
        ax.hlines(m_b, cut.start - 0.4, cut.stop - 0.6, color="black", lw=1.2)
    y_box = bottom - 0.45 * height
    y_run = bottom - 1.25 * height
    state, prev_x = sm.empty_state(), None
    for b, cut in enumerate(cuts):
        blk = sm.block_state(x[cut])
        cx = (cut.start + cut.stop - 1) / 2
        ax.text(cx, y_box, f"block {b}: m={float(blk.row_max):.2f}, l={float(blk.row_sum):.2f}",
                ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", facecolor=palette[b % len(palette)], alpha=0.35))
        new = sm.merge(state, blk)
        rescale = (f"\nold l \u00d7 e^(m_old - m) = \u00d7{float(np.exp(state.row_max - new.row_max)):.2f}"
                   if b else "")
        ax.text(cx, y_run, f"\u2295  m={float(new.row_max):.2f}, l={float(new.row_sum):.2f}"
                + rescale, ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor="gray"))
        ax.annotate("", xy=(cx, y_run + 0.22 * height), xytext=(cx, y_box - 0.12 * height),
                    arrowprops=dict(arrowstyle="-|>", lw=0.8))
        if prev_x is not None:
            ax.annotate("", xy=(cx - 0.3 * block, y_run), xytext=(prev_x + 0.3 * block, y_run),
                        arrowprops=dict(arrowstyle="-|>", lw=1.2, color="gray"))
        state, prev_x = new, cx
    lse = float(state.lse)
    ax.text(x.size - 0.5, y_run - 0.4 * height,
            f"merged: m = {float(state.row_max):.2f}, lse = m + log l = {lse:.3f}",
            ha="right", va="top", fontsize=8, weight="bold")
    ax.set_ylim(y_run - 0.55 * height, top + 0.1 * height)
    ax.set_xlim(-0.8, x.size - 0.2)
    ax.set_xlabel("key j (bars: scores $s_j$; black line: each block's max)")
    ax.set_yticks([])
    ax.set_title(f"Online softmax: {len(cuts)} blocks of {block}, merged left to right", fontsize=9)
    return ax


def running_max(axes, scores, block: int) -> dict:
    """The running maximum of one row of scores and the rescale factor it causes.

    ``axes`` is a pair (top, bottom). Top: the scores, the running maximum one score at
    a time (a step line) and after each block of ``block`` scores (squares). Bottom: the
    factor $e^{m_{old} - m_{new}}$ that rescales the old sum at each step, both ways (1
    where the maximum did not move). The maxima come from ``softmax.online_softmax``'s
    trace. Returns the numbers the figure shows: ``m1``, ``m_block`` (the running maxima),
    ``alpha1``, ``alpha_block`` (the factors) and ``moves1``, ``moves_block`` (how often
    the maximum moved).
    """
    from . import softmax as sm

    x = np.asarray(scores, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"scores must be a 1-D array of at least 2 scores, got shape {x.shape}")
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block < x.size:
        raise ValueError(f"block must be an int from 1 to len(scores) - 1, got {block!r}")
    m1 = np.array([t.row_max for t in sm.online_softmax(x, block_size=1, return_trace=True)[2]])
    mb = np.array([t.row_max for t in sm.online_softmax(x, block_size=block, return_trace=True)[2]])
    alpha1, alphab = np.exp(m1[:-1] - m1[1:]), np.exp(mb[:-1] - mb[1:])   # step 0 has no old state
    ends = np.minimum(np.arange(block, x.size + block, block), x.size) - 1  # last score of each block
    top, bottom = axes
    top.plot(x, "o", ms=3.5, color="0.55", label="score $x_j$")
    top.step(range(x.size), m1, where="post", color="C0", lw=2, label="running max, one score at a time")
    top.plot(ends, mb, "s", color="C3", ms=7, mfc="none", mew=2,
             label=f"running max after each block of {block}")
    for b in range(block, x.size, block):
        top.axvline(b - 0.5, color="C3", lw=0.6, ls=":")
    top.set_ylabel("score")
    top.legend(fontsize=8, loc="upper left")
    bottom.stem(range(1, x.size), alpha1, linefmt="C0-", markerfmt="C0o", basefmt=" ", label="one score at a time")
    bottom.plot(ends[1:], alphab, "s", color="C3", ms=7, mfc="none", mew=2, label=f"blocks of {block}")
    bottom.set_ylim(0, 1.08)
    bottom.set_ylabel(r"rescale $e^{m_{old}-m_{new}}$")
    bottom.set_xlabel("score index j")
    bottom.legend(fontsize=8, loc="lower right")
    return {"m1": m1, "m_block": mb, "alpha1": alpha1, "alpha_block": alphab,
            "moves1": int((alpha1 < 1).sum()), "moves_block": int((alphab < 1).sum())}


# ----------------------------------------------------------------- chapter 6

def tensor_layout(ax, shape=(2, 2, 8, 4), *, block_m: int = 4, program=(1, 0, 1)):
    """A contiguous (B, H, N, d) tensor as memory: one row of d addresses per token.

    Rows are coloured by (batch, head); the rows that the program ``(b, h, m)`` (query
    tile m of head h of batch b) loads are outlined in red, with their first and last
    addresses. Strides (in elements) are NumPy's for a C-contiguous array.
    """
    B, H, N, d = (int(s) for s in shape)
    b, h, m = (int(p) for p in program)
    if min(B, H, N, d) < 1:
        raise ValueError(f"shape must be four positive sizes (B, H, N, d), got {shape}")
    if not (0 <= b < B and 0 <= h < H and 0 <= m * block_m < N):
        raise ValueError(f"program must be (b, h, m) inside shape {shape} with block_m = "
                         f"{block_m}, got {program}")
    strides = [s // 8 for s in np.empty((B, H, N, d)).strides]   # float64: 8 bytes each
    rows = B * H * N
    shades = ["#DCE9F5", "#B7D0EA", "#F6E3D1", "#EBC7A4"]
    for r in range(rows):
        bh = r // N
        ax.add_patch(Rectangle((0, r), d, 1, facecolor=shades[bh % len(shades)],
                               edgecolor="white", lw=0.5))
    for bh in range(B * H):
        ax.text(-0.3, bh * N + N / 2, f"b={bh // H}, h={bh % H}", ha="right", va="center",
                fontsize=7)
    first_row = b * H * N + h * N + m * block_m
    n_rows = min(block_m, N - m * block_m)
    start = b * strides[0] + h * strides[1] + m * block_m * strides[2]
    end = start + (n_rows - 1) * strides[2] + (d - 1) * strides[3]
    ax.add_patch(Rectangle((0, first_row), d, n_rows, fill=False, edgecolor="red", lw=2.5,
                           zorder=5))
    ax.text(d + 0.3, first_row + 0.5, f"address {start}", color="red", fontsize=7, va="center")
    ax.text(d + 0.3, first_row + n_rows - 0.5, f"address {end}", color="red", fontsize=7,
            va="center")
    ax.text(d + 0.3, rows * 0.02, "strides (elements):\n"
            + "\n".join(f"{n_} = {s}" for n_, s in zip(("stride_b", "stride_h", "stride_n",
                                                          "stride_d"), strides)),
            fontsize=7, va="top", family="monospace")
    ax.set_xlim(-3.2, d + 5.5)
    ax.set_ylim(rows, 0)
    ax.set_xticks(np.arange(d) + 0.5, [str(j) for j in range(d)], fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("offset within a row (dimension j of d)")
    ax.set_title(f"(B, H, N, d) = {tuple(shape)} in memory; red: program (b={b}, h={h}, "
                 f"m={m}) with $B_r$ = {block_m}", fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return ax
