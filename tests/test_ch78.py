"""What chapters 7 and 8 claim about the kernels' tiles, checked on the kernels themselves.

Chapter 7 runs the forward kernel's own ``causal_bounds`` (through a probe kernel,
``probes.stage_map``, which also runs the dK/dV kernel's ``query_bounds``)
and says the kernel visits exactly the tiles of chapter 4's NumPy loop, masking
those the causal diagonal cuts. Chapter 8 watches the backward kernels with
poisoned inputs (``probes.observed_stages``) (NaN in dO or V shows which tiles a program visits; lse = -inf
shows whether the visit runs unmasked) and says they visit exactly chapter 5's
tiles. These tests assert the same on more shapes, so a change to the kernels'
bounds fails here before it fails a chapter.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashbook import tiled
from flashbook.kernels import configs, probes


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32), (64, 64), (16, 16)])
@pytest.mark.parametrize("n_q, n_k", [(128, 128), (100, 100), (40, 110), (112, 48), (1, 77), (77, 1)])
def test_forward_visits_chapter_4_tiles(n_q, n_k, block_m, block_n, causal):
    kinds = probes.stage_map(n_q, n_k, block_m, block_n, causal)
    visited = (kinds != "skipped").sum(axis=1).tolist()
    assert visited == tiled.visible_key_tiles(n_q, n_k, block_m, block_n, causal)
    ch4 = tiled.tile_kinds(n_q, n_k, block_m, block_n, causal=causal)
    assert np.all(kinds[ch4 == "partial"] == "masked"), "a tile the diagonal cuts ran unmasked"
    extra = (kinds == "masked") & (ch4 == "full")
    # the only whole tiles allowed in the masked stage: the ragged last key tile
    assert extra[:, :-1].sum() == 0 and (n_k % block_n != 0 or not extra.any())


def _schedule(n_q, n_k, block_m, block_n):
    return set(tiled.tile_schedule(n_q, n_k, block_m, block_n, causal=True))


@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(72, 72, 16, 32), (64, 64, 32, 16), (40, 70, 16, 16),
                                                         (70, 40, 16, 32)])
def test_dkdv_kernel_visits_chapter_5_tiles(n_q, n_k, block_m, block_n):
    kinds = probes.observed_stages(n_q, n_k, configs.Config(block_m, block_n, 4, 1), "backward_dkdv")
    assert {tuple(ij) for ij in np.argwhere(kinds != "skipped")} == _schedule(n_q, n_k, block_m, block_n)
    ch5 = tiled.tile_kinds(n_q, n_k, block_m, block_n, causal=True)
    assert np.all(kinds[ch5 == "partial"] == "masked"), "a tile the diagonal cuts ran unmasked"
    # the kernel's own query_bounds, probed, says the same as the poisoned gradients
    assert np.array_equal(kinds, probes.stage_map(n_q, n_k, block_m, block_n, True, kernel="backward_dkdv"))


@pytest.mark.parametrize("n, block_m, block_n", [(64, 16, 32), (64, 32, 16), (64, 16, 16), (128, 32, 32)])
def test_masked_tiles_number_n_over_the_smaller_block(n, block_m, block_n):
    """Chapters 7 and 8, exercises: causal, N a multiple of both blocks, the diagonal band
    holds N / min(B_r, B_c) tiles, in the forward and in the dK/dV kernel alike."""
    dkdv = probes.observed_stages(n, n, configs.Config(block_m, block_n, 4, 1), "backward_dkdv")
    forward = probes.stage_map(n, n, block_m, block_n, True)
    assert int((dkdv == "masked").sum()) == n // min(block_m, block_n)
    assert int((forward == "masked").sum()) == n // min(block_m, block_n)


@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(72, 72, 32, 16), (40, 70, 16, 16), (70, 40, 32, 16)])
def test_dq_kernel_visits_chapter_5_tiles(n_q, n_k, block_m, block_n):
    seen = probes.observed_stages(n_q, n_k, configs.Config(block_m, block_n, 4, 1), "backward_dq") != "skipped"
    assert {tuple(ij) for ij in np.argwhere(seen)} == _schedule(n_q, n_k, block_m, block_n)
    stages = probes.stage_map(n_q, n_k, block_m, block_n, True, kernel="backward_dq")  # causal_bounds, as the forward
    assert np.array_equal(seen, stages != "skipped")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(100, 100, 32, 16), (40, 110, 16, 32), (112, 48, 64, 16),
                                                         (1, 77, 16, 16), (77, 1, 16, 32)])
def test_dkdv_stage_map_matches_the_mask_tile_by_tile(n_q, n_k, block_m, block_n, causal):
    """The dK/dV kernel's map, from the mask alone: skipped when no row sees any key of the
    tile, main when every row of a whole query tile sees every key, masked otherwise (a
    ragged key tile runs unmasked there: keys past seq_k only touch dK/dV rows never stored)."""
    kinds = probes.stage_map(n_q, n_k, block_m, block_n, causal, kernel="backward_dkdv")
    diagonal = n_k - n_q
    for (i, j), kind in np.ndenumerate(kinds):
        rows = np.arange(i * block_m, (i + 1) * block_m)[:, None]
        cols = np.arange(j * block_n, (j + 1) * block_n)[None, :]
        seen = (cols <= rows + diagonal) if causal else np.ones((block_m, block_n), bool)
        seen = seen & (cols < n_k)
        whole_rows = (i + 1) * block_m <= n_q
        inside = cols < n_k
        want = ("skipped" if not (seen & (rows < n_q)).any()
                else "main" if whole_rows and seen[:, inside[0]].all() else "masked")
        assert kind == want, (i, j, kind, want)


# ------------------------------------------------------------ the stage map and its figure

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(100, 100, 32, 16), (40, 110, 16, 32), (112, 48, 64, 16)])
def test_stage_map_matches_the_mask_tile_by_tile(n_q, n_k, block_m, block_n, causal):
    """Brute force from the mask: a tile is main when every row of the query tile sees every
    key of a whole key tile, skipped when no row sees any key, masked otherwise."""
    kinds = probes.stage_map(n_q, n_k, block_m, block_n, causal)
    diagonal = n_k - n_q
    for (i, j), kind in np.ndenumerate(kinds):
        rows = np.arange(i * block_m, (i + 1) * block_m)[:, None]   # the tile's rows, as the kernel counts them
        cols = np.arange(j * block_n, (j + 1) * block_n)[None, :]
        seen = (cols < n_k) & ((cols <= rows + diagonal) if causal else True)
        want = "main" if seen.all() else "skipped" if not seen.any() else "masked"
        assert kind == want, (i, j, kind, want)


def test_stage_map_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_m"):
        probes.stage_map(64, 64, 24, 16)
    with pytest.raises(ValueError, match="seq_k"):
        probes.stage_map(64, 0, 16, 16)
    with pytest.raises(TypeError, match="causal"):
        probes.stage_map(64, 64, 16, 16, causal=1)
    with pytest.raises(ValueError, match="kernel"):
        probes.stage_map(64, 64, 16, 16, kernel="backward")


def test_stage_grid_draws_one_patch_per_tile():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashbook import plots

    kinds = probes.stage_map(40, 110, 16, 32, True)
    fig, (a, b) = plt.subplots(1, 2)
    plots.stage_grid(a, kinds, 40, 110, 16, 32, causal=True, per="row")
    plots.stage_grid(b, kinds, 40, 110, 16, 32, causal=False, per="column")
    assert len(a.patches) == kinds.size + 1 and len(b.patches) == kinds.size   # + the hatched mask
    assert len(a.texts) == kinds.shape[0] and len(b.texts) == kinds.shape[1]
    colors = {p.get_facecolor()[:3] for p in a.patches[:kinds.size]}
    assert len(colors) == len(set(kinds.ravel()))
    with pytest.raises(ValueError, match="shape"):
        plots.stage_grid(a, kinds[:, :2], 40, 110, 16, 32)
    with pytest.raises(ValueError, match="per"):
        plots.stage_grid(a, kinds, 40, 110, 16, 32, per="diagonal")
    plt.close(fig)
