"""A call signature seen before launches from its plan (``flashbook.kernels.launch``).

The plan skips the checks and Triton's binding, so it must give exactly what the checked
path gives, for every mask, layout and entry point, and must never be used for a call
that differs in anything the checks or the compiled kernel read.

On the CPU the interpreter runs the kernels and plans are off (``call_key`` is None there);
these tests switch them on by giving ``launch`` a runtime that says "no interpreter", so the
plans' bookkeeping (which tensor goes where, what is allocated, what is kept) runs through
the interpreter's launches. The GPU tests check the same with the compiled kernels' own
launchers, the NaN-poisoned buffers and a CUDA graph.
"""
from __future__ import annotations

import types

import pytest
import torch

import flashbook
from flashbook import runtime
from flashbook.kernels import autograd, dispatch, launch, varlen

DEVICE = runtime.device()
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


@pytest.fixture
def plans_on(monkeypatch):
    """Plans as on a GPU, and none remembered from other tests."""
    if runtime.INTERPRET:
        monkeypatch.setattr(launch, "runtime", types.SimpleNamespace(INTERPRET=False))
    autograd.forget_plans()
    dispatch._CHOICES.clear()
    varlen._CHECKED.clear()
    yield
    autograd.forget_plans()
    dispatch._CHOICES.clear()
    varlen._CHECKED.clear()


def _grads(seed, fn, shapes, do_shape):
    gen = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(s, generator=gen).to(DEVICE, DTYPE).requires_grad_() for s in shapes]
    do = torch.randn(do_shape, generator=gen).to(DEVICE, DTYPE)
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


def _counts():
    return len(autograd._PLANS["forward"]), len(autograd._PLANS["backward"]), len(dispatch._CHOICES)


MASKS = [dict(causal=True), dict(causal=False), dict(causal=True, window=(7, 0), softcap=5.0),
         dict(causal=False, window=(5, 3)), dict(causal=True, prefix=6), dict(causal=True, alibi=True),
         dict(causal=True, scale=0.3)]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
def test_a_planned_call_is_the_checked_call(plans_on, mask):
    mask = dict(mask)
    slopes = (torch.rand(4, generator=torch.Generator().manual_seed(1)) * 0.3).to(DEVICE) if mask.pop("alibi", 0) else None
    shapes, do_shape = ((1, 4, 24, 16), (1, 2, 19, 16), (1, 2, 19, 16)), (1, 4, 24, 16)

    def fn(q, k, v):
        return flashbook.flash_attention(q, k, v, alibi_slopes=slopes, **mask)

    first = _grads(0, fn, shapes, do_shape)           # checked: makes the plans
    assert _counts() == (1, 1, 1)
    again = _grads(0, fn, shapes, do_shape)           # planned: the same inputs, the same bits
    other = _grads(5, fn, shapes, do_shape)           # planned: new values, the same signature
    assert _counts() == (1, 1, 1)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    autograd.forget_plans()
    dispatch._CHOICES.clear()
    checked = _grads(5, fn, shapes, do_shape)
    for a, b in zip(other, checked):
        assert torch.equal(a, b)


def test_a_different_signature_gets_its_own_plan(plans_on):
    shapes, do_shape = ((1, 2, 24, 16),) * 3, (1, 2, 24, 16)

    def plain(q, k, v):
        return flashbook.flash_attention(q, k, v, causal=True)

    _grads(0, plain, shapes, do_shape)
    _grads(0, lambda q, k, v: flashbook.flash_attention(q, k, v, causal=False), shapes, do_shape)
    assert _counts() == (2, 2, 2)
    # (batch, seq, heads, d) passed transposed: other strides, another plan, the same answer
    transposed = _grads(0, lambda q, k, v: plain(*(x.transpose(1, 2) for x in (q, k, v))), ((1, 24, 2, 16),) * 3,
                        (1, 2, 24, 16))
    assert _counts() == (3, 3, 3)
    again = _grads(0, lambda q, k, v: plain(*(x.transpose(1, 2) for x in (q, k, v))), ((1, 24, 2, 16),) * 3,
                   (1, 2, 24, 16))
    assert _counts() == (3, 3, 3) and all(torch.equal(a, b) for a, b in zip(transposed, again))
    # a head_dim that is not the last-stride-1 axis is copied by the checked path: never planned
    x = torch.randn(1, 2, 16, 24, device=DEVICE, dtype=DTYPE).transpose(2, 3)
    autograd.flash_forward(x, x, x, causal=True)
    assert len(autograd._PLANS["forward"]) == 3
    # a window given as a list, a scale given as a tensor: not plain values, the checked path
    assert launch.call_key((x,), ([3, 0],)) is None and launch.call_key((x,), (torch.tensor(0.5),)) is None
    assert launch.call_key((x, "q"), ()) is None
    autograd.set_autotune(False)   # switching autotuning forgets every plan
    assert len(autograd._PLANS["forward"]) == 0


def test_packed_documents_are_planned_too(plans_on):
    cu = torch.tensor([0, 7, 20, 33], dtype=torch.int32, device=DEVICE)

    def fn(q, k, v):
        return varlen.flash_attention_varlen(q, k, v, cu, cu, 13, 13, causal=True, window=(4, 0), check_values=False)

    shapes = ((33, 4, 16), (33, 2, 16), (33, 2, 16))
    first = _grads(3, fn, shapes, (33, 4, 16))
    assert _counts()[:2] == (1, 1)
    again = _grads(3, fn, shapes, (33, 4, 16))
    assert _counts()[:2] == (1, 1) and all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(varlen._CHECKED) == 1   # the entry point's checks, remembered once
    # with its value checks on (the default), a call is checked every time: cu_seqlens' values may change
    varlen.flash_attention_varlen(*(torch.randn(s).to(DEVICE, DTYPE) for s in shapes), cu, cu, 13, 13, causal=True)
    assert len(varlen._CHECKED) == 1
    with pytest.raises(ValueError, match="more than max_seqlen_q"):
        varlen.flash_attention_varlen(*(torch.randn(s).to(DEVICE, DTYPE) for s in shapes), cu, cu, 12, 13)


def test_a_plan_keeps_no_tensor_of_its_call_alive(plans_on):
    import gc
    import weakref

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=gen).to(DEVICE, DTYPE).requires_grad_() for _ in range(3))
    slopes = torch.rand(2, generator=gen).to(DEVICE)
    o = flashbook.flash_attention(q, k, v, causal=True, window=(5, 0), alibi_slopes=slopes)
    o.sum().backward()   # dO is a stride-0 view: the checked path copies it, and so does the plan
    assert _counts() == (1, 1, 1)
    grads = [x.grad.clone() for x in (q, k, v)]
    q.grad = k.grad = v.grad = None
    flashbook.flash_attention(q, k, v, causal=True, window=(5, 0), alibi_slopes=slopes).sum().backward()
    assert _counts() == (1, 1, 1) and all(torch.equal(a, x.grad) for a, x in zip(grads, (q, k, v)))
    refs = [weakref.ref(x) for x in (q, k, v, o, slopes)]
    del q, k, v, o, slopes
    gc.collect()
    assert all(r() is None for r in refs)   # a model's activations are not held by the plans


def test_launch_keeps_the_slots_it_was_given():
    calls = []

    class Kernel:
        arg_names = ["A", "n", "B", "FLAG"]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    run = launch.Launch(Kernel(), (3, 2), [None, 7], dict(B=None, FLAG=True, num_warps=4), [0, "B"])
    run("a", "b")
    assert calls == [((3, 2), ("a", 7), dict(B="b", FLAG=True, num_warps=4))]
    assert run.launcher is None   # no compiled kernel came back: the next call binds again
    plans = launch.Plans()
    plans.remember(None, "never")
    assert len(plans) == 0


def test_later_calls_take_the_compiled_kernels_launcher(monkeypatch):
    """After a launch through Triton returned a compiled kernel, the calls go to that kernel's
    own launcher with every parameter in order: the given ones, the defaults, this call's
    tensors in their places, and none of an earlier call's tensors kept."""
    monkeypatch.setattr(launch, "runtime", types.SimpleNamespace(INTERPRET=False))
    bound, launched = [], []

    class Param:
        def __init__(self, default=None):
            self.default = default

    class Compiled:
        launch_metadata = None

        def __getitem__(self, grid):
            return lambda *values: launched.append((grid, values))

    class Kernel:
        arg_names = ["A", "n", "B", "FLAG", "LATE"]
        params = [Param(), Param(), Param(), Param(), Param("late default")]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: bound.append((grid, args, kwargs)) or Compiled()

    a1, b1 = torch.ones(2), torch.zeros(2)
    run = launch.Launch(Kernel(), (3, 2), [a1, 7], dict(B=b1, FLAG=True, num_warps=4), [0, "B"])
    run(a1, b1)   # through Triton's binding
    assert len(bound) == 1 and bound[0][1][0] is a1 and bound[0][2]["B"] is b1
    a2, b2 = torch.ones(3), torch.zeros(3)
    run(a2, b2)   # the compiled kernel's launcher
    assert len(bound) == 1 and len(launched) == 1
    grid, values = launched[0]
    assert grid == (3, 2, 1) and values[0] is a2 and values[2] is b2
    assert values[1:2] + values[3:] == (7, True, "late default")
    assert all(x is not a1 and x is not b1 for x in run.values)


@pytest.mark.gpu
def test_gpu_plans_use_the_compiled_launchers_and_poisoned_buffers(plans_on):
    shapes, do_shape = ((2, 8, 300, 128), (2, 2, 300, 128), (2, 2, 300, 128)), (2, 8, 300, 128)

    def fn(q, k, v):
        return flashbook.flash_attention(q, k, v, causal=True, window=(100, 0), softcap=30.0)

    first = _grads(0, fn, shapes, do_shape)
    (plan,) = autograd._PLANS["backward"].values()
    with autograd.poisoned_outputs():
        for _ in range(20):
            again = _grads(0, fn, shapes, do_shape)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(run.launcher is not None for run, _ in plan.launches)   # the planned calls' launchers
    assert all(run.values[p] is None for run, _ in plan.launches for p in run.places)   # no tensor kept


@pytest.mark.gpu
def test_gpu_a_planned_forward_replays_in_a_cuda_graph(plans_on):
    from flashbook.timing import graph_replay

    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = flashbook.flash_attention(q, k, v, causal=True, window=(64, 0))
    replay, out = graph_replay(lambda: flashbook.flash_attention(q, k, v, causal=True, window=(64, 0)))
    for x in (q, k, v):
        x.copy_(torch.randn_like(x))
    replay()
    torch.cuda.synchronize()
    assert torch.equal(out, flashbook.flash_attention(q, k, v, causal=True, window=(64, 0)))
    assert not torch.equal(out, want)
