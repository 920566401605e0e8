"""Packed documents' grid (``packed.document_tile``, ``autograd.launch_shape``).

Each program of a varlen kernel finds its document and tile from ``cu_seqlens``: the grid holds
every document's tiles (and at most a document's worth of idle programs), heaviest first under
a causal mask. Checked here: the mapping reaches every tile exactly once and in that order, on
documents of random lengths (empty ones too); and the kernels give bitwise the same outputs and
gradients as with the older grid of one program row per document.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashbook import runtime
from flashbook.kernels import autograd, varlen
from flashbook.kernels.packed import document_tile

import triton  # noqa: E402  (after flashbook: it decides GPU or interpreter first)
import triton.language as tl  # noqa: E402

from test_launch_order import _assert_same, _grads, forced

DEVICE = runtime.device()


@triton.jit
def _tiles_of(CU, OUT, n_docs, BLOCK: tl.constexpr, DOCS: tl.constexpr, CAUSAL: tl.constexpr,
              KEY_SIDE: tl.constexpr, HEAVY_LAST: tl.constexpr):
    position = tl.program_id(0)
    doc, tile = document_tile(CU, position, n_docs, BLOCK, DOCS, CAUSAL, KEY_SIDE, HEAVY_LAST)
    tl.store(OUT + 2 * position, doc)
    tl.store(OUT + 2 * position + 1, tile)


def _mapping(lengths, block, causal, key_side=False, heavy_last=False):
    """[(document, tile)] for each position of the grid ``launch_shape`` makes."""
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=DEVICE)
    programs = int(sum(lengths)) // block + len(lengths)
    out = torch.full((programs, 2), -7, dtype=torch.int32, device=DEVICE)
    _tiles_of[(programs,)](cu, out, len(lengths), BLOCK=block, DOCS=triton.next_power_of_2(len(lengths)),
                           CAUSAL=causal, KEY_SIDE=key_side, HEAVY_LAST=heavy_last)
    return [tuple(p) for p in out.cpu().tolist()]


LENGTHS = {
    "one": [70],
    "mixed": [33, 0, 128, 5, 64, 200, 1],
    "equal": [64, 64, 64],
    "random": list(np.random.default_rng(3).integers(0, 300, size=13)),
}


@pytest.mark.parametrize("name", sorted(LENGTHS))
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("causal,key_side,heavy_last", [(True, False, False), (True, True, False),
                                                        (False, False, False), (False, False, True)])
def test_every_tile_once_heaviest_first(name, block, causal, key_side, heavy_last):
    lengths = [int(n) for n in LENGTHS[name]]
    tiles = [-(-n // block) for n in lengths]
    got = _mapping(lengths, block, causal, key_side, heavy_last)
    real = [(d, t) for d, t in got if t < tiles[d]]
    assert sorted(real) == [(d, t) for d in range(len(lengths)) for t in range(tiles[d])]   # each tile once
    assert all(t < tiles[d] for d, t in got[:len(real)])      # the real tiles come first,
    assert all((d, t) == (0, tiles[0]) for d, t in got[len(real):])   # then idle ones past document 0
    if causal:   # work: query tile t sees t + 1 key tiles; key tile t is seen by tiles t .. end
        work = [tiles[d] - t if key_side else t + 1 for d, t in real]
        assert work == sorted(work, reverse=True), work
        for w in set(work):   # ties: documents in packing order
            docs = [d for (d, _), x in zip(real, work) if x == w]
            assert docs == sorted(docs)
    else:        # documents in packing order; each one's tiles in order, or last first
        assert [d for d, _ in real] == sorted(d for d, _ in real)
        for d in range(len(lengths)):
            mine = [t for e, t in real if e == d]
            assert mine == (sorted(mine, reverse=True) if heavy_last else sorted(mine))


def _packed(lens, heads, kv_heads, d, seed):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    q = torch.randn(total, heads, d, generator=gen).to(DEVICE, torch.float16)
    k, v = (torch.randn(total, kv_heads, d, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device=DEVICE)
    return q, k, v, cu


@pytest.mark.parametrize("kwargs,heads,kv_heads", [(dict(causal=True), 3, 3), (dict(causal=False), 4, 2),
                                                   (dict(causal=True, window=(9, 0)), 2, 1),
                                                   (dict(causal=True, softcap=5.0), 2, 2)])
def test_packed_grid_changes_nothing(kwargs, heads, kv_heads):
    lens = [30, 0, 7, 53, 1, 20]
    q, k, v, cu = _packed(lens, heads, kv_heads, 16, seed=len(kwargs) + heads)
    longest = max(lens)
    fn = lambda q, k, v: varlen.flash_attention_varlen(q, k, v, cu, cu, longest, longest, **kwargs)  # noqa: E731
    packed = _grads(fn, q, k, v)
    with forced("packed_grid_docs", 0):   # one program row per document, as before the packed grid
        rows = _grads(fn, q, k, v)
    _assert_same(packed, rows, "one row per document")
    with forced("packed_grid_docs", 0), forced("head_group", 1):
        assert autograd.launch_shape(varlen.Packed(cu, cu, longest, longest), "q", heads, 1, sum(lens), 16,
                                     {})[0] == (-(-longest // 16), len(lens) * heads)
    grid, extra = autograd.launch_shape(varlen.Packed(cu, cu, longest, longest), "k", kv_heads, 1, sum(lens), 16, {})
    assert grid == (sum(lens) // 16 + len(lens), kv_heads)
    assert extra["n_docs"] == len(lens) and extra["DOCS"] == 8 and extra.get("HEAD_GROUP", 1) == kv_heads
