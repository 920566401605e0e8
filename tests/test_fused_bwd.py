"""The backward's dK/dV and dQ programs in one launch (``backward._bwd_fused``,
``autograd.fuse_backward``): bitwise the two launches' gradients for every mask it can take, in
FlexAttention's order and in the lab's alternating one (benchmarks/fused_bwd_experiment.py); one
launch where the two grids match, two where they do not (GQA, grouped heads); the rule takes it
for packed documents on sm_90 only; a plan replays it."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from flashbook import runtime
from flashbook.kernels import autograd, backward, configs, launch, varlen

from conftest import benchmark_script
from test_launch_order import forced

DEVICE = runtime.device()
MASKS = {
    "documents": dict(causal=True),
    "documents-alibi-softcap": dict(causal=True, softcap=4.0),
    "causal": dict(causal=True),
    "full": dict(causal=False),
    "window-softcap": dict(causal=True, window=(20, 0), softcap=4.0),
    "prefix": dict(causal=True, prefix=23),
}


def _inputs(name, seed, kv_heads=2):
    gen = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(1, 2, 90, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, 90, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    kw = dict(MASKS[name])
    if name.startswith("documents"):
        cu = torch.tensor(np.cumsum([0, 33, 1, 40, 16]), dtype=torch.int32, device=DEVICE)
        kw["packed"] = varlen.Packed(cu, cu, 40, 40, varlen.longest_first(cu, cu))
    if "alibi" in name:
        kw["alibi_slopes"] = torch.tensor([0.25, 0.0625], device=DEVICE)
    return q, k, v, do, kw


#: The interpreter's tiles, given on a GPU too: there the chip's own dK/dV and dQ tiles differ at
#: head_dim 16 (so their grids differ and the library rightly launches twice), and these tests are
#: about the one launch that matching grids allow.
SAME_GRIDS = dict(config_dkdv=configs.INTERPRETER["backward_dkdv"], config_dq=configs.INTERPRETER["backward_dq"])


#: The dQ tiles a refused one grid retries with: the same height, so the grids still match, and
#: twice the width (a GPU's tl.dot needs 16 or more along the summed axis).
WIDER_DQ = configs.Config(SAME_GRIDS["config_dq"].block_m, 2 * SAME_GRIDS["config_dq"].block_n,
                          SAME_GRIDS["config_dq"].num_warps, 1)


def _backward(q, k, v, o, lse, do, kw):
    return autograd.flash_backward(q, k, v, o, lse, do, **kw, **SAME_GRIDS)


def _launched(run):
    """(what run() returned, the kernels it launched after the delta kernel)."""
    kernels, original = [], autograd._launch

    def counting(kernel, grid, args, kwargs, names):
        kernels.append(kernel)
        return original(kernel, grid, args, kwargs, names)

    autograd._launch = counting
    try:
        return run(), kernels[1:]
    finally:
        autograd._launch = original


@pytest.mark.parametrize("name", sorted(MASKS))
def test_one_launch_computes_the_two_launches_gradients_bitwise(name):
    exp = benchmark_script("fused_bwd_experiment")
    q, k, v, do, kw = _inputs(name, len(name))
    o, lse = autograd.flash_forward(q, k, v, **kw)

    def grads():
        return _backward(q, k, v, o, lse, do, kw)

    with exp.backward("separate"):
        expected, kernels = _launched(grads)
    assert [k.fn.__name__ for k in kernels] == ["_bwd_dkdv", "_bwd_dq"]
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in expected)
    for variant, kernel in (("halves", backward._bwd_fused), ("interleaved", exp.INTERLEAVED),
                            ("tile_major", exp.TILE_MAJOR), ("given_order", backward._bwd_fused)):
        with exp.backward(variant):
            got, kernels = _launched(grads)
        assert kernels == [kernel], variant
        for what, a, b in zip(("dq", "dk", "dv"), expected, got):
            assert torch.equal(a, b), f"{variant}: {what} differs by {(a - b).abs().max().item()}"
    assert autograd._bwd_fused is backward._bwd_fused and autograd._state["fused_backward"] is None


def test_grids_that_differ_take_two_launches():
    """GQA (2 query heads a key head) gives the dQ kernel twice the dK/dV kernel's programs, and a
    small grid on sm_90 deals heads out in groups: either way the library launches twice."""
    q, k, v, do, kw = _inputs("causal", 5, kv_heads=1)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    with forced("fused_backward", True):
        fused, kernels = _launched(lambda: _backward(q, k, v, o, lse, do, kw))
    assert [k.fn.__name__ for k in kernels] == ["_bwd_dkdv", "_bwd_dq"]
    with forced("fused_backward", False):
        separate = _backward(q, k, v, o, lse, do, kw)
    assert all(torch.equal(a, b) for a, b in zip(fused, separate))
    q, k, v, do, kw = _inputs("causal", 6)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    with forced("fused_backward", True), forced("head_group", 2):
        _, kernels = _launched(lambda: _backward(q, k, v, o, lse, do, kw))
    assert [k.fn.__name__ for k in kernels] == ["_bwd_dkdv", "_bwd_dq"]


def test_the_rule_fuses_packed_documents_on_sm90_at_the_measured_head_dim_only(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert not autograd.fuse_backward(True, cpu, 128) and not autograd.fuse_backward(False, cpu, 128)
    monkeypatch.setattr(autograd, "_cc", lambda device: 90)
    assert autograd.fuse_backward(True, gpu, 128) and not autograd.fuse_backward(False, gpu, 128)
    assert not autograd.fuse_backward(True, gpu, 64) and not autograd.fuse_backward(True, gpu, 256)
    monkeypatch.setattr(autograd, "_cc", lambda device: 80)
    assert not autograd.fuse_backward(True, gpu, 128)
    with forced("fused_backward", True):
        assert autograd.fuse_backward(False, cpu, 16)
    with forced("fused_backward", False):
        monkeypatch.setattr(autograd, "_cc", lambda device: 90)
        assert not autograd.fuse_backward(True, gpu, 128)


def test_a_launch_that_does_not_fit_never_leaves_dk_dv_unwritten(monkeypatch):
    """If the one grid (or the dK/dV kernel kept for it) does not fit, the dQ kernel's next
    tiles are tried with the dK/dV launch still pending: every gradient is written or the call
    fails, never a dK or dV left as torch.empty made it."""
    q, k, v, do, kw = _inputs("documents", 8)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    with forced("fused_backward", False):   # the tiles the retry ends on (_run_with_two_dq_configs)
        expected = autograd.flash_backward(q, k, v, o, lse, do, **kw, config_dkdv=SAME_GRIDS["config_dkdv"],
                                           config_dq=WIDER_DQ)
    original, refused = autograd._launch, []

    def refuse_once(kernel, grid, args, kwargs, names):
        if kernel is backward._bwd_fused and not refused:
            refused.append(grid)
            raise autograd.OutOfResources(1, 0, "shared memory")
        return original(kernel, grid, args, kwargs, names)

    monkeypatch.setattr(autograd, "_launch", refuse_once)
    configs_tried = []
    monkeypatch.setattr(autograd, "_run", _run_with_two_dq_configs(autograd._run, configs_tried))
    # heads not dealt out in groups (a GPU does so for a grid this small): the grids can match
    with forced("fused_backward", True), forced("head_group", 1), autograd.poisoned_outputs():
        got = _backward(q, k, v, o, lse, do, kw)
    assert refused and len(configs_tried) == 2
    for what, a, b in zip(("dq", "dk", "dv"), expected, got):
        assert torch.equal(a, b), what


def _run_with_two_dq_configs(run, tried):
    """autograd._run where the dQ kernel has two candidate tiles, the interpreter's and
    ``WIDER_DQ``, and a refusal moves on to the next."""
    def patched(kernel, x, bd, causal, key, launch, config=None, window=False):
        if kernel != "backward_dq":
            return run(kernel, x, bd, causal, key, launch, config, window)
        for cfg in (SAME_GRIDS["config_dq"], WIDER_DQ):
            tried.append(cfg)
            try:
                launch(cfg)
                return cfg
            except autograd.OutOfResources:
                continue
        raise autograd.OutOfResources(1, 0, "shared memory")

    return patched


def test_a_plan_replays_the_one_launch(monkeypatch):
    """The second call of a signature replays the launches the first made: delta and the fused grid."""
    if runtime.INTERPRET:   # plans as on a GPU (test_launch's plans_on)
        monkeypatch.setattr(launch, "runtime", types.SimpleNamespace(INTERPRET=False))
    q, k, v, do, kw = _inputs("documents", 7)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    autograd.forget_plans()
    try:
        with forced("fused_backward", True), forced("head_group", 1):   # as above: one grid on a GPU too
            first, kernels = _launched(lambda: _backward(q, k, v, o, lse, do, kw))
            assert kernels == [backward._bwd_fused]
            do2 = torch.randn_like(do)
            replayed, kernels = _launched(lambda: _backward(q, k, v, o, lse, do2, kw))
            assert kernels == []   # the plan launches without autograd._launch
        with forced("fused_backward", False):
            autograd.forget_plans()
            expected = _backward(q, k, v, o, lse, do2, kw)
    finally:
        autograd.forget_plans()
    assert all(torch.equal(a, b) for a, b in zip(replayed, expected))
    assert not torch.equal(first[0], replayed[0])


def test_the_experiment_refuses_unknown_variants_and_restores_the_library():
    exp = benchmark_script("fused_bwd_experiment")
    with pytest.raises(ValueError, match="a variant is one of"):
        with exp.backward("fused"):
            pass
    with exp.backward("interleaved"):
        assert autograd._bwd_fused is exp.INTERLEAVED and autograd._state["head_group"] == 1
    assert autograd._bwd_fused is backward._bwd_fused and autograd._state["head_group"] is None


def test_both_experiments_record_each_shape_as_it_finishes(monkeypatch, tmp_path):
    """``one_loop_experiment.run_shapes`` (the loop both experiments run): a row per shape, the
    file rewritten after each; a shape that raises is recorded and the rest run with
    ``keep_going`` (the fused experiment), and stops the run without it (the one-loop one)."""
    import json

    exp = benchmark_script("one_loop_experiment")

    def fake(text, names, rounds, variant, base):
        if text.startswith("causal"):
            raise ValueError("grids differ")
        return {"shape": text, "median_ms": {n: 1.0 for n in names}, "spread": {n: 0.0 for n in names},
                "bitwise_equal": {n: True for n in names}}

    monkeypatch.setattr(exp, "run_shape", fake)
    path, record = tmp_path / "run.json", {"rows": []}
    exp.run_shapes("documents:8K:128,causal:8K:128,window:8K:128:1K", ["a", "b"], 1, str(path), record,
                   keep_going=True)
    rows = json.loads(path.read_text())["rows"]
    assert [r["shape"] for r in rows] == ["documents:8K:128", "causal:8K:128", "window:8K:128:1K"]
    assert rows[1] == {"shape": "causal:8K:128", "error": "ValueError: grids differ"} and rows == record["rows"]
    with pytest.raises(ValueError, match="grids differ"):
        exp.run_shapes("documents:8K:128,causal:8K:128", ["a"], 1, str(path), {"rows": []})
    assert [r["shape"] for r in json.loads(path.read_text())["rows"]] == ["documents:8K:128"]
