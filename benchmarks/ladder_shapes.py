"""Chapter 10's rungs timed at two batch sizes, in one session: what moves a rung's speed-up.

    PYTHONPATH=<tree> python3 benchmarks/ladder_shapes.py --out FILE.json [--batches 4,8]
        [--heads 16] [--seq 4096] [--head-dim 128]

Chapter 10's ladder was timed at batch 8 (``python -m flashbook.bench --ladder``, 32K tokens);
the chapter's live cell re-times the same rungs at batch 4 with a later library, and its
speed-ups differ (exp2 x1.14 in the ladder, x1.34 live). This script times every rung's
forward, without a mask and causal, at each batch, through the same timer the live cell uses
(``bench.time_ms``: CUDA-event median, L2 flushed), and the CPU time of one call while the GPU
is busy (``host_us``: calls queued back to back, no synchronisation between them). Only the
public names both old and new trees have are used (``ladder.RUNGS``, ``run_rung``,
``bench.time_ms``, ``bench.attention_flops``, ``bench.tflops``), so one copy of this script runs
against the ladder's commit and today's: set PYTHONPATH to the tree and FLASHBOOK_COMMIT to
its commit. Every output is compared with the last rung's (max |difference|), so a rung that
computes something else shows.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import flashbook  # noqa: F401  (decides GPU or interpreter before triton is imported)
import torch

from flashbook import bench
from flashbook.kernels.ladder import RUNGS, run_rung


def host_us(fn, calls: int = 20) -> float:
    """CPU microseconds per call with the GPU still busy: ``calls`` calls, no sync between
    (``flashbook.timing.host_us``'s loop, written out: the ladder's commit has no ``flashbook.timing``)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    per = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return per


def provenance(argv) -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    import triton
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 benchmarks/ladder_shapes.py " + " ".join(argv),
        "gpu": torch.cuda.get_device_name(),
        "driver": run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "torch": torch.__version__, "triton": triton.__version__,
        "flashbook": getattr(flashbook, "__version__", None),
        "git_commit": os.environ.get("FLASHBOOK_COMMIT"),
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batches", default="4,8")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("ladder_shapes.py times GPU kernels: it needs a CUDA GPU")
        return 2
    rows = []
    for batch in (int(b) for b in a.batches.split(",")):
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, a.heads, a.seq, a.head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for causal in (False, True):
            flops = bench.attention_flops(batch, a.heads, a.seq, a.seq, a.head_dim, causal, "fwd")
            with torch.no_grad():
                want = run_rung(RUNGS[-1], q, k, v, causal=causal)[0].float()
                for i, r in enumerate(RUNGS):
                    fn = (lambda r=r: run_rung(r, q, k, v, causal=causal))
                    diff = (fn()[0].float() - want).abs().max().item()
                    ms = bench.time_ms(fn)
                    rows.append({"batch": batch, "heads": a.heads, "seq": a.seq, "head_dim": a.head_dim,
                                 "causal": causal, "rung": i, "name": r.name, "ms": ms,
                                 "tflops": bench.tflops(flops, ms), "host_us": host_us(fn),
                                 "max_diff_vs_last": diff})
                    print(f"B={batch} {'causal' if causal else 'full'} {i} {r.name}: {ms:.3f} ms "
                          f"{rows[-1]['tflops']:.1f} TFLOP/s host {rows[-1]['host_us']:.0f} us diff {diff:.2e}",
                          flush=True)
    with open(a.out, "w") as f:
        json.dump({"provenance": provenance(argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
