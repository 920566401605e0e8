"""The Triton kernels, run in the interpreter on the CPU (or on a GPU if there is one).

Every case checks the output and all three gradients against the float64 truth
(``flashbook.reference``). Tolerance, as in the FlashAttention repository's own
tests: the same attention written in plain PyTorch and computed in the input
dtype is the yardstick, and the kernel may be at most twice as far from the truth
as it is. The yardstick rounds S, P, dP and dS to the input dtype; the kernel
keeps S and the softmax statistics in fp32 but rounds P and dS before its matrix
products, so it lands within that (measured: at most ~1.4x here for fp16). Two tiny
floors cover rounding luck rather than accuracy (see ``checks.within_twice_yardstick``):
a few float32 ulps for values that are exactly 0 (one key: dQ = dK = 0), and one
rounding step of the dtype at magnitude 1/4 for small tensors.
In the interpreter float32 dots are exact float32 (no TF32).

The shapes are small and odd on purpose (the interpreter is slow): lengths that
are not multiples of any tile, seq_q != seq_k both ways, rows that see no key,
head_dims that are not powers of two, grouped-query heads, transposed layouts.
"""
from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashbook
from flashbook import runtime
from flashbook.kernels import checks, configs
from flashbook.kernels import flash_backward, flash_forward

DEVICE = runtime.device()
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def make(shape, dtype, gen, layout="bhsd"):
    """Fresh normal inputs; layout 'bshd' builds (batch, seq, heads, d) and transposes."""
    b, h, n, d = shape
    if layout == "bshd":
        x = torch.randn(b, n, h, d, generator=gen, dtype=torch.float32).to(dtype).transpose(1, 2)
    elif layout == "strided_d":  # head_dim not contiguous: the library copies it
        x = torch.randn(b, h, n, 2 * d, generator=gen, dtype=torch.float32).to(dtype)[..., ::2]
    else:
        x = torch.randn(b, h, n, d, generator=gen, dtype=torch.float32).to(dtype)
    return x.to(DEVICE)


def run_case(b, h, h_kv, n_q, n_k, d, causal, dtype, *, dq_mode="separate", layout="bhsd",
             scale=None, seed=None):
    seed = random.randrange(2**31) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    q = make((b, h, n_q, d), dtype, gen, layout).requires_grad_()
    k = make((b, h_kv, n_k, d), dtype, gen, layout).requires_grad_()
    v = make((b, h_kv, n_k, d), dtype, gen, layout).requires_grad_()
    do = make((b, h, n_q, d), dtype, gen, layout)
    o = flashbook.flash_attention(q, k, v, causal=causal, scale=scale, dq_mode=dq_mode, backend="triton")
    o.backward(do)
    got = (o, q.grad, k.grad, v.grad)
    want = checks.reference_grads(q, k, v, do, causal=causal, scale=scale)
    yardstick = checks.torch_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal=causal, scale=scale,
                                  dtype=dtype)
    for name, g, w in zip(checks.GRADS, got, want):
        assert g.shape == w.shape and g.dtype == dtype, f"{name}: {g.shape} {g.dtype}"
    # the book's rule, dQ and dK granted the error of the kernel's own rounded o (read for delta)
    problems = checks.backward_problems(tuple(g.detach().cpu() for g in got), want, yardstick,
                                        *(x.detach().cpu() for x in (q, k, v, do)), head_dim=d,
                                        causal=causal, scale=scale)
    assert not problems, f"seed {seed}: " + "; ".join(problems)
    return q, k, v, o


# (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal, dtype)
CASES = {
    "seq1": (1, 2, 2, 1, 1, 16, False, "fp32"),
    "seq1-sees-all-keys": (1, 1, 1, 1, 17, 16, True, "fp16"),
    "17-causal": (2, 2, 2, 17, 17, 16, True, "fp16"),
    "113-causal": (1, 2, 2, 113, 113, 64, True, "fp16"),
    "113-full-fp32": (1, 2, 2, 113, 113, 64, False, "fp32"),
    "300-causal-d80": (1, 1, 1, 300, 300, 80, True, "fp16"),
    "q-shorter-causal-d128": (1, 2, 2, 17, 300, 128, True, "fp32"),
    "q-longer-full-d128": (1, 1, 1, 300, 113, 128, False, "fp16"),
    "gqa-causal-rows-see-nothing": (1, 4, 2, 113, 40, 64, True, "fp16"),
    "mqa-d80": (1, 4, 1, 17, 113, 80, False, "fp32"),
    "gqa-d16-q-shorter": (2, 6, 3, 40, 113, 16, True, "fp32"),
    "d256": (1, 1, 1, 40, 33, 256, True, "fp16"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case):
    b, h, h_kv, n_q, n_k, d, causal, dtype = CASES[case]
    run_case(b, h, h_kv, n_q, n_k, d, causal, DTYPES[dtype])


@pytest.mark.parametrize("case", ["113-causal", "gqa-causal-rows-see-nothing", "mqa-d80"])
def test_atomic_dq_matches_reference(case):
    b, h, h_kv, n_q, n_k, d, causal, dtype = CASES[case]
    run_case(b, h, h_kv, n_q, n_k, d, causal, DTYPES[dtype], dq_mode="atomic")


@settings(max_examples=8, deadline=None)
@given(n_q=st.integers(1, 80), n_k=st.integers(1, 80), d=st.sampled_from([16, 24, 40, 64]),
       group=st.sampled_from([1, 2]), causal=st.booleans(), dq_mode=st.sampled_from(["separate", "atomic"]))
def test_any_shape(n_q, n_k, d, group, causal, dq_mode):
    run_case(1, 2, 2 // group, n_q, n_k, d, causal, torch.float32, dq_mode=dq_mode)


def test_custom_scale():
    run_case(1, 2, 1, 40, 70, 32, True, torch.float32, scale=0.3)


def test_transposed_layout_is_used_as_is():
    """q, k, v built as (batch, seq, heads, d) and transposed: output and grads keep that layout."""
    q, k, v, o = run_case(1, 2, 2, 113, 113, 64, True, torch.float16, layout="bshd")
    assert not q.is_contiguous()
    assert o.stride() == q.stride()
    assert q.grad.stride() == q.stride() and k.grad.stride() == k.stride()


def test_head_dim_not_contiguous():
    run_case(1, 2, 2, 17, 33, 32, False, torch.float32, layout="strided_d")


@pytest.mark.parametrize("fwd,dkdv,dq", [
    (configs.Config(16, 32, 4, 1), configs.Config(32, 16, 4, 1), configs.Config(16, 32, 4, 1)),
    (configs.Config(64, 64, 4, 1), configs.Config(64, 64, 4, 1), configs.Config(64, 64, 4, 1)),
])
@pytest.mark.parametrize("n_q,n_k", [(70, 45), (45, 70)])
def test_other_tile_shapes(fwd, dkdv, dq, n_q, n_k):
    """The causal loop bounds hold for tiles wider or narrower than the diagonal's offset."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v, do = (torch.randn(1, 2, n, 32, generator=gen).to(DEVICE) for n in (n_q, n_k, n_k, n_q))
    o, lse = flash_forward(q, k, v, causal=True, config=fwd)
    for mode in ("separate", "atomic"):
        grads = flash_backward(q, k, v, o, lse, do, causal=True, dq_mode=mode,
                                config_dkdv=dkdv, config_dq=dq)
        want = checks.reference_grads(q, k, v, do, causal=True)
        for name, g, w in zip(("o", "dq", "dk", "dv"), (o, *grads), want):
            err, where = checks.max_error(g.cpu(), w)
            assert err < 1e-5 * (1 + float(w.abs().max())), f"{mode} {name}: {err:.2e} at {where}"


def test_lse_is_the_natural_log_logsumexp():
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen).to(DEVICE) for n in (40, 8, 8))
    _, lse = flash_forward(q, k, v, causal=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / 4.0
    allowed = torch.from_numpy(flashbook.reference.causal_mask(40, 8))
    want = torch.logsumexp(s.cpu().masked_fill(~allowed, float("-inf")), dim=-1)
    seen = allowed.any(-1)
    assert torch.allclose(lse.cpu()[..., seen].double(), want[..., seen], atol=1e-5)
    assert torch.all(lse.cpu()[..., ~seen] == float("-inf"))


@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_rows_that_see_no_key_give_zeros(dq_mode):
    """causal with seq_q > seq_k: the first seq_q - seq_k rows see no key at all."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen).to(DEVICE).requires_grad_() for n in (40, 8, 8))
    o = flashbook.flash_attention(q, k, v, causal=True, dq_mode=dq_mode)
    o.backward(torch.randn(o.shape, generator=gen).to(DEVICE))
    blind = slice(0, 40 - 8)
    for name, x in (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert torch.isfinite(x).all(), f"{name} has NaN or inf"
    assert torch.all(o[:, :, blind] == 0) and torch.all(q.grad[:, :, blind] == 0)
    assert o[:, :, 32:].abs().sum() > 0


def test_no_grad_forward_runs_without_saving():
    q = torch.randn(1, 1, 5, 16).to(DEVICE)
    with torch.no_grad():
        o = flashbook.flash_attention(q, q, q)
    assert o.shape == q.shape and not o.requires_grad


# ------------------------------------------------------------------ bad input

def _qkv(shape_q=(1, 2, 8, 16), shape_k=(1, 2, 8, 16), shape_v=None, dtype=torch.float32):
    shape_v = shape_v or shape_k
    return (torch.randn(shape_q, dtype=dtype), torch.randn(shape_k, dtype=dtype),
            torch.randn(shape_v, dtype=dtype))


BAD = {
    "q not a tensor": (lambda: ([[1.0]], *_qkv()[1:]), {}, TypeError, "q must be a torch.Tensor"),
    "q rank 3": (lambda: (torch.randn(2, 8, 16), *_qkv()[1:]), {}, ValueError, "q must have 4 dimensions"),
    "k rank 5": (lambda: (_qkv()[0], torch.randn(1, 1, 2, 8, 16), _qkv()[2]), {}, ValueError,
                 "k must have 4 dimensions"),
    "integer dtype": (lambda: tuple(x.long() for x in _qkv()), {}, TypeError, "q must be float16"),
    "float64": (lambda: tuple(x.double() for x in _qkv()), {}, TypeError, "q must be float16"),
    "mixed dtypes": (lambda: (_qkv()[0].half(), *_qkv()[1:]), {}, TypeError, "same dtype"),
    "batch mismatch": (lambda: _qkv(shape_k=(2, 2, 8, 16)), {}, ValueError, "batch size"),
    "k/v heads differ": (lambda: _qkv(shape_k=(1, 2, 8, 16), shape_v=(1, 1, 8, 16)), {}, ValueError,
                         "same number of heads"),
    "heads not divisible": (lambda: _qkv(shape_q=(1, 3, 8, 16)), {}, ValueError, "must divide"),
    "k/v lengths differ": (lambda: _qkv(shape_v=(1, 2, 9, 16)), {}, ValueError, "same sequence length"),
    "head_dim mismatch": (lambda: _qkv(shape_k=(1, 2, 8, 32)), {}, ValueError, "k must have q's head_dim"),
    "v head_dim mismatch": (lambda: _qkv(shape_v=(1, 2, 8, 32)), {}, ValueError, "v must have q's head_dim"),
    "head_dim 0": (lambda: _qkv((1, 2, 8, 0), (1, 2, 8, 0)), {}, ValueError, "q must have at least one head"),
    "no heads": (lambda: _qkv((1, 0, 8, 16), (1, 0, 8, 16)), {}, ValueError, "q must have at least one head"),
    "head_dim 257": (lambda: _qkv((1, 1, 2, 257), (1, 1, 2, 257)), {}, ValueError, "at most 256"),
    "scale 0": (lambda: _qkv(), {"scale": 0.0}, ValueError, "scale must be a finite number > 0"),
    "scale negative": (lambda: _qkv(), {"scale": -1.0}, ValueError, "scale"),
    "scale NaN": (lambda: _qkv(), {"scale": math.nan}, ValueError, "scale"),
    "scale inf": (lambda: _qkv(), {"scale": math.inf}, ValueError, "scale"),
    "scale string": (lambda: _qkv(), {"scale": "0.1"}, TypeError, "scale must be a real number"),
    "causal not bool": (lambda: _qkv(), {"causal": "yes"}, TypeError, "causal must be True or False"),
    "dq_mode unknown": (lambda: _qkv(), {"dq_mode": "fast"}, ValueError, "dq_mode must be one of"),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape_q,shape_k", [((1, 2, 0, 16), (1, 2, 8, 16)), ((1, 2, 5, 16), (1, 1, 0, 16)),
                                             ((0, 2, 4, 16), (0, 2, 4, 16)), ((1, 2, 0, 16), (1, 2, 0, 16))],
                         ids=["no-queries", "no-keys-gqa", "no-batch", "neither"])
def test_empty_sequences_give_empty_or_zero_results(shape_q, shape_k, causal):
    """seq_q = 0 or seq_k = 0 (or batch 0): an output of q's shape (empty, or zeros where
    no key exists) and gradients of the inputs' shapes, all zero, as SDPA gives; no error."""
    q, k, v = (x.to(DEVICE).requires_grad_() for x in _qkv(shape_q, shape_k))
    o = flashbook.flash_attention(q, k, v, causal=causal)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert torch.equal(o, torch.zeros_like(o))
    o.backward(torch.randn_like(o))
    for x in (q, k, v):
        assert x.grad.shape == x.shape and torch.equal(x.grad, torch.zeros_like(x))
    o, lse = flash_forward(q.detach(), k.detach(), v.detach(), causal=causal)
    assert lse.shape == q.shape[:3] and bool((lse == float("-inf")).all())


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_argument(case):
    make_args, kwargs, error, message = BAD[case]
    with pytest.raises(error, match=message):
        flashbook.flash_attention(*make_args(), **kwargs)


def test_mixed_devices_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="same device"):
        flashbook.flash_attention(q, k.to("meta"), v)


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU tensors are what the interpreter needs")
def test_cuda_kernels_want_the_interpreter_device():
    q, k, v = (x.to("meta") for x in _qkv())
    with pytest.raises(ValueError, match="CPU tensors"):
        flashbook.flash_attention(q, k, v)


@pytest.mark.skipif(DEVICE == "cuda", reason="bfloat16 runs on a GPU")
def test_bfloat16_is_refused_in_the_interpreter():
    q, k, v = _qkv(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16.*interpreter"):
        flashbook.flash_attention(q, k, v)


def test_backward_checks_what_forward_saved():
    """lse is indexed by row alone: a wrong one must be refused, not read."""
    from flashbook.kernels import flash_backward, flash_forward
    q, k, v = _qkv(shape_q=(1, 2, 16, 16), shape_k=(1, 2, 16, 16))
    o, lse = flash_forward(q, k, v)
    do = torch.randn_like(o)
    with pytest.raises(ValueError, match=r"lse must be a tensor of shape \(1, 2, 16\)"):
        flash_backward(q, k, v, o, lse[:, :1], do)
    with pytest.raises(ValueError, match="lse must be a tensor of shape"):
        flash_backward(q, k, v, o, lse.transpose(1, 2)[..., :2].reshape(1, 16, 2), do)
    with pytest.raises(TypeError, match="lse must be float32"):
        flash_backward(q, k, v, o, lse.half(), do)
    with pytest.raises(ValueError, match="do must be a tensor of shape"):
        flash_backward(q, k, v, o, lse, do[..., :8])
    dq, dk, dv = flash_backward(q, k, v, o, lse, do)   # and the right ones still work
    assert torch.isfinite(dq).all() and dq.abs().max() > 0


@pytest.mark.parametrize("causal", [False, True])
def test_every_ladder_rung_is_exact(causal):
    """Chapter 10's rungs switch optimisations off; each must still be attention."""
    import os

    import numpy as np

    from flashbook import reference
    from flashbook.kernels.ladder import RUNGS, run_rung
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    q = torch.randn(1, 2, 45, 32, dtype=torch.float32)     # ragged: 45 rows, 3 tiles of 16
    k = torch.randn(1, 2, 70, 32, dtype=torch.float32)
    v = torch.randn(1, 2, 70, 32, dtype=torch.float32)
    want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    for rung in RUNGS:
        o, lse = run_rung(rung, q, k, v, causal=causal)
        err = np.abs(o.double().numpy() - want).max()
        # fp32 in the interpreter: products exact to ~1e-7 relative, sums of 70 terms
        assert err < 1e-5, f"rung {rung.name!r}: max error {err:.2e}"
        s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(32)
        if causal:
            s = s.masked_fill(~torch.from_numpy(reference.causal_mask(45, 70)), float("-inf"))
        assert torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=1e-5), rung.name
    with pytest.raises(TypeError, match="rung must be one of"):
        run_rung("exp2", q, k, v)


def test_every_combination_of_features_is_exact():
    """Any mix of chapter 10's switches (not only the six rungs) is still attention,
    including rows that see no key at all (causal, seq_q > seq_k: output 0, lse -inf)."""
    import itertools
    import os

    import numpy as np

    from flashbook import reference
    from flashbook.kernels.ladder import FIRST_CONFIG, Features, Rung, run_rung
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    q = torch.randn(1, 2, 45, 16, dtype=torch.float32)
    k = torch.randn(1, 1, 30, 16, dtype=torch.float32)    # GQA, and 15 query rows that see no key
    v = torch.randn(1, 1, 30, 16, dtype=torch.float32)
    want = reference.attention(q.numpy(), k.repeat(1, 2, 1, 1).numpy(), v.repeat(1, 2, 1, 1).numpy(),
                               causal=True)
    blind = np.arange(45) < 45 - 30
    for flags in itertools.product((False, True), repeat=4):
        features = Features(*flags)
        o, lse = run_rung(Rung(str(flags), "", features, FIRST_CONFIG), q, k, v, causal=True)
        assert torch.isfinite(o).all(), features
        err = np.abs(o.double().numpy() - np.nan_to_num(want)).max()
        assert err < 1e-5, f"{features}: max error {err:.2e}"   # fp32, sums of at most 30 terms
        assert (o[:, :, blind] == 0).all() and torch.isinf(lse[:, :, blind]).all(), features
        assert (lse[:, :, blind] < 0).all() and torch.isfinite(lse[:, :, ~blind]).all(), features


def test_a_rung_swaps_only_helpers_the_library_kernel_calls():
    """A rung is ``_attn_fwd`` compiled against other helpers: each helper it swaps must be
    one ``_attn_fwd`` calls by that name (else the swap would silently change nothing),
    with the same arguments; the library's own features swap nothing."""
    from triton.runtime.jit import JITFunction

    from flashbook.kernels import forward, ladder
    assert ladder.rung_kernel(ladder.Features()) is forward._attn_fwd
    called = set(forward._attn_fwd.fn.__code__.co_names)
    for flags in ((False, True, True, True), (True, False, True, True), (True, True, False, True),
                  (True, True, True, False), (False, False, False, False)):
        features = ladder.Features(*flags)
        swapped = ladder.swaps(features)
        assert swapped and set(swapped) <= called, (features, set(swapped) - called)
        for name, plain in swapped.items():
            assert plain.arg_names == getattr(forward, name).arg_names, name
        kernel = ladder.rung_kernel(features)
        assert kernel is not forward._attn_fwd and kernel is ladder.rung_kernel(features)   # built once
        # what a GPU launch reads (the interpreter does not): the same constexpr arguments
        gpu_view = [(p.name, p.is_constexpr) for p in JITFunction(kernel.fn).params]
        assert gpu_view == [(p.name, p.is_constexpr) for p in JITFunction(forward._attn_fwd.fn).params]
        # HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, DOT_PRECISION, WINDOW, SOFTCAP, VARLEN, PREFIX, ALIBI,
        # HEAD_GROUP, HEAVY_LAST
        assert sum(c for _, c in gpu_view) == 13, gpu_view
    with pytest.raises(TypeError, match="features must be"):
        ladder.rung_kernel((True, True, True, True))
    with pytest.raises(ValueError, match="calls no helper named"):
        ladder.kernel_with({"attend_fast": forward.attend})
    fixed = ladder.kernel_with({}, constexprs=("seq_q", "seq_k"))   # an experiment's knob
    assert [p.name for p in JITFunction(fixed.fn).params if p.is_constexpr][:2] == ["seq_q", "seq_k"]
    with pytest.raises(ValueError, match="constexprs must name arguments"):
        ladder.kernel_with({}, constexprs=("seq_len",))
    # another kernel as the base (benchmarks/atomic_dq_experiment.py's dK/dV variants)
    from flashbook.kernels import backward

    assert ladder.kernel_with({}, base=backward._bwd_dkdv) is backward._bwd_dkdv
    with pytest.raises(ValueError, match="_bwd_dkdv calls no helper named"):
        ladder.kernel_with({"attend": forward.attend}, base=backward._bwd_dkdv)
    inner = ladder.kernel_with({"_bwd_dkdv_inner": backward._bwd_dkdv_inner}, base=backward._bwd_dkdv)
    assert inner is not backward._bwd_dkdv
    assert [p.name for p in JITFunction(inner.fn).params] == [p.name for p in JITFunction(backward._bwd_dkdv.fn).params]


def test_rung_kernels_are_specialised_as_the_library_compiles_its_kernel(monkeypatch):
    """A rung is the library's kernel with helpers swapped, compiled with the same length
    specialisation: rungs once compiled with seq_q and seq_k never specialised ran the first
    kernel 12-26% slower than the ladder recorded it (benchmarks/results/ladder_shapes_h100)."""
    from flashbook.kernels import forward, ladder

    seen = []
    real_jit = ladder.triton.jit

    def jit(fn, **kw):
        seen.append((fn.__name__, kw.get("do_not_specialize")))
        return real_jit(fn, **kw)

    monkeypatch.setattr(ladder.triton, "jit", jit)
    monkeypatch.setattr(ladder, "_kernels", {})
    for rung in ladder.RUNGS[:4]:
        assert ladder.rung_kernel(rung.features) is not forward._attn_fwd
    assert seen and all(dns == [] for _, dns in seen), seen   # _attn_fwd: every argument specialised
    seen.clear()
    ladder.kernel_with({}, constexprs=("seq_q",))
    assert seen == [("_attn_fwd", [])]


def test_atomic_dq_experiment_variants_are_exact_in_the_interpreter():
    """benchmarks/atomic_dq_experiment.py's relaxed and staggered dK/dV kernels give the
    library's gradients (float32, a length whose main stage has several query tiles)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import atomic_dq_experiment as exp

    gen = torch.Generator().manual_seed(3)
    for causal in (False, True):
        q, k, v, do = (torch.randn(1, 2, 80, 16, generator=gen) for _ in range(4))
        o, lse = flash_forward(q, k, v, causal=causal)
        ref = exp.reference_grads(q, k, v, do, causal)
        for name, kernel, mode, config in exp.VARIANTS:
            if config is None:   # the interpreter takes its own tiles
                grads = exp.run_variant(kernel, mode, config, q, k, v, o, lse, do, causal)
                for g, r in zip(grads, ref):
                    assert (g[:1, :1].double() - r).abs().max() < 1e-4, (name, causal)


def test_static_shape_experiment_is_exact():
    """benchmarks/static_shape_experiment.py's kernels (lengths as compile-time constants, and
    the query tile loaded without a row mask) compute attention at lengths they allow."""
    import os

    import numpy as np

    from conftest import benchmark_script
    from flashbook import reference
    from flashbook.kernels.autograd import forward_with
    static = benchmark_script("static_shape_experiment")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    for name, kernel in static.VARIANTS:
        for causal, nk in ((False, 96), (True, 64), (True, 96)):   # 64 query rows: whole tiles
            q, k, v = torch.randn(1, 2, 64, 32), torch.randn(1, 2, nk, 32), torch.randn(1, 2, nk, 32)
            o, _ = forward_with(kernel, q, k, v, causal=causal)
            want = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
            assert np.abs(o.double().numpy() - want).max() < 1e-5, (name, causal, nk)   # fp32, <= 96 terms


def test_lazy_rescaling_experiment_is_exact():
    """The variant benchmarks/lazy_rescale_experiment.py timed (and rejected: slower on an
    H200) must still compute attention, also when the row maxima jump by more than its
    threshold between tiles (scores scaled up 4x) and for rows that see no key."""
    import os

    import numpy as np

    from conftest import benchmark_script
    from flashbook import reference
    from flashbook.kernels.autograd import forward_with
    lazy = benchmark_script("lazy_rescale_experiment")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    for causal, (nq, nk) in ((False, (45, 70)), (True, (70, 45)), (True, (64, 64))):
        q, k = torch.randn(1, 2, nq, 32) * 4, torch.randn(1, 2, nk, 32) * 4
        v = torch.randn(1, 2, nk, 32)
        o, lse = forward_with(lazy.LAZY, q, k, v, causal=causal)
        want = np.nan_to_num(reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal))
        # fp32 in the interpreter: sums of nk weights that the lazy variant lets grow up to 2^8
        # before it rescales, so a relative error of about nk float32 ulps in the row sum and
        # as much in o, against |o| <= max|v| (a fixed 1e-5 failed a fresh draw at 1.13e-5)
        bound = 4 * nk * torch.finfo(torch.float32).eps * float(v.abs().max())
        assert np.abs(o.double().numpy() - want).max() < bound, (causal, nq, nk, bound)
        assert torch.isfinite(o).all()


# ------------------------------------------------------------ float32: PyTorch's switch

@pytest.fixture
def torch_matmul_precision():
    """Set PyTorch's float32 matmul switch for one test; restore it and the override after."""
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)
    flashbook.kernels.set_fp32_precision(None)


# (PyTorch's switch, set_fp32_precision's override, what the kernels must get)
FP32_SELECTION = [
    ("highest", None, "ieee"), ("high", None, "tf32"), ("medium", None, "tf32"),
    ("highest", "tf32", "tf32"), ("high", "ieee", "ieee"), ("medium", "ieee", "ieee"),
]


@pytest.mark.parametrize("torch_setting, override, want", FP32_SELECTION)
def test_fp32_launches_follow_torch_switch(torch_matmul_precision, monkeypatch, torch_setting, override, want):
    """Every kernel launch with float32 inputs passes the precision the switch asks for.

    The interpreter ignores ``input_precision``, so what is checked is the argument
    each launch hands to the kernel (the GPU tests check what it does to the error).
    """
    from flashbook.kernels import autograd

    seen = {}

    class Spy:  # stands in for a @triton.jit kernel: kernel[grid](*args, **meta)
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **meta):
                seen.setdefault(self.name, set()).add(meta.get("DOT_PRECISION"))
                return self.kernel[grid](*args, **meta)
            return launch

    for name in ("_attn_fwd", "_bwd_dkdv", "_bwd_dq"):
        monkeypatch.setattr(autograd, name, Spy(name, getattr(autograd, name)))
    torch_matmul_precision(torch_setting)
    flashbook.kernels.set_fp32_precision(override)
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = (make((1, 1, 9, 16), torch.float32, gen).requires_grad_() for _ in range(3))
    flashbook.flash_attention(q, k, v, causal=True).sum().backward()
    assert seen == {"_attn_fwd": {want}, "_bwd_dkdv": {want}, "_bwd_dq": {want}}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_ignore_the_fp32_switch(torch_matmul_precision, dtype):
    torch_matmul_precision("highest")
    assert flashbook.kernels.dot_precision(dtype) == "tf32"  # the neutral value: exact products anyway


def test_fp32_precision_refuses_unknown_names():
    with pytest.raises(ValueError, match="precision must be"):
        flashbook.kernels.set_fp32_precision("highest")  # PyTorch's word, not ours
