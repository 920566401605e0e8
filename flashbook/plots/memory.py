"""Where the arrays live and how they move: the three levels of memory and what crosses
between them (``dataflow``, chapters 1 and 5, counted by ``flashbook.tiled``), and one
tensor laid out in memory as a kernel addresses it (``tensor_layout``, chapter 6).
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Rectangle

from .. import tiled
from .tiles import BUFFER_COLORS

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


def _compute(ax, sources, target, label, at, color="#55A868"):
    """Thin dashed arrows from the on-chip tiles ``sources`` ((x, level) each) into the tile
    ``target`` that a matrix product makes from them, the product written at ``at``."""
    (xt, lt) = target
    yt = _LEVEL_Y[lt]
    for xs, ls in sources:
        ys = _LEVEL_Y[ls]
        if ys == yt:        # beside it on the same level: edge to edge
            start, end = (xs + 0.42 * np.sign(xt - xs), ys), (xt - 0.42 * np.sign(xt - xs), yt)
        else:               # above it: bottom edge to top edge
            start, end = (xs, ys - 0.22), (xt + 0.12 * np.sign(xs - xt), yt + 0.22)
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=color, lw=1.1,
                                                              linestyle="--", shrinkA=0, shrinkB=0))
    ax.text(*at, label, fontsize=7.5, color=color, ha="center", va="center")


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
    stays, K_j and V_j stream, O and lse are written once; dashed arrows show the two
    matrix products that turn the tiles into S/P and O_i. Backward: K_j and V_j stay,
    Q_i and dO_i stream; dQ goes back by atomic adds (``dq="atomic"``) or through a
    second kernel with query tiles outside (``dq="separate"``).
    """
    counts = dataflow_counts(n, d, block_q, block_k, pass_=pass_, dq=dq)
    r, w = counts["reads"], counts["writes"]
    for level, y in _LEVEL_Y.items():
        ax.add_patch(Rectangle((-0.6, y - 0.45), 9.2, 0.9, facecolor=_LEVEL_SHADE[level],
                               edgecolor="none", zorder=0))
        if pass_ == "backward":     # bottom left: the arrow from Q to Q_i crosses the top left
            ax.text(-0.55, y - 0.42, level, fontsize=8, va="bottom", style="italic")
        else:
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
        _compute(ax, [(1.0, S), (2.6, S)], (2.6, R), "$S = Q_i K_j^T$", at=(1.25, 0.42))   # the two products
        _compute(ax, [(4.2, S), (2.6, R)], (6.0, R), "$O_i$ += $P V_j$", at=(4.3, 0.12))
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
        for x, name in ((3.0, "K"), (4.2, "V")):   # separate: once here, the rest in the dQ kernel
            _arrow(ax, x, H, x, S, _times(r[name]) if dq == "atomic"
                   else f"once + {_times(r[name] - 1)}\n(dQ kernel)")
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


# ----------------------------------------------------------------- a tensor in memory (chapter 6)

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
    ax.set_title(f"(B, H, N, d) = {tuple(shape)} in memory; red: the program for batch {b}, head {h}, "
                 f"query tile {m} ($B_r$ = {block_m})", fontsize=9)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return ax
