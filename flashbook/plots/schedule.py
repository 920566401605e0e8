"""Chapter 10's schematic of one warpgroup's loop: when its tile products run on the tensor
cores and when its softmax runs, in chapter 7's Triton kernel (every wait is
``wgmma.wait_group 0``) and in the Gluon kernel (``warpgroup_mma_wait(1)``).

A picture of the *order* of the work, not a measurement: the durations are arguments, equal
by default. ``issue_timeline`` computes the events, ``issue_order_figure`` draws them. The
measured effect of the order is chapter 10's schedule table.
"""
from __future__ import annotations

from matplotlib.figure import Figure

#: Colours of the three kinds of work.
COLOURS = {"S": "#4C72B0", "PV": "#55A868", "softmax": "#DD8452"}
LANES = ("tensor cores", "softmax")


def issue_timeline(n_tiles: int = 3, *, overlap: bool, qk: float = 1.0, pv: float = 1.0,
                   softmax: float = 1.0) -> list[tuple[str, str, int, float, float]]:
    """Events ``(lane, kind, tile, start, end)`` of one warpgroup's loop over ``n_tiles`` key
    tiles. ``overlap=False``: chapter 7's order, S_j, then its softmax, then P_j V_j, each
    waited for before the next starts. ``overlap=True``: the Gluon kernel's, where step j
    issues S_j and P_{j-1} V_{j-1} back to back, waits for S_j only, and runs the softmax of
    S_j while P_{j-1} V_{j-1} is still on the tensor cores; the last P V follows the loop."""
    if n_tiles < 1:
        raise ValueError(f"n_tiles must be >= 1, got {n_tiles}")
    if min(qk, pv, softmax) <= 0:
        raise ValueError(f"durations must be > 0, got qk={qk}, pv={pv}, softmax={softmax}")
    events, t = [], 0.0
    if not overlap:
        for j in range(n_tiles):
            events += [("tensor cores", "S", j, t, t + qk), ("softmax", "softmax", j, t + qk, t + qk + softmax),
                       ("tensor cores", "PV", j, t + qk + softmax, t + qk + softmax + pv)]
            t += qk + softmax + pv
        return events
    events += [("tensor cores", "S", 0, 0.0, qk), ("softmax", "softmax", 0, qk, qk + softmax)]
    t = qk + softmax
    for j in range(1, n_tiles):
        events += [("tensor cores", "S", j, t, t + qk), ("tensor cores", "PV", j - 1, t + qk, t + qk + pv),
                   ("softmax", "softmax", j, t + qk, t + qk + softmax)]   # after wait(1): S_j is done
        t += qk + max(pv, softmax)                                         # wait(0), then rescale O
    events.append(("tensor cores", "PV", n_tiles - 1, t, t + pv))
    return events


def _label(kind: str, j: int) -> str:
    return {"S": f"$S_{j}$", "PV": f"$P_{j}V_{j}$", "softmax": f"softmax$(S_{j})$"}[kind]


def issue_order_figure(n_tiles: int = 3, **durations) -> Figure:
    """Two timelines, chapter 7's order above the Gluon kernel's, on one time axis."""
    fig = Figure(figsize=(9.0, 3.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    titles = ("Chapter 7 (Triton): every wait is wait_group 0; the softmax and the products take turns",
              "Gluon: issue $S_j$ and $P_{j-1}V_{j-1}$, wait(1), softmax$(S_j)$ while $P_{j-1}V_{j-1}$ runs")
    ends = []
    for ax, overlap, title in zip(axes, (False, True), titles):
        events = issue_timeline(n_tiles, overlap=overlap, **durations)
        for lane, kind, j, start, end in events:
            y = 1 - LANES.index(lane)
            ax.barh(y, end - start, left=start, height=0.7, color=COLOURS[kind], edgecolor="white")
            ax.text((start + end) / 2, y, _label(kind, j), ha="center", va="center", fontsize=8, color="white")
        end = max(e[4] for e in events)
        ends.append(end)
        ax.axvline(end, color="black", lw=0.8, ls=":")
        ax.set_yticks([1, 0], LANES)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(title, fontsize=9, loc="left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.suptitle("One warpgroup's loop (other warpgroups and programs on the SM may fill its gaps)", fontsize=10)
    axes[1].set_xlim(0, max(ends) * 1.02)
    axes[1].set_xlabel(f"time, schematic (every step drawn the same length); {n_tiles} key tiles "
                       f"end at {ends[0]:g} and {ends[1]:g}")
    return fig
