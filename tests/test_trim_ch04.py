"""Chapter 4's traffic figures, moved from the notebook into ``flashbook.plots.traffic``:
they draw what the chapter's prose says."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flashbook import runtime, tiled  # noqa: E402
from flashbook.plots import ORDER_NAMES, traffic  # noqa: E402


def test_traffic_grows_as_n_squared_and_fa2_tends_to_d_over_2br():
    fig, ax = plt.subplots()
    ns = 2 ** np.arange(9, 17)
    curves, slopes = traffic.against_n(ax, ns, 128, 128)
    assert set(slopes) == {"naive", *ORDER_NAMES.values()}
    assert all(abs(s - 2) < 0.05 for s in slopes.values())
    assert abs(curves[ORDER_NAMES["fa2"]][-1] / curves["naive"][-1] - 128 / (2 * 128)) < 0.01
    plt.close(fig)


def test_heat_maps_cross_the_tiles_the_papers_count_cannot_fit():
    fig = plt.figure()
    limit = runtime.chip("A100").smem_per_block_bytes
    fracs = traffic.block_maps(fig, 4096, 128, [64, 128], limit)
    assert fracs["fa2"][1, 0] < fracs["fa2"][0, 0] and fracs["fa2"][1, 0] == fracs["fa2"][1, 1]  # B_r only
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[-1].endswith("×") and not texts[0].endswith("×")       # 128x128 crossed, 64x64 not
    assert tiled.onchip_bytes(128, 128, 128) > limit >= tiled.onchip_bytes(64, 64, 128)
    plt.close(fig)


def test_the_m_and_tile_figures_mark_each_chip_once():
    fig, (a, b) = plt.subplots(1, 2)
    traffic.against_m(a, 4096, 128, 2 ** np.arange(10, 19), runtime.CHIPS.values())
    traffic.onchip_vs_tile(b, runtime.CHIPS.values(), np.arange(16, 257, 8))
    names = [t.get_text() for t in a.texts]
    assert sorted(names) == sorted(c.name for c in runtime.CHIPS.values() if c.name != "H200")
    assert any("(= H200)" in t.get_text() for t in b.texts)
    plt.close(fig)
