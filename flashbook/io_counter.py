"""Counting what a tiled run moves (chapters 4 and 5): the ``IOCounter`` that
``flashbook.tiled``'s loops report to, and the ``IOStats`` it sums up.

Here "HBM" is the full NumPy arrays and "on chip" is the tile-sized arrays a loop
holds: every ``read`` and ``write`` crosses between the two, ``hold`` occupies an
on-chip buffer, ``matmul`` counts FLOPs. ``tiled`` re-exports both classes.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from .validation import check_count


@dataclass(frozen=True)
class IOStats:
    """What one run moved and held, or what a closed-form formula says it should.

    ``reads``/``writes``: elements read from / written to HBM, per array, summed over
    all programs (batch, heads, tiles). ``onchip``: elements that one program holds
    on chip at its peak, per buffer. ``matmul_flops``: 2 m n k per (m x k)(k x n)
    product. ``tile_visits``: score tiles computed, per (batch, head).
    """

    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)
    onchip: dict = field(default_factory=dict)
    matmul_flops: int = 0
    tile_visits: int = 0

    @property
    def hbm_reads(self) -> int:
        return sum(self.reads.values())

    @property
    def hbm_writes(self) -> int:
        return sum(self.writes.values())

    @property
    def hbm_total(self) -> int:
        """Elements moved between HBM and the chip, both directions."""
        return self.hbm_reads + self.hbm_writes

    @property
    def onchip_elements(self) -> int:
        return sum(self.onchip.values())

    def hbm_bytes(self, dtype_bytes: int = 2, stat_bytes: int = 4) -> int:
        """Bytes moved, with the per-row statistics (m, l, lse, delta) in ``stat_bytes``."""
        moved = merge_counts(self.reads, self.writes)
        return sum(n * (stat_bytes if name in STAT_ARRAYS else dtype_bytes)
                   for name, n in moved.items())

    def onchip_bytes_by_buffer(self, dtype_bytes: int = 2, acc_bytes: int = 4) -> dict:
        """Bytes per on-chip buffer at the peak: input tiles (Q, K, V, dO) in
        ``dtype_bytes``, everything accumulated on chip in ``acc_bytes``."""
        return buffer_bytes(self.onchip, dtype_bytes, acc_bytes)

    def onchip_bytes(self, dtype_bytes: int = 2, acc_bytes: int = 4) -> int:
        """Bytes on chip at the peak, all buffers together."""
        return sum(self.onchip_bytes_by_buffer(dtype_bytes, acc_bytes).values())


# Per-row statistics are kept in fp32 even when Q, K, V are fp16 (chapter 3).
STAT_ARRAYS = frozenset({"m", "l", "lse", "delta"})
# On chip, everything that is computed (rather than loaded) is an fp32 accumulator.
INPUT_BUFFERS = frozenset({"Q", "K", "V", "dO"})


def buffer_bytes(buffers: dict, dtype_bytes: int, acc_bytes: int) -> dict:
    return {name: n * (dtype_bytes if name in INPUT_BUFFERS else acc_bytes)
            for name, n in buffers.items()}


def merge_counts(*dicts: dict) -> dict:
    out: dict = {}
    for d in dicts:
        for name, n in d.items():
            out[name] = out.get(name, 0) + n
    return out


def nonzero_counts(d: dict) -> dict:
    return {name: int(n) for name, n in d.items() if n}


class IOCounter:
    """Counts HBM traffic, on-chip buffers and matmul FLOPs of one tiled run.

    Pass one as ``io=`` to ``forward`` or ``backward``; afterwards ``stats()`` gives
    an ``IOStats``, ``visits`` the tiles (i, j) in the order they were computed and,
    if ``watch_row`` was set, ``trace`` the running (step, m, l) of that query row
    (first batch element) after each forward step that touched it.

    Arrays inside the loops are (programs, rows, cols): the first axis is the
    flattened batch and heads, so per-program sizes are ``size // shape[0]``.
    """

    def __init__(self, watch_row: int | None = None):
        if watch_row is not None:
            watch_row = check_count(watch_row, "watch_row", 0)
        self.watch_row = watch_row
        self.reads: dict = {}
        self.writes: dict = {}
        self.matmul_flops = 0
        self.visits: list[tuple[int, int]] = []
        self.trace: list[tuple[int, float, float]] = []
        self._live: dict = {}            # buffers on chip now -> elements per program
        self._peak: dict = {}            # the live buffers when their total was largest

    # -- HBM <-> chip
    def read(self, name: str, x: np.ndarray) -> np.ndarray:
        """A tile loaded from HBM: count it, and it now occupies the chip."""
        self.reads[name] = self.reads.get(name, 0) + x.size
        return self.hold(name, x)

    def write(self, name: str, x: np.ndarray) -> np.ndarray:
        """A tile stored to HBM."""
        self.writes[name] = self.writes.get(name, 0) + x.size
        return x

    # -- on chip
    def hold(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x`` occupies the on-chip buffer ``name`` (replacing what it held)."""
        self._live[name] = x.size // x.shape[0] if x.ndim and x.shape[0] else 0
        if sum(self._live.values()) > sum(self._peak.values()):
            self._peak = dict(self._live)
        return x

    @contextlib.contextmanager
    def program(self):
        """One GPU program: its on-chip buffers are freed when it ends."""
        try:
            yield
        finally:
            self._live = {}

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b, counting 2 m n k multiply-adds per program."""
        out = a @ b
        self.matmul_flops += 2 * a.shape[0] * a.shape[-2] * a.shape[-1] * b.shape[-1]
        return out

    def visit(self, i: int, j: int, rows: slice | None = None,
              row_max: np.ndarray | None = None, row_sum: np.ndarray | None = None):
        """Record that tile (i, j) was computed (and the watched row's m and l)."""
        self.visits.append((i, j))
        r = self.watch_row
        if r is not None and row_max is not None and rows.start <= r < rows.stop:
            self.trace.append((len(self.visits) - 1, float(row_max[0, r - rows.start]),
                               float(row_sum[0, r - rows.start])))

    def stats(self) -> IOStats:
        return IOStats(nonzero_counts(self.reads), nonzero_counts(self.writes), nonzero_counts(self._peak),
                       int(self.matmul_flops), len(self.visits))


class _NoCounter(IOCounter):
    """Counts nothing: what ``io=None`` means, so the loops read the same either way."""

    def read(self, name, x):
        return x

    def write(self, name, x):
        return x

    def hold(self, name, x):
        return x

    def matmul(self, a, b):
        return a @ b

    def visit(self, *args, **kwargs):
        pass


def as_counter(io) -> IOCounter:
    if io is None:
        return _NoCounter()
    if not isinstance(io, IOCounter):
        raise TypeError(f"io must be an IOCounter or None, got {type(io).__name__}")
    return io
