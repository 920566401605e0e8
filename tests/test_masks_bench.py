"""benchmarks/masks_bench.py compares flashbook with FlexAttention on the same masks: its
FlexAttention ``mask_mod`` and ``score_mod`` are checked here against ``flashbook.masks``
(the float64 truth), on the CPU, so that the GPU comparison is of one function."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT
from flashbook import masks

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import masks_bench as mb  # noqa: E402


def _grid(mask_mod, n_q, n_k):
    q_idx, kv_idx = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    return mask_mod(0, 0, q_idx, kv_idx).expand(n_q, n_k).numpy()


@pytest.mark.parametrize("n_q,n_k", [(40, 40), (17, 50), (50, 17)])
def test_flex_masks_are_flash_attn_windows(n_q, n_k):
    for window in ((-1, -1), (0, 0), (5, 0), (3, 7), (-1, 4), (9, -1)):
        for causal in (False, True):
            got = _grid(mb.flex_mask(n_q, n_k, causal=causal, window=window), n_q, n_k)
            assert (got == masks.allowed(n_q, n_k, causal=causal, window=window)).all(), (window, causal)


def test_flex_document_masks_and_the_pair_count():
    cu = mb.documents(4096, seed=3)
    assert cu[0] == 0 and cu[-1] == 4096 and (np.diff(cu) > 0).all() and len(cu) > 3
    ids = masks.doc_ids_from_cu_seqlens(cu)
    small = mb.documents(300, seed=1, shortest=20)
    small_ids = masks.doc_ids_from_cu_seqlens(small)
    for window in ((-1, -1), (25, 0)):
        want = masks.allowed(300, 300, causal=True, window=window, doc_ids_q=small_ids, doc_ids_k=small_ids)
        got = _grid(mb.flex_mask(300, 300, causal=True, window=window, doc_ids=torch.as_tensor(small_ids)), 300, 300)
        assert (got == want).all(), window
        assert mb.allowed_pairs(300, True, window, small) == int(want.sum())
    assert mb.allowed_pairs(4096, True, (-1, -1), cu) == int(np.sum(np.diff(cu) * (np.diff(cu) + 1) // 2))
    assert mb.allowed_pairs(4096, True, (1023, 0), None) == sum(min(i + 1, 1024) for i in range(4096))
    assert len(ids) == 4096


# eager FlexAttention warns that it is not compiled: here that is the point (float64 on the CPU)
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_these_mods_is_the_float64_truth():
    """FlexAttention itself (eager, on the CPU) with the window, the soft cap and GQA as the
    benchmark builds them: the same function as flashbook.masks.attention."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 128, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 128, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    window, cap = (20, 0), 5.0
    block_mask = create_block_mask(mb.flex_mask(128, 128, causal=True, window=window), None, None, 128, 128,
                                   device="cpu")
    got = flex_attention(q, k, v, block_mask=block_mask, score_mod=mb.flex_score(cap), enable_gqa=True)
    want = masks.attention(q.numpy(), np.repeat(k.numpy(), 2, axis=1), np.repeat(v.numpy(), 2, axis=1),
                           causal=True, window=window, softcap=cap)
    assert np.abs(got.numpy() - want).max() < 1e-10
    assert mb.flex_score(None) is None and mb.flex_score(0) is None


def test_spread_and_the_mask_names():
    assert mb.spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    assert mb.spread([2.0]) == 0.0 and np.isnan(mb.spread([]))
    assert "causal" in mb.MASKS   # the reference row: no mask beyond causal
    with pytest.raises(SystemExit):
        mb.main(["--out", "/nonexistent-never-written", "--masks", "window,sliding"])


def test_the_profiler_reads_its_shapes():
    import masks_profile as mp

    assert mp.parse_shape("window:4K:128:1K:8") == dict(name="window", n=4096, d=128, window=1024, batch=8)
    assert mp.parse_shape("causal:16K:64") == dict(name="causal", n=16384, d=64, window=None, batch=1)
    for bad in ("window:4K:128", "sliding:4K:128:1K", "causal:4K"):
        with pytest.raises(ValueError, match="mask:N:d|needs a window"):
            mp.parse_shape(bad)
