"""The lab's Gluon backward (``benchmarks/gluon_bwd_lab.py``) against float64, chapter 8's kernels and cuDNN.

    PYTHONPATH=. python3 benchmarks/hopper_bwd_experiment.py --out DIR [--rounds 3] [--quick]

1. Correctness: for small shapes (fp16 and bf16, d 64 and 128, causal or not, GQA, ragged
   lengths, N = 1), several seeds, outputs NaN-poisoned: the largest error of dQ, dK, dV
   against float64 autograd, beside chapter 8's backward's on the same inputs.
2. Speed: the Hopper comparison's shapes (bf16; d 64 and 128; N 1K, 4K, 16K; B*N = 32K
   tokens, H = 32 at d = 64 and 16 at d = 128; causal or not): backward time of the
   Gluon kernel (each ``--modes`` dQ mode, and ``none``, which does not write dQ; the
   compiler then drops the dQ products too, so ``none`` times a four-product kernel, not a
   bound: run ``gluon_bwd_rows``'s ncu counts), of ``flash_backward``
   (separate dQ kernel) and of SDPA's cuDNN backend (``torch.autograd.grad`` of its output),
   each ``--rounds`` times taking turns, CUDA events, L2 flushed (``flashbook.bench.time_ms``).
   TFLOP/s by the usual convention: 2.5 * 4*B*H*N^2*d, halved when causal.

DIR/hopper_bwd.json: every row and the provenance.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401
import torch  # noqa: E402
from flashbook import bench  # noqa: E402
from flashbook.bench.records import collect_provenance  # noqa: E402
from flashbook.kernels import autograd  # noqa: E402

import gluon_bwd_lab as lab  # noqa: E402  (beside this file)

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
CHECKS = [  # (batch, heads, kv_heads, seq_q, seq_k, d)
    (2, 4, 4, 256, 256, 64), (2, 4, 4, 256, 256, 128), (1, 4, 2, 1000, 1000, 128), (1, 4, 1, 130, 777, 64),
    (1, 2, 2, 200, 333, 128), (2, 2, 2, 1, 1, 128), (2, 2, 2, 1, 1, 64), (1, 2, 2, 64, 64, 128),
    (1, 2, 2, 4097, 4097, 128)]
MODES = ["red2", "red4", "atomic", "rows_split_tma", "rows_split_red4", "rows_split_tma2", "rows_tma"]   # --modes
VARIANTS = {   # name -> gluon_backward's keyword arguments; each --modes name that is a dQ mode is added
    "none": dict(dq_mode="none"),
    "tma_stagger": dict(dq_mode="tma", stagger=True),
    "tma2_stagger": dict(dq_mode="tma", stagger=True, dq_bufs=2),
    "red4_stagger": dict(dq_mode="red4", stagger=True),
    "tma_pipe": dict(dq_mode="tma", pipe=True),
    "tma_pipe_s3": dict(dq_mode="tma", pipe=True, stages=3),
    "red4_pipe": dict(dq_mode="red4", pipe=True),
    # FA3's register plan (S, dP in rows of queries; P, dS through shared memory): ptxas
    # spills nothing at d = 128 with dQ in two head_dim halves (Triton 3.6's ptxas, sm_90a)
    "rows_split_tma": dict(dq_mode="tma", rows=True, dq_split=True),
    "rows_split_red4": dict(dq_mode="red4", rows=True, dq_split=True),
    "rows_split_tma2": dict(dq_mode="tma", rows=True, dq_split=True, dq_bufs=2),   # 229,392 bytes of shared memory
    "rows_tma": dict(dq_mode="tma", rows=True),
    "rows_none": dict(dq_mode="none", rows=True),
    # dQ added from the product's own layout, two columns per reduction: no trip through shared
    # memory to regroup four (ptxas of Triton 3.6: 0 bytes of spill, 8 causal, against 0 and 32 for red4)
    "rows_split_red2": dict(dq_mode="red2", rows=True, dq_split=True),
    # a third Q/dO stage in the ring: 32 KB more shared memory (about 213,000 bytes with red4, 229,392 with tma)
    "rows_split_red4_s3": dict(dq_mode="red4", rows=True, dq_split=True, stages=3),
    "rows_split_tma_s3": dict(dq_mode="tma", rows=True, dq_split=True, stages=3),
}
TIMED = ["none", "tma", "tma_pipe", "tma_pipe_s3", "red4_pipe", "rows_split_tma", "rows_split_red4",
         "rows_split_tma2", "rows_tma", "rows_none"]   # --timed
SPEED = [(d, n, causal) for d in (64, 128) for n in (1024, 4096, 16384) for causal in (False, True)]


def reference_grads(q, k, v, do, causal):
    """dq, dk, dv in float64 by autograd, GQA by repeating K/V heads."""
    q, k, v, do = (x.detach().double().requires_grad_(x is not do) for x in (q, k, v, do))
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(group, dim=1) for x in (k, v))
    s = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ vv
    return torch.autograd.grad(o, (q, k, v), do)


def errors(got, want):
    return [float((g.double() - w).abs().max()) for g, w in zip(got, want)]


def check(rows, seeds):
    for (b, h, hk, sq, sk, d) in CHECKS:
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                if causal and sq > sk:
                    continue
                for seed in range(seeds):
                    torch.manual_seed(seed)
                    q = torch.randn(b, h, sq, d, device="cuda", dtype=DT[dtype])
                    k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=DT[dtype]) for _ in range(2))
                    do = torch.randn_like(q)
                    o, lse = autograd.flash_forward(q, k, v, causal=causal)
                    want = reference_grads(q, k, v, do, causal)
                    row = dict(shape=[b, h, hk, sq, sk, d], dtype=dtype, causal=causal, seed=seed)
                    with autograd.poisoned_outputs():
                        row["triton"] = errors(autograd.flash_backward(q, k, v, o, lse, do, causal=causal), want)
                        for mode in MODES:
                            try:
                                got = lab.gluon_backward(q, k, v, o, lse, do, causal=causal,
                                                                     **VARIANTS[mode])
                                torch.cuda.synchronize()
                                row[mode] = errors(got, want)
                            except Exception as e:  # noqa: BLE001  (recorded, not hidden)
                                row[mode] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    print("check", json.dumps(row), flush=True)


def speed(rows, rounds, shapes):
    for d, n, causal in shapes:
        heads = 32 if d == 64 else 16
        batch = 32768 // n
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        do = torch.randn_like(q)
        o, lse = autograd.flash_forward(q, k, v, causal=causal)
        flops = 2.5 * 4 * batch * heads * n * n * d / (2 if causal else 1)
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        fns = {f"gluon_{name}": functools.partial(lab.gluon_backward, q, k, v, o, lse, do, causal=causal,
                                                  **VARIANTS[name]) for name in TIMED}
        fns["triton"] = lambda: autograd.flash_backward(q, k, v, o, lse, do, causal=causal)
        fns["cudnn"] = lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                try:
                    times[name].append(bench.time_ms(fn))
                except Exception as e:  # noqa: BLE001
                    times[name].append(None)
                    print(name, "failed:", type(e).__name__, str(e)[:300], flush=True)
        row = dict(d=d, n=n, batch=batch, heads=heads, causal=causal, ms=times)
        row["tflops"] = {name: (flops / statistics.median(t) / 1e9 if None not in t else None)
                         for name, t in times.items()}
        rows.append(row)
        print("speed", json.dumps(row), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="checks only, one seed")
    p.add_argument("--timed", default=",".join(TIMED), help="variants (VARIANTS) to time")
    p.add_argument("--modes", default=",".join(MODES), help="dQ modes of the Gluon kernel to check and time")
    p.add_argument("--head-dims", default="64,128", help="the timed shapes' head dims (of 64, 128)")
    args = p.parse_args(argv)
    MODES[:] = args.modes.split(",")
    TIMED[:] = args.timed.split(",")
    for mode in MODES + TIMED:
        VARIANTS.setdefault(mode, dict(dq_mode=mode))
    os.makedirs(args.out, exist_ok=True)
    result = dict(provenance=collect_provenance(sys.argv[1:], program="python3 benchmarks/hopper_bwd_experiment.py"),
                  tma_add=lab.TMA_ADD is not None, modes=list(MODES), variants=VARIANTS, timed=list(TIMED),
                  checks=[], speed=[])
    try:
        check(result["checks"], 1 if args.quick else args.seeds)
        if not args.quick:
            dims = {int(d) for d in args.head_dims.split(",")}
            speed(result["speed"], args.rounds, [shape for shape in SPEED if shape[0] in dims])
    except Exception:  # noqa: BLE001
        result["error"] = traceback.format_exc()
        print(result["error"], flush=True)
    with open(os.path.join(args.out, "hopper_bwd.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
