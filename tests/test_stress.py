"""The stress test's harness, and a short run of it in Triton's interpreter (CI, no GPU).

The GPU suite (``test_stress_gpu.py``) runs about 10,000 seeded cases; here every length
class that the interpreter can show a masking bug in runs a few times in fp16 and fp32
with NaN-poisoned outputs, and the harness itself is checked: a kernel that leaves an
element unwritten, or is off by more than the rule allows, must fail.
"""
from __future__ import annotations

import pytest
import torch

from flashbook import runtime
from flashbook.kernels import autograd, checks, stress

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
