"""Ring attention on two GPUs (NCCL): correct against one GPU, how fast, how much traffic hides.

    PYTHONPATH=. python3 benchmarks/ring_bench.py --out DIR            # 2 GPUs, ~3 minutes
    PYTHONPATH=. python3 benchmarks/ring_bench.py --out DIR --cpu-smoke  # 2 gloo processes, tiny

For each N (default 16K, 32K, 64K, 128K), batch 1, H = 8 heads, head_dim 128, bf16,
causal, zigzag layout, forward + backward:

* correctness: the ring's o, dq, dk, dv (gathered on rank 0, head 0) against a float32
  run of ``flash_attention`` on the whole sequence (IEEE products, no TF32), with the
  book's criterion: within twice the error of the single-GPU bf16 ``flash_attention``
  (``kernels.checks.within_twice_yardstick``);
* time per step: single GPU (the whole sequence on GPU 0) against the ring
  (``ring_attention`` with autograd, the slowest rank);
* overlap: the ring's forward + backward timed three ways with the same blocks and
  messages: compute only (no sends), communication only (no attention), and both
  overlapped; hidden fraction = (compute + comm - overlapped) / comm.

Writes DIR/ring.csv and DIR/ring_provenance.json (GPU, driver, torch, triton, NCCL, date,
command, git commit). NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"      # NVLink multicast must stay off on the lent machines

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
from flashbook import bench  # noqa: E402
from flashbook import distributed as D  # noqa: E402

FIELDS = ["n", "batch", "heads", "head_dim", "dtype", "causal", "layout", "world_size",
          "single_ms", "ring_ms", "speedup", "overlapped_ms", "compute_ms", "comm_ms",
          "hidden_fraction", "overlapped_spread_ms", "compute_spread_ms", "comm_spread_ms",
          "kv_bytes_per_hop", "check", "err_o", "err_dq", "err_dk", "err_dv",
          "single_err_o", "single_err_dq", "single_err_dk", "single_err_dv"]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn, device, warmup, reps, spread=None):
    """Median wall time of fn() over reps, every rank starting together; the slowest rank's.

    With a dict ``spread``, also stores there the largest max - min over ranks ("spread"):
    how far apart single calls were, to judge a difference of two medians by."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor([statistics.median(times), max(times) - min(times)], dtype=torch.float64,
                           device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if spread is not None:
        spread["spread"] = float(slowest[1])
    return float(slowest[0])


def _single(q, k, v, do, causal):
    """(o, dq, dk, dv) of the whole sequence in one process."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    if q.is_cuda:
        o = flashbook.flash_attention(*leaves, causal=causal, backend="triton")
    else:
        from flashbook.kernels.checks import torch_attention
        o = torch_attention(*leaves, causal=causal)
    o.backward(do)
    return [o.detach()] + [x.grad for x in leaves]


def _truth(q, k, v, do, causal):
    """The reference for head 0: float32 flash_attention with IEEE products on a GPU, float64 on a CPU."""
    head = [x[:, :1] for x in (q, k, v, do)]
    if q.is_cuda:
        from flashbook.kernels import set_fp32_precision
        set_fp32_precision("ieee")
        try:
            return _single(*(x.float() for x in head), causal)
        finally:
            set_fp32_precision("tf32")
    from flashbook.kernels.checks import reference_grads
    return list(reference_grads(*head, causal=causal))


def _gather_head0(x, world, layout):
    """Every rank's shard of head 0, joined on every rank (rank 0 uses it)."""
    part = x[:, :1].contiguous()
    parts = [torch.empty_like(part) for _ in range(world)]
    dist.all_gather(parts, part)
    return D.unshard(parts, layout=layout)


def run_size(rank, world, n, args, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device=device).manual_seed(args.seed + n)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v, do = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
    layout, causal = args.layout, args.causal
    mine = [D.shard(x, rank, world, layout=layout).contiguous() for x in (q, k, v, do)]
    row = {"n": n, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
           "dtype": args.dtype, "causal": causal, "layout": layout, "world_size": world,
           "kv_bytes_per_hop": 2 * mine[1].numel() * mine[1].element_size()}

    # correctness: the ring (autograd) against one process, head 0
    leaves = [x.clone().requires_grad_() for x in mine[:3]]
    o = D.ring_attention(*leaves, causal=causal, layout=layout)
    o.backward(mine[3])
    ring = [_gather_head0(x, world, layout) for x in (o.detach(), *(t.grad for t in leaves))]
    if rank == 0:
        from flashbook.kernels.checks import max_error, within_twice_yardstick
        single = [x[:, :1] for x in _single(q, k, v, do, causal)]
        truth = _truth(q, k, v, do, causal)
        problems = []
        for name, got, yard, want in zip(("o", "dq", "dk", "dv"), ring, single, truth):
            want = want.to(got.device)
            row[f"err_{name}"] = max_error(got, want)[0]
            row[f"single_err_{name}"] = max_error(yard, want)[0]
            problem = within_twice_yardstick(name, got, want, yard, head_dim=args.head_dim)
            if problem:
                problems.append(problem)
        row["check"] = "; ".join(problems) or "pass"
        del single, truth
    del o, leaves, ring

    # time per step: one GPU (rank 0 alone, the others wait) against the ring
    def single_step():
        if rank == 0:
            _single(q, k, v, do, causal)
    row["single_ms"] = _time_ms(single_step, device, args.warmup, args.reps)

    def ring_step():
        leaves = [x.detach().requires_grad_() for x in mine[:3]]
        D.ring_attention(*leaves, causal=causal, layout=layout).backward(mine[3])
    row["ring_ms"] = _time_ms(ring_step, device, args.warmup, args.reps)
    row["speedup"] = row["single_ms"] / row["ring_ms"]

    # overlap: the same ring with compute only, communication only, and both
    ring_ = D._Ring(dist.group.WORLD, rank, world)
    scale = args.head_dim ** -0.5
    common = dict(causal=causal, scale=scale, layout=layout, ring=ring_, rank=rank, world=world)
    o_full, lse_full = D._ring_forward(*mine[:3], **common)
    o_full = o_full.to(dtype)

    def parts(compute, communicate):
        def step():
            D._ring_forward(*mine[:3], **common, compute=compute, communicate=communicate)
            D._ring_backward(*mine[:3], o_full, lse_full, mine[3], **common,
                             compute=compute, communicate=communicate)
        return step
    for name, compute, communicate in (("overlapped", True, True), ("compute", True, False),
                                       ("comm", False, True)):
        spread = {}
        row[f"{name}_ms"] = _time_ms(parts(compute, communicate), device, args.warmup, args.reps, spread)
        row[f"{name}_spread_ms"] = spread["spread"]
    row["hidden_fraction"] = (row["compute_ms"] + row["comm_ms"] - row["overlapped_ms"]) / row["comm_ms"]
    return row


def worker(rank, world, args):
    device = torch.device("cuda", rank) if args.backend == "nccl" else torch.device("cpu")
    rows = []
    for n in args.seqs:
        rows.append(run_size(rank, world, n, args, device))
        if rank == 0:
            r = rows[-1]
            print(f"N={n:>7}: single {r['single_ms']:8.2f} ms, ring {r['ring_ms']:8.2f} ms "
                  f"({r['speedup']:.2f}x), compute {r['compute_ms']:.2f} + comm {r['comm_ms']:.2f} "
                  f"-> overlapped {r['overlapped_ms']:.2f} ms, hidden {r['hidden_fraction']:.0%}, "
                  f"check: {r['check']}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows if rank == 0 else None


def environment(args) -> dict:
    prov = bench.collect_provenance(sys.argv)
    prov["command"] = " ".join(["python3"] + sys.argv)
    prov["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    prov["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    prov["nccl_nvls_enable"] = os.environ.get("NCCL_NVLS_ENABLE")
    prov["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    prov["timing"] = {
        "method": "wall clock between a barrier and a device synchronise, per rank; median "
                  "over reps; the slowest rank's median",
        "single": "flash_attention forward + backward of the whole sequence on GPU 0",
        "ring": "ring_attention forward + backward (autograd), every rank",
        "overlap": "the ring's forward + backward with compute only (no sends), communication "
                   "only (no attention) and both; hidden_fraction = (compute + comm - overlapped) / comm; "
                   "*_spread_ms: the largest (max - min) over ranks of the timed calls",
    }
    prov["check"] = ("head 0 of o, dq, dk, dv against float32 flash_attention (IEEE products) on "
                     "the whole sequence; pass if within twice the single-GPU bf16 error "
                     "(kernels.checks.within_twice_yardstick)")
    return prov


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for ring.csv and ring_provenance.json")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="two gloo processes on the CPU at tiny sizes (checks the script runs)")
    p.add_argument("--seqs", type=bench.parse_seq_list, default=None, help="e.g. 16K,32K,64K,128K")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--layout", default="zigzag", choices=list(D.LAYOUTS))
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.backend = "gloo"
        args.seqs = args.seqs or (64, 128)
        args.heads, args.head_dim, args.dtype = min(args.heads, 2), min(args.head_dim, 16), "fp32"
        args.warmup, args.reps = 1, 2
    else:
        if torch.cuda.device_count() < args.world_size:
            p.error(f"--world-size {args.world_size} needs as many GPUs, found "
                    f"{torch.cuda.device_count()} (use --cpu-smoke without GPUs)")
        args.backend = "nccl"
        args.seqs = args.seqs or (16384, 32768, 65536, 131072)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    rows = D.spawn(worker, args.world_size, args, backend=args.backend, timeout_s=600)[0]
    prov = environment(args)
    prov["elapsed_s"] = round(time.time() - start, 1)
    csv = bench.write_csv(rows, os.path.join(args.out, "ring.csv"), FIELDS)
    prov["files"] = {"ring.csv": os.path.basename(csv)}
    with open(os.path.join(args.out, "ring_provenance.json"), "w") as f:
        json.dump(prov, f, indent=1, default=str)
    print(f"wrote {args.out}/ring.csv and ring_provenance.json in {prov['elapsed_s']} s")
    return 0 if all(r["check"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
