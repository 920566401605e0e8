"""Chapter 4's block-size explorer: choose N, d, B_r, B_c and a GPU, and see what happens.

In three layers, so that the book can show it without a kernel:

- ``Settings``: the knobs, a frozen dataclass;
- ``explorer_state(settings) -> ExplorerState``: runs the real ``tiled.forward`` on the
  example inputs, counts its traffic and on-chip footprint, and checks its output
  against ``reference.attention``. Same settings, same state;
- ``render(state) -> Figure``: draws the state (no pyplot, no globals).

``blocksize_config`` is what ``flashbook_explorers.js`` (beside this file) is given:
the library's constants and the start settings; the JavaScript mirrors
``explorer_state`` from them. The example inputs are ``example_qkv(n, d)``: an integer
hash that the browser evaluates exactly as NumPy does, so that it recomputes the
watched row's m and l.

What fits is counted twice, and the explorer shows both, labelled:

- *everything on chip* (``tiled.onchip_bytes``, the paper's view): every buffer one
  program holds, Q, K, V in fp16 and S/P, O, m, l in fp32, one copy each;
- *the kernel's shared memory* (``smem.smem_buffers``, the model chapters 6 to 9 use):
  only the Q tile and ``num_stages`` copies of the K and V tiles, in fp16 (S/P, O, m, l
  sit in registers); on the T4, Triton's fp32 operand tiles (Q and K, or P and V). It is
  always chapter 7's forward kernel, query tiles outside, whichever loop order is chosen,
  with d rounded up to the tile width the kernels load (``smem.tile_d``).
"""
from __future__ import annotations

import functools
import io as _io
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from matplotlib.collections import QuadMesh
from matplotlib.figure import Figure

from .. import io_counter, plots, reference, runtime, smem, tiled
from ..validation import check_choice, check_count, check_flag

#: A live run stops being quick (about 0.1 ms per tile in NumPy) beyond this many tiles.
MAX_LIVE_TILES = 8192
#: Bytes per element of Q, K, V, O in HBM and of the input tiles on chip (fp16),
#: and of the accumulators and per-row statistics (fp32).
DTYPE_BYTES, ACC_BYTES = 2, 4
#: The controls' ranges: (min, max, step) per setting.
LIMITS = {"n": (16, 1024, 8), "d": (16, 256, 16), "block_q": (8, 256, 8), "block_k": (8, 256, 8),
          "num_stages": (1, 4, 1)}
#: The example inputs: uniform on [LOW, LOW + WIDTH) from a 32-bit integer hash.
EXAMPLE_SEED, EXAMPLE_LOW, EXAMPLE_WIDTH = 0x9E3779B9, -2.0, 4.0


def _hash32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer mix (xor-shift-multiply); the browser evaluates the same."""
    x = x.astype(np.uint64) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def example_qkv(n: int, d: int) -> tuple:
    """The explorer's Q, K, V (n x d each): entry (a, r, c) of the three is
    LOW + WIDTH * hash(seed + (a * 65536 + r) * 512 + c) / 2**32, exact in float64."""
    n, d = check_count(n, "n"), check_count(d, "d")
    if n > 65536 or d > 512:
        raise ValueError(f"n must be <= 65536 and d <= 512, got n={n}, d={d}")
    a, r, c = np.meshgrid(np.arange(3), np.arange(n), np.arange(d), indexing="ij")
    key = (EXAMPLE_SEED + (a * 65536 + r) * 512 + c) & 0xFFFFFFFF
    x = EXAMPLE_LOW + EXAMPLE_WIDTH * (_hash32(key).astype(np.float64) / 2.0**32)
    return x[0], x[1], x[2]


@dataclass(frozen=True)
class Settings:
    """The explorer's knobs. ``step=None``: halfway through the loop; ``row=None``: N // 2."""

    n: int = 256            # sequence length (N_q = N_k = N)
    d: int = 64             # head dimension
    block_q: int = 64       # B_r
    block_k: int = 64       # B_c
    chip: str = "A100"      # one of runtime.CHIPS
    causal: bool = False
    order: str = "fa2"      # "fa2": query tiles outer; "fa1": key/value tiles outer
    num_stages: int = 2     # the kernel's copies of the K, V tiles in flight (its shared memory)
    step: int | None = None
    row: int | None = None

    def checked(self) -> "Settings":
        """The same settings, validated (TypeError/ValueError naming the field)."""
        runtime.chip(self.chip)                    # ValueError naming the chip
        n = check_count(self.n, "n")
        row = n // 2 if self.row is None else check_count(self.row, "row", 0)
        if row >= n:
            raise ValueError(f"row must be < n = {n}, got {row}")
        step = None if self.step is None else check_count(self.step, "step", 0)
        return replace(self, n=n, d=check_count(self.d, "d"),
                       block_q=check_count(self.block_q, "block_q"),
                       block_k=check_count(self.block_k, "block_k"),
                       causal=check_flag(self.causal, "causal"),
                       order=check_choice(self.order, "order", tiled.ORDERS),
                       num_stages=check_count(self.num_stages, "num_stages"),
                       step=step, row=row)


@dataclass(frozen=True, eq=False)
class ExplorerState:
    """Everything the figure shows, computed from ``settings`` alone."""

    settings: Settings
    kinds: np.ndarray                 # (T_r, T_c): "full", "partial" or "skipped"
    schedule: tuple                   # tiles (i, j) in visiting order
    step: int                         # the highlighted step, clipped to the schedule
    trace: tuple                      # (step, m, l) of the watched row after each of its steps
    onchip: dict                      # bytes per on-chip buffer (one program), everything on chip
    smem_per_block: int               # the chip's limit for one program, bytes
    smem_per_sm: int
    traffic: dict                     # bytes moved per algorithm
    ran: bool                         # did the live NumPy run happen?
    max_error: float | None           # max |O - O_reference| of that run
    note: str = ""
    stats: tiled.IOStats = field(default_factory=tiled.IOStats)
    kernel_smem: dict = field(default_factory=dict)   # bytes per buffer in a kernel's shared memory

    @property
    def n_tiles(self) -> int:
        return self.kinds.size

    @property
    def n_skipped(self) -> int:
        return int((self.kinds == "skipped").sum())

    @property
    def onchip_total(self) -> int:
        return sum(self.onchip.values())

    @property
    def fits(self) -> bool:
        """Does everything one program holds fit the chip's shared memory (the paper's view)?"""
        return self.onchip_total <= self.smem_per_block

    @property
    def kernel_smem_total(self) -> int:
        return sum(self.kernel_smem.values())

    @property
    def kernel_fits(self) -> bool:
        """Does a GPU kernel's shared memory (``smem.smem_bytes``) fit the chip?"""
        return bool(self.kernel_smem) and self.kernel_smem_total <= self.smem_per_block

    @property
    def current_tile(self) -> tuple | None:
        return self.schedule[self.step] if self.schedule else None

    def stats_at_step(self) -> tuple | None:
        """(m, l) of the watched row after the last of its steps up to ``step``."""
        seen = [t for t in self.trace if t[0] <= self.step]
        return (seen[-1][1], seen[-1][2]) if seen else None

    def summary(self) -> str:
        s, chip = self.settings, runtime.chip(self.settings.chip)
        flash = self.traffic[plots.ORDER_NAMES[s.order]]
        parts = [f"{self.n_tiles} tiles ({self.n_skipped} skipped), {len(self.schedule)} steps",
                 f"everything on chip {plots.human_bytes(self.onchip_total)} of "
                 f"{plots.human_bytes(self.smem_per_block)} per program on {chip.name}: "
                 + ("fits" if self.fits else "does NOT fit"),
                 f"a kernel's shared memory ({_kernel_kind(s, chip)}) "
                 f"{plots.human_bytes(self.kernel_smem_total)}: "
                 + ("fits" if self.kernel_fits else "does NOT fit"),
                 f"HBM traffic {plots.human_bytes(flash)}, "
                 f"{flash / self.traffic['naive']:.2f} times the naive algorithm's"]
        if self.ran:
            parts.append(f"max |O - O_ref| = {self.max_error:.1e}")
        elif self.note:
            parts.append(self.note)
        return "; ".join(parts)


@functools.lru_cache(maxsize=32)
def _live_run(n, d, block_q, block_k, causal, order, row):
    """Run the real tiled forward on the example inputs (cached: the step slider
    only redraws). Returns (IOStats, visits, trace, max error vs the reference)."""
    q, k, v = example_qkv(n, d)
    io = tiled.IOCounter(watch_row=row)
    o, _ = tiled.forward(q, k, v, block_q=block_q, block_k=block_k, causal=causal,
                         order=order, io=io)
    error = float(np.abs(o - reference.attention(q, k, v, causal=causal)).max())
    return io.stats(), tuple(io.visits), tuple(io.trace), error


def explorer_state(settings: Settings = Settings()) -> ExplorerState:
    """Compute what the explorer shows for ``settings`` (a pure function of them)."""
    if not isinstance(settings, Settings):
        raise TypeError(f"settings must be a Settings, got {type(settings).__name__}")
    s = settings.checked()
    chip = runtime.chip(s.chip)
    kinds = tiled.tile_kinds(s.n, s.n, s.block_q, s.block_k, causal=s.causal)
    n_visits = int((kinds != "skipped").sum())
    shape = (s.n, s.n, s.d, s.block_q, s.block_k)
    closed = {o: tiled.io_flash(*shape, causal=s.causal, order=o) for o in tiled.ORDERS}
    if n_visits <= MAX_LIVE_TILES:
        stats, schedule, trace, error = _live_run(s.n, s.d, s.block_q, s.block_k, s.causal,
                                                  s.order, s.row)
        ran, note = True, ""
    else:
        stats = closed[s.order]
        schedule = tuple(tiled.tile_schedule(s.n, s.n, s.block_q, s.block_k,
                                             causal=s.causal, order=s.order))
        trace, error, ran = (), None, False
        note = (f"{n_visits} tiles is too many for a quick NumPy run (limit "
                f"{MAX_LIVE_TILES}); counts are the closed-form ones")
    counted = {o: (stats if o == s.order else closed[o]) for o in tiled.ORDERS}
    traffic = {"naive": tiled.io_naive(s.n, s.n, s.d).hbm_bytes(DTYPE_BYTES, ACC_BYTES)}
    traffic.update({plots.ORDER_NAMES[o]: counted[o].hbm_bytes(DTYPE_BYTES, ACC_BYTES)
                    for o in tiled.ORDERS})
    step = len(schedule) // 2 if s.step is None else min(s.step, max(len(schedule) - 1, 0))
    onchip = stats.onchip_bytes_by_buffer(DTYPE_BYTES, ACC_BYTES)
    return ExplorerState(settings=s, kinds=kinds, schedule=schedule, step=step, trace=trace,
                         onchip=onchip, smem_per_block=chip.smem_per_block_kib * 1024,
                         smem_per_sm=chip.smem_per_sm_kib * 1024, traffic=traffic, ran=ran,
                         max_error=error, note=note, stats=stats,
                         kernel_smem=kernel_smem(s, chip))


def _kernel_kind(settings: Settings, chip) -> str:
    """How a kernel on ``chip`` holds its tiles: pipeline stages, or (sm_75) fp32 copies."""
    return "fp32 tiles" if int(chip.arch[3:]) < 80 else f"{settings.num_stages} stages"


def kernel_smem(settings: Settings, chip) -> dict:
    """A forward kernel's shared memory for these tiles on ``chip``, by buffer: the book's
    one model (``smem.smem_buffers``), fp16 inputs, d padded to the kernels' tile width.
    It is chapter 7's kernel (query tiles outside: Q stays, K and V stream) whatever
    ``settings.order`` says. Empty when d is wider than any kernel's tile (no kernel takes it)."""
    if settings.d > smem.TILE_DS[-1]:
        return {}
    return smem.smem_buffers(settings.block_q, settings.block_k, smem.tile_d(settings.d),
                             num_stages=settings.num_stages, dtype_bytes=DTYPE_BYTES,
                             arch=chip.arch)


def _draw_trace(ax_m, ax_l, state: ExplorerState):
    """The watched row's running m (top) and l (bottom) against the loop step."""
    s = state.settings
    ax_m.set_title(f"running m and l of row {s.row}", fontsize=10)
    if not state.trace:
        ax_m.text(0.5, 0.5, "no live run" if not state.ran else "this row sees no key",
                  ha="center", va="center", transform=ax_m.transAxes)
        for ax in (ax_m, ax_l):
            ax.set_xticks([]); ax.set_yticks([])
        return
    steps, ms, ls = (np.array(c) for c in zip(*state.trace))
    done = steps <= state.step
    for ax, ys, color, label in [(ax_m, ms, "#4C72B0", "m"), (ax_l, ls, "#C44E52", "l")]:
        ax.step(steps, ys, where="post", color=color, lw=1.2)
        ax.plot(steps[done], ys[done], "o", color=color, ms=4)
        ax.plot(steps[~done], ys[~done], "o", mfc="none", color=color, ms=4)
        ax.axvline(state.step, color="red", lw=1)
        ax.set_ylabel(label, color=color, rotation=0, labelpad=10)
        ax.set_xlim(-0.5, max(len(state.schedule) - 0.5, steps.max() + 0.5))
        ax.tick_params(labelsize=8)
    ax_m.tick_params(labelbottom=False)
    ax_l.set_xlabel("step of the loop (filled: done by the red step)", fontsize=9)
    now = state.stats_at_step()
    if now is not None:
        ax_m.set_title(f"row {s.row} after step {state.step}: m = {now[0]:.3f}, "
                       f"l = {now[1]:.3f}", fontsize=10)


def render(state: ExplorerState) -> Figure:
    """The explorer's figure for ``state``: tile grid (its colour bar says what the colours
    mean), m and l, the two on-chip counts (stacked by buffer, outlined in red when they do
    not fit), HBM traffic."""
    s = state.settings
    chip = runtime.chip(s.chip)
    fig = Figure(figsize=(11.5, 7.4))      # fixed margins: a layout engine doubles the time
    grid = fig.add_gridspec(4, 2, width_ratios=[1.1, 1], height_ratios=[1.3, 0.45, 0.45, 0.9],
                            left=0.06, right=0.9, bottom=0.07, top=0.91, wspace=0.45, hspace=0.95)
    ax_grid = fig.add_subplot(grid[:, 0])
    plots.tile_grid(ax_grid, s.n, s.n, s.block_q, s.block_k,
                    causal=s.causal, order=s.order, step=state.step, row=s.row)
    meshes = [c for c in ax_grid.collections if isinstance(c, QuadMesh)]
    fig.colorbar(meshes[-1], ax=ax_grid, orientation="horizontal", fraction=0.035, pad=0.1,
                 label="step that visits the tile (grey: skipped, faded: not yet, red: now)")
    trace = grid[0, 1].subgridspec(2, 1, hspace=0.08)
    ax_m = fig.add_subplot(trace[0])
    _draw_trace(ax_m, fig.add_subplot(trace[1], sharex=ax_m), state)
    limit = f"{chip.name} per program"
    plots.footprint_bar(fig.add_subplot(grid[1, 1]), state.onchip, state.smem_per_block,
                        limit_label=limit,
                        title=f"everything on chip (the paper's count): "
                              f"{plots.human_bytes(state.onchip_total)}"
                              + ("" if state.fits else ", does NOT fit"))
    if state.kernel_smem:
        plots.footprint_bar(fig.add_subplot(grid[2, 1]), state.kernel_smem, state.smem_per_block,
                            limit_label=limit,
                            title=f"a kernel's shared memory ({_kernel_kind(s, chip)}): "
                                  f"{plots.human_bytes(state.kernel_smem_total)}"
                                  + ("" if state.kernel_fits else ", does NOT fit"))
    plots.traffic_bars(fig.add_subplot(grid[3, 1]), state.traffic,
                       highlight=plots.ORDER_NAMES[s.order])
    check = (f"max |O - O_ref| = {state.max_error:.1e}" if state.ran
             else "output not checked (too many tiles for a live run)")
    fig.suptitle(f"N = {s.n}, d = {s.d}, $B_r$ = {s.block_q}, $B_c$ = {s.block_k}, "
                 f"{'causal, ' if s.causal else ''}{chip.name}: step {state.step} "
                 f"(steps 0 to {len(state.schedule) - 1}), {check}", fontsize=11)
    return fig


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ----------------------------------------------------------------- what the JavaScript is given

def blocksize_config(settings=None) -> dict:
    """The constants the browser needs (chips, bytes per element, which buffers are
    inputs, the example inputs' hash), and the start settings."""
    settings = Settings() if settings is None else settings
    s = settings.checked()
    start = dict(asdict(s))
    if start["step"] is None:                       # halfway, as explorer_state does
        start["step"] = len(tiled.tile_schedule(s.n, s.n, s.block_q, s.block_k,
                                                causal=s.causal, order=s.order)) // 2
    return {
        "chips": {name: {"name": c.name, "smem_per_block": c.smem_per_block_kib * 1024,
                         "smem_per_sm": c.smem_per_sm_kib * 1024, "arch": c.arch}
                  for name, c in runtime.CHIPS.items()},
        "tile_ds": list(smem.TILE_DS), "fp32_operands": smem.FP32_OPERANDS,
        "buffer_colors": {k: plots.BUFFER_COLORS[k] for k in ("Q", "K", "V", "S/P", "O", "m", "l")},
        "dtype_bytes": DTYPE_BYTES, "acc_bytes": ACC_BYTES,
        "input_buffers": sorted(io_counter.INPUT_BUFFERS), "stat_arrays": sorted(io_counter.STAT_ARRAYS),
        "orders": dict(plots.ORDER_NAMES),
        "limits": {k: list(v) for k, v in LIMITS.items()},
        "example": {"seed": EXAMPLE_SEED, "low": EXAMPLE_LOW, "width": EXAMPLE_WIDTH},
        "settings": start,
    }


def blocksize_state(settings: dict) -> ExplorerState:
    """What the explorer shows for the settings its controls hold (a dict)."""
    return explorer_state(Settings(**settings))
