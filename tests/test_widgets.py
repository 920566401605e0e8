"""flashbook.widgets: the explorer's pure functions and the live widget.

The state must agree with the closed-form counts in flashbook.tiled and with the
chip facts in flashbook.runtime; the figure must draw for every chip and for the
edge settings; the widget must rebuild its state when a control changes.
"""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flashbook import plots, runtime, tiled, widgets  # noqa: E402
from flashbook.widgets import Settings, explorer_state, render  # noqa: E402


def draws(state):
    """render() returns a Figure with the four panels, without touching pyplot."""
    before = plt.get_fignums()
    fig = render(state)
    assert isinstance(fig, Figure) and len(fig.axes) >= 4
    assert widgets.figure_png(fig).startswith(b"\x89PNG")
    assert plt.get_fignums() == before
    return fig


@pytest.mark.parametrize("chip", sorted(runtime.CHIPS))
def test_every_chip(chip):
    state = explorer_state(Settings(chip=chip, n=192, d=64, block_q=32, block_k=64))
    limit = runtime.chip(chip).smem_per_block_kib * 1024
    assert state.smem_per_block == limit
    assert state.onchip_total == tiled.onchip_bytes(32, 64, 64, widgets.DTYPE_BYTES,
                                                    acc_bytes=widgets.ACC_BYTES)
    assert state.fits == (state.onchip_total <= limit)
    assert state.ran and state.max_error < 1e-12      # float64 against float64: rounding only
    assert chip in state.summary()
    draws(state)


def test_default_state_matches_closed_forms():
    state = explorer_state()
    s = state.settings
    assert (s.step, s.row) == (None, 128) and state.step == len(state.schedule) // 2
    assert state.stats == tiled.io_flash(s.n, s.n, s.d, s.block_q, s.block_k)
    assert list(state.schedule) == tiled.tile_schedule(s.n, s.n, s.block_q, s.block_k)
    assert state.traffic["naive"] == tiled.io_naive(s.n, s.n, s.d).hbm_bytes(2, 4)
    # the watched row's last (m, l) give its lse: the trace comes from the real run
    assert [t[0] for t in state.trace] == [k for k, (i, _) in enumerate(state.schedule)
                                           if i == s.row // s.block_q]


def test_edge_settings_block_larger_than_n_and_d_256():
    one_tile = explorer_state(Settings(n=40, block_q=64, block_k=128, chip="T4"))
    assert one_tile.kinds.shape == (1, 1) and len(one_tile.schedule) == 1
    assert one_tile.onchip_total == tiled.onchip_bytes(40, 40, 64, 2)   # tiles clipped to N
    draws(one_tile)
    wide = dict(n=128, d=256, block_q=64, block_k=64)
    t4, h200 = explorer_state(Settings(chip="T4", **wide)), explorer_state(Settings(chip="H200", **wide))
    assert not t4.fits and h200.fits      # 176.5 KiB: over a T4's 64 KiB, under an H200's 227 KiB
    assert t4.onchip_total == 176.5 * 1024
    assert "does NOT fit" in t4.summary()
    draws(t4)


def test_causal_fa1_order_and_step_clipping():
    state = explorer_state(Settings(n=100, block_q=16, block_k=32, causal=True, order="fa1",
                                    step=10_000, row=99))
    assert state.n_skipped > 0 and "skipped" in state.kinds
    assert len(state.schedule) == state.n_tiles - state.n_skipped
    assert state.step == len(state.schedule) - 1
    assert state.current_tile == state.schedule[-1]
    assert state.stats_at_step() is not None
    draws(state)


def test_too_many_tiles_falls_back_to_closed_forms():
    state = explorer_state(Settings(n=1000, block_q=8, block_k=8))
    assert not state.ran and state.max_error is None and "too many" in state.note
    assert state.stats == tiled.io_flash(1000, 1000, 64, 8, 8)
    draws(state)


@pytest.mark.parametrize("bad,error,word", [
    ({"chip": "V100"}, ValueError, "chip"), ({"block_q": 0}, ValueError, "block_q"),
    ({"n": 2.5}, TypeError, "n"), ({"order": "fa9"}, ValueError, "order"),
    ({"row": 300}, ValueError, "row"), ({"causal": "no"}, TypeError, "causal"),
])
def test_bad_settings_are_named(bad, error, word):
    with pytest.raises(error, match=word):
        explorer_state(Settings(**bad))


def test_tile_grid_draws_alone():
    fig = Figure()
    ax = plots.tile_grid(fig.add_subplot(), 20, 33, 8, 5, causal=True, step=3, row=7)
    assert ax.get_xlim() == (0, 33) and ax.get_ylim() == (20, 0)
    index = plots.visit_index(20, 33, 8, 5, causal=True)
    assert sorted(index[index >= 0]) == list(range(len(tiled.tile_schedule(20, 33, 8, 5,
                                                                             causal=True))))


def test_widget_builds_and_responds_to_sliders():
    pytest.importorskip("ipywidgets")
    w = widgets.explorer(n=128, block_q=32, block_k=32)
    assert w.state.settings.block_q == 32 and w.state.n_tiles == 16
    first_png = bytes(w.image.value)
    assert first_png.startswith(b"\x89PNG") and "16 tiles" in w.summary.value

    w.controls["block_q"].value = 64                      # a slider moves
    assert w.state.settings.block_q == 64 and w.state.n_tiles == 8
    assert w.controls["step"].max == len(w.state.schedule) - 1
    assert bytes(w.image.value) != first_png

    w.controls["step"].value = 2
    assert w.state.step == 2 and w.state.current_tile == w.state.schedule[2]

    w.controls["chip"].value = "T4"
    assert w.state.settings.chip == "T4" and "T4" in w.summary.value

    w.controls["n"].value = 64                            # N shrinks: row is clipped
    assert w.controls["row"].value <= 63 and w.state.settings.n == 64
    assert w.state.ran and w.state.max_error < 1e-12
    assert "application/vnd.jupyter.widget-view+json" in w._repr_mimebundle_()
