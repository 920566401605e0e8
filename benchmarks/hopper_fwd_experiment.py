"""Does Hopper's tensor-memory accelerator (TMA) speed up the forward kernel?

    PYTHONPATH=. python3 benchmarks/hopper_fwd_experiment.py --out DIR

The library's forward kernel (``flashbook.kernels.forward``) loads its K and V
tiles with pointer arithmetic, which Triton turns into asynchronous copies issued
by every thread (``cp.async``, the Ampere mechanism). On sm_90 Triton can instead
hand a whole tile to the TMA engine through a *tensor descriptor*, and it can
split a loop between producer and consumer warps (``tl.range(...,
warp_specialize=True)``). This script builds the same algorithm on descriptors
(same causal bounds, same masked/unmasked split, same exp2 trick) and times it,
the library kernel and cuDNN side by side at chapter 9's d = 128 shapes, forward
only, bf16. Every variant's output is compared with the library kernel's.

It writes DIR/hopper_fwd.json (environment as ``gpu_check.py`` records it, command,
every timing and error).
Descriptors need the tensors flattened to (rows, head_dim) with 16-byte aligned
rows, so the variant handles only contiguous inputs with head_dim a power of 2;
the experiment's shapes are all of that kind.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashbook import bench  # noqa: E402
from flashbook.kernels import flash_forward  # noqa: E402
from flashbook.kernels.configs import Config  # noqa: E402
from flashbook.kernels.forward import LN2, LOG2E, MAIN, MASKED, causal_bounds, shifted_scores  # noqa: E402
from flashbook.bench.harness import reference_slice  # noqa: E402
from flashbook.bench.impls import sdpa_attention  # noqa: E402
from gpu_check import environment  # noqa: E402  (beside this script)


@triton.jit
def _tma_inner(acc, row_max, row_sum, q, desc_k, desc_v, kv_row0, offs_m, offs_n,
               seq_k, diagonal, lo, hi, qk_scale,
               BLOCK_N: tl.constexpr, STAGE: tl.constexpr, CAUSAL: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([kv_row0 + start_n, 0])
        qk = tl.dot(q, tl.trans(k))
        qk, new_max = shifted_scores(qk, row_max, offs_m, start_n + offs_n, seq_k, diagonal, qk_scale,
                                     STAGE, CAUSAL)
        p = tl.exp2(qk)
        alpha = tl.exp2(row_max - new_max)
        row_sum = row_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([kv_row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _tma_fwd(desc_q, desc_k, desc_v, O, LSE, stride_ob, stride_oh, stride_om,
             n_heads, group, seq_q, seq_k, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    start_m = pid_m * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    bh_kv = b * (n_heads // group) + h // group
    kv_row0 = bh_kv * seq_k
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = desc_q.load([bh * seq_q + start_m, 0])
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    diagonal = seq_k - seq_q
    full_end, hi = causal_bounds(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    acc, row_max, row_sum = _tma_inner(acc, row_max, row_sum, q, desc_k, desc_v, kv_row0, offs_m, offs_n,
                                       seq_k, diagonal, 0, full_end, qk_scale, BLOCK_N, MAIN, CAUSAL, WS)
    acc, row_max, row_sum = _tma_inner(acc, row_max, row_sum, q, desc_k, desc_v, kv_row0, offs_m, offs_n,
                                       seq_k, diagonal, full_end, hi, qk_scale, BLOCK_N, MASKED, CAUSAL, False)
    seen = row_sum > 0.0
    acc = acc / tl.where(seen, row_sum, 1.0)[:, None]
    lse = tl.where(seen, (row_max + tl.log2(tl.where(seen, row_sum, 1.0))) * LN2, float("-inf"))
    row_ok = offs_m < seq_q
    tl.store(LSE + bh.to(tl.int64) * seq_q + offs_m, lse, mask=row_ok)
    o_ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


def tma_forward(q, k, v, *, causal, cfg: Config, ws: bool):
    from triton.tools.tensor_descriptor import TensorDescriptor

    batch, heads, seq_q, d = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = d ** -0.5
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_q), device=q.device, dtype=torch.float32)
    desc_q = TensorDescriptor.from_tensor(q.reshape(-1, d), [cfg.block_m, d])
    desc_k = TensorDescriptor.from_tensor(k.reshape(-1, d), [cfg.block_n, d])
    desc_v = TensorDescriptor.from_tensor(v.reshape(-1, d), [cfg.block_n, d])
    grid = (triton.cdiv(seq_q, cfg.block_m), batch * heads)
    _tma_fwd[grid](desc_q, desc_k, desc_v, o, lse, o.stride(0), o.stride(1), o.stride(2),
                   heads, heads // kv_heads, seq_q, seq_k, scale * LOG2E,
                   HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal, WS=ws,
                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse


#: PyTorch's SDPA held to its cuDNN backend (the benchmark's own ``sdpa-cudnn``).
cudnn_forward = sdpa_attention("sdpa-cudnn")


def measure_variant(row: dict, fn, flops: float, ref, ref_lse, o64=None, graph: bool = False) -> dict:
    """Run ``fn`` (a forward returning o, or (o, lse)), compare it with the library's output
    ``ref``/``ref_lse`` (and with float64 ``o64`` for batch 0, head 0, if given), time it
    (``graph``: replayed from a CUDA graph); an exception is recorded in the row, not raised."""
    try:
        out = fn()
        o = out[0] if isinstance(out, tuple) else out
        row["max_abs_diff_vs_flashbook"] = float((o.float() - ref.float()).abs().max())
        if isinstance(out, tuple):
            row["lse_max_abs_diff"] = float((out[1] - ref_lse).abs().max())
        if o64 is not None:
            row["max_abs_err_head0_vs_float64"] = float((o[0, 0].double() - o64).abs().max())
        ms = bench.time_ms(fn, graph=graph)
        row.update(ms=ms, tflops=bench.tflops(flops, ms))
    except Exception as err:  # record, go on
        row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    return row


def record(result: dict, row: dict, path: str) -> None:
    """Add ``row`` to ``result``, print it, and rewrite ``path`` (a crash keeps what ran)."""
    result["rows"].append(row)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


def run_tutorial_shapes(doc: str, script: str, filename: str, variants_for, dtypes: str = "fp16") -> None:
    """The experiments' common main: at the tutorial comparison's shapes (batch 1,
    heads = 262144 / N, causal or not; ``--seqs``, ``--head-dim``, ``--dtypes``, ``--graph``) time cuDNN,
    the library's kernel and ``variants_for(q, k, v, causal)`` (a list of (name, forward)),
    each checked against the library's output and float64 on one head, into
    ``--out``/``filename`` with the run's provenance."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seqs", default="1024,4096,16384")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtypes", default=dtypes)
    parser.add_argument("--graph", action="store_true", help="replay each forward from a CUDA graph (the GPU's work alone)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prov = bench.collect_provenance(sys.argv[1:], program=f"python3 benchmarks/{script}", graph=args.graph)
    result = {"what": doc.split("\n\n")[0], "environment": prov, "rows": []}
    path = os.path.join(args.out, filename)
    gen = torch.Generator(device="cuda").manual_seed(0)
    d = args.head_dim
    for dtype_name in args.dtypes.split(","):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        for n in (int(s) for s in args.seqs.split(",")):
            heads = 16 * 16384 // n
            q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            for causal in (False, True):
                flops = bench.attention_flops(1, heads, n, n, d, causal)
                ref, ref_lse = flash_forward(q, k, v, causal=causal)
                o64 = reference_slice(q, k, v, None, causal)[0][0, 0]   # batch 0, head 0, float64
                variants = [("cudnn", lambda: cudnn_forward(q, k, v, causal=causal)),
                            ("flashbook", lambda: flash_forward(q, k, v, causal=causal))]
                for name, fn in variants + variants_for(q, k, v, causal):
                    row = {"dtype": dtype_name, "seq": n, "heads": heads, "head_dim": d, "causal": causal,
                           "variant": name}
                    record(result, measure_variant(row, fn, flops, ref, ref_lse, o64, args.graph), path)
    result["elapsed_s"] = round(time.time() - START, 1)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


CONFIGS = [Config(128, 64, 8, 3), Config(128, 64, 8, 4), Config(128, 128, 8, 2), Config(128, 128, 8, 3),
           Config(128, 64, 4, 3), Config(128, 128, 4, 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seqs", default="4096,8192,16384")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result = {"what": __doc__.split("\n\n")[0], "environment": environment(), "rows": []}
    path = os.path.join(args.out, "hopper_fwd.json")
    gen = torch.Generator(device="cuda").manual_seed(0)
    d = args.head_dim
    heads = 2048 // d
    for n in (int(s) for s in args.seqs.split(",")):
        batch = 32768 // n
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(3))
        for causal in (False, True):
            flops = bench.attention_flops(batch, heads, n, n, d, causal)
            ref, ref_lse = flash_forward(q, k, v, causal=causal)
            variants = [("cudnn", lambda: cudnn_forward(q, k, v, causal=causal)),
                        ("flashbook", lambda: flash_forward(q, k, v, causal=causal))]
            for cfg in CONFIGS:
                for ws in (False, True):
                    variants.append((f"tma {cfg}{' ws' if ws else ''}",
                                     lambda cfg=cfg, ws=ws: tma_forward(q, k, v, causal=causal, cfg=cfg, ws=ws)))
            for name, fn in variants:
                row = {"seq": n, "batch": batch, "heads": heads, "head_dim": d, "causal": causal, "variant": name}
                record(result, measure_variant(row, fn, flops, ref, ref_lse), path)
    result["elapsed_s"] = round(time.time() - START, 1)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


START = time.time()

if __name__ == "__main__":
    main()
