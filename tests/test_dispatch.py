"""The front door, ``flashbook.flash_attention(..., backend=)``, on the CPU.

Here only the Triton kernel can run (the interpreter), so "auto" must choose it, say why,
and give what ``backend="triton"`` gives; "gluon" must refuse with an error that names the
backend. Where the Gluon forward is allowed, "auto" must run it and still differentiate
through chapter 8's backward: checked by standing a recording stand-in in for the Gluon
forward. The GPU side (``test_stress_gpu.py``) checks the real choice on an H200.
"""
from __future__ import annotations

import pytest
import torch

import flashbook
from flashbook import runtime
from flashbook.kernels import autograd, dispatch

DEVICE = runtime.device()


def _inputs(seed=0, shape_q=(1, 4, 40, 32), shape_k=(1, 2, 33, 32)):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, generator=gen).to(DEVICE).requires_grad_() for s in (shape_q, shape_k, shape_k))
    return q, k, v


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU's choice")
def test_auto_runs_the_triton_kernel_here_and_says_why():
    q, k, v = _inputs()
    o = flashbook.flash_attention(q, k, v, causal=True)
    assert flashbook.last_backend() == "triton"
    backend, why = dispatch.explain_backend()
    assert backend == "triton" and "interpreter" in why
    want = autograd.flash_attention(*(x.detach() for x in (q, k, v)), causal=True)
    assert torch.equal(o.detach(), want)
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU's refusal")
def test_gluon_backend_is_refused_here_with_the_reason():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="backend='gluon' cannot run this call: no CUDA GPU"):
        flashbook.flash_attention(q, k, v, backend="gluon")


def test_unknown_backend_names_the_argument():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'triton', 'gluon'\), got 'cudnn'"):
        flashbook.flash_attention(q, k, v, backend="cudnn")


def test_bad_inputs_are_refused_before_any_backend_is_chosen():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="must divide"):
        flashbook.flash_attention(q[:, :3], k, v, backend="auto")


def test_auto_takes_the_gluon_forward_where_it_is_allowed(monkeypatch):
    """With the Gluon kernel allowed, "auto" runs it forward and chapter 8's kernels backward."""
    from flashbook.kernels import hopper

    calls = []

    def stand_in(q, k, v, *, causal=False, scale=None):
        calls.append((tuple(q.shape), causal))
        return autograd.flash_forward(q, k, v, causal=causal, scale=scale)

    monkeypatch.setattr(dispatch, "gluon_refusal", lambda *args: None)
    monkeypatch.setattr(hopper, "gluon_forward", stand_in)
    q, k, v = _inputs(1)
    o = flashbook.flash_attention(q, k, v, causal=True)
    assert flashbook.last_backend() == "gluon" and calls == [((1, 4, 40, 32), True)]
    o.sum().backward()
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    autograd.flash_attention(*leaves, causal=True).sum().backward()
    for a, b in zip((q, k, v), leaves):
        assert torch.equal(a.grad, b.grad)


def test_empty_input_needs_no_kernel():
    q, k, v = _inputs(shape_q=(1, 4, 0, 32))
    assert flashbook.flash_attention(q, k, v).shape == (1, 4, 0, 32)
    assert flashbook.last_backend() == "triton"


def test_auto_takes_triton_where_the_gluon_forward_measured_slower(monkeypatch):
    """A call the Gluon kernel can run but measured slower on (d = 64, a ragged key length,
    one-warpgroup programs): "auto" runs Triton and says why; "gluon" still runs it."""
    from flashbook.kernels import hopper

    monkeypatch.setattr(dispatch, "gluon_refusal", lambda *args: None)
    q = torch.randn(1, 2, 1000, 64)
    assert hopper.slower_than_triton(64, 1000, 1000, False)
    chosen, why = dispatch.choose_backend(q, q, q, False, "auto")
    assert chosen == "triton" and "measured slower" in why
    assert dispatch.choose_backend(q, q, q, False, "gluon") == ("gluon", "asked for")
    assert dispatch.choose_backend(torch.randn(1, 2, 1024, 64), torch.randn(1, 2, 1024, 64),
                                   torch.randn(1, 2, 1024, 64), False, "auto")[0] == "gluon"
