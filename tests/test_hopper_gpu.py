"""Chapter 10's Gluon kernel (``flashbook.kernels.hopper``) on a Hopper GPU: ``pytest -m gpu``.

Every case runs forward and backward (the backward is chapter 8's, from the o and lse
the Gluon kernel saved) against the float64 truth, with the book's yardstick: at most
twice the error of plain PyTorch attention computed in the input dtype. Shapes cover
batch > 1, GQA and MQA, seq_q != seq_k (causal, diagonal bottom-right), both head dims,
both key tiles, ring depths of 2 to 4, each schedule (``hopper.SCHEDULES``), float16 and bfloat16, with fresh random inputs.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from flashbook import reference
from flashbook.kernels import checks, hopper

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not hopper.available(), reason="needs a Hopper GPU and Triton's Gluon")]

# (batch, heads, kv_heads, seq_q, seq_k, head_dim, causal)
CASES = {
    "square": (2, 4, 4, 256, 256, 128, False),
    "square-causal": (2, 2, 2, 512, 512, 128, True),
    "gqa-q-shorter-causal-d64": (1, 4, 2, 128, 384, 64, True),
    "mqa-q-shorter-d128": (1, 8, 1, 256, 512, 128, False),
    "one-tile-causal-d64": (3, 2, 2, 128, 128, 64, True),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_m,block_n,stages,schedule", [
    (64, 64, 3, "overlap"), (64, 128, 2, "overlap"), (128, 128, 3, "overlap"), (128, 64, 4, "overlap"),
    (128, 128, 2, "producer"), (128, 64, 3, "producer"), (128, 128, 3, "pingpong"), (128, 64, 2, "pingpong")])
@pytest.mark.parametrize("case", list(CASES))
def test_gluon_against_float64(case, block_m, block_n, stages, schedule, dtype):
    b, h, h_kv, n_q, n_k, d, causal = CASES[case]
    seed = random.randrange(2**31)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, h_kv, n_k, d, device="cuda", dtype=dtype, generator=gen)
    do = torch.randn(b, h, n_q, d, device="cuda", dtype=dtype, generator=gen)
    o, lse = hopper.gluon_forward(q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages,
                                  schedule=schedule)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ag = hopper.gluon_attention(*leaves, causal=causal)
    o_ag.backward(do)
    got = (o, *(x.grad for x in leaves))
    want = checks.reference_grads(q, k, v, do, causal=causal)
    yardstick = checks.torch_grads(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal=causal, dtype=dtype)
    problems = [checks.within_twice_yardstick(name, g.cpu(), w, y, head_dim=d)
                for name, g, w, y in zip(("o", "dq", "dk", "dv"), got, want, yardstick)]
    problems = [p for p in problems if p]
    assert not problems, f"seed {seed}: " + "; ".join(problems)
    # the autograd path ran the default configuration's forward
    assert torch.equal(o_ag.detach(), hopper.gluon_forward(q, k, v, causal=causal)[0])
    # lse is the natural-log logsumexp of each row
    s = reference.scores(q.double().cpu().numpy(), np.repeat(k.double().cpu().numpy(), h // h_kv, axis=1),
                         scale=d ** -0.5)
    if causal:
        s = np.where(reference.causal_mask(n_q, n_k), s, -np.inf)
    # float32 scores from exact products, ex2/lg2 approximations of about 2 ulp: ~1e-6 relative
    torch.testing.assert_close(lse.double().cpu(), torch.logsumexp(torch.from_numpy(s), -1), rtol=1e-5, atol=1e-4)
