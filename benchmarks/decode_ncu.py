"""One decoding step per shape, for Nsight Compute: where flash_decode's time goes.

    ncu --profile-from-start off --csv --page raw --metrics METRICS \\
        python3 benchmarks/decode_ncu.py --shapes 1x32K,1x128K,64x32K [--paged] [--sdpa] --steps OUT/steps.json

(``tools``-free: the command is in ``benchmarks/results/decode_ncu_h200/README.md``.) Each
shape is called twice first (compiling, and planning the call signature); then one call runs
between ``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu profiles exactly that call's
kernels: flash_decode's split kernel and its combine (and, with ``--sdpa``, SDPA cuDNN's, for
comparison). The same inputs as ``decode_bench.py`` (bf16, 32 query / 8 KV heads, d = 128,
one new token). ``METRICS`` (``decode_ncu.METRICS``) reads: time, DRAM bytes and throughput,
the SMs' busy cycles, the grid and its waves, the L2 hit rate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402,F401
from flashbook import bench  # noqa: E402
from flashbook.kernels import decode, flash_decode  # noqa: E402
from flashbook.timing import profile_once  # noqa: E402

from decode_bench import PAGE_SIZE, decode_inputs, parse_shapes  # noqa: E402

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__cycles_active.avg",
           "sm__cycles_elapsed.avg", "sm__cycles_active.max", "launch__grid_size",
           "launch__waves_per_multiprocessor", "launch__occupancy_limit_shared_mem",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "lts__t_sector_hit_rate.pct")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=parse_shapes, default=parse_shapes("1x32K,1x128K,64x32K"))
    p.add_argument("--paged", action="store_true", help="also the same cache in shuffled pages")
    p.add_argument("--sdpa", action="store_true", help="also SDPA's cuDNN backend")
    p.add_argument("--metrics", action="store_true", help="print METRICS for ncu's --metrics and exit")
    p.add_argument("--steps", help="write the profiled steps, in order, to this JSON file (steps.json)")
    args = p.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    cudnn = bench.sdpa_attention("sdpa-cudnn")
    steps = []
    for batch, seq in args.shapes:
        q, k, v = decode_inputs(batch, seq)
        calls = [("dense", lambda: flash_decode(q, k, v))]
        if args.paged:
            kp, vp, table = decode.paginate(k, v, PAGE_SIZE, generator=torch.Generator().manual_seed(0))
            table = table.to(q.device)
            calls.append(("paged", lambda: flash_decode(q, kp, vp, block_table=table)))
        if args.sdpa:
            calls.append(("sdpa-cudnn", lambda: cudnn(q, k, v)))
        for name, call in calls:
            call(), call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"{name} B{batch} N{seq}")
            profile_once(call, warmups=0)
            torch.cuda.nvtx.range_pop()
            print(f"profiled {name} batch {batch} seq {seq}", flush=True)
            steps.append({"impl": name, "batch": batch, "seq": seq})
        del q, k, v, calls
        torch.cuda.empty_cache()
    if args.steps:   # what flashbook.bench.decoding.ncu_steps reads beside ncu's raw.csv
        with open(args.steps, "w") as f:
            json.dump({"about": "the decoding steps decode_ncu.py profiled, in order", "steps": steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
