"""Chapter 10's Gluon kernel (``flashbook.kernels.hopper``) and its lab's variants
(``benchmarks/gluon_lab.py``) on a Hopper GPU: ``pytest -m gpu``.

Every case runs forward and backward (the backward is chapter 8's, from the o and lse
the Gluon kernel saved) against the float64 truth, with the book's yardstick: at most
twice the error of plain PyTorch attention computed in the input dtype. Shapes cover
batch > 1, GQA and MQA, seq_q != seq_k (causal, diagonal bottom-right), both head dims,
both key tiles, ring depths of 2 to 4, each schedule (the library's ``hopper.SCHEDULES`` and the
lab's ``gluon_lab.SCHEDULES``) with one to three warpgroups per program, sequence lengths that are
not whole tiles, float16 and bfloat16, with fresh random inputs; the lab's FMA exponentials too.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import benchmark_script
from flashbook import reference
from flashbook.kernels import checks, hopper

lab = benchmark_script("gluon_lab")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not hopper.available(), reason="needs a Hopper GPU and Triton's Gluon")]

# (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal)
CASES = {
    "square": (2, 4, 4, 256, 256, 128, False),
    "square-causal": (2, 2, 2, 512, 512, 128, True),
    "gqa-q-shorter-causal-d64": (1, 4, 2, 128, 384, 64, True),
    "mqa-q-shorter-d128": (1, 8, 1, 256, 512, 128, False),
    "one-tile-causal-d64": (3, 2, 2, 128, 128, 64, True),
    # seq_q not a whole number of tiles: the last tile overlaps the one before
    "ragged-gqa-causal-d64": (2, 4, 2, 320, 512, 64, True),
    "ragged-d64": (1, 2, 2, 448, 384, 64, False),
    "ragged-mqa-causal-d128": (1, 2, 1, 320, 384, 128, True),
    # seq_k not a whole number of key tiles (the last overlaps the one before), seq_q not of 64
    "ragged-keys-d128": (2, 4, 4, 200, 333, 128, False),
    "ragged-keys-causal-gqa-d64": (1, 4, 2, 1000, 1000, 64, True),
    "ragged-keys-mqa-causal-d128": (1, 4, 1, 130, 777, 128, True),
    "short-causal-d128": (2, 2, 2, 100, 100, 128, True),
}
#: (block_m, block_n, stages, schedule): every schedule, both key tiles, ring depths 2 to 4,
#: one to three warpgroups per program (one: the overlap schedule only); "pingpong" is the lab's
CONFIGS = [(64, 64, 3, "overlap"), (64, 128, 2, "overlap"), (128, 128, 3, "overlap"), (128, 64, 4, "overlap"),
           (128, 128, 2, "producer"), (128, 64, 3, "producer"), (128, 128, 3, "pingpong"), (128, 64, 2, "pingpong"),
           (192, 128, 4, "producer"), (192, 64, 3, "producer")]


def runs(case, config) -> bool:
    """Whether the kernel takes ``config`` at ``case`` (three warpgroups: d=64 only, as the defaults;
    the lab's own schedules: whole tiles only)."""
    _, _, _, n_q, n_k, d, _ = CASES[case]
    block_m, block_n = config[:2]
    schedule = config[3] if len(config) > 3 else "persistent"
    whole = schedule in hopper.SCHEDULES or (n_q % 64 == 0 and n_k % block_n == 0)
    return n_q >= block_m and n_k >= block_n and whole and (block_m != 192 or d == 64)


PAIRS = [(case, config) for case in CASES for config in CONFIGS if runs(case, config)]


def random_inputs(case, dtype):
    """Fresh random q, k, v, dO for ``case`` on the GPU, and the seed that made them."""
    b, h, h_kv, n_q, n_k, d, causal = CASES[case]
    seed = random.randrange(2**31)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=gen)
    do = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=gen)
    return seed, (q, k, v, do)


def check_lse(lse, q, k, causal, atol):
    """lse against the natural-log logsumexp of each row's float64 scores."""
    h, n_q, d = q.shape[1], q.shape[2], q.shape[3]
    s = reference.scores(q.double().cpu().numpy(), np.repeat(k.double().cpu().numpy(), h // k.shape[1], axis=1),
                         scale=d ** -0.5)
    if causal:
        s = np.where(reference.causal_mask(n_q, k.shape[2]), s, -np.inf)
    torch.testing.assert_close(lse.double().cpu(), torch.logsumexp(torch.from_numpy(s), -1), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case,config", PAIRS, ids=[f"{c}-m{m}n{n}s{s}-{sch}" for c, (m, n, s, sch) in PAIRS])
def test_gluon_against_float64(case, config, dtype):
    block_m, block_n, stages, schedule = config
    seed, (q, k, v, do) = random_inputs(case, dtype)
    causal, d = CASES[case][6], CASES[case][5]
    forward = hopper.gluon_forward if schedule in hopper.SCHEDULES else lab.gluon_forward
    o, lse = forward(q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages, schedule=schedule)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ag = hopper.gluon_attention(*leaves, causal=causal)
    o_ag.backward(do)
    got = (o, *(x.grad for x in leaves))
    want = checks.reference_grads(q, k, v, do, causal=causal)
    yardstick = checks.torch_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal=causal, dtype=dtype)
    problems = checks.backward_problems(tuple(g.detach().cpu() for g in got), want, yardstick,
                                        *(x.cpu() for x in (q, k, v, do)), head_dim=d, causal=causal)
    assert not problems, f"seed {seed}: " + "; ".join(problems)
    # the autograd path ran the default configuration's forward
    assert torch.equal(o_ag.detach(), hopper.gluon_forward(q, k, v, causal=causal)[0])
    # float32 scores from exact products, ex2/lg2 approximations of about 2 ulp: ~1e-6 relative
    check_lse(lse, q, k, causal, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fma_share,degree", [(2, 3), (2, 4), (4, 3), (4, 4)])
@pytest.mark.parametrize("block_m,block_n,stages,schedule", [(64, 128, 2, "overlap"), (128, 128, 3, "producer")])
@pytest.mark.parametrize("case", list(CASES)[:5])
def test_fma_exponentials_against_float64(case, block_m, block_n, stages, schedule, fma_share, degree, dtype):
    """Part of the exponentials on the FMA units (the lab's ``exp2_fma``): the output stays
    within the yardstick, and lse within the polynomial's relative error of the truth."""
    seed, (q, k, v, do) = random_inputs(case, dtype)
    causal, d = CASES[case][6], CASES[case][5]
    o, lse = lab.gluon_forward(q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages,
                               schedule=schedule, fma_share=fma_share, degree=degree)
    want = checks.reference_grads(q, k, v, do, causal=causal)[0]
    yardstick = checks.torch_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal=causal, dtype=dtype)[0]
    problem = checks.within_twice_yardstick("o", o.cpu(), want, yardstick, head_dim=d)
    assert not problem, f"seed {seed}: {problem}"
    # each weight is off by at most the polynomial's relative error, so each row sum and lse too
    check_lse(lse, q, k, causal, atol=1e-4 + lab.exp2_fma_error(degree))


#: the lab's persistent schedule's configurations: both key tiles, ring depths 2 to 4, one and two warpgroups
PERSISTENT = [(64, 128, 2), (64, 64, 3), (64, 64, 4), (128, 64, 2)]
PERSISTENT_PAIRS = [(case, config) for case in CASES for config in PERSISTENT if runs(case, config)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("programs", [1, 5, None], ids=["1-program", "5-programs", "resident"])
@pytest.mark.parametrize("case,config", PERSISTENT_PAIRS,
                         ids=[f"{c}-m{m}n{n}s{s}" for c, (m, n, s) in PERSISTENT_PAIRS])
def test_persistent_walks_every_tile(case, config, programs, dtype):
    """Programs that go from query tile to query tile (one program takes them all, five take
    turns, or as many as fit on the GPU) give the float64 truth within the yardstick, and
    the very bits of the one-program-per-tile kernel with the same tiles: the walk changes
    which program computes a tile, never how."""
    block_m, block_n, stages = config
    seed, (q, k, v, do) = random_inputs(case, dtype)
    causal, d = CASES[case][6], CASES[case][5]
    o, lse = lab.gluon_forward(q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages,
                               schedule="persistent", programs=programs)
    want = checks.reference_grads(q, k, v, do, causal=causal)[0]
    yardstick = checks.torch_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal=causal, dtype=dtype)[0]
    problem = checks.within_twice_yardstick("o", o.cpu(), want, yardstick, head_dim=d)
    assert not problem, f"seed {seed}: {problem}"
    check_lse(lse, q, k, causal, atol=1e-4)
    o_tiles, lse_tiles = hopper.gluon_forward(q, k, v, causal=causal, block_m=block_m, block_n=block_n,
                                              stages=stages, schedule="overlap")
    assert torch.equal(o, o_tiles) and torch.equal(lse, lse_tiles), f"seed {seed}: differs from schedule='overlap'"
