"""Chapter 6's picture of ``num_stages``: what the K/V buffers in shared memory hold, tile by
tile, in the forward kernel's loop over key tiles, in the order Triton's compiled loop works.

A schematic of the *order* of the work, not a measurement: a tile's products take one unit of
time, a copy half a unit. Each buffer holds one K tile and one V tile (B_c x d each); how many
buffers there are is the book's shared-memory model (``smem.smem_buffers``, via
``model_buffers``). The order is what the compiled loop does (PTX of ``_attn_fwd``, Triton 3.6):

- before the loop, the copies of the first ``s - 1`` tiles are issued (``s = num_stages``);
- iteration j waits for tile j's copy, computes S_j, the softmax and P_j V_j, and only then
  issues the copy of tile ``j + s - 1``: while tile j is computed, ``s - 2`` copies are in
  flight, so at ``s = 2`` a program overlaps no copy with its own products on sm_80, and on
  sm_90 only with the tail of P_j V_j (other programs on the SM fill the gap);
- on sm_80, ``ldmatrix`` and the synchronous ``mma.sync`` are done with tile j's buffer when
  the refill is issued, so it goes into that buffer: ``s - 1`` buffers, and the model's last
  one is never needed (the model is on the safe side there);
- on sm_90, the wgmma of P_j V_j is not waited for until the next iteration, so it still reads
  V_j from its buffer when the refill is issued: the refill needs another buffer, ``s`` in all;
- at one stage Triton does not pipeline: copy, then compute, one buffer, which K and V take in
  turns (one tile where the model counts two).

The panels count tiles as chapter 6's table of the compiled kernel does (``tiles_held``): K and V
together, against the model's ``2 * model_buffers``.

``pipeline_schedule`` gives the events, ``pipeline_figure`` draws them.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .. import smem
from ..validation import check_count

#: The two architectures the figure compares, with the chips the book has of each.
ARCHS = {"sm_80": "A100", "sm_90": "H100, H200"}
#: Colours of the states of a tile in its buffer.
COLOURS = {"copy": "#9DBBDF", "ready": "#D9E6F2", "use": "#55A868", "tail": "#2E6B3A", "spare": "#F2F2F2"}


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


#: Durations in the schematic: a tile's products, and one copy.
COMPUTE, COPY = 1.0, 0.5
#: How long P_j V_j's wgmma still reads its buffer after the refill is issued (sm_90, s >= 2).
TAIL = 0.25


def pipeline_schedule(num_stages: int, arch: str, n_tiles: int = 4) -> list[tuple[int, int, str, float, float]]:
    """Events ``(buffer, tile, state, start, end)`` of a loop over ``n_tiles`` key tiles.

    ``state``: ``"copy"`` (the tile's copy into the buffer is under way), ``"ready"`` (arrived,
    not yet used), ``"use"`` (its products read it), ``"tail"`` (sm_90: P_j V_j's wgmma still
    reads it after the next copy was issued). A buffer is 0 to ``model_buffers(num_stages,
    arch) - 1``; the schedule uses ``rotation`` of them, tile t in buffer ``t % rotation``."""
    stages = check_count(num_stages, "num_stages")
    tiles = check_count(n_tiles, "n_tiles")
    arch = _check_arch(arch)
    rotation = buffers_used(stages, arch)
    if rotation > model_buffers(stages, arch):
        raise AssertionError("the schedule needs more buffers than the model counts")
    tail = TAIL if (arch == "sm_90" and stages > 1) else 0.0
    ahead = max(stages - 1, 1)            # tiles issued before the loop (one stage: the first)
    issued, landed, begun, done, events = {}, {}, {}, {}, []
    for t in range(tiles):
        # the copy: before the loop, or after the products of tile t - ahead (t - 1 at one stage)
        issued[t] = 0.0 if t < ahead else done[t - ahead]
        landed[t] = issued[t] + COPY
        begun[t] = max(landed[t], done.get(t - 1, 0.0))
        done[t] = begun[t] + COMPUTE
    for t in range(tiles):
        buffer = t % rotation
        events.append((buffer, t, "copy", issued[t], landed[t]))
        if begun[t] > landed[t]:
            events.append((buffer, t, "ready", landed[t], begun[t]))
        events.append((buffer, t, "use", begun[t], done[t]))
        if tail and t + ahead < tiles:    # the refill issued at done[t]: this buffer is still read
            events.append((buffer, t, "tail", done[t], done[t] + tail))
    return events


def buffers_used(num_stages: int, arch: str) -> int:
    """How many buffers the compiled loop fills: s on sm_90, s - 1 on sm_80, 1 at one stage."""
    stages = check_count(num_stages, "num_stages")
    return 1 if stages == 1 else (stages if _check_arch(arch) == "sm_90" else stages - 1)


def tiles_held(num_stages: int, arch: str) -> int:
    """B_c x d tiles of K and V together that the compiled loop keeps in shared memory: two per
    buffer it fills, except at one stage, where K and V take turns in a single tile."""
    stages = check_count(num_stages, "num_stages")
    return 1 if stages == 1 else 2 * buffers_used(stages, arch)


def in_flight(events, t: float) -> list:
    """The tiles whose copy is under way at time ``t``."""
    return sorted(tile for _b, tile, state, start, end in events if state == "copy" and start <= t < end)


def occupancy(events, t: float) -> dict:
    """At time ``t``: ``{buffer: (tile, state)}`` for the buffers that hold a tile then."""
    return {row: (tile, state) for row, tile, state, start, end in events if start <= t < end}


def pipeline_figure(stages=(1, 2, 3), n_tiles: int = 4) -> Figure:
    """One timeline per ``num_stages`` (rows) and architecture (columns, sm_80 then sm_90), a
    row of bars per buffer the model counts."""
    stages = tuple(check_count(s, "num_stages") for s in stages)
    if not stages:
        raise ValueError("stages must name at least one num_stages")
    archs = tuple(ARCHS)
    heights = [model_buffers(s, "sm_80") for s in stages]
    fig = Figure(figsize=(10.0, 1.3 + 0.62 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(stages), len(archs), sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})
    end = max(e for s in stages for a in archs for *_, e in pipeline_schedule(s, a, n_tiles))
    for r, s in enumerate(stages):
        for c, arch in enumerate(archs):
            ax = axes[r][c]
            n_buffers = model_buffers(s, arch)
            events = pipeline_schedule(s, arch, n_tiles)
            names = [f"buffer {b + 1}" for b in range(n_buffers)]
            y_of = {b: n_buffers - 1 - b for b in range(n_buffers)}     # top to bottom
            for b in range(buffers_used(s, arch), n_buffers):          # counted, never filled
                ax.barh(y_of[b], end, left=0, height=0.7, color=COLOURS["spare"], edgecolor="grey", linestyle="--")
                ax.text(end / 2, y_of[b], "counted by the model, never needed here", ha="center", va="center",
                        fontsize=7.5, color="dimgrey")
            for row, tile, state, start, stop in events:
                ax.barh(y_of[row], stop - start, left=start, height=0.7, color=COLOURS[state], edgecolor="white",
                        hatch="//" if state == "copy" else None)
                if state in ("copy", "use"):
                    ax.text((start + stop) / 2, y_of[row], f"{tile}", ha="center", va="center", fontsize=8.5,
                            color="white" if state == "use" else "black", fontweight="bold")
            ax.set_yticks(range(n_buffers), list(reversed(names)), fontsize=8)
            ax.set_ylim(-0.6, n_buffers - 0.4)
            ax.set_xlim(0, end)
            held = tiles_held(s, arch)
            head = f"{arch} ({ARCHS[arch]})\n" if r == 0 else ""
            what = "1 tile (K and V in turns)" if s == 1 else f"{held} tiles ({held // 2} K, {held // 2} V)"
            ax.set_title(f"{head}num_stages = {s}: holds {what}; the model counts {2 * n_buffers}",
                         fontsize=9, loc="left")
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("time, schematic: a tile's products take 1, a copy 1/2", fontsize=8)
    fig.legend(handles=[Patch(facecolor=COLOURS["copy"], hatch="//", edgecolor="white", label="copy under way"),
                        Patch(facecolor=COLOURS["ready"], label="arrived, waiting"),
                        Patch(facecolor=COLOURS["use"], label="read by the tile's products"),
                        Patch(facecolor=COLOURS["tail"], label="sm_90: the asynchronous P V still reading"),
                        Patch(facecolor=COLOURS["spare"], edgecolor="grey", linestyle="--",
                              label="counted by the model, never needed")],
               loc="outside lower center", ncol=5, fontsize=7.5, frameon=False)
    fig.suptitle("The K/V buffers in shared memory: each buffer holds one K and one V tile; at 1 stage they take turns "
                 "in one tile's space.\nThe number on a bar: which key tile. The copy of tile j + s - 1 is issued after "
                 "tile j's products; sm_80 reuses tile j's buffer,\nsm_90 cannot yet: its matrix instruction runs "
                 "asynchronously, and P_j V_j still reads the buffer", fontsize=9.5)
    return fig
