"""Chapter 11's figures (flashbook.plots.split_grid, ring_schedule) draw what the library computes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from flashbook import distributed, plots, split  # noqa: E402
from flashbook.reference import causal_mask  # noqa: E402


def _texts(ax):
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("n_q, n_k, num_splits, causal", [(6, 24, 4, False), (6, 10, 8, True), (3, 5, 7, True)])
def test_split_grid_draws_every_split_and_the_mask(n_q, n_k, num_splits, causal):
    fig, ax = plt.subplots()
    try:
        assert plots.split_grid(ax, n_q, n_k, num_splits, causal=causal) is ax
        bounds = split.split_bounds(n_k, num_splits)
        masked = int((~causal_mask(n_q, n_k)).sum()) if causal else 0
        rects = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(rects) == sum(1 for b in bounds if len(b)) + masked
        labels = _texts(ax)
        empty = [s for s, b in enumerate(bounds) if not len(b)]
        assert empty == list(range(num_splits - len(empty), num_splits))   # the empty splits come last
        assert len(labels) == num_splits - len(empty) + bool(empty)        # the empty ones: one label
        allowed = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), bool)
        for s, keys in enumerate(bounds[:num_splits - len(empty)]):   # the rows that see none of its keys
            blind = int((~allowed[:, keys.start:keys.stop].any(axis=1)).sum())
            assert labels[s].startswith(f"split {s}\n{len(keys)} keys")
            assert (f"{blind} rows see none" in labels[s]) == (blind > 0)
        if empty:                           # named once, not overprinted one on another
            names = f"split {empty[0]}" if len(empty) == 1 else f"splits {empty[0]}–{empty[-1]}"
            assert labels[-1] == f"{names}\nno keys"
    finally:
        plt.close(fig)


@pytest.mark.parametrize("layout", distributed.LAYOUTS)
@pytest.mark.parametrize("world", [2, 4])
def test_ring_schedule_shows_holders_and_work(layout, world):
    fig, ax = plt.subplots()
    try:
        assert plots.ring_schedule(ax, world, layout) is ax
        assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == world * world
        work = np.array(distributed.causal_work(world, layout))
        texts = _texts(ax)
        totals = [t for t in texts if t.startswith("total")]
        assert totals == [f"total {w:g}" for w in work.sum(axis=1)]
        cells = [t for t in texts if t.startswith("K/V")]
        for r in range(world):          # rank r holds rank (r - t)'s shard at step t
            for t in range(world):
                chunks = ",".join(map(str, distributed.chunk_ids((r - t) % world, world, layout)))
                assert cells[r * world + t].startswith(f"K/V {chunks}\n")
    finally:
        plt.close(fig)
