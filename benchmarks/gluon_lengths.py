"""The Gluon forward at lengths that are not whole tiles: does ``backend="auto"`` fall off a cliff?

    PYTHONPATH=. python3 benchmarks/gluon_lengths.py --out DIR [--rounds 5]

``hopper.gluon_forward`` takes any seq_q >= its query tile and seq_k >= its key tile: a
last query tile that does not fit overlaps the one before, and so does a last key tile
(``hopper.key_start``), whose shared keys are masked away; the kernel is compiled with
``RAGGED=True`` for such key lengths. This script times, forward only (the backward is
chapter 8's kernel under every backend), bf16, B*N = 32K tokens, H = 2048 / d:

- ``gluon``: ``hopper.gluon_forward`` as the front door runs it;
- ``triton``: chapter 7's kernel (``flash_forward``), the front door's fallback;
- ``gluon-producer``: at d = 64, the warp-specialised schedule with two consumer warpgroups
  (128 x 128 tiles, 3 stages) instead of the default one-warpgroup programs below 2K/6K
  rows (``hopper.SHORT_DEFAULT``), whose registers a ragged key tile raises;
- ``gluon-ragged``: at whole-tile lengths only, the same launch compiled with
  ``RAGGED=True``: what the ragged kernel's extra instructions cost by themselves,
  apart from the lengths.

N = 1000, 1024, 4096, 4097; d = 64 and 128; causal or not. ``--rounds`` rounds take turns
over the variants (CUDA-event medians, ``flashbook.timing.time_ms``, L2 flushed); each
variant's median over rounds, with min and max, is recorded, and every output is compared
with ``triton``'s.

Writes DIR/gluon_lengths.json: provenance and every row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import torch  # noqa: E402

from flashbook import bench  # noqa: E402
from flashbook.bench.records import collect_provenance  # noqa: E402
from flashbook.kernels import flash_forward, hopper  # noqa: E402
from flashbook.timing import time_ms  # noqa: E402

LENGTHS = (1000, 1024, 4096, 4097)


def gluon_launch(q, k, v, causal: bool, ragged: bool):
    """``hopper.gluon_forward``'s launch with RAGGED given (True at a whole-tile length costs
    only the extra instructions: no tile is shifted)."""
    block_m, block_n, stages, schedule = hopper.configuration(q, causal, seq_k=k.shape[2])
    hopper.check_inputs(q, k, v, causal, block_m, block_n, stages, schedule)
    kernel, options, q_rows, extra = hopper._launch_plan(schedule, block_m)
    o, lse, descriptors, numbers = hopper.operands(q, k, v, None, q_rows, block_n)
    d = q.shape[-1]
    grid = (-(-q.shape[2] // block_m), q.shape[0] * q.shape[1])
    kernel[grid](*descriptors, hopper._descriptor(o.view(-1, d), (q_rows, d)), lse, *numbers, HEAD_DIM=d,
                 BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal, RAGGED=ragged, **extra, **options)
    return o, lse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/gluon_lengths.py"),
              "rows": []}
    for d in (64, 128):
        for n in LENGTHS:
            for causal in (False, True):
                b, h = 32768 // n, 2048 // d
                gen = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v = (torch.randn(b, h, n, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
                variants = {"triton": lambda: flash_forward(q, k, v, causal=causal),
                            "gluon": lambda: hopper.gluon_forward(q, k, v, causal=causal)}
                if d == 64:
                    variants["gluon-producer"] = lambda: hopper.gluon_forward(
                        q, k, v, causal=causal, block_m=128, block_n=128, stages=3, schedule="producer")
                if n % 128 == 0:
                    variants["gluon-ragged"] = lambda: gluon_launch(q, k, v, causal, True)
                want = variants["triton"]()[0].float()
                row = {"head_dim": d, "seq": n, "batch": b, "heads": h, "causal": causal,
                       "config": list(hopper.configuration(q, causal, seq_k=n)), "ragged": n % 128 != 0}
                for name, fn in variants.items():
                    row[f"{name}_max_diff"] = float((fn()[0].float() - want).abs().max())
                times = {name: [] for name in variants}
                for r in range(args.rounds):
                    order = list(variants) if r % 2 == 0 else list(variants)[::-1]
                    for name in order:
                        times[name].append(time_ms(variants[name]))
                flops = bench.attention_flops(b, h, n, n, d, causal=causal)
                for name, ts in times.items():
                    med = statistics.median(ts)
                    row[name] = {"ms": med, "min_ms": min(ts), "max_ms": max(ts), "times_ms": ts,
                                 "tflops": flops / med / 1e9, "spread": (max(ts) - min(ts)) / med}
                row["gluon_over_triton"] = row["triton"]["ms"] / row["gluon"]["ms"]
                if "gluon-ragged" in row:
                    row["ragged_cost"] = row["gluon-ragged"]["ms"] / row["gluon"]["ms"] - 1
                record["rows"].append(row)
                print(f"d={d} N={n} {'causal' if causal else 'full'} {row['config']}: "
                      + ", ".join(f"{x} {row[x]['tflops']:.0f} TFLOP/s (spread {row[x]['spread']:.1%})" for x in times)
                      + f"; gluon/triton {row['gluon_over_triton']:.2f}"
                      + (f"; RAGGED=True costs {row['ragged_cost']:+.1%}" if "ragged_cost" in row else ""), flush=True)
                del q, k, v
    with open(os.path.join(args.out, "gluon_lengths.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
