"""Figures that several chapters (and the explorers) share, one module per idea.

- ``tiles``:    the score matrix as tiles: visiting order, kernel stages, what a program
                holds and moves (chapters 4, 5, 7, 8 and the block-size explorer)
- ``memory``:   HBM, shared memory and registers: what crosses between them; a tensor's
                addresses (chapters 1, 5, 6)
- ``scores``:   one row of scores: the scale's saturation, the online softmax (chapters 1, 3)
- ``naive``:    naive attention's time, step by step (chapter 1)
- ``parallel``: split-K, a paged KV cache, and the ring over several GPUs (chapter 11)
- ``scaling``:  a masked kernel's recorded time against N, window against causal (chapter 12)
- ``benchmarks``: the recorded runs: TFLOP/s, memory, the roofline, the block-size sweep (chapter 9)
- ``ladder``:   chapter 10's rungs, the backward's dQ modes and the Gluon schedules, from their runs

Each function draws on a matplotlib ``Axes`` that you pass in and returns it (chapter 9's
multi-panel figures, in ``benchmarks`` and ``ladder``, make and return a ``Figure`` of their own). None of
them touches pyplot's global state, so they work the same in a notebook, in a widget
callback and in a test. They draw what the NumPy modules compute (``tiled``,
``softmax``, ``split``, ``ring``) and import no feature module (no kernels, no
``distributed``, no ``bench``). Every name is importable from ``flashbook.plots``.
"""
from .benchmarks import block_heatmap, block_state_figure, memory_figure, roofline_figure, tflops_figure
from .ladder import backward_figure, ladder_figure, schedules_figure
from .memory import LEVELS, dataflow, dataflow_counts, tensor_layout
from .naive import measure_naive_steps, time_breakdown
from .parallel import SPLIT_COLORS, paged_cache, paged_reads, ring_schedule, split_grid
from .scaling import mask_label, window_scaling
from .scores import online_merge, running_max, saturation, saturation_stats
from .tiles import (
    BUFFER_COLORS,
    ORDER_NAMES,
    STAGE_COLORS,
    footprint_bar,
    human_bytes,
    stage_grid,
    stage_legend,
    tile_grid,
    traffic_bars,
    visit_index,
)

__all__ = [
    "BUFFER_COLORS", "ORDER_NAMES", "STAGE_COLORS", "human_bytes", "visit_index", "tile_grid",
    "footprint_bar", "traffic_bars", "stage_grid", "stage_legend",
    "LEVELS", "dataflow_counts", "dataflow", "tensor_layout",
    "saturation_stats", "saturation", "online_merge", "running_max",
    "measure_naive_steps", "time_breakdown", "SPLIT_COLORS", "split_grid", "paged_reads", "paged_cache", "ring_schedule",
    "mask_label", "window_scaling",
    "tflops_figure", "memory_figure", "roofline_figure", "block_heatmap", "block_state_figure",
    "ladder_figure", "backward_figure", "schedules_figure",
]
