"""What chapters 7 and 8 claim about the kernels' tiles, checked on the kernels themselves.

Chapter 7 runs the forward kernel's own ``causal_bounds`` (through a probe kernel)
and says the kernel visits exactly the tiles of chapter 4's NumPy loop, masking
those the causal diagonal cuts. Chapter 8 watches the backward kernels with
poisoned inputs (NaN in dO or V shows which tiles a program visits; lse = -inf
shows whether the visit runs unmasked) and says they visit exactly chapter 5's
tiles. These tests assert the same on more shapes, so a change to the kernels'
bounds fails here before it fails a chapter.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashbook import runtime, tiled
from flashbook.kernels import configs, flash_backward, flash_forward, probes

import triton

DEVICE = runtime.device()


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


def _fresh(n_q, n_k, d=16):
    gen = torch.Generator().manual_seed(n_q * 1000 + n_k)
    q, k, v = (torch.randn(1, 1, n, d, generator=gen).to(DEVICE) for n in (n_q, n_k, n_k))
    o, lse = flash_forward(q, k, v, causal=True)
    return q, k, v, o, lse, torch.randn(o.shape, generator=gen).to(DEVICE)


def dkdv_stages(n_q, n_k, config):
    """The dK/dV kernel observed: NaN rows of dO show visits, lse = -inf shows unmasked ones."""
    q, k, v, o, lse, do = _fresh(n_q, n_k)
    t_r, t_c = triton.cdiv(n_q, config.block_m), triton.cdiv(n_k, config.block_n)
    kinds = np.full((t_r, t_c), "skipped", dtype=object)

    def dv_tiles(lse_, do_):
        _, _, dv = flash_backward(q, k, v, o, lse_, do_, causal=True, dq_mode="atomic", config_dkdv=config)
        return [dv[..., j * config.block_n:(j + 1) * config.block_n, :] for j in range(t_c)]

    with np.errstate(all="ignore"):
        for i in range(t_r):
            rows = slice(i * config.block_m, (i + 1) * config.block_m)
            do_nan, lse_inf = do.clone(), lse.clone()
            do_nan[..., rows, :] = math.nan
            lse_inf[..., rows] = -math.inf
            for j, (seen, main) in enumerate(zip(dv_tiles(lse, do_nan), dv_tiles(lse_inf, do))):
                if torch.isnan(seen).any():
                    kinds[i, j] = "masked" if torch.isfinite(main).all() else "main"
    return kinds


def dq_visits(n_q, n_k, config):
    """The dQ kernel observed: NaN rows of V tile j show which query tiles visit it."""
    q, k, v, o, lse, do = _fresh(n_q, n_k)
    t_r, t_c = triton.cdiv(n_q, config.block_m), triton.cdiv(n_k, config.block_n)
    seen = np.zeros((t_r, t_c), dtype=bool)
    with np.errstate(all="ignore"):
        for j in range(t_c):
            v_nan = v.clone()
            v_nan[..., j * config.block_n:(j + 1) * config.block_n, :] = math.nan
            dq, _, _ = flash_backward(q, k, v_nan, o, lse, do, causal=True, config_dq=config)
            for i in range(t_r):
                seen[i, j] = bool(torch.isnan(dq[..., i * config.block_m:(i + 1) * config.block_m, :]).any())
    return seen


def _schedule(n_q, n_k, block_m, block_n):
    return set(tiled.tile_schedule(n_q, n_k, block_m, block_n, causal=True))


@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(72, 72, 16, 32), (64, 64, 32, 16), (40, 70, 16, 16),
                                                         (70, 40, 16, 32)])
def test_dkdv_kernel_visits_chapter_5_tiles(n_q, n_k, block_m, block_n):
    kinds = dkdv_stages(n_q, n_k, configs.Config(block_m, block_n, 4, 1))
    assert {tuple(ij) for ij in np.argwhere(kinds != "skipped")} == _schedule(n_q, n_k, block_m, block_n)
    ch5 = tiled.tile_kinds(n_q, n_k, block_m, block_n, causal=True)
    assert np.all(kinds[ch5 == "partial"] == "masked"), "a tile the diagonal cuts ran unmasked"


@pytest.mark.parametrize("n, block_m, block_n", [(64, 16, 32), (64, 32, 16), (64, 16, 16), (128, 32, 32)])
def test_masked_tiles_number_n_over_the_smaller_block(n, block_m, block_n):
    """Chapters 7 and 8, exercises: causal, N a multiple of both blocks, the diagonal band
    holds N / min(B_r, B_c) tiles, in the forward and in the dK/dV kernel alike."""
    dkdv = dkdv_stages(n, n, configs.Config(block_m, block_n, 4, 1))
    forward = probes.stage_map(n, n, block_m, block_n, True)
    assert int((dkdv == "masked").sum()) == n // min(block_m, block_n)
    assert int((forward == "masked").sum()) == n // min(block_m, block_n)


@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [(72, 72, 32, 16), (40, 70, 16, 16), (70, 40, 32, 16)])
def test_dq_kernel_visits_chapter_5_tiles(n_q, n_k, block_m, block_n):
    seen = dq_visits(n_q, n_k, configs.Config(block_m, block_n, 4, 1))
    assert {tuple(ij) for ij in np.argwhere(seen)} == _schedule(n_q, n_k, block_m, block_n)
    stages = probes.stage_map(n_q, n_k, block_m, block_n, True)     # _bwd_dq uses the same bounds
    assert np.array_equal(seen, stages != "skipped")


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
