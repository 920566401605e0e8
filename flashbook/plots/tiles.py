"""The score matrix cut into tiles: the order a loop visits them (``tile_grid``, chapters
4 and 5 and the block-size explorer), the stage a kernel runs on each (``stage_grid``,
chapters 7 and 8), and what one program holds (``footprint_bar``) and moves
(``traffic_bars``).
"""
from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Polygon, Rectangle

from .. import tiled

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
