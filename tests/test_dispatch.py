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


def test_flash_attn_keyword_names_give_the_same_call():
    """``softmax_scale=`` and ``window_size=`` (flash-attn's names) are ``scale=`` and ``window=``,
    for the front door, the varlen entry point and decoding; both names of one argument at once
    are refused, naming the two. flash-attn's (batch, seq, heads, head_dim) tensors transposed
    to (batch, heads, seq, head_dim) give flash-attn's result: the float64 reference's."""
    from flashbook import masks
    from flashbook.kernels import flash_decode, varlen

    q, k, v = (x.detach() for x in _inputs(3))
    ours = flashbook.flash_attention(q, k, v, causal=True, scale=0.3, window=(5, 0))
    theirs = flashbook.flash_attention(q, k, v, causal=True, softmax_scale=0.3, window_size=(5, 0))
    assert torch.equal(ours, theirs) and ours.abs().max() > 0
    truth = masks.attention(*(x.double().cpu().numpy() for x in (q, k.repeat_interleave(2, 1),
                                                                  v.repeat_interleave(2, 1))),
                            causal=True, scale=0.3, window=(5, 0))
    assert abs(ours.double().cpu().numpy() - truth).max() < 1e-4   # float32 on the interpreter: IEEE products
    bshd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]       # flash-attn's layout
    again = flashbook.flash_attention(*(x.transpose(1, 2) for x in bshd), causal=True, softmax_scale=0.3,
                                      window_size=(5, 0)).transpose(1, 2)
    assert torch.equal(again.transpose(1, 2), ours)
    with pytest.raises(TypeError, match="scale= or flash-attn's softmax_scale="):
        flashbook.flash_attention(q, k, v, scale=0.3, softmax_scale=0.3)
    with pytest.raises(TypeError, match="window= or flash-attn's window_size="):
        flashbook.flash_attention(q, k, v, window=(5, 0), window_size=(5, 0))
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=DEVICE)
    packed = [x[0].transpose(0, 1).contiguous() for x in (q, k[:, :, :33], v[:, :, :33])]
    cuk = torch.tensor([0, 15, 33], dtype=torch.int32, device=DEVICE)
    a = varlen.flash_attention_varlen(*packed, cu, cuk, 25, 18, causal=True, scale=0.3, window=(5, 0))
    b = varlen.flash_attention_varlen(*packed, cu, cuk, 25, 18, causal=True, softmax_scale=0.3, window_size=(5, 0))
    assert torch.equal(a, b) and a.abs().max() > 0
    with pytest.raises(TypeError, match="softmax_scale"):
        varlen.flash_attention_varlen(*packed, cu, cuk, 25, 18, scale=0.3, softmax_scale=0.2)
    q1 = q[:, :, -1:]
    a = flash_decode(q1, k, v, scale=0.3, window=(5, 0))
    b = flash_decode(q1, k, v, softmax_scale=0.3, window_size=(5, 0))
    assert torch.equal(a, b) and a.abs().max() > 0
    with pytest.raises(TypeError, match="window_size"):
        flash_decode(q1, k, v, window=(5, 0), window_size=(4, 0))
