"""Where naive attention's time goes on a GPU, step by step (chapter 1's figure).

    PYTHONPATH=. python benchmarks/naive_breakdown.py --out DIR [--n 4096 8192] [--d 64 128]

Times the steps of softmax(Q K^T) V as separate operations, each writing its result to
memory as naive code does (``flashbook.plots.measure_naive_steps``): the two matrix
products, the bytes the softmax must move (a copy of S), and the softmax's arithmetic.
On a GPU each step is timed by ``flashbook.timing.time_ms``, the timer of every recorded
number (CUDA events, the L2 cache flushed before each call, the median).
Writes DIR/naive_breakdown.json: the rows, and under "environment" the provenance record
every run writes (``flashbook.bench.collect_provenance``: GPU, driver, CUDA, torch, triton,
date, command, git commit, a digest of the sources, settings). Without a GPU it runs the
same code on the CPU, small, so the script can be checked anywhere; the record says which
device it used.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from flashbook import bench, plots, timing  # noqa: E402


def environment(argv, settings: dict) -> dict:
    """``bench.collect_provenance`` for this script: its own command, settings and timing."""
    prov = bench.collect_provenance(argv, program="python3 benchmarks/naive_breakdown.py")
    prov["settings"] = settings
    if settings["device"] == "cuda":
        prov["timing"] = {"method": "flashbook.timing.time_ms around each step: CUDA events, "
                                    "the L2 cache flushed before each call",
                          "statistic": "median"}
    else:
        prov["timing"] = {"method": "wall clock around each step (flashbook.plots.measure_naive_steps)",
                          "statistic": "min", "repeats": settings["repeats"]}
    prov["conventions"] = {"softmax: max, exp, sum": "the whole softmax less a copy of S "
                                                     "(the bytes it must move)"}
    prov["files"] = {"naive_breakdown.json": "one row per (dtype, n, d): ms per step"}
    return prov


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=None)
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3,
                        help="without a GPU: wall-clock runs per step, the fastest kept")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sizes = args.n or ([1024, 2048, 4096, 8192] if cuda else [256])
    dtypes = [torch.float16, torch.bfloat16] if cuda else [torch.float32]
    heads = args.heads if cuda else 2
    os.makedirs(args.out, exist_ok=True)
    settings = {"device": device, "n": sizes, "d": list(args.d), "batch_heads": heads,
                "dtypes": [str(t).removeprefix("torch.") for t in dtypes]}
    if not cuda:
        settings["repeats"] = args.repeats
    result = {"what": __doc__.split("\n\n")[2].replace("\n", " "),
              "environment": environment(argv, settings), "device": device, "rows": []}
    for dtype in dtypes:
        for n in sizes:
            for d in args.d:
                row = plots.measure_naive_steps(n, d, batch_heads=heads, device=device,
                                                dtype=dtype, repeats=args.repeats,
                                                timer=timing.time_ms if cuda else None)
                result["rows"].append(row)
                print({k: row[k] for k in ("n", "d", "dtype")},
                      {k: round(v, 3) for k, v in row["ms"].items()}, flush=True)
    with open(os.path.join(args.out, "naive_breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
