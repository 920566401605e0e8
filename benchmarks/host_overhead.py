"""What one call costs the CPU, and what the GPU alone takes (chapter 10).

    PYTHONPATH=. python3 benchmarks/host_overhead.py --out DIR [--peer .peer/06-fused-attention.py]

The benchmark's timer (``bench.time_ms``) records a CUDA event, calls the function
and records another; it measures the GPU, but if the CPU takes longer to prepare a
call (checks, TMA descriptors, the launch) than the GPU takes to run the call
before it, the GPU waits and the wait is timed. This measures, per implementation:

* ``host_us``: CPU microseconds per call on a tiny shape (the GPU far ahead of
  nothing: calls are only enqueued, the median of 5 rounds of 500 calls);
* ``timer_ms`` and ``graph_ms`` at each of the given shapes: the benchmark's timer on
  the call, and on a CUDA graph of the same call (the GPU's work alone).

Writes DIR/host_overhead.json with the run's provenance. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401
import torch  # noqa: E402

from flashbook import bench, timing  # noqa: E402
from flashbook.kernels import flash_forward  # noqa: E402
from flashbook.kernels.autograd import flash_attention  # noqa: E402  (the Triton kernels)
from flashbook.kernels import hopper  # noqa: E402


def host_us(fn, calls: int = 500, rounds: int = 5) -> float:
    """Median CPU time per call in microseconds while the calls are only enqueued."""
    return timing.host_us(fn, calls, rounds)["median_us"]


def implementations(peer):
    found = {"flashbook forward": lambda q, k, v, c: flash_forward(q, k, v, causal=c),
             "flashbook (autograd)": lambda q, k, v, c: flash_attention(q, k, v, causal=c)}
    if hopper.available():
        found["gluon forward"] = lambda q, k, v, c: hopper.gluon_forward(q, k, v, causal=c)
        found["gluon (autograd)"] = lambda q, k, v, c: hopper.gluon_attention(q, k, v, causal=c)
    if peer is not None:
        found["peer"] = lambda q, k, v, c: peer(q, k, v, causal=c)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--peer", default=None, help="PATH[:FUNC] of a peer kernel file, as for --peer")
    parser.add_argument("--shapes", default="1024:64:1,1024:64:0,1024:128:1,16384:64:1",
                        help="N:d:causal,... (batch 1, heads = 262144 / N)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from flashbook.bench.peer import load_peer
    peer = load_peer(args.peer) if args.peer else None
    prov = bench.collect_provenance(sys.argv[1:], program="python3 benchmarks/host_overhead.py")
    if peer is not None:
        prov["peer"] = peer.provenance()
    result = {"what": __doc__.split("\n\n")[0], "environment": prov, "host": [], "shapes": []}
    path = os.path.join(args.out, "host_overhead.json")
    gen = torch.Generator(device="cuda").manual_seed(0)
    impls = implementations(peer)
    tiny = [torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3)]
    for grad in (False, True):
        q, k, v = (t.clone().requires_grad_(grad) for t in tiny)
        for name, fn in impls.items():
            row = {"impl": name, "requires_grad": grad, "shape": "1x2x128x64 fp16 causal"}
            try:
                row["host_us"] = host_us(lambda: fn(q, k, v, True))
            except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
            print(row, flush=True)
            result["host"].append(row)
    if hopper.available():   # the Gluon wrapper's parts
        q, k, v = tiny
        q2 = q.view(-1, 64)
        parts = {"hopper.check_inputs": lambda: hopper.check_inputs(q, k, v, True, 64, 128, 2, "overlap"),
                 "4 TMA descriptors": lambda: [hopper._descriptor(q2, (64, 64)) for _ in range(4)]}
        for name, fn in parts.items():
            row = {"impl": name, "host_us": host_us(fn)}
            print(row, flush=True)
            result["host"].append(row)
    for text in args.shapes.split(","):
        n, d, causal = (int(x) for x in text.split(":"))
        heads = 16 * 16384 // n
        q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
        flops = bench.attention_flops(1, heads, n, n, d, bool(causal))
        for name, fn in impls.items():
            row = {"impl": name, "seq": n, "heads": heads, "head_dim": d, "causal": bool(causal)}
            try:
                call = (lambda fn=fn: fn(q, k, v, bool(causal)))
                row["timer_ms"] = bench.time_ms(call)
                row["graph_ms"] = bench.time_ms(call, graph=True)
                row["timer_tflops"] = bench.tflops(flops, row["timer_ms"])
                row["graph_tflops"] = bench.tflops(flops, row["graph_ms"])
            except Exception as err:  # noqa: BLE001
                row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
            print(row, flush=True)
            result["shapes"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
