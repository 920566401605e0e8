"""Sliding windows and soft caps in the Triton kernels, against float64 (``flashbook.masks``).

Runs wherever the kernels run: in Triton's CPU interpreter here (float16 and float32;
the interpreter cannot compute bfloat16), on a GPU under ``pytest -m gpu`` through the
stress classes (``kernels.stress.MASKS``: 60 seeds each, outputs poisoned with NaN).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import flashbook
from flashbook import masks, runtime
from flashbook.kernels import autograd, checks, probes, stress

DEVICE = runtime.device()


# --- every mask class, forward and backward, by the book's error rule ------------------

#: length pairs where a window's edges, ragged tiles and rows that see no key meet
INTERPRETER_PAIRS = ((1, 1), (17, 33), (40, 9))
#: (dtype, GQA group, head_dim, batch, heads) each pair runs in (the interpreter is slow: one
#: case each; the GPU suite runs every class 60 times at batch 2 and 8 heads): a padded
#: head_dim in float32 over two batch entries, GQA 4 in float16
FP32, FP16 = ("fp32", 1, 24, 2, 2), ("fp16", 4, 16, 1, 4)
RUNS = {(1, 1): (FP32, FP16), (17, 33): (FP32,), (40, 9): (FP16,)}


@pytest.mark.slow
@pytest.mark.parametrize("window,causal,cap", stress.MASKS, ids=[stress.mask_name(*m) for m in stress.MASKS])
@pytest.mark.parametrize("n_q,n_k", INTERPRETER_PAIRS, ids=[f"{a}x{b}" for a, b in INTERPRETER_PAIRS])
def test_mask_class_in_the_interpreter(n_q, n_k, window, causal, cap):
    for dtype, group, head_dim, batch, heads in RUNS[n_q, n_k]:
        cases = stress.attention_class(n_q, n_k, dtype, causal, 1, batch=batch, heads=heads, groups=(group,),
                                       head_dims=(head_dim,), window=window, softcap=cap)
        result = stress.run_class(f"{dtype}-{n_q}x{n_k}", cases, DEVICE, first_seed=7 * n_q + n_k)
        assert result.runs == 1 and result.passed, stress.report(result)


@pytest.mark.slow
@pytest.mark.parametrize("prefix", stress.PREFIXES)
@pytest.mark.parametrize("n_q,n_k", INTERPRETER_PAIRS, ids=[f"{a}x{b}" for a, b in INTERPRETER_PAIRS])
def test_prefix_lm_class_in_the_interpreter(n_q, n_k, prefix):
    for dtype, group, head_dim, batch, heads in RUNS[n_q, n_k]:
        cases = stress.attention_class(n_q, n_k, dtype, True, 1, batch=batch, heads=heads, groups=(group,),
                                       head_dims=(head_dim,), prefix=prefix)
        result = stress.run_class(f"{dtype}-{n_q}x{n_k}-prefix{prefix}", cases, DEVICE, first_seed=n_q + prefix)
        assert result.runs == 1 and result.passed, stress.report(result)


def test_scores_far_below_zero_are_not_lost_behind_a_window():
    """Rows whose first visible key lies past the first key tile they visit: a running
    maximum stood in by 0 there would make exp2 of scores near -290 (log2 units) underflow
    to an all-zero row. Every score here is about -200, so each row's softmax is nearly
    uniform over the 3 keys of its window."""
    gen = torch.Generator().manual_seed(3)
    u = torch.nn.functional.normalize(torch.randn(16, generator=gen), dim=0)
    q = (200 ** 0.5 * u + 0.01 * torch.randn(1, 1, 64, 16, generator=gen))
    k = (-(200 ** 0.5) * u + 0.01 * torch.randn(1, 1, 64, 16, generator=gen))
    v = torch.randn(1, 1, 64, 16, generator=gen)
    want = masks.attention(*(x.double().numpy()[0, 0] for x in (q, k, v)), causal=True, window=(2, 0), scale=1.0)
    q, k, v = (x.to(DEVICE) for x in (q, k, v))
    o = autograd.flash_attention(q, k, v, causal=True, window=(2, 0), scale=1.0)
    assert np.abs(want).min(axis=1).max() > 0   # the truth is no zero row
    assert np.abs(o.cpu().numpy()[0, 0] - want).max() < 1e-4


# --- which tiles the kernels visit, against NumPy's count -----------------------------

@pytest.mark.parametrize("kernel", probes.KERNELS)
@pytest.mark.parametrize("n_q,n_k", [(64, 64), (128, 96), (96, 160), (100, 70)])
def test_the_kernels_visit_exactly_the_tiles_the_window_touches(kernel, n_q, n_k):
    for window in ((0, 0), (5, 0), (16, 40), (-1, 7), (50, -1), (200, 200)):
        for causal in (False, True):
            stages = probes.stage_map(n_q, n_k, 32, 16, causal, kernel, window=window)
            kinds = masks.tile_kinds(n_q, n_k, 32, 16, causal=causal, window=window)
            what = f"{kernel} {n_q}x{n_k} window={window} causal={causal}"
            assert (kinds[stages == "main"] == "full").all(), what   # unmasked only where nothing is hidden
            visited, touched = stages != "skipped", kinds != "skipped"
            if n_q % 32 == 0:
                assert (visited == touched).all(), what
            else:   # a ragged last query tile's missing rows may widen what it visits, never narrow it
                assert (visited >= touched).all(), what


@pytest.mark.parametrize("kernel", probes.KERNELS)
def test_a_prefix_lm_visits_exactly_the_tiles_its_mask_touches(kernel):
    for n_q, n_k in ((64, 64), (96, 160), (128, 96)):
        for prefix in (1, 16, 40, 100, 500):
            stages = probes.stage_map(n_q, n_k, 32, 16, True, kernel, prefix=prefix)
            kinds = masks.tile_kinds(n_q, n_k, 32, 16, causal=True, prefix=prefix)
            what = f"{kernel} {n_q}x{n_k} prefix={prefix}"
            assert (kinds[stages == "main"] == "full").all(), what
            assert ((stages != "skipped") == (kinds != "skipped")).all(), what


def test_a_sliding_window_visits_tiles_in_proportion_to_the_window_not_to_n_squared():
    visited = {}
    for n in (1024, 2048, 4096):
        stages = probes.stage_map(n, n, 64, 64, True, "forward", window=(255, 0))
        visited[n] = int((stages != "skipped").sum())
        assert visited[n] == masks.tile_counts(n, n, 64, 64, causal=True, window=(255, 0))["visited"]
    # each query tile visits the 5 key tiles that its 64 rows' 256-key windows reach
    assert visited == {n: 5 * (n // 64) - 10 for n in visited}


# --- the public call: conventions, the plain paths, errors ---------------------------

def _qkv(n_q=33, n_k=33, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, n, d, generator=gen).to(DEVICE) for n in (n_q, n_k, n_k)]


def test_no_window_and_the_causal_window_take_the_kernels_usual_paths():
    assert autograd.kernel_mask(False, None, None, 5, 7, 0.25) == (False, 0.25 * autograd.LOG2E, {})
    assert autograd.kernel_mask(False, (-1, -1), 0, 5, 7, 0.25)[2] == {}
    assert autograd.kernel_mask(False, (-1, 0), None, 5, 7, 0.25)[:2] == (True, 0.25 * autograd.LOG2E)
    causal, _, extra = autograd.kernel_mask(True, (4, 9), None, 5, 7, 0.25)   # causal: right is 0
    assert not causal and extra == dict(first=7 - 5 - 4, last=7 - 5, WINDOW=True)
    q, k, v = _qkv()
    both = [flashbook.flash_attention(q, k, v, causal=c, window=w) for c, w in ((True, None), (False, (-1, 0)))]
    assert torch.equal(both[0], both[1]) and flashbook.last_backend() == "triton"


@pytest.mark.parametrize("window,long,head_dim", [((3000, 0), True, 128), ((1000, 0), False, 128),
                                                  ((-1, 7), True, 128), (None, None, 128), ((4, 2), False, 128),
                                                  ((3000, 0), False, 64), ((-1, 7), False, 16)])
def test_the_kernels_choose_a_windows_tiles_by_its_length(monkeypatch, window, long, head_dim):
    """What the forward and the backward ask ``_run`` (the tiles' choice) for: a long window the
    causal mask's tiles above head_dim 64 and its own at 64 and below, a short one the window's own
    (``configs.tiles_for``), no window its own mask's. (The forward once passed the kernel's mask
    alone, so a short window's own forward tiles, 64 x 64 on sm_90 at d <= 128, were never used.)"""
    from flashbook.kernels import configs

    asked = []
    run = autograd._run

    def spy(kernel, x, bd, causal, key, launch, config=None, window=False):
        asked.append((kernel, causal, window))
        return run(kernel, x, bd, causal, key, launch, config, window)

    monkeypatch.setattr(autograd, "_run", spy)
    gen = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(1, 1, 40, head_dim, generator=gen).to(DEVICE, torch.float16) for _ in range(4))
    o, lse = autograd.flash_forward(q, k, v, causal=window is None or window[1] == 0, window=window)
    autograd.flash_backward(q, k, v, o, lse, do, causal=window is None or window[1] == 0, window=window)
    want = (True, False) if long or window is None else (False, True)
    assert asked == [("forward", *want), ("backward_dkdv", *want), ("backward_dq", *want)], asked
    assert configs.tiles_for(False, 3001) == (True, False) and configs.tiles_for(False, 1001) == (False, True)
    assert configs.tiles_for(False, 3001, 128) == (True, False) and configs.tiles_for(False, 3001, 64) == (False, True)
    # the backward's loops follow the window's length alone (autograd.one_loop), whatever its tiles
    assert configs.long_window(3001) and not configs.long_window(1001) and not configs.long_window(None)


def test_last_backend_names_the_kernel_of_a_packed_call():
    """flash_attention_varlen runs the Triton kernels: last_backend says so after it, not what
    the call before it ran (benchmarks record it per row)."""
    from flashbook.kernels import dispatch

    dispatch.record_backend("gluon", "a call before")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(40, 2, 16, generator=gen).to(DEVICE) for _ in range(3))
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=DEVICE)
    flashbook.flash_attention_varlen(q, k, v, cu, cu, 25, 25, causal=True)
    assert flashbook.last_backend() == "triton"
    assert "packed documents" in dispatch.explain_backend()[1]


def test_soft_cap_in_the_limit_of_a_large_cap_is_no_cap():
    q, k, v = _qkv(seed=1)
    plain = flashbook.flash_attention(q, k, v, causal=True)
    capped = flashbook.flash_attention(q, k, v, causal=True, softcap=1e6)
    # scores are O(5): c * tanh(s / c) differs from s by s^3 / (3 c^2), about 4e-11
    assert (capped - plain).abs().max() < 1e-5


def test_the_soft_cap_is_tanh_to_a_few_ulps_on_either_side_of_its_switch():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 64, 16, generator=gen)
    k = torch.randn(1, 1, 64, 16, generator=gen)
    v = torch.randn(1, 1, 64, 16, generator=gen)
    for cap in (0.5, 3.0, 50.0):   # |s / c| on both sides of 0.3, where the formula switches
        got = autograd.flash_attention(*(x.to(DEVICE) for x in (q, k, v)), softcap=cap)
        want = masks.attention(*(x.double().numpy()[0, 0] for x in (q, k, v)), softcap=cap)
        assert np.abs(got.cpu().numpy()[0, 0] - want).max() < 2e-6, cap


@pytest.mark.parametrize("bad,error,match", [
    ("left", TypeError, "window"), ((1, 2, 3), ValueError, "window"), ((2.0, 0), TypeError, r"window\[0\]"),
    ((0, True), TypeError, r"window\[1\]"), ((-5, 0), ValueError, r"window\[0\] = -5"),
])
def test_a_bad_window_is_refused_by_name(bad, error, match):
    q, k, v = _qkv()
    for call in (flashbook.flash_attention, autograd.flash_attention):
        with pytest.raises(error, match=match):
            call(q, k, v, window=bad)


@pytest.mark.parametrize("bad,error", [(-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                       ("30", TypeError), (True, TypeError)])
def test_a_bad_softcap_is_refused_by_name(bad, error):
    q, k, v = _qkv()
    for call in (flashbook.flash_attention, autograd.flash_attention):
        with pytest.raises(error, match="softcap"):
            call(q, k, v, softcap=bad)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(prefix=4), ValueError, "prefix=4 needs causal=True"),
    (dict(prefix=4, causal=True, window=(3, 0)), ValueError, "no window"),
    (dict(prefix=-1, causal=True), ValueError, "prefix must be >= 0"),
    (dict(prefix=True, causal=True), TypeError, "prefix must be an integer"),
])
def test_a_bad_prefix_is_refused_by_name(kwargs, error, match):
    q, k, v = _qkv()
    for call in (flashbook.flash_attention, autograd.flash_attention):
        with pytest.raises(error, match=match):
            call(q, k, v, **kwargs)


def test_the_gluon_backend_says_it_has_no_window():
    from flashbook.kernels import dispatch

    q, k, v = _qkv()
    assert "sliding window" in dispatch.gluon_refusal(q, k, v, True, (4, 0))
    with pytest.raises(ValueError, match="sliding window"):
        flashbook.flash_attention(q, k, v, window=(4, 0), backend="gluon")
    flashbook.flash_attention(q, k, v, window=(4, 0))
    assert dispatch.explain_backend()[0] == "triton"


# --- packed documents: flash_attention_varlen -----------------------------------------

#: The packed-document tests below build CPU tensors and hold float32 to 2e-5 (the interpreter's
#: IEEE products): they are the interpreter's. On a CUDA GPU (TF32 products) the stress classes
#: of tests/test_stress_gpu.py check packed documents against float64 instead.
INTERPRETER_ONLY = pytest.mark.skipif(DEVICE == "cuda", reason="CPU tensors and the interpreter's float32 "
                                      "tolerance; tests/test_stress_gpu.py checks packed documents on a GPU")


def _packed(lens_q, lens_k, heads=4, kv_heads=2, d=16, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    cu_q, cu_k = (torch.tensor(np.concatenate([[0], np.cumsum(n)]), dtype=torch.int32, device=DEVICE)
                  for n in (lens_q, lens_k))
    q = torch.randn(int(cu_q[-1]), heads, d, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(int(cu_k[-1]), kv_heads, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    return q, k, v, cu_q, cu_k


def _packed_truth(q, k, v, do, cu_q, cu_k, **mask):
    """float64 (o, dq, dk, dv) over the whole packed sequence, documents by id (``masks``)."""
    group = q.shape[1] // k.shape[1]
    heads_first = lambda x: x.detach().double().numpy().transpose(1, 0, 2)  # noqa: E731
    kn, vn = (np.repeat(heads_first(x), group, axis=0) for x in (k, v))
    ids = dict(doc_ids_q=masks.doc_ids_from_cu_seqlens(cu_q.numpy()),
               doc_ids_k=masks.doc_ids_from_cu_seqlens(cu_k.numpy()))
    o = masks.attention(heads_first(q), kn, vn, **ids, **mask)
    dq, dk, dv = masks.attention_backward(heads_first(q), kn, vn, heads_first(do), **ids, **mask)
    fold = lambda g: g.reshape(k.shape[1], group, *g.shape[1:]).sum(1).transpose(1, 0, 2)  # noqa: E731
    return o.transpose(1, 0, 2), dq.transpose(1, 0, 2), fold(dk), fold(dv)


@INTERPRETER_ONLY
@pytest.mark.parametrize("window,causal,cap", [((-1, -1), False, 0.0), ((-1, -1), True, 0.0), ((3, 0), True, 0.0),
                                               ((2, 5), False, 4.0)],
                         ids=["full", "causal", "window3-causal", "window2,5-softcap4"])
def test_packed_documents_match_float64_attention_within_each_document(window, causal, cap):
    # an empty document, one with queries and no keys, keys and no queries, ragged tiles
    lens_q, lens_k = [3, 0, 19, 5, 0], [6, 2, 19, 0, 4]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=len(window) + int(causal))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = flashbook.flash_attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         window=window, softcap=cap)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(9))
    o.backward(do)
    truth = _packed_truth(q, k, v, do, cu_q, cu_k, causal=causal, window=window, softcap=cap or None)
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *(x.grad for x in leaves)), truth):
        assert got.shape == want.shape, name
        assert np.abs(got.detach().numpy() - want).max() < 2e-5, name
    rows_without_keys = slice(int(cu_q[3]), int(cu_q[4]))   # document 3 has queries and no key
    assert not o[rows_without_keys].any() and not leaves[0].grad[rows_without_keys].any()


@INTERPRETER_ONLY
def test_equal_documents_give_the_batched_call_bit_for_bit():
    """Packed documents of one length are a batch: the same kernels over the same tiles."""
    q, k, v, cu_q, cu_k = _packed([21, 21, 21], [30, 30, 30], seed=4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = flashbook.flash_attention_varlen(*leaves, cu_q, cu_k, 21, 30, causal=True)
    o.backward(torch.ones_like(o))
    batched = [x.reshape(3, -1, *x.shape[1:]).transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]
    ob = flashbook.flash_attention(*batched, causal=True, backend="triton")
    ob.backward(torch.ones_like(ob))
    unbatch = lambda x: x.transpose(1, 2).reshape(-1, *x.shape[1:2], x.shape[-1])  # noqa: E731
    assert torch.equal(o, unbatch(ob))
    for packed, dense in zip(leaves, batched):
        assert torch.equal(packed.grad, unbatch(dense.grad))


@INTERPRETER_ONLY
def test_a_packed_call_is_one_autograd_node():
    """The (1, heads, total, d) views the kernels take are made inside ``varlen.PackedAttention``:
    autograd records the call and nothing for the views (each view's node cost the H200's host
    time per call), and the gradients come back in the inputs' (total, heads, d) layout."""
    q, k, v, cu_q, cu_k = _packed([5, 11], [7, 11], seed=3)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = flashbook.flash_attention_varlen(*leaves, cu_q, cu_k, 11, 11, causal=True)
    assert type(o.grad_fn).__name__ == "PackedAttentionBackward"
    assert [type(f).__name__ for f, _ in o.grad_fn.next_functions[:3]] == ["AccumulateGrad"] * 3
    o.backward(torch.randn(o.shape, generator=torch.Generator().manual_seed(2)))
    for x in leaves:
        assert x.grad.shape == x.shape and x.grad.is_contiguous() == x.is_contiguous() and x.grad.abs().sum() > 0


@INTERPRETER_ONLY
def test_packed_documents_start_heaviest_first_with_the_same_results(monkeypatch):
    """``varlen.longest_first``: the grid's rows take the documents by work (queries x keys), the
    most first, ties in their order, one document needs none; the order is kept for the same
    ``cu_seqlens`` and worked out again when they change in place. The same programs in another
    order: the output and every gradient bit for bit the order given's."""
    from flashbook.kernels import varlen

    lens_q, lens_k = [3, 0, 19, 5, 19], [6, 2, 19, 4, 19]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=5)
    order = varlen.longest_first(cu_q, cu_k)
    assert order.dtype == torch.int32 and order.tolist() == [2, 4, 3, 0, 1]
    assert varlen.longest_first(cu_q, cu_k) is order
    assert varlen.longest_first(cu_q[:2], cu_k[:2]) is None
    cu_q2, cu_k2 = cu_q.clone(), cu_k.clone()
    assert varlen.longest_first(cu_q2, cu_k2).tolist() == [2, 4, 3, 0, 1]
    cu_k2[1:] += 30   # the first document now has 36 keys: 3 x 36 = 108 is third
    assert varlen.longest_first(cu_q2, cu_k2).tolist() == [2, 4, 0, 3, 1]
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    launched, launch = [], autograd._launch

    def recording(kernel, grid, args, kwargs, names):   # each launch's kernel and its order
        launched.append((kernel.fn.__name__, kwargs.get("DOC_ORDER")))
        return launch(kernel, grid, args, kwargs, names)

    monkeypatch.setattr(autograd, "_launch", recording)
    results, orders = [], []
    for heaviest_first in (True, False):
        monkeypatch.setitem(varlen.ORDER, "longest_first", heaviest_first)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        launched.clear()
        o = flashbook.flash_attention_varlen(*leaves, cu_q, cu_k, 19, 19, causal=True)
        o.backward(do)
        results.append((o.detach(), *(x.grad for x in leaves)))
        orders.append({name: order for name, order in launched if name != "_bwd_delta"})
    # the forward and both backward kernels took the order, and only when it was on
    assert set(orders[0]) >= {"_attn_fwd", "_bwd_dkdv", "_bwd_dq"} or "_bwd_fused" in orders[0], orders[0]
    assert all(order is not None and order.tolist() == [2, 4, 3, 0, 1] for order in orders[0].values())
    assert orders[1] and all(order is None for order in orders[1].values())
    assert results[0][0].abs().max() > 0
    for name, a, b in zip(("o", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


@INTERPRETER_ONLY
def test_no_document_gives_zeros_and_zero_gradients():
    q, k, v, _, _ = _packed([4], [4])
    empty = torch.zeros(1, dtype=torch.int32)
    leaves = [x.clone().requires_grad_() for x in (q[:0], k[:0], v[:0])]
    o = flashbook.flash_attention_varlen(*leaves, empty, empty, 0, 0)
    assert o.shape == (0, 4, 16)


@pytest.mark.parametrize("change,error,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int64)), TypeError, "cu_seqlens_q must be a 1-D int32"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 9], dtype=torch.int32)), ValueError, "cu_seqlens_q must start at 0"),
    (dict(cu_seqlens_k=torch.tensor([0, 7, 5], dtype=torch.int32)), ValueError, "cu_seqlens_k must be nondecreasing"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32)), ValueError, "cu_seqlens_q must end at the packed length 9"),
    (dict(cu_seqlens_q=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "count the same documents"),
    (dict(max_seqlen_q=5), ValueError, "more than max_seqlen_q = 5"),
    (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    (dict(q=torch.randn(1, 9, 4, 16)), ValueError, "q must have 3 dimensions"),
    (dict(window=(1.5, 0)), TypeError, r"window\[0\]"),
])
def test_bad_varlen_arguments_are_refused_by_name(change, error, match):
    q, k, v, cu_q, cu_k = _packed([3, 6], [5, 2])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6, max_seqlen_k=5)
    args.update({name: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for name, x in change.items()})
    with pytest.raises(error, match=match):
        flashbook.flash_attention_varlen(**args)


@pytest.mark.parametrize("window,causal,cap", [((-1, -1), True, 0.0), stress.MASKS[-1]],
                         ids=["causal", stress.mask_name(*stress.MASKS[-1])])
def test_the_stress_harness_checks_packed_documents(window, causal, cap):
    """The GPU suite's varlen classes, once each in the interpreter: four documents of random
    lengths (some empty), each against float64 attention over that document alone."""
    for dtype, group in (("fp32", 1), ("fp16", 4)):
        cases = stress.attention_class(17, 17, dtype, causal, 1, batch=4, heads=4, groups=(group,), head_dims=(16,),
                                       kernel="varlen", window=window, softcap=cap)
        result = stress.run_class(f"varlen-{dtype}", cases, DEVICE, first_seed=11)
        assert result.runs == 1 and result.passed, stress.report(result)
    assert any(name.startswith("varlen-bf16-max129") for name, _ in stress.all_classes(("varlen",), runs=2))


# --- ALiBi biases (flash-attn's alibi_slopes) -----------------------------------------

def _fresh_seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return seed


def _slopes(shape, gen):
    """Slopes in [0.05, 0.55]: at ~40 keys the bias (up to ~20) reshapes every row's softmax."""
    return 0.05 + 0.5 * torch.rand(shape, generator=gen)


def _alibi_truth(q, k, v, do, **rule):
    """float64 (o, lse, dq, dk, dv) from ``flashbook.masks``, GQA's K/V heads repeated for the
    formula and their gradients summed back over the group."""
    group = q.shape[1] // k.shape[1]
    to64 = lambda x: x.detach().double().cpu().numpy()  # noqa: E731
    kn, vn = (np.repeat(to64(x), group, axis=1) for x in (k, v))
    o, lse = masks.attention(to64(q), kn, vn, return_lse=True, **rule)
    dq, dk, dv = masks.attention_backward(to64(q), kn, vn, to64(do), **rule)
    fold = lambda g: g.reshape(k.shape[0], k.shape[1], group, *g.shape[2:]).sum(2)  # noqa: E731
    return [torch.from_numpy(x) for x in (o, lse, dq, fold(dk), fold(dv))]


#: (dtype, seq_q, seq_k, batch, heads, group, head_dim, causal, window, softcap, slopes per batch entry)
ALIBI_CASES = {
    "alone": (torch.float32, 17, 33, 2, 2, 1, 24, False, None, None, False),
    "causal-more-queries-gqa": (torch.float16, 40, 9, 1, 4, 2, 16, True, None, None, False),
    "causal-more-keys-batch-slopes": (torch.float32, 9, 40, 2, 2, 1, 16, True, None, None, True),
    "window-softcap-batch-slopes": (torch.float32, 33, 17, 1, 4, 2, 16, False, (3, 2), 2.0, True),
    "causal-window-softcap-gqa4": (torch.float16, 33, 33, 2, 4, 4, 16, True, (5, 0), 1.5, True),
    "one-query": (torch.float32, 1, 17, 1, 2, 1, 16, True, None, None, False),
}


@pytest.mark.parametrize("case", ALIBI_CASES)
def test_alibi_forward_and_backward_match_float64(case):
    """o, lse and the three gradients against ``masks`` in float64, by the book's rule: within
    twice the error of PyTorch's own math in the same dtype (``checks.within_twice_yardstick``).
    The bias is large here (slopes up to 0.55 over up to 40 positions), so a bias left out, a
    wrong sign or a distance off by one puts o off by O(0.1), far outside the rule."""
    dtype, n_q, n_k, batch, heads, group, d, causal, window, cap, per_batch = ALIBI_CASES[case]
    gen = torch.Generator().manual_seed(_fresh_seed())
    q = torch.randn(batch, heads, n_q, d, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(batch, heads // group, n_k, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    do = torch.randn(batch, heads, n_q, d, generator=gen).to(DEVICE, dtype)
    slopes = _slopes((batch, heads) if per_batch else (heads,), gen).to(DEVICE)
    rule = dict(causal=causal, window=window, softcap=cap)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with autograd.poisoned_outputs():
        o = autograd.flash_attention(*leaves, alibi_slopes=slopes, **rule)
        o.backward(do)
        _, lse = autograd.flash_forward(q, k, v, alibi_slopes=slopes, **rule)
    o_want, lse_want, *grads_want = _alibi_truth(q, k, v, do, alibi_slopes=slopes.cpu().numpy(),
                                                 **dict(rule, window=window or (-1, -1)))
    yardstick = checks.torch_grads(q, k, v, do, dtype=dtype, alibi_slopes=slopes, **rule)
    seen = masks.allowed(n_q, n_k, causal=causal, window=window or (-1, -1)).sum(axis=1)
    terms = (1, 1, group * max(1, int((seen == 1).sum())), 1)   # dK: rows that see one key alone
    # the book's rule as the stress suite applies it: dQ and dK may also carry the error of the
    # kernel's own rounded o, read back for delta (a fresh seed once put fp16 dQ 2.2e-3 off, all
    # of it that term: checks.output_error_grads)
    problems = checks.backward_problems((o.detach(), *(x.grad for x in leaves)), (o_want, *grads_want),
                                        yardstick, q, k, v, do, head_dim=d, terms=terms, alibi_slopes=slopes, **rule)
    assert not problems, problems
    finite = torch.isfinite(lse_want)   # rows that see no key: -inf in both
    lse = lse.cpu()
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - lse_want[finite]).abs().max() < 1e-5 * (1 + lse_want[finite].abs().max())
    kn, vn = (x.repeat_interleave(group, 1).double().cpu().numpy() for x in (k, v))
    plain = masks.attention(q.double().cpu().numpy(), kn, vn, **dict(rule, window=window or (-1, -1)))
    assert np.abs(plain - o_want.numpy()).max() > 0.05   # the bias matters here


def test_torch_attention_adds_the_same_bias_as_the_numpy_truth():
    """``reference.torch_attention`` (the tests' yardstick) and ``masks.attention`` agree in
    float64, for (heads,) and (batch, heads) slopes and both alignments."""
    gen = torch.Generator().manual_seed(_fresh_seed())
    for n_q, n_k, causal in ((5, 9, False), (9, 5, True), (7, 7, False)):
        q, k, v = (torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for n in (n_q, n_k, n_k))
        for slopes in (_slopes((3,), gen), _slopes((2, 3), gen)):
            got = checks.torch_attention(q, k, v, causal=causal, softcap=2.0, alibi_slopes=slopes)
            want = masks.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, softcap=2.0,
                                   alibi_slopes=slopes.numpy())
            assert np.abs(got.nan_to_num().numpy() - want).max() < 1e-12


@INTERPRETER_ONLY
@pytest.mark.parametrize("per_document", [False, True], ids=["heads-slopes", "document-slopes"])
def test_packed_documents_with_alibi_count_positions_within_each_document(per_document):
    """Ragged documents (one empty, one with queries and no keys, one with keys and no queries):
    each against float64 attention over that document alone, with its own slopes."""
    lens_q, lens_k = [3, 0, 19, 5, 7], [6, 2, 19, 0, 11]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=_fresh_seed())
    gen = torch.Generator().manual_seed(_fresh_seed())
    slopes = _slopes((len(lens_q), 4) if per_document else (4,), gen)
    rule = dict(causal=True, window=(4, 0), softcap=3.0) if per_document else dict(window=(2, 5))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with autograd.poisoned_outputs():
        o = flashbook.flash_attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), alibi_slopes=slopes,
                                             **rule)
        do = torch.randn(o.shape, generator=gen)
        o.backward(do)
    heads_first = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731  (total, h, d) -> (1, h, total, d)
    for b in range(len(lens_q)):
        rows, cols = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if rows.stop == rows.start or cols.stop == cols.start:   # no query, or no key: zeros
            assert not o[rows].any() and not leaves[0].grad[rows].any(), b
            assert not any(x.grad[cols].any() for x in leaves[1:]), b
            continue
        o_want, _, *grads_want = _alibi_truth(*(heads_first(x[s]) for x, s in ((q, rows), (k, cols), (v, cols),
                                                                                (do, rows))),
                                              alibi_slopes=(slopes[b] if per_document else slopes).numpy(), **rule)
        got = (o[rows], leaves[0].grad[rows], leaves[1].grad[cols], leaves[2].grad[cols])
        for name, g, want in zip(("o", "dq", "dk", "dv"), got, (o_want, *grads_want)):
            assert (heads_first(g).double() - want).abs().max() < 2e-5, (b, name)   # float32, as above


def test_bad_alibi_slopes_are_refused_by_name():
    q, k, v = _qkv()   # batch 1, 2 heads
    cases = [(torch.rand(2, dtype=torch.float64), TypeError, "alibi_slopes must be a float32"),
             ([0.5, 0.25], TypeError, "alibi_slopes must be a float32 torch.Tensor"),
             (torch.rand(3), ValueError, r"alibi_slopes must have shape \(2,\) or \(1, 2\)"),
             (torch.rand(2, 2), ValueError, r"got \(2, 2\)"),
             (torch.rand(1, 1, 2), ValueError, "alibi_slopes must have shape"),
             (torch.rand(2, device="meta"), ValueError, "alibi_slopes must be on q's device")]
    for bad, error, match in cases:
        for call in (flashbook.flash_attention, autograd.flash_attention):
            with pytest.raises(error, match=match):
                call(q, k, v, alibi_slopes=bad)
    qp, kp, vp, cu_q, cu_k = _packed([3, 6], [5, 2])   # 2 documents, 4 heads
    with pytest.raises(ValueError, match=r"\(4,\) or \(2, 4\)"):
        flashbook.flash_attention_varlen(qp, kp, vp, cu_q, cu_k, 6, 5, alibi_slopes=torch.rand(1, 4))
    from flashbook.kernels import dispatch

    assert "ALiBi" in dispatch.gluon_refusal(q, k, v, alibi_slopes=torch.rand(2, device=DEVICE))
    with pytest.raises(ValueError, match="ALiBi"):
        flashbook.flash_attention(q, k, v, alibi_slopes=torch.rand(2, device=DEVICE), backend="gluon")



def test_the_alibi_fp16_dq_that_missed_the_rule_is_the_rounded_outputs_error(monkeypatch):
    """Seed 4071579741 put fp16 dQ (causal, 40 queries over 9 keys, GQA) 2.2e-3 off, just past
    the rule without its allowance; ``checks.output_error_grads`` explains that element to 1e-7:
    the backward reads the forward's rounded o for delta, as FlashAttention's does. With the
    allowance (``checks.backward_problems``) the case passes, and nothing else is loosened."""
    dtype, n_q, n_k, batch, heads, group, d, causal, window, cap, per_batch = ALIBI_CASES["causal-more-queries-gqa"]
    gen = torch.Generator().manual_seed(4071579741)
    q = torch.randn(batch, heads, n_q, d, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(batch, heads // group, n_k, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    do = torch.randn(batch, heads, n_q, d, generator=gen).to(DEVICE, dtype)
    slopes = _slopes((heads,), gen).to(DEVICE)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = autograd.flash_attention(*leaves, alibi_slopes=slopes, causal=True)
    o.backward(do)
    _, _, dq_want, _, _ = _alibi_truth(q, k, v, do, alibi_slopes=slopes.cpu().numpy(), causal=True, window=(-1, -1))
    yard = checks.torch_grads(q, k, v, do, dtype=dtype, alibi_slopes=slopes, causal=True)[1]
    dq = leaves[0].grad
    assert "dq: max error" in checks.within_twice_yardstick("dq", dq, dq_want, yard, head_dim=d)
    explained, _ = checks.output_error_grads(q, k, v, do, o.detach(), alibi_slopes=slopes, causal=True)
    err = dq.double().cpu() - dq_want
    worst = tuple(int(i) for i in (err.abs() == err.abs().max()).nonzero()[0])
    assert abs(float(err[worst]) - float(explained[worst])) < 1e-6 < abs(float(err[worst]))
    assert checks.within_twice_yardstick("dq", dq, dq_want, yard, head_dim=d,
                                         allow=float(explained.abs().max())) is None
