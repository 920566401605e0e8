"""The lab's Gluon backward (benchmarks/gluon_bwd_lab.py) still compiles for sm_90, on a machine
without that GPU: the kernel the recorded run ``gluon_bwd`` measured stays runnable for the next
try. Three variants, PTX only (the H200 assembles and runs them): dQ by TMA reduce-add at d = 128,
causal, dQ one step late by vector reductions at d = 64, and FA3's register plan with dQ in two
head_dim halves (``rows``, ``dq_split``) at d = 128, causal. Each fits an H200's shared memory
and holds the instructions its dQ mode is named for."""
from __future__ import annotations

import json

from conftest import compile_probe

SCRIPT = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import gluon_bwd_lab as lab
out = []
for kw in (dict(head_dim=128, causal=True, dq_mode="tma"), dict(head_dim=64, causal=False, dq_mode="red4", pipe=True),
           dict(head_dim=128, causal=True, dq_mode="tma", rows=True, dq_split=True)):
    c = lab.compile_bwd_for(90, **kw)
    ptx = c.asm["ptx"]
    out.append(dict(kw, shared=c.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                    tma_reduce=ptx.count("cp.reduce.async.bulk.tensor"),
                    red4=ptx.count("red.relaxed.gpu.global.add.v4.f32")))
print(json.dumps(out))
"""


def test_the_lab_backward_compiles_for_sm90_and_fits(tmp_path):
    from flashbook import runtime

    tma, red, rows = json.loads(compile_probe(tmp_path, SCRIPT).strip().splitlines()[-1])
    limit = runtime.chip("H200").smem_per_block_bytes
    for r in (tma, red, rows):
        assert 0 < r["shared"] <= limit, r
        assert r["wgmma"] >= 5, r   # S^T, dP^T, dV, dK, dQ: five products a step
    assert tma["tma_reduce"] > 0 and tma["red4"] == 0, tma
    assert red["red4"] > 0 and red["tma_reduce"] == 0, red
    # FA3's plan, dQ in two head_dim halves: two more wgmma instructions' worth of dQ (n32 instead of n64)
    assert rows["tma_reduce"] > 0 and rows["red4"] == 0 and rows["wgmma"] == tma["wgmma"] + 8, rows
