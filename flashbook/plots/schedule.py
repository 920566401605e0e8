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
    # the compiled Triton loop has a bar.sync 0 before each S_j is issued and one after each P_j V_j
    # (Triton 3.6.0, which the profile ran, and 3.9.0, which adds one after each wait: chapter 7's test)
    fig.suptitle("One program's loop (above, barriers before each $S_j$ and after each $P_jV_j$ keep its "
                 "two warpgroups in step)", fontsize=10)
    axes[1].set_xlim(0, max(ends) * 1.02)
    axes[1].set_xlabel(f"time, schematic (every step drawn the same length); {n_tiles} key tiles "
                       f"end at {ends[0]:g} and {ends[1]:g}")
    return fig


def slot_ring(n_tiles: int = 7, stages: int = 3, *, load: float = 1.0, step: float = 1.0) -> dict:
    """The Gluon kernel's producer schedule (``hopper.producer`` and ``attend_tiles``) as events.

    The producer warp copies K_t and V_t into ring slot ``t % stages``; their barriers complete
    for the (t // stages)-th time, so a consumer waits on phase ``(t // stages) & 1``. Before
    reusing a slot it waits until the consumers released the tile ``stages`` before. Consumer
    step j uses K_j and V_{j-1} (S_j and P_{j-1} V_{j-1}) and releases tile j - 1 at its end, so
    the consumers hold two tiles at once; the last tile's P V follows the loop and releases it.
    Copies take ``load``, a consumer step ``step`` (a schematic: the copies go one after another).
    Returns ``{"loads": [(tile, slot, phase, start, end)], "steps": [(j, start, end)],
    "held": [(tile, slot, phase, loaded_from, released_at)]}``."""
    if n_tiles < 1 or stages < 2:
        raise ValueError(f"n_tiles must be >= 1 and stages >= 2 (a step holds two tiles), got {n_tiles}, {stages}")
    if min(load, step) <= 0:
        raise ValueError(f"durations must be > 0, got load={load}, step={step}")
    loads, steps, released = [], [], {}
    for t in range(n_tiles):
        copier = loads[-1][4] if loads else 0.0                # the previous copy's end
        start = max(copier, released.get(t - stages, 0.0))   # the slot's previous tile released
        loads.append((t, t % stages, (t // stages) & 1, start, start + load))
        # the consumers run every step whose tiles are in: step t needs K_t (and V_{t-1}, in before it)
        begin = max(steps[-1][2] if steps else 0.0, start + load)
        steps.append((t, begin, begin + step))
        if t >= 1:
            released[t - 1] = begin + step
    last = steps[-1][2]
    steps.append((n_tiles, last, last + step / 2))   # the last P V, after the loop
    released[n_tiles - 1] = last + step / 2
    held = [(t, slot, phase, start, released[t]) for t, slot, phase, start, _ in loads]
    return {"loads": loads, "steps": steps, "held": held}


def slot_ring_figure(n_tiles: int = 7, stages: int = 3, **durations) -> Figure:
    """The producer, the consumers and the ring's slots on one time axis (``slot_ring``)."""
    ring = slot_ring(n_tiles, stages, **durations)
    fig = Figure(figsize=(9.0, 1.2 + 0.45 * (stages + 2)), layout="constrained")
    ax = fig.subplots()
    lanes = ["producer warp: TMA copies", "consumer warpgroups"] + [f"slot {s}" for s in range(stages)]
    y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
    colours = ["#4C72B0", "#55A868", "#DD8452", "#8172B3", "#937860", "#DA8BC3"]
    for t, slot, phase, start, end in ring["loads"]:
        ax.barh(y[lanes[0]], end - start, left=start, height=0.6, color=colours[slot % len(colours)], edgecolor="white")
        ax.text((start + end) / 2, y[lanes[0]], f"$K_{t}V_{t}$", ha="center", va="center", fontsize=8, color="white")
    for j, start, end in ring["steps"]:
        label = f"$S_{{{j}}}$, $P_{{{j - 1}}}V_{{{j - 1}}}$" if 0 < j < n_tiles else (
            "$S_0$" if j == 0 else f"$P_{{{j - 1}}}V_{{{j - 1}}}$")
        ax.barh(y[lanes[1]], end - start, left=start, height=0.6, color="#777777", edgecolor="white")
        ax.text((start + end) / 2, y[lanes[1]], label, ha="center", va="center", fontsize=7, color="white")
    for t, slot, phase, start, end in ring["held"]:
        ax.barh(y[f"slot {slot}"], end - start, left=start, height=0.6, color=colours[slot % len(colours)],
                edgecolor="white", alpha=0.85)
        ax.text((start + end) / 2, y[f"slot {slot}"], f"tile {t}, phase {phase}", ha="center", va="center",
                fontsize=7, color="white")
    ax.set_yticks([y[name] for name in lanes], lanes, fontsize=8)
    end = max(e for *_, e in ring["held"])
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(f"time, schematic (a copy and a step drawn the same length); {stages} slots, {n_tiles} key tiles")
    ax.set_title("The producer refills a slot once the consumers release the tile it held; "
                 "a slot's barrier phase flips each round", fontsize=9, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
