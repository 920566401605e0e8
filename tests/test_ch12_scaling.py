"""Chapter 12's measured figure (flashbook.plots.window_scaling) draws what a masks_bench
record holds: one line per mask, window and implementation, from the recorded times."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashbook import plots  # noqa: E402


def _row(mask, n, window, ours, flex, d=128):
    return {"mask": mask, "seq": n, "head_dim": d, "window": [window, 0],
            "flashbook": {"fwd_ms": ours / 4, "fwd_bwd_ms": ours}, "flex": {"fwd_ms": flex / 4, "fwd_bwd_ms": flex}}


def test_window_scaling_draws_every_recorded_point():
    rows = [_row("window", n, w, 0.1 * n / 4096 * (w / 1024), 0.12 * n / 4096 * (w / 1024))
            for n in (4096, 8192, 16384) for w in (1024, 4096)]
    rows += [_row("causal", n, -1, 0.3 * (n / 4096) ** 2, 0.35 * (n / 4096) ** 2) for n in (4096, 8192, 16384)]
    rows += [_row("window", 4096, 1024, 9.0, 9.0, d=64), _row("softcap", 4096, -1, 9.0, 9.0)]
    fig, ax = plt.subplots()
    assert plots.window_scaling(ax, rows) is ax
    data = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert set(data) == {f"{m}, {impl}" for m in ("window 1024", "window 4096", "causal") for impl in ("ours", "Flex")}
    assert data["window 4096, ours"] == pytest.approx([0.4, 0.8, 1.6])
    assert data["causal, Flex"] == pytest.approx([0.35, 1.4, 5.6])
    assert 9.0 not in sum(data.values(), [])   # d = 64 and the soft cap are not drawn
    plt.close(fig)
    assert plots.mask_label({"mask": "window-softcap", "window": [1024, 0]}) == "window 1024 + softcap"
    assert plots.mask_label({"mask": "documents", "window": [-1, -1]}) == "documents"
    with pytest.raises(ValueError, match="no recorded rows"):
        plots.window_scaling(plt.subplots()[1], rows, head_dim=256)
