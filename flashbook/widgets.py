"""The block-size explorer: choose N, d, B_r, B_c and a GPU, and see what happens.

It is built in three layers so that the book can show it without a kernel:

- ``Settings``: the knobs, a frozen dataclass;
- ``explorer_state(settings) -> ExplorerState``: runs the real ``tiled.forward`` on
  random inputs, counts its traffic and on-chip footprint, and checks its output
  against ``reference.attention``. Same settings, same state;
- ``render(state) -> Figure``: draws the state (no pyplot, no globals);
- ``BlockSizeExplorer``: ipywidgets sliders wired to the two functions above. It
  shows the figure as a PNG image widget, which works in Jupyter and in Colab.

The rendered book calls ``render(explorer_state(Settings(...)))`` directly.
"""
from __future__ import annotations

import functools
import io as _io
from dataclasses import dataclass, field, replace

import numpy as np
from matplotlib.figure import Figure

from . import plots, reference, runtime, tiled
from .validation import check_choice, check_count, check_flag

#: A live run stops being quick (about 0.1 ms per tile in NumPy) beyond this many tiles.
MAX_LIVE_TILES = 8192
#: Bytes per element of Q, K, V, O in HBM and of the input tiles on chip (fp16),
#: and of the accumulators and per-row statistics (fp32).
DTYPE_BYTES, ACC_BYTES = 2, 4


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
                       step=step, row=row)


@dataclass(frozen=True, eq=False)
class ExplorerState:
    """Everything the figure shows, computed from ``settings`` alone."""

    settings: Settings
    kinds: np.ndarray                 # (T_r, T_c): "full", "partial" or "skipped"
    schedule: tuple                   # tiles (i, j) in visiting order
    step: int                         # the highlighted step, clipped to the schedule
    trace: tuple                      # (step, m, l) of the watched row after each of its steps
    onchip: dict                      # bytes per on-chip buffer (one program)
    smem_per_block: int               # the chip's limit for one program, bytes
    smem_per_sm: int
    traffic: dict                     # bytes moved per algorithm
    ran: bool                         # did the live NumPy run happen?
    max_error: float | None           # max |O - O_reference| of that run
    note: str = ""
    stats: tiled.IOStats = field(default_factory=tiled.IOStats)

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
        return self.onchip_total <= self.smem_per_block

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
                 f"on chip {plots.human_bytes(self.onchip_total)} of "
                 f"{plots.human_bytes(self.smem_per_block)} per program on {chip.name}: "
                 + ("fits" if self.fits else "does NOT fit"),
                 f"HBM traffic {plots.human_bytes(flash)}, "
                 f"{flash / self.traffic['naive']:.2f} times the naive algorithm's"]
        if self.ran:
            parts.append(f"max |O - O_ref| = {self.max_error:.1e}")
        elif self.note:
            parts.append(self.note)
        return "; ".join(parts)


@functools.lru_cache(maxsize=32)
def _live_run(n, d, block_q, block_k, causal, order, row):
    """Run the real tiled forward on fixed random inputs (cached: the step slider
    only redraws). Returns (IOStats, visits, trace, max error vs the reference)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
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
                         max_error=error, note=note, stats=stats)


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
    """The explorer's figure for ``state``: tile grid, m and l, on-chip bytes, HBM traffic."""
    s = state.settings
    chip = runtime.chip(s.chip)
    fig = Figure(figsize=(11.5, 6.4))      # fixed margins: a layout engine doubles the time
    grid = fig.add_gridspec(3, 2, width_ratios=[1.1, 1], height_ratios=[1.3, 0.6, 1],
                            left=0.06, right=0.9, bottom=0.08, top=0.9, wspace=0.45, hspace=0.6)
    plots.tile_grid(fig.add_subplot(grid[:, 0]), s.n, s.n, s.block_q, s.block_k,
                    causal=s.causal, order=s.order, step=state.step, row=s.row)
    trace = grid[0, 1].subgridspec(2, 1, hspace=0.08)
    ax_m = fig.add_subplot(trace[0])
    _draw_trace(ax_m, fig.add_subplot(trace[1], sharex=ax_m), state)
    plots.footprint_bar(fig.add_subplot(grid[1, 1]), state.onchip, state.smem_per_block,
                        limit_label=f"{chip.name} shared memory per program",
                        title=f"on chip, one program: {plots.human_bytes(state.onchip_total)}"
                              + ("" if state.fits else ": does NOT fit"))
    plots.traffic_bars(fig.add_subplot(grid[2, 1]), state.traffic,
                       highlight=plots.ORDER_NAMES[s.order])
    check = (f"max |O - O_ref| = {state.max_error:.1e}" if state.ran
             else "output not checked (too many tiles for a live run)")
    fig.suptitle(f"N = {s.n}, d = {s.d}, $B_r$ = {s.block_q}, $B_c$ = {s.block_k}, "
                 f"{'causal, ' if s.causal else ''}{chip.name}: step {state.step + 1} of "
                 f"{len(state.schedule)}, {check}", fontsize=11)
    return fig


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ----------------------------------------------------------------- the live widget

class BlockSizeExplorer:
    """Sliders for N, d, B_r, B_c, the chip, the loop order, the step and the row.

    ``controls`` maps each Settings field to its widget; changing any ``.value``
    recomputes ``state`` and redraws ``image``. Display the object (or ``.widget``).
    """

    def __init__(self, settings: Settings = Settings()):
        import ipywidgets as W

        s = settings.checked()
        blocks = dict(min=min(8, s.block_q, s.block_k), max=max(256, s.block_q, s.block_k),
                      step=8 if s.block_q % 8 == 0 and s.block_k % 8 == 0 else 1)
        style = dict(continuous_update=False, style={"description_width": "60px"})
        self.controls = {
            "n": W.IntSlider(value=s.n, min=min(16, s.n), max=max(1024, s.n),
                             step=8 if s.n % 8 == 0 else 1, description="N", **style),
            "d": W.IntSlider(value=s.d, min=min(16, s.d), max=max(256, s.d),
                             step=16 if s.d % 16 == 0 else 1, description="d", **style),
            "block_q": W.IntSlider(value=s.block_q, description="B_r", **blocks, **style),
            "block_k": W.IntSlider(value=s.block_k, description="B_c", **blocks, **style),
            "chip": W.Dropdown(options=list(runtime.CHIPS), value=s.chip, description="chip",
                               style=style["style"]),
            "order": W.ToggleButtons(options=[("FA2 order", "fa2"), ("FA1 order", "fa1")],
                                     value=s.order, description="order", style=style["style"]),
            "causal": W.Checkbox(value=s.causal, description="causal"),
            "step": W.IntSlider(value=0, min=0, max=1, description="step", **style),
            "row": W.IntSlider(value=s.row, min=0, max=s.n - 1, description="row", **style),
        }
        self.image = W.Image(format="png", layout=W.Layout(width="100%", max_width="1000px"))
        self.summary = W.HTML()
        c = self.controls
        self.widget = W.VBox([
            W.HBox([W.VBox([c["n"], c["d"], c["block_q"], c["block_k"]]),
                    W.VBox([c["chip"], c["order"], c["causal"]]),
                    W.VBox([c["step"], c["row"]])]),
            self.summary, self.image])
        self._busy = False
        self.state: ExplorerState | None = None
        self._update(initial_step=s.step)
        for control in self.controls.values():
            control.observe(self._on_change, names="value")

    @property
    def settings(self) -> Settings:
        values = {name: control.value for name, control in self.controls.items()}
        return Settings(**values)

    def _on_change(self, change):
        if not self._busy:
            self._update()

    def _update(self, initial_step: int | None = None):
        self._busy = True
        try:
            c = self.controls
            c["row"].max = c["n"].value - 1            # clips row if N shrank
            settings = self.settings
            if initial_step is not None or self.state is None:
                settings = replace(settings, step=initial_step)
            self.state = explorer_state(settings)
            steps = max(len(self.state.schedule) - 1, 0)
            c["step"].max = max(steps, 1)
            c["step"].value = self.state.step
            self.image.value = figure_png(render(self.state))
            self.summary.value = f"<b>{self.state.summary()}</b>"
        finally:
            self._busy = False

    def _ipython_display_(self):
        # Works with ipywidgets 7 (Colab's long-time default) and 8 alike.
        from IPython.display import display

        display(self.widget)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def explorer(**settings) -> BlockSizeExplorer:
    """The live explorer, e.g. ``explorer(n=512, chip="T4")``."""
    return BlockSizeExplorer(Settings(**settings))
