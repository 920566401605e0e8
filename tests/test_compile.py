"""``flashbook.flash_attention`` inside ``torch.compile`` (``kernels/dispatch.py``, its last section).

On this machine the kernels run in Triton's interpreter, so compiled and eager calls run the
same kernels on the same inputs: their outputs and gradients must be the same bits. The
operators' schemas, fake (shape-only) versions and autograd registration are checked by
``torch.library.opcheck``. ``tests/test_kernels_gpu.py`` compiles with Inductor on a GPU.
"""
from __future__ import annotations

import pytest
import torch

import flashbook
from flashbook.kernels import dispatch


def _inputs(seed, b=1, h=4, h_kv=4, n_q=48, n_k=48, d=32, dtype=torch.float32, layout="bhsd"):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, n_q, d), (b, h_kv, n_k, d), (b, h_kv, n_k, d)]
    xs = [torch.randn(s, generator=g, dtype=torch.float32).to(dtype) for s in shapes]
    if layout == "bshd":   # flash-attn's layout, passed as x.transpose(1, 2)
        xs = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in xs]
    return [x.requires_grad_() for x in xs]


def _run(fn, q, k, v, seed):
    o = fn(q, k, v)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1)).to(o.dtype)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


CASES = {
    "causal": dict(causal=True),
    "full, gqa": dict(shape=dict(h=4, h_kv=2, n_q=40, n_k=56)),
    "window + softcap": dict(causal=True, window_size=(16, 0), softcap=5.0),
    "alibi": dict(causal=True, alibi=True),
    "prefix": dict(causal=True, prefix=8),
    "fp16, flash-attn layout": dict(causal=True, shape=dict(dtype=torch.float16, layout="bshd"),
                                    softmax_scale=0.3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_call_gives_the_eager_bits(name):
    case = dict(CASES[name])
    seed = int(torch.randint(0, 2**30, ()))
    q, k, v = _inputs(seed, **case.pop("shape", {}))
    if case.pop("alibi", False):
        case["alibi_slopes"] = torch.rand(q.shape[1], generator=torch.Generator().manual_seed(seed)) * 0.5 + 0.05

    def f(q, k, v):
        return flashbook.flash_attention(q, k, v, **case)

    torch._dynamo.reset()
    eager = _run(f, q, k, v, seed)
    got = _run(torch.compile(f, backend="aot_eager", fullgraph=True), q, k, v, seed)
    for name_, a, b in zip(("o", "dq", "dk", "dv"), got, eager):
        assert a.shape == b.shape and a.dtype == b.dtype, name_
        assert torch.isfinite(b).all() and b.abs().max() > 0, name_
        assert torch.equal(a, b), (name_, (a.float() - b.float()).abs().max().item())


def test_inductor_compiles_a_layer_around_the_kernels():
    """The default backend (Inductor) fuses the ops around the operators; the kernels' results
    are the eager ones, and what Inductor fuses around them agrees to rounding."""
    seed = int(torch.randint(0, 2**30, ()))
    q, k, v = _inputs(seed, b=2, h=2, h_kv=2, n_q=33, n_k=33, d=16)
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(seed))

    def layer(q, k, v):
        return torch.nn.functional.gelu(flashbook.flash_attention(q * 1.5, k, v, causal=True) @ w)

    torch._dynamo.reset()
    eager = _run(layer, q, k, v, seed)
    got = _run(torch.compile(layer, fullgraph=True), q, k, v, seed)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert b.abs().max() > 0


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_the_operators_pass_opcheck(op):
    q, k, v = _inputs(int(torch.randint(0, 2**30, ())), n_q=24, n_k=24, d=16)
    flags = (True, None)
    if op == "forward":
        torch.library.opcheck(dispatch.attention_forward, (q, k, v, *flags, [8, 0], 4.0, 0, None, "auto", "separate"))
    else:
        with torch.no_grad():   # the backward's inputs need no gradient (it has none: no double backward)
            o, lse = dispatch.attention_forward(q, k, v, *flags, None, None, 0, None, "auto", "separate")
        do = torch.randn_like(o)
        torch.library.opcheck(dispatch.attention_backward,
                              (do, q.detach(), k.detach(), v.detach(), o, lse, *flags, None, None, 0, None, "separate"),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_compiled_call_says_which_backend_ran():
    q, k, v = _inputs(3, n_q=16, n_k=16, d=16)
    dispatch._last.backend = None
    torch._dynamo.reset()
    torch.compile(lambda q, k, v: flashbook.flash_attention(q, k, v), backend="aot_eager", fullgraph=True)(q, k, v)
    assert flashbook.last_backend() == "triton"


def test_no_double_backward_through_the_operators():
    q, k, v = _inputs(4, n_q=16, n_k=16, d=16)
    o = dispatch.attention(q, k, v, True, None, "auto", "separate", None, None, 0, None)
    (dq,) = torch.autograd.grad(o.square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        dq.sum().backward()


def test_bad_input_is_refused_when_the_compiled_code_runs():
    """The operators check as the eager call does, when they run: the same message."""
    q, k, v = _inputs(5, n_q=16, n_k=16, d=16)
    k = k.detach()[..., :8]
    with pytest.raises(ValueError) as eager:
        flashbook.flash_attention(q, k, v)
    torch._dynamo.reset()
    with pytest.raises(Exception) as got:
        torch.compile(lambda q, k, v: flashbook.flash_attention(q, k, v), backend="aot_eager")(q, k, v)
    assert str(eager.value) in str(got.value)


def test_varlen_compiles_to_the_eager_bits():
    """``flash_attention_varlen`` has its own two operators: compiled, its output and gradients are
    the eager call's bits, under a window and ALiBi too; with no document at all, zeros."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**30, ())))
    cu = torch.tensor([0, 5, 21, 40], dtype=torch.int32)
    q = torch.randn(40, 4, 16, generator=g).requires_grad_()
    k, v = (torch.randn(40, 2, 16, generator=g).requires_grad_() for _ in range(2))
    slopes = torch.rand(4, generator=g) * 0.5
    for kw in (dict(causal=True), dict(causal=True, window_size=(6, 0), alibi_slopes=slopes), dict(softcap=3.0)):
        def f(q, k, v):
            return flashbook.flash_attention_varlen(q * 2, k, v, cu, cu, 19, 19, **kw).relu()

        torch._dynamo.reset()
        eager = _run(f, q, k, v, 9)
        got = _run(torch.compile(f, backend="aot_eager", fullgraph=True), q, k, v, 9)
        for a, b in zip(got, eager):
            assert torch.equal(a, b) and b.abs().max() > 0, kw
    none = torch.zeros(1, dtype=torch.int32)
    torch._dynamo.reset()
    o = torch.compile(lambda q, k, v: flashbook.flash_attention_varlen(q, k, v, none, none, 0, 0),
                      backend="aot_eager", fullgraph=True)(q[:0], k[:0], v[:0])
    assert o.shape == (0, 4, 16)


def test_varlen_operators_pass_opcheck():
    from flashbook.kernels import varlen

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**30, ())))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    q, k, v = (torch.randn(20, 2, 16, generator=g) for _ in range(3))
    flags = (True, None, [4, 0], None, 0, None, "separate")
    torch.library.opcheck(varlen.varlen_forward, (q.requires_grad_(), k, v, cu, cu, 13, 13, *flags, True))
    with torch.no_grad():
        o, lse = varlen.varlen_forward(q, k, v, cu, cu, 13, 13, *flags, True)
    torch.library.opcheck(varlen.varlen_backward, (torch.randn_like(o), q.detach(), k, v, o, lse, cu, cu, 13, 13, *flags),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_decode_compiles_to_the_eager_bits():
    """``flash_decode`` is one operator (``flashbook::decode``, no gradient): compiled, dense and
    paged, with a window and with an int length, it gives the eager call's bits."""
    from flashbook.kernels import decode, flash_decode

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**30, ())))
    q = torch.randn(2, 4, 3, 16, generator=g)
    k, v = (torch.randn(2, 2, 64, 16, generator=g) for _ in range(2))
    lengths = torch.tensor([64, 31], dtype=torch.int32)
    k_pages, v_pages, table = decode.paginate(k, v, 16, generator=g)
    calls = {"dense": lambda q: flash_decode(q * 2, k, v, cache_seqlens=lengths, num_splits=3),
             "window, int length": lambda q: flash_decode(q, k, v, cache_seqlens=40, window_size=(9, 0)),
             "paged": lambda q: flash_decode(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table),
             "softcap, lse": lambda q: flash_decode(q, k, v, cache_seqlens=lengths, softcap=4.0, num_splits=2,
                                                    return_softmax_lse=True)}
    for name, f in calls.items():
        torch._dynamo.reset()
        eager = f(q)
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q)
        eager, compiled = (x if isinstance(x, tuple) else (x,) for x in (eager, compiled))
        assert all(torch.equal(a, b) for a, b in zip(compiled, eager, strict=True)), name
        assert eager[0].abs().max() > 0
    torch.library.opcheck(decode.decode_operator, (q, k, v, lengths, None, 2, True, None, None, 4.0, False),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_the_write_operators_pass_opcheck():
    """flashbook::append_kv (writes the caches in place: its schema says so) and flashbook::rotate."""
    from flashbook.kernels import append

    g = torch.Generator().manual_seed(9)
    k, v = (torch.randn(2, 3, 2, 32, generator=g) for _ in range(2))
    caches = [torch.randn(2, 40, 2, 32, generator=g) for _ in range(2)]
    cos, sin = (torch.randn(40, 8, generator=g) for _ in range(2))
    lengths = torch.tensor([4, 30], dtype=torch.int32)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(append.append_kv_operator, (k, v, *caches, lengths, None, cos, sin, True), test_utils=utils)
    torch.library.opcheck(append.rotate_operator, (k, cos, sin, lengths, 1, False), test_utils=utils)

# --- flash_attn_func: flash-attn's layout and order of arguments ------------------------------

def test_flash_attn_func_takes_flash_attns_layout_and_positional_order():
    from flashbook import reference

    seed = int(torch.randint(0, 2**30, ()))
    g = torch.Generator().manual_seed(seed)
    b, n_q, n_k, h, h_kv, d = 2, 40, 56, 4, 2, 32
    q = torch.randn(b, n_q, h, d, generator=g).requires_grad_()          # (batch, seq, heads, head_dim)
    k, v = (torch.randn(b, n_k, h_kv, d, generator=g).requires_grad_() for _ in range(2))
    o = flashbook.flash_attn_func(q, k, v, 0.0, 0.3, True)               # dropout_p, softmax_scale, causal
    assert o.shape == q.shape and o.is_contiguous()
    same = flashbook.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, scale=0.3)
    assert torch.equal(o, same.transpose(1, 2))
    # float64 truth, K/V heads repeated for the query heads that share them (GQA)
    rep = lambda x: x.detach().double().transpose(1, 2).repeat_interleave(h // h_kv, dim=1)   # noqa: E731
    truth = torch.stack([torch.from_numpy(reference.attention(a, b_, c, causal=True, scale=0.3))
                         for a, b_, c in zip(q.detach().double().transpose(1, 2).reshape(-1, n_q, d).numpy(),
                                             rep(k).reshape(-1, n_k, d).numpy(), rep(v).reshape(-1, n_k, d).numpy())])
    assert (o.detach().double().transpose(1, 2).reshape(-1, n_q, d) - truth).abs().max() < 1e-5
    o.square().sum().backward()
    assert all(x.grad is not None and x.grad.shape == x.shape and x.grad.abs().max() > 0 for x in (q, k, v))


def test_flash_attn_func_errors_speak_of_its_layout():
    q, k = torch.randn(1, 16, 3, 8), torch.randn(1, 16, 2, 8)
    with pytest.raises(ValueError, match=r"q must be a 4-D tensor in flash-attn's layout \(batch, seq, heads, head_dim\), got \(16, 3, 8\)"):
        flashbook.flash_attn_func(q[0], k, k)
    with pytest.raises(ValueError) as err:
        flashbook.flash_attn_func(q, k, k)
    assert "got q (1, 16, 3, 8), k (1, 16, 2, 8)" in str(err.value) and "transpose" not in str(err.value)
    with pytest.raises(ValueError, match="dropout_p"):
        flashbook.flash_attn_func(q, q, q, dropout_p=0.1)


def test_flash_attn_func_compiles():
    q, k, v = (torch.randn(2, 24, 2, 16).requires_grad_() for _ in range(3))

    def f(q, k, v):
        return flashbook.flash_attn_func(q, k, v, causal=True, softcap=0.0)

    torch._dynamo.reset()
    eager = _run(f, q, k, v, 7)
    for a, b in zip(_run(torch.compile(f, backend="aot_eager", fullgraph=True), q, k, v, 7), eager):
        assert torch.equal(a, b) and b.abs().max() > 0


# --- the review of the compiled path and the flash-attn names ---------------------------------

def test_outputs_keep_the_inputs_layout_compiled_and_eager():
    """An SDPA-style port (flash-attn's layout as transpose views, the output viewed back) runs
    eagerly and compiled alike: o has q's memory layout in both, so ``.view`` works in both."""
    b, s, h, d = 2, 24, 4, 16
    x, xk, xv = (torch.randn(b, s, h, d).requires_grad_() for _ in range(3))

    def port(q, k, v):
        o = flashbook.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        assert o.transpose(1, 2).is_contiguous()
        return o.transpose(1, 2).view(b, s, h * d)

    torch._dynamo.reset()
    eager = _run(port, x, xk, xv, 11)
    for a, e in zip(_run(torch.compile(port, backend="aot_eager", fullgraph=True), x, xk, xv, 11), eager):
        assert torch.equal(a, e) and a.stride() == e.stride()


def test_the_gluon_forward_returns_qs_layout_too(monkeypatch):
    """The Gluon kernel writes o contiguous; the front door hands it back in q's layout, as the
    Triton forward does (a stand-in kernel here: no Hopper GPU)."""
    from flashbook.kernels import autograd, hopper

    def contiguous_stand_in(q, k, v, *, causal=False, scale=None):
        o, lse = autograd.flash_forward(q, k, v, causal=causal, scale=scale)
        return o.contiguous(), lse

    monkeypatch.setattr(dispatch, "gluon_refusal", lambda *args: None)
    monkeypatch.setattr(dispatch, "choose_backend", lambda *args: ("gluon", "a stand-in"))
    monkeypatch.setattr(hopper, "gluon_forward", contiguous_stand_in)
    x = torch.randn(1, 20, 2, 16)
    o = flashbook.flash_attention(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2))
    assert flashbook.last_backend() == "gluon" and o.stride() == x.transpose(1, 2).stride()
    assert torch.equal(o, flashbook.flash_attention(*(x.transpose(1, 2),) * 3, backend="triton"))


def test_compiled_errors_speak_of_the_layout_passed():
    """A compiled flash_attn_func with mismatched heads fails while tracing, with the shapes as
    passed and no advice to transpose (the caller's layout is flash-attn's already)."""
    q, k = torch.randn(2, 24, 4, 16), torch.randn(2, 24, 3, 16)
    torch._dynamo.reset()
    with pytest.raises(ValueError) as err:
        torch.compile(flashbook.flash_attn_func, backend="aot_eager")(q, k, k)
    assert "got q (2, 24, 4, 16), k (2, 24, 3, 16)" in str(err.value) and "transpose" not in str(err.value)
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="causal must be True or False, got 1"):   # as eagerly
        torch.compile(lambda a, b, c: flashbook.flash_attn_func(a, b, c, causal=1), backend="aot_eager")(q, q, q)


def test_flash_attn_varlen_func_takes_flash_attns_order():
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**30, ())))
    cu = torch.tensor([0, 9, 30], dtype=torch.int32)
    q, k, v = (torch.randn(30, 2, 16, generator=g) for _ in range(3))
    o = flashbook.flash_attn_varlen_func(q, k, v, cu, cu, 21, 21, 0.0, 0.25, True)   # dropout_p, scale, causal
    assert torch.equal(o, flashbook.flash_attention_varlen(q, k, v, cu, cu, 21, 21, scale=0.25, causal=True))
    with pytest.raises(ValueError, match="block_table must be None"):
        flashbook.flash_attn_varlen_func(q, k, v, cu, cu, 21, 21, block_table=torch.zeros(2, 1, dtype=torch.int32))


def test_no_document_still_gives_every_input_a_gradient():
    none = torch.zeros(1, dtype=torch.int32)
    q, k, v = (torch.randn(0, 2, 16, requires_grad=True) for _ in range(3))
    o = flashbook.flash_attention_varlen(q, k, v, none, none, 0, 0)
    grads = torch.autograd.grad(o.sum(), (q, k, v))
    assert [tuple(g.shape) for g in grads] == [(0, 2, 16)] * 3


def test_decode_warns_when_q_looks_like_flash_attns_layout():
    """(batch, 1, 8, d) over a one-KV-head cache is one head and 8 new tokens here, or flash-attn's
    (batch, 1 new token, 8 heads, d): it runs, and says how to pass the other."""
    from flashbook.kernels import flash_decode

    q, cache = torch.randn(2, 1, 8, 16), torch.randn(2, 1, 40, 16)
    with pytest.warns(UserWarning, match=r"if it is flash-attn's \(batch, new tokens, heads, head_dim\), pass "
                                         r"q.transpose\(1, 2\)"):
        flash_decode(q, cache, cache, cache_seqlens=torch.tensor([30, 12], dtype=torch.int32))
