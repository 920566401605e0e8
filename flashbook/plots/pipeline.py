"""Chapter 6's picture of ``num_stages``: what the K/V buffers in shared memory hold, iteration
by iteration, in the forward kernel's loop over key tiles.

A schematic of the *order* of the work, not a measurement. Each buffer holds one K tile and one
V tile (B_c x d each); how many there are is the book's shared-memory model
(``smem.smem_buffers``, via ``model_buffers``), not a count made here. ``pipeline_schedule``
says what each buffer holds when; ``pipeline_figure`` draws it:

- from 2 stages on, the copies of the next ``num_stages - 1`` tiles are under way
  (asynchronous copies) while ``tl.dot`` works on the current tile;
- on sm_90, wgmma reads its operands from shared memory while it runs: the tile in use keeps
  its buffer, and all ``num_stages`` buffers the model counts are busy;
- on sm_80, ``tl.dot`` first copies the tile into registers, which frees its buffer for the
  next copy: ``num_stages - 1`` buffers suffice, and the model's last one is never needed
  (the model is on the safe side there);
- at 1 stage nothing overlaps: a tile is copied in, then used.

Time is counted in iterations: iteration j is ``[j, j + 1)``; the copies issued before the loop
starts (the prologue) are drawn in ``[-1, 0)``.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .. import smem
from ..validation import check_count

#: The two architectures the figure compares, with the chips the book has of each.
ARCHS = {"sm_80": "A100", "sm_90": "H100, H200"}
#: The row of the sm_80 timelines where the tile in use sits once copied out of its buffer.
REGISTERS = "registers"
#: Colours of the states of a tile.
COLOURS = {"copy": "#9DBBDF", "use": "#55A868", "spare": "#F2F2F2"}


def _check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {tuple(ARCHS)}, got {arch!r}")
    return arch


def model_buffers(num_stages: int, arch: str = "sm_80") -> int:
    """The buffers (each one K tile and one V tile) that ``smem.smem_buffers`` counts for the
    forward kernel at ``num_stages`` on ``arch``: its K entry over the bytes of one tile."""
    stages = check_count(num_stages, "num_stages")
    block, d, elt = 64, 64, 2           # any tile: the count does not depend on its size
    k_bytes = smem.smem_buffers(block, block, d, num_stages=stages, dtype_bytes=elt,
                                arch=_check_arch(arch))["K"]
    assert k_bytes % (block * d * elt) == 0, k_bytes
    return k_bytes // (block * d * elt)


def _issued(tile: int, stages: int) -> float:
    """When the copy of ``tile`` starts: before the loop for the first ``stages - 1`` tiles,
    else in iteration ``tile - stages + 1`` (which has just freed a buffer); at one stage, at
    the start of the tile's own iteration."""
    if stages == 1:
        return float(tile)
    return max(-1.0, float(tile - stages + 1))


def pipeline_schedule(num_stages: int, arch: str, n_steps: int = 4,
                      n_tiles: int | None = None) -> list[tuple[object, int, str, float, float]]:
    """Events ``(row, tile, state, start, end)`` of the first ``n_steps`` iterations.

    ``row`` is a buffer index (0 to ``model_buffers(num_stages, arch) - 1``) or
    ``REGISTERS``; ``state`` is ``"copy"`` (the tile's copy into its buffer is under way) or
    ``"use"`` (``tl.dot`` reads the tile). ``n_tiles``: how many key tiles the loop has (None:
    more than are drawn), so that no copy is issued past the last one. Events are cut at
    ``n_steps``."""
    stages = check_count(num_stages, "num_stages")
    steps = check_count(n_steps, "n_steps")
    arch = _check_arch(arch)
    last = None if n_tiles is None else check_count(n_tiles, "n_tiles")
    # sm_90 keeps the tile in use in its buffer (s buffers); sm_80 frees it (s - 1), but at one
    # stage a tile still passes through a buffer on both
    rotation = stages if (arch == "sm_90" or stages == 1) else stages - 1
    if rotation > model_buffers(stages, arch):
        raise AssertionError("the schedule needs more buffers than the model counts")
    # at one stage the copy takes the first half of the iteration and the product the second
    use_from = 0.5 if stages == 1 else 0.0
    events = []
    tile = 0
    while (last is None or tile < last) and _issued(tile, stages) < steps:
        buffer = tile % rotation
        start, used = _issued(tile, stages), tile + use_from
        events.append((buffer, tile, "copy", start, min(used, float(steps))))
        if used < steps:
            row = buffer if arch == "sm_90" else REGISTERS
            events.append((row, tile, "use", used, min(tile + 1.0, float(steps))))
        tile += 1
    return events


def occupancy(events, t: float) -> dict:
    """At time ``t``: ``{buffer: (tile, state)}`` for the buffers that hold a tile then."""
    return {row: (tile, state) for row, tile, state, start, end in events
            if row != REGISTERS and start <= t < end}


def pipeline_figure(stages=(1, 2, 3), n_steps: int = 4) -> Figure:
    """One timeline per ``num_stages`` (rows) and architecture (columns, sm_80 then sm_90): a
    lane per buffer the model counts, and on sm_80 one for the tile in registers."""
    stages = tuple(check_count(s, "num_stages") for s in stages)
    if not stages:
        raise ValueError("stages must name at least one num_stages")
    archs = tuple(ARCHS)
    heights = [model_buffers(s, "sm_80") + 1 for s in stages]
    fig = Figure(figsize=(10.0, 1.0 + 0.62 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(stages), len(archs), sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})
    for r, s in enumerate(stages):
        for c, arch in enumerate(archs):
            ax = axes[r][c]
            n_buffers = model_buffers(s, arch)
            events = pipeline_schedule(s, arch, n_steps)
            lanes = [f"buffer {b + 1}" for b in range(n_buffers)] + ([REGISTERS] if arch == "sm_80" else [])
            y_of = {b: len(lanes) - 1 - b for b in range(n_buffers)} | {REGISTERS: 0}   # top to bottom
            used = {row for row, *_ in events if row != REGISTERS}
            for b in range(n_buffers):
                if b not in used:     # counted by the model, never needed by this schedule
                    ax.barh(y_of[b], n_steps + 1, left=-1, height=0.7, color=COLOURS["spare"],
                            edgecolor="grey", linestyle="--")
                    ax.text((n_steps - 1) / 2, y_of[b], "counted by the model, never needed here",
                            ha="center", va="center", fontsize=7.5, color="dimgrey")
            for row, tile, state, start, end in events:
                y = y_of[row]
                ax.barh(y, end - start, left=start, height=0.7, color=COLOURS[state], edgecolor="white",
                        hatch="//" if state == "copy" else None)
                ax.text((start + end) / 2, y, f"{tile}", ha="center", va="center", fontsize=8.5,
                        color="black" if state == "copy" else "white", fontweight="bold",
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none")
                        if state == "copy" else None)
            ax.set_yticks(range(len(lanes)), list(reversed(lanes)), fontsize=8)
            ax.set_ylim(-0.6, len(lanes) - 0.4)
            ax.set_xlim(-1, n_steps)
            for step in range(n_steps):
                ax.axvline(step, color="black", lw=0.5, ls=":", zorder=0)
            busy = max(len(occupancy(events, t + 0.25)) for t in range(-1, n_steps))
            head = f"{arch} ({ARCHS[arch]}): " if r == 0 else ""
            ax.set_title(f"{head}num_stages = {s}: the model counts {n_buffers}, "
                         f"{busy} {'is' if busy == 1 else 'are'} used", fontsize=9, loc="left")
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
    for ax in axes[-1]:
        ax.set_xticks([t + 0.5 for t in range(-1, n_steps)],
                      ["before\nthe loop"] + [f"iteration {t}" for t in range(n_steps)], fontsize=8)
    fig.legend(handles=[Patch(facecolor=COLOURS["copy"], hatch="//", edgecolor="white",
                              label="tile being copied in (asynchronous copy)"),
                        Patch(facecolor=COLOURS["use"], label="tile in use by tl.dot"),
                        Patch(facecolor=COLOURS["spare"], edgecolor="grey", linestyle="--",
                              label="buffer the model counts but the loop never needs")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("The K/V buffers in shared memory, each holding one K and one V tile (the number: which key tile)\n"
                 "sm_80: tl.dot copies the tile into registers first; sm_90: wgmma reads it from its buffer "
                 "while it runs", fontsize=9.5)
    return fig
