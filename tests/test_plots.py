"""The book's pictures: each figure shows the numbers the library computes."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from flashbook import plots, softmax, tiled  # noqa: E402


def texts(ax):
    return [t.get_text() for t in ax.texts]


def arrows(ax):
    return [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_dataflow_forward_counts_come_from_the_io_model():
    n, d, bq = 1024, 64, 128
    ax = plots.dataflow(plt.subplots()[1], "forward", n=n, d=d, block_q=bq, block_k=bq)
    io = tiled.io_flash(n, n, d, bq, bq)
    times_k = io.reads["K"] // (n * d)
    assert times_k == n // bq                       # K streams once per query tile
    words = texts(ax)
    assert f"read {times_k}\u00d7" in words and "read once" in words
    assert "written once" in words and "lse written once" in words
    for level in plots.LEVELS:
        assert level in words
    names = {p.get_label() for p in ax.patches}
    assert {"Q_i", "K_j", "V_j", "S/P", "O_i", "m, l", "Q", "K", "V", "O", "lse"} <= names
    # 5 crossings of the HBM boundary, and the two products: Q_i, K_j -> S/P and V_j, S/P -> O_i
    dashed = [a for a in arrows(ax) if a.arrow_patch.get_linestyle() != "solid"]
    assert len(arrows(ax)) == 5 + 4 and len(dashed) == 4
    assert "$S = Q_i K_j^T$" in words and "$O_i$ += $P V_j$" in words


@pytest.mark.parametrize("dq", ["atomic", "separate"])
def test_dataflow_backward_shows_where_dq_goes(dq):
    n, d, b = 512, 32, 64
    ax = plots.dataflow(plt.subplots()[1], "backward", n=n, d=d, block_q=b, block_k=b, dq=dq)
    io = tiled.io_flash_backward(n, n, d, b, b,
                                 dq_strategy="atomic" if dq == "atomic" else "second_pass")
    joined = "\n".join(texts(ax))
    assert f"{io.reads['Q'] // (n * d)}\u00d7" in joined
    if dq == "atomic":
        assert "atomic add" in joined and f"read {io.reads['dQ'] // (n * d)}\u00d7" in joined
    else:
        assert "dQ kernel" in joined and "atomic" not in joined
        assert f"K, V read {io.reads['K'] // (n * d) - 1}\u00d7" in joined
        # the K and V arrows count both kernels: once in the first, the rest in the dQ kernel
        assert "once here" not in joined
        assert joined.count(f"once + {io.reads['K'] // (n * d) - 1}\u00d7\n(dQ kernel)") == 2
    # the level names sit where no arrow crosses them (bottom left of each band)
    shared = next(t for t in ax.texts if t.get_text() == "shared memory (SRAM)")
    assert shared.get_position()[1] < 1.0 - 0.22        # below the Q_i box, away from Q's arrow
    assert len(arrows(ax)) == 7
    with pytest.raises(ValueError, match="dq"):
        plots.dataflow_counts(n, d, b, b, pass_="backward", dq="sometimes")
    with pytest.raises(ValueError, match="pass_"):
        plots.dataflow_counts(n, d, b, b, pass_="sideways")


def test_naive_steps_are_measured_and_drawn():
    m = plots.measure_naive_steps(128, 16, batch_heads=2, repeats=2)
    assert list(m["ms"]) == ["Q K^T (matmul)", "softmax: moving S in and P out",
                             "softmax: max, exp, sum", "P V (matmul)"]
    assert all(t >= 0 for t in m["ms"].values()) and m["softmax_ms"] > 0
    # the two softmax parts add up to the measured softmax (when the copy was not slower)
    parts = m["ms"]["softmax: moving S in and P out"] + m["ms"]["softmax: max, exp, sum"]
    assert parts >= m["softmax_ms"] - 1e-9
    ax = plots.time_breakdown(plt.subplots()[1], m)
    labels = ax.get_legend_handles_labels()[1]
    total = sum(m["ms"].values())
    for name, t in m["ms"].items():
        assert f"{name}: {t:.2f} ms ({100 * t / total:.0f}%)" in labels
    with pytest.raises(ValueError, match="n must"):
        plots.measure_naive_steps(0)


def test_naive_steps_take_the_timer_they_are_given():
    """benchmarks/naive_breakdown.py passes flashbook.timing.time_ms on a GPU."""
    calls = []
    m = plots.measure_naive_steps(32, 8, batch_heads=1, timer=lambda fn: calls.append(fn()) or 2.0)
    assert len(calls) == 4 and m["repeats"] is None
    assert m["ms"] == {"Q K^T (matmul)": 2.0, "softmax: moving S in and P out": 2.0,
                       "softmax: max, exp, sum": 0.0, "P V (matmul)": 2.0}


def test_saturation_is_measured_and_the_scale_removes_it(rng):
    st = plots.saturation_stats([4, 64, 1024], n_keys=128, rows=128, rng=rng)
    # unit-variance q, k: q.k has standard deviation sqrt(d); 128 x 128 samples give
    # the estimate to a few percent, so 15% is a safe band
    assert np.allclose(st["std_raw"], np.sqrt(st["d"]), rtol=0.15)
    assert np.allclose(st["std_scaled"], 1.0, rtol=0.15)
    assert st["pmax_raw"][-1] > 0.8 > 0.2 > st["pmax_scaled"].max()
    axes = plots.saturation(plt.subplots(1, 2)[1], st)
    assert np.allclose(axes[1].lines[0].get_ydata(), st["pmax_raw"])
    with pytest.raises(ValueError, match="dims"):
        plots.saturation_stats([0])


def test_online_merge_ends_at_the_rows_logsumexp(rng):
    x = 3 * rng.standard_normal(11)
    ax = plots.online_merge(plt.subplots()[1], x, 4)
    words = texts(ax)
    final = [w for w in words if w.startswith("merged")][0]
    assert f"m = {x.max():.2f}" in final
    assert f"lse = m + log l = {float(softmax.logsumexp(x)):.3f}" in final
    blocks = [w for w in words if w.startswith("block ")]
    assert len(blocks) == math.ceil(11 / 4)
    assert f"m={x[8:].max():.2f}" in blocks[2]
    with pytest.raises(ValueError, match="block"):
        plots.online_merge(plt.subplots()[1], x, 0)


def test_running_max_figure_shows_the_rows_running_maximum(rng):
    x = 2 * rng.standard_normal(30)
    fig, axes = plt.subplots(2, 1)
    got = plots.running_max(axes, x, 8)
    want = np.maximum.accumulate(x)
    np.testing.assert_array_equal(got["m1"], want)
    np.testing.assert_array_equal(axes[0].lines[1].get_ydata(), want)   # the step line
    ends = [7, 15, 23, 29]                                              # a ragged last block
    np.testing.assert_array_equal(got["m_block"], want[ends])
    np.testing.assert_array_equal(axes[0].lines[2].get_xdata(), ends)
    # the maximum moves exactly where a new score beats all before it
    assert got["moves1"] == int((x[1:] > want[:-1]).sum())
    assert got["moves_block"] == int((want[ends][1:] > want[ends][:-1]).sum())
    assert np.all((got["alpha1"] > 0) & (got["alpha1"] <= 1))
    with pytest.raises(ValueError, match="block"):
        plots.running_max(axes, x, 30)
    with pytest.raises(ValueError, match="scores"):
        plots.running_max(axes, x[:1], 1)


def test_tensor_layout_addresses_match_numpy_strides():
    shape, block_m, (b, h, m) = (2, 3, 8, 4), 4, (1, 2, 1)
    ax = plots.tensor_layout(plt.subplots()[1], shape, block_m=block_m, program=(b, h, m))
    a = np.arange(np.prod(shape)).reshape(shape)          # each element holds its address
    tile = a[b, h, m * block_m:(m + 1) * block_m, :]
    words = "\n".join(texts(ax))
    assert f"address {tile.min()}" in words and f"address {tile.max()}" in words
    for name, s in zip(("stride_b", "stride_h", "stride_n", "stride_d"), (a.strides)):
        assert f"{name} = {s // a.itemsize}" in words
    red = [p for p in ax.patches if p.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
    assert len(red) == 1 and red[0].get_height() == block_m
    # the title names the program as the prose does: batch, head and query tile
    assert f"the program for batch {b}, head {h}, query tile {m} ($B_r$ = {block_m})" in ax.get_title()
    with pytest.raises(ValueError, match="program"):
        plots.tensor_layout(plt.subplots()[1], shape, block_m=4, program=(2, 0, 0))


def test_the_issue_order_figure_says_barriers_keep_the_warpgroups_in_step():
    """Chapters 7 and 10 draw one program's Triton loop: a bar.sync 0 comes before each Q K_j^T (S_j)
    is issued and after each P_j V_j, in Triton 3.6.0 (profiled) and 3.9.0 alike; only 3.9.0 adds one
    right after each wgmma.wait_group 0, so the title does not claim that one (tests/test_lesson_ch7.py
    compiles the loop)."""
    from flashbook.plots.schedule import issue_order_figure

    fig = issue_order_figure()
    title = fig._suptitle.get_text()
    assert "barriers before each $S_j$ and after each $P_jV_j$ keep its two warpgroups in step" in title
    assert "after each wait" not in title and "fill its gaps" not in title
    plt.close(fig)
