"""The stress test's harness, and a short run of it in Triton's interpreter (CI, no GPU).

The GPU suite (``test_stress_gpu.py``) runs about 10,000 seeded cases; here every length
class that the interpreter can show a masking bug in runs a few times in fp16 and fp32
with NaN-poisoned outputs, and the harness itself is checked: a kernel that leaves an
element unwritten, or is off by more than the rule allows, must fail.
"""
from __future__ import annotations

import os

import pytest
import torch

from flashbook import masks, runtime
from flashbook.kernels import autograd, checks, stress

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "results")

DEVICE = runtime.device()


def test_poisoned_outputs_fill_every_buffer_with_nan():
    q = torch.randn(1, 2, 3, 16)
    with autograd.poisoned_outputs():
        fresh = autograd.new_buffer(None, like=q)
        shaped = autograd.new_buffer((2, 5), device="cpu", dtype=torch.float32)
    assert fresh.isnan().all() and shaped.isnan().all() and fresh.stride() == q.stride()
    assert not autograd._state["poison"]   # the flag goes back when the block ends


def test_the_harness_catches_a_missed_write_and_a_wrong_value(monkeypatch):
    real = autograd.flash_attention
    case = stress.Case("attention", 1, 2, 2, 17, 17, 16, True, "fp32")
    assert stress.run_case(case, 1, DEVICE) == []

    def unwritten(*args, **kwargs):   # one output row left as the poison
        o = real(*args, **kwargs)
        return o.index_fill(2, torch.tensor([3], device=o.device), float("nan"))

    monkeypatch.setattr(autograd, "flash_attention", unwritten)
    assert any(p.startswith("o: max error inf") for p in stress.run_case(case, 1, DEVICE))

    def slightly_off(*args, **kwargs):
        return real(*args, **kwargs) * (1 + 1e-3)

    monkeypatch.setattr(autograd, "flash_attention", slightly_off)
    assert any(p.startswith("o:") for p in stress.run_case(case, 1, DEVICE))


def test_every_class_has_the_runs_it_asks_for():
    classes = stress.all_classes(runs=60)
    assert len({name for name, _ in classes}) == len(classes)
    assert all(len(cases) == 60 for _, cases in classes)
    assert sum(len(cases) for _, cases in classes) >= 9_000
    square = [c for name, cases in classes if name == "attention-bf16-1x1-causal" for c in cases]
    assert {(c.kv_heads, c.head_dim) for c in square} >= {(8, 128), (2, 128)}   # GQA 1 and 4 at d=128
    fp32 = [c for name, cases in classes if name.startswith("attention-fp32") for c in cases]
    assert {c.head_dim for c in fp32} == set(stress.FP32_HEAD_DIMS)    # one head_dim per pair, each met
    assert {(c.seq_q, c.seq_k) for c in fp32} == set(stress.LENGTH_PAIRS)


# (seq_q, seq_k): where tile edges, one-row tiles and rows that see no key meet
INTERPRETER_PAIRS = ((1, 1), (17, 17), (1, 40), (40, 1), (17, 33), (33, 17))


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("n_q,n_k", INTERPRETER_PAIRS, ids=[f"{a}x{b}" for a, b in INTERPRETER_PAIRS])
def test_interpreter_class_few_seeds(n_q, n_k, dtype, causal):
    # one batch of 4 query heads: a masking bug shows in every program alike, and GQA
    # groups 1 and 4 still map query heads to KV heads both ways (a quarter of the
    # programs of the default 2 x 8: 149 s of CI became a quarter of it)
    cases = stress.attention_class(n_q, n_k, dtype, causal, 2, batch=1, heads=4, groups=(1, 4),
                                   head_dims=(16, 24))
    result = stress.run_class(f"{dtype}-{n_q}x{n_k}", cases, DEVICE, first_seed=n_q * 1000 + n_k)
    assert result.passed, stress.report(result)


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [0, 16], ids=["dense", "paged16"])
@pytest.mark.parametrize("n_new", [1, 3])
def test_interpreter_decode_few_seeds(n_new, page_size):
    cases = stress.decode_class(n_new, "fp16", True, 2, n_max=40, heads=4, groups=(1, 4), head_dims=(16,),
                                page_size=page_size)
    result = stress.run_class(f"decode-{n_new}", cases, DEVICE, first_seed=n_new)
    assert result.passed, stress.report(result)


def test_the_decode_softcap_classes_run_the_cap_against_a_capped_truth():
    """The GPU suite's decode soft-cap classes (dense and paged, fp16 and bf16, 1 and 4 new
    tokens) exist, and one of them passes here with two seeds against the capped float64 truth."""
    names = [name for name, _ in stress.all_classes(kernels=("decode",), runs=2) if "softcap" in name]
    assert len(names) == 8 and all(name.endswith("-softcap5-causal") for name in names)
    cases = stress.decode_class(3, "fp16", True, 2, n_max=40, heads=4, groups=(1, 4), head_dims=(16,),
                                page_size=16, softcap=5.0)
    assert all(c.softcap == 5.0 for c in cases)
    result = stress.run_class("decode-softcap", cases, DEVICE, first_seed=7)
    assert result.passed, stress.report(result)


def test_a_key_seen_alone_lets_dk_sum_the_roundings_of_an_exact_zero():
    """One key, no mask: P = 1 in every row, so dK = 0 exactly, while the kernel's dS is
    dP (a dot product) minus delta (a row sum in another order): a few float32 ulps per
    row, summed over the rows of a KV head. The floor counts those rows, no more."""
    full = stress.Case("attention", 2, 8, 2, 64, 1, 80, False, "fp32")
    assert stress.alone_rows(full) == 4 * 64
    assert stress.alone_rows(stress.Case("attention", 2, 8, 2, 64, 1, 80, True, "fp32")) == 4
    assert stress.alone_rows(stress.Case("attention", 2, 8, 8, 17, 17, 80, False, "fp32")) == 1
    for seed in range(3):
        assert stress.run_case(full, seed, DEVICE) == []
    zero = torch.zeros(2, 2, 1, 80, dtype=torch.float64)
    floor = 8 * torch.finfo(torch.float32).eps * (80 * 256) ** 0.5     # 1.36e-4
    near, off = (zero + 0.5 * floor).float(), (zero + 1.5 * floor).float()
    assert checks.within_twice_yardstick("dk", near, zero, zero, head_dim=80, terms=256) is None
    assert "dk: max error" in checks.within_twice_yardstick("dk", off, zero, zero, head_dim=80, terms=256)
    assert "dk: max error" in checks.within_twice_yardstick("dk", near, zero, zero, head_dim=80)


def test_the_backward_is_granted_the_error_its_forward_output_carries():
    """A FlashAttention backward takes delta = rowsum(dO * o) from the forward's rounded o, so
    its dQ and dK carry the output's error; ``checks.output_error_grads`` is exactly that part
    (first order, here exact: the gradients are linear in delta). Against a float64 backward
    written out with o perturbed: equal to rounding."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for n in (5, 7, 7, 5))
    scale = 8 ** -0.5
    allowed = torch.as_tensor(masks.allowed(5, 7, causal=True, window=(3, 0)))
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1)
    o_true = p @ v
    o_kernel = o_true + 1e-3 * torch.randn(o_true.shape, generator=gen, dtype=torch.float64)
    def backward(o):   # dS = P (dP - rowsum(dO * o)), the kernels' formula, in float64
        ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        return ds @ k * scale, ds.transpose(-1, -2) @ q * scale
    (dq0, dk0), (dq1, dk1) = backward(o_true), backward(o_kernel)
    ddq, ddk = checks.output_error_grads(q, k, v, do, o_kernel, causal=True, window=(3, 0))
    assert torch.allclose(ddq, dq1 - dq0, atol=1e-13) and torch.allclose(ddk, dk1 - dk0, atol=1e-13)
    assert float(ddk.abs().max()) > 1e-4   # not a zero that passes any test
    same = checks.output_error_grads(q, k, v, do, o_true, causal=True, window=(3, 0))
    assert all(float(x.abs().max()) < 1e-14 for x in same)   # o exact to rounding: nothing granted


def test_the_allowance_in_head_chunks_is_the_allowance_of_the_whole(monkeypatch):
    """``checks.output_error_allowance`` works through ``checks.head_chunks`` (on an 80 GB H100
    the whole float64 autograd graph of a 4 x 32 x 4096 x 4096 case ran out of memory): with a
    budget that cuts every batch entry into single GQA groups, the largest elements are the
    whole computation's, ALiBi's per-head slopes following their heads (both slope shapes)."""
    gen = torch.Generator().manual_seed(5)
    q, do = (torch.randn(2, 4, 6, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 2, 9, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    o = checks.torch_attention(q, k, v, causal=True) + 1e-3 * torch.randn(2, 4, 6, 8, generator=gen,
                                                                           dtype=torch.float64)
    tiny = 6 * 9 * 8 * 6   # one head's float64 scores and autograd's copies: groups of 2 heads
    pieces = list(checks.head_chunks(q, k, budget=tiny))
    assert [(b.start, h.start, h.stop, g.start, g.stop) for b, h, g in pieces] == [
        (0, 0, 2, 0, 1), (0, 2, 4, 1, 2), (1, 0, 2, 0, 1), (1, 2, 4, 1, 2)]
    assert len(list(checks.head_chunks(q, k))) == 2   # the default budget: one chunk per batch entry
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)
    for mask in (dict(causal=True), dict(causal=True, alibi_slopes=slopes),
                 dict(causal=False, alibi_slopes=torch.stack([slopes, 2 * slopes]))):
        whole = [float(x.abs().max()) for x in checks.output_error_grads(q, k, v, do, o, **mask)]
        monkeypatch.setattr(checks, "head_chunks", lambda q, k: pieces)
        chunked = checks.output_error_allowance(q, k, v, do, o, **mask)
        monkeypatch.undo()
        assert chunked[0] == chunked[3] == 0.0 and min(whole) > 1e-5
        assert chunked[1:3] == pytest.approx(whole, rel=1e-12), (mask, chunked, whole)


def test_the_one_gpu_failure_of_run_14_is_the_forwards_output_error():
    """Stress run 14's one failure, replayed on the H200 (same error on three calls: not
    intermittent) with its inputs and outputs saved: document 1 (14 queries x 3 keys, window 3,
    causal, fp16) had a dK error of 1.11 x the rule's bound. The exact gradient given the
    kernel's own o (truth + output_error_grads) is within one fp16 step of what the kernel
    wrote; with that part granted the run passes, and twice the error would still fail."""
    run = torch.load(os.path.join(RESULTS, "stress_h200", "15_case_varlen-fp16-window3,0-causal_3060000.pt"))
    assert run["case"].startswith("varlen-fp16") and run["seed"] == 3060000
    (q, k, v, do), (cu_q, cu_k), (o, _, dk, _) = run["inputs"], run["lengths"], run["outputs"]
    one = lambda x, a, b: x[a:b].transpose(0, 1).unsqueeze(0)   # noqa: E731
    rows, keys = (cu_q[1], cu_q[2]), (cu_k[1], cu_k[2])
    ins = (one(q, *rows), one(k, *keys), one(v, *keys), one(do, *rows))
    mask = dict(causal=True, window=(3, 0), softcap=0.0, prefix=0, alibi_slopes=None)
    truth = checks.torch_grads(*ins, dtype=torch.float64, **mask)[2]
    yardstick = checks.torch_grads(*ins, dtype=torch.float16, **mask)[2]
    got = one(dk, *keys)
    _, ddk = checks.output_error_grads(*ins, one(o, *rows), **mask)
    step = torch.finfo(torch.float16).eps * float(truth.abs().max())
    assert float((got.double() - truth - ddk).abs().max()) <= step
    assert "dk: max error" in checks.within_twice_yardstick("dk", got, truth, yardstick, head_dim=16)
    allow = checks.output_error_allowance(*ins, one(o, *rows), **mask)[2]
    assert allow == float(ddk.abs().max())
    assert checks.within_twice_yardstick("dk", got, truth, yardstick, head_dim=16, allow=allow) is None
    worse = truth + 2 * (got.double() - truth)
    assert "the output's error" in checks.within_twice_yardstick("dk", worse.half(), truth, yardstick,
                                                                  head_dim=16, allow=allow)



@pytest.mark.slow
@pytest.mark.parametrize("window,causal,cap", stress.ALIBI_MASKS,
                         ids=[stress.mask_name(*m, alibi=True) for m in stress.ALIBI_MASKS])
def test_interpreter_alibi_classes_few_seeds(window, causal, cap):
    """The GPU suite's ALiBi classes, in float32 here (17 x 33: ragged, N_q != N_k), and
    packed documents with ALiBi, through the same harness."""
    cases = stress.attention_class(17, 33, "fp32", causal, 2, batch=1, heads=4, groups=(1, 4), head_dims=(16,),
                                   window=window, softcap=cap, alibi=True)
    if causal and window == (-1, -1):
        cases += stress.attention_class(17, 17, "fp32", True, 1, batch=3, heads=4, groups=(1,), head_dims=(16,),
                                        kernel="varlen", alibi=True)
    result = stress.run_class(f"alibi-{stress.mask_name(window, causal, cap)}", cases, DEVICE, first_seed=17)
    assert result.passed, stress.report(result)


def test_the_rule_and_its_bound_agree_and_a_run_replays(capsys):
    """``checks.error_bound`` is the rule's bound (a run passes exactly when its error is at most
    2 x the first part + the second), and ``benchmarks/replay_case.py`` replays a class's runs
    by seed, as a failure report names them, with each run's share of the bound."""
    import os
    import sys

    gen = torch.Generator().manual_seed(4)
    want = torch.randn(3, 40, generator=gen, dtype=torch.float64)
    yard = (want + 1e-3 * torch.randn(3, 40, generator=gen, dtype=torch.float64)).float()
    base, floor = checks.error_bound(yard, want, yard, head_dim=16)
    for scale in (0.5, 0.99, 1.01, 3.0):
        got = want.float() + scale * (2 * base + floor) * torch.sign(torch.randn(3, 40, generator=gen))
        err, _ = checks.max_error(got, want)
        passed = checks.within_twice_yardstick("o", got, want, yard, head_dim=16) is None
        assert passed == (err <= 2 * base + floor)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import replay_case

    assert replay_case.main(["attention-fp16-2x2-causal", "30000", "--times", "2"]) == 0
    assert replay_case.main(["attention-fp16-2x2-causal", "30000", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("right") == 2 and "of the bound" in out and "largest:" in out
    for bad in (["no-such-class", "1"], ["attention-fp16-2x2-causal", "20000"]):
        with pytest.raises(SystemExit):
            replay_case.main(bad)


def test_packed_documents_stress_the_one_launch_backward(monkeypatch):
    """The GPU classes ``varlen-...-fused`` force the backward's one launch (small classes would
    otherwise group heads and launch twice) at head_dims whose tile is the rule's 128, without
    GQA; here a small such case runs it in the interpreter, within the rule, and restores the
    library's switches."""
    from flashbook.kernels import backward

    fused = [(name, cases) for name, cases in stress.all_classes(kernels=("varlen",)) if name.endswith("-fused")]
    assert len(fused) == 8 and all(len(cases) == 60 for _, cases in fused)
    for _, cases in fused:
        assert all(c.fused and c.kv_heads == c.heads and c.kernel == "varlen" for c in cases)
        assert {c.head_dim for c in cases} == {128, 80} and cases[0].label().endswith("-fused")
    launched, original = [], autograd._launch
    monkeypatch.setattr(autograd, "_launch", lambda kernel, *a: launched.append(kernel) or original(kernel, *a))
    case = stress.Case("varlen", 4, 2, 2, 40, 40, 16, True, "fp16", fused=True)
    result = stress.run_class("varlen-fused-small", [case] * 2, DEVICE, first_seed=7)
    assert result.passed, stress.report(result)
    assert launched.count(backward._bwd_fused) == 2 and backward._bwd_dkdv not in launched
    assert autograd._state["fused_backward"] is None and autograd._state["head_group"] is None
