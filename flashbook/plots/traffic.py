"""Chapter 4's counts drawn: a forward pass's HBM traffic against the sequence length
(``against_n``), the block sizes (``block_maps``) and the on-chip memory ``M``
(``against_m``), and what one program holds against the tile size (``onchip_vs_tile``).

Every number comes from ``flashbook.tiled``'s closed forms (``io_naive``, ``io_flash``,
``io_bound``, ``onchip_bytes``); chips are ``flashbook.runtime.CHIPS`` entries (anything
with ``name`` and ``smem_per_block_kib``), passed in.
"""
from __future__ import annotations

import numpy as np

from .. import tiled
from .tiles import ORDER_NAMES

_KIB, _MIB = 2**10, 2**20


def against_n(ax, ns, d: int, block: int):
    """HBM bytes of one head's forward pass against N, naive and both loop orders, on log
    axes. Returns ({name: bytes per N}, {name: slope of log bytes over the last four N})."""
    curves = {"naive": [tiled.io_naive(n, n, d).hbm_bytes() for n in ns]}
    for order in ("fa1", "fa2"):
        curves[ORDER_NAMES[order]] = [tiled.io_flash(n, n, d, block, block, order=order).hbm_bytes()
                                      for n in ns]
    slopes = {}
    for (name, ys), style in zip(curves.items(), ["-o", "-s", "-^"]):
        slopes[name] = np.polyfit(np.log(ns[-4:]), np.log(ys[-4:]), 1)[0]
        ax.loglog(ns, np.array(ys) / _MIB, style, label=f"{name} (slope {slopes[name]:.2f})")
    ax.set_xticks(ns, [f"{n // 1024}K" if n >= 1024 else str(n) for n in ns])
    ax.set_xlabel("sequence length N"); ax.set_ylabel("HBM traffic per head (MiB)")
    ax.set_title(f"Traffic of one head's forward pass, d = {d}, $B_r$ = $B_c$ = {block}")
    ax.legend(fontsize=8)
    return curves, slopes


def block_maps(fig, n: int, d: int, blocks, limit_bytes: float):
    """Two heat maps on ``fig``, one per loop order: HBM traffic / naive for each
    (B_r, B_c) at N = n, one colour scale for both; × marks tiles whose everything-on-chip
    count (``tiled.onchip_bytes``) exceeds ``limit_bytes``. Returns {order: fractions}."""
    naive = tiled.io_naive(n, n, d).hbm_bytes()
    fracs = {order: np.array([[tiled.io_flash(n, n, d, bq, bk, order=order).hbm_bytes() / naive
                               for bk in blocks] for bq in blocks]) for order in ("fa1", "fa2")}
    top = max(f.max() for f in fracs.values())
    axes = fig.subplots(1, 2)
    for ax, (order, frac) in zip(axes, fracs.items()):
        im = ax.imshow(frac, cmap="viridis_r", vmin=0, vmax=top)
        for a, bq in enumerate(blocks):
            for b, bk in enumerate(blocks):
                fits = tiled.onchip_bytes(bq, bk, d) <= limit_bytes
                ax.text(b, a, f"{frac[a, b]:.2f}" + ("" if fits else "\n×"), ha="center",
                        va="center", fontsize=8, color="white" if frac[a, b] > 0.5 * top else "black")
        ax.set_xticks(range(len(blocks)), blocks); ax.set_yticks(range(len(blocks)), blocks)
        ax.set_xlabel("$B_c$ (key tile)"); ax.set_ylabel("$B_r$ (query tile)")
        ax.set_title(f"{ORDER_NAMES[order]}: traffic / naive")
    fig.colorbar(im, ax=axes, shrink=0.8)
    return fracs


def _drawn(chips):
    """The chips a shared-memory line is drawn for: the H200 has the H100's shared memory, so
    its line would lie on the H100's (which says "= H200")."""
    return [c for c in chips if c.name != "H200"]


def onchip_vs_tile(ax, chips, sizes, ds=(64, 128, 256)):
    """Everything on chip for one program (fp16 tiles, fp32 accumulators) against the square
    tile size, one line per head dimension, with each chip's shared memory per program."""
    for d, style in zip(ds, ["-", "--", ":"]):
        ax.plot(sizes, [tiled.onchip_bytes(b, b, d, 2) / _KIB for b in sizes], style, color="k",
                label=f"$B_r$ = $B_c$, d = {d}")
    for c, color in zip(_drawn(chips), ["C0", "C1", "C2", "C3"]):
        ax.axhline(c.smem_per_block_kib, color=color, lw=1)
        ax.text(sizes[0], c.smem_per_block_kib * 1.03, f"{c.name} per program"
                + (" (= H200)" if c.name == "H100" else ""), color=color, fontsize=8)
    ax.set_xlabel("tile size $B_r$ = $B_c$"); ax.set_ylabel("everything on chip (KiB)")
    ax.set_ylim(0, 400); ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Everything on chip, one program (fp16 tiles, fp32 accumulators)")
    return ax


def against_m(ax, n: int, d: int, ms, chips):
    """HBM traffic (elements) against the on-chip memory M (elements) with the paper's
    blocks (``tiled.paper_blocks``), both loop orders, beside N²d²/M, the naive count and
    each chip's M (its shared memory per program in fp16 elements)."""
    for order, style in [("fa1", "-o"), ("fa2", "-s")]:
        t = [tiled.io_flash(n, n, d, *tiled.paper_blocks(int(m), d), order=order).hbm_total
             for m in ms]
        ax.loglog(ms, t, style, label=f"{ORDER_NAMES[order]}, paper's blocks")
    ax.loglog(ms, [tiled.io_bound(n, d, m) for m in ms], "k--", label="$N^2d^2/M$")
    ax.axhline(tiled.io_naive(n, n, d).hbm_total, color="gray", label="naive")
    for c in _drawn(chips):
        m_el = c.smem_per_block_kib * _KIB // 2
        ax.axvline(m_el, color="gray", ls=":", lw=0.8)
        ax.text(m_el, 2e6, c.name, rotation=90, fontsize=8, va="bottom")
    ax.set_xlabel("on-chip memory M (elements)"); ax.set_ylabel("HBM traffic (elements)")
    ax.set_title(f"N = {n}, d = {d}")
    ax.legend(fontsize=8)
    return ax
