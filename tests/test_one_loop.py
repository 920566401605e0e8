"""The backward's ``ONE_LOOP`` (``autograd.one_loop``): a program's tiles in one masked loop
instead of three computes bitwise the same gradients, for every mask the kernels take, in the
interpreter; the rule takes it for a short sliding window only; and the experiment that times
it (benchmarks/one_loop_experiment.py) switches it and restores the library's choice."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashbook import runtime
from flashbook.kernels import autograd, configs, varlen

from conftest import benchmark_script
from test_launch_order import forced

DEVICE = runtime.device()

MASKS = {   # name: flash_forward / flash_backward keywords beyond causal (documents: see below)
    "causal": dict(causal=True),
    "full-gqa": dict(causal=False),
    "window": dict(causal=True, window=(20, 0)),
    "window-both-sides": dict(causal=False, window=(12, 7), softcap=4.0),
    "prefix": dict(causal=True, prefix=23),
    "documents": dict(causal=True),
}


def _gradients(kw, q, k, v, do):
    o, lse = autograd.flash_forward(q, k, v, **kw)
    return autograd.flash_backward(q, k, v, o, lse, do, **kw)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_one_loop_computes_the_three_loops_gradients_bitwise(name):
    gen = torch.Generator().manual_seed(len(name))
    kv_heads = 1 if name == "full-gqa" else 2
    q, do = (torch.randn(1, 2, 90, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, 90, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    kw = dict(MASKS[name])
    if name == "documents":
        cu = torch.tensor(np.cumsum([0, 33, 1, 40, 16]), dtype=torch.int32, device=DEVICE)
        kw["packed"] = varlen.Packed(cu, cu, 40, 40)
    with forced("one_loop", False):
        three = _gradients(kw, q, k, v, do)
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in three)
    with forced("one_loop", True):
        one = _gradients(kw, q, k, v, do)
    for what, a, b in zip(("dq", "dk", "dv"), three, one):
        assert torch.equal(a, b), f"{what} differs in one loop: {(a - b).abs().max().item()}"


def test_the_rule_takes_one_loop_for_a_short_window_only():
    assert autograd.one_loop(True) == {"ONE_LOOP": True} and autograd.one_loop(False) == {}
    # configs.tiles_for's "short window" is the rule's input: rows of fewer than LONG_WINDOW keys
    assert configs.tiles_for(False, configs.LONG_WINDOW - 1) == (False, True)
    assert configs.tiles_for(False, configs.LONG_WINDOW) == (True, False)
    assert configs.tiles_for(True, None) == (True, False)
    with forced("one_loop", True):
        assert autograd.one_loop(False) == {"ONE_LOOP": True}
    with forced("one_loop", False):
        assert autograd.one_loop(True) == {}


def test_the_experiment_switches_the_loops_and_restores_the_rule():
    exp = benchmark_script("one_loop_experiment")
    assert exp.VARIANTS == {"rule": None, "three": False, "one": True}
    with exp.loops("one"):
        assert autograd._state["one_loop"] is True
    assert autograd._state["one_loop"] is None
