"""The lab's fused backward (benchmarks/fused_bwd_experiment.py): the library's dK/dV and dQ
programs in one launch, in FlexAttention's order ("halves") or alternating ("interleaved"),
compute bitwise the library's gradients, launch once where the library launches twice, refuse
what they cannot fuse, and leave the library as it was."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashbook import runtime
from flashbook.kernels import autograd, varlen

from conftest import benchmark_script

DEVICE = runtime.device()
MASKS = {
    "documents": dict(causal=True),
    "causal": dict(causal=True),
    "full": dict(causal=False),
    "window-softcap": dict(causal=True, window=(20, 0), softcap=4.0),
}


def _inputs(name, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, 2, 90, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(4))
    kw = dict(MASKS[name])
    if name == "documents":
        cu = torch.tensor(np.cumsum([0, 33, 1, 40, 16]), dtype=torch.int32, device=DEVICE)
        kw["packed"] = varlen.Packed(cu, cu, 40, 40)
    return q, k, v, do, kw


@pytest.mark.parametrize("name", sorted(MASKS))
def test_the_fused_launch_computes_the_librarys_gradients_bitwise(name):
    exp = benchmark_script("fused_bwd_experiment")
    q, k, v, do, kw = _inputs(name, len(name))
    o, lse = autograd.flash_forward(q, k, v, **kw)
    with exp.backward("library"):
        expected = autograd.flash_backward(q, k, v, o, lse, do, **kw)
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in expected)
    for order in ("halves", "interleaved"):
        launched = []
        original = autograd._launch

        def counting(kernel, grid, args, kwargs, names):   # what reaches the GPU
            launched.append((kernel, grid))
            return original(kernel, grid, args, kwargs, names)

        autograd._launch = counting   # the fused launcher launches through it
        try:
            with exp.backward(order):
                got = autograd.flash_backward(q, k, v, o, lse, do, **kw)
            assert autograd._launch is counting
        finally:
            autograd._launch = original
        # delta, then the one fused grid: the dK/dV programs' tiles twice over
        assert [kernel for kernel, _ in launched][1:] == [exp.FUSED[order]]
        assert launched[1][1][0] % 2 == 0
        for what, a, b in zip(("dq", "dk", "dv"), expected, got):
            assert torch.equal(a, b), f"{order}: {what} differs by {(a - b).abs().max().item()}"


def test_the_fused_launch_refuses_what_it_cannot_fuse():
    exp = benchmark_script("fused_bwd_experiment")
    gen = torch.Generator().manual_seed(1)
    q, do = (torch.randn(1, 4, 64, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    k, v = (torch.randn(1, 2, 64, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    o, lse = autograd.flash_forward(q, k, v, causal=True)
    with exp.backward("halves"), pytest.raises(ValueError, match="one dQ program per dK/dV program"):
        autograd.flash_backward(q, k, v, o, lse, do, causal=True)   # GQA: 2 key heads, 4 query heads
    with pytest.raises(ValueError, match="a variant is one of"):
        with exp.backward("fused"):
            pass
    assert autograd._state["head_group"] is None
