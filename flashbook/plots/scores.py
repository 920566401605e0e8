"""One row of scores: how the softmax saturates without the 1/sqrt(d) scale
(``saturation``, chapter 1), and the online softmax's blocks, their merge and the
running maximum (``online_merge``, ``running_max``, chapter 3).
"""
from __future__ import annotations

import numpy as np

from .. import softmax as sm
from .. import tiled
from ..reference import softmax_rows

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


# ----------------------------------------------------------------- the online softmax (chapter 3)

def online_merge(ax, scores, block: int):
    """One row of scores cut into blocks, each block's (m, l), and their merge, left to right.

    The states come from ``softmax.block_state`` and ``softmax.merge``. Each merge box after
    the first prints its l as ``old l x e^(m_old - m) + block l x e^(m_block - m)``, both
    factors with the two sums they scale;
    the last box holds the merged (m, l) and lse, which equal the whole row's max and
    logsumexp. The scores are bars from a dotted zero line.
    """
    x = np.asarray(scores, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {x.shape}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    cuts = tiled.tile_slices(x.size, block)
    palette = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#C44E52", "#937860"]
    top = max(x.max(), 0.0)
    bottom = min(x.min(), 0.0)
    height = (top - bottom) or 1.0
    # the scores, coloured by block, as bars from a zero line: a score's sign and size can be
    # read off, and the smallest score has a bar too (unless it is 0)
    ax.axhline(0.0, color="gray", lw=0.8, ls=":")
    for b, cut in enumerate(cuts):
        idx = np.arange(cut.start, cut.stop)
        ax.bar(idx, x[cut], color=palette[b % len(palette)], width=0.8)
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
        # both factors: whichever side had the smaller maximum shrinks, the other keeps 1
        ref = float(new.row_max) if np.isfinite(new.row_max) else 0.0   # as merge's guard
        alpha = float(np.exp(state.row_max - ref)) if b else 0.0
        beta = float(np.exp(blk.row_max - ref))
        rescale = (f"\n= old {float(state.row_sum):.2f} \u00d7 {alpha:.2f}"
                   f"\n+ block {float(blk.row_sum):.2f} \u00d7 {beta:.2f}") if b else ""
        ax.text(cx, y_run, f"\u2295  m={float(new.row_max):.2f}, l={float(new.row_sum):.2f}"
                + rescale, ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor="gray"))
        ax.annotate("", xy=(cx, y_run + 0.3 * height), xytext=(cx, y_box - 0.12 * height),
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
    ax.set_yticks([0.0], ["0"])
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
