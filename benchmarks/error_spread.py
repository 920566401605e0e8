"""How much does "max error against float64" vary from one random draw to the next?

    PYTHONPATH=.:tests python3 benchmarks/error_spread.py --out DIR [--seeds 12]

The GPU tests compare the kernel's worst element with SDPA's worst element on the
same fresh random inputs. A maximum over millions of elements is a tail statistic,
so its ratio moves from draw to draw. This script repeats the comparison of
``tests/test_kernels_gpu.py`` on a few shapes over many seeds and records, for the
output and each gradient, the ratio of the maxima and the ratio of the RMS errors
(ours / SDPA's, both against float64): DIR/error_spread.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from gpu_check import environment  # noqa: E402
from test_kernels_gpu import three_ways  # noqa: E402

CASES = [("fp16-d64-N1024-full", 16, 32, 32, 1024, 1024, 64, False, "fp16"),
         ("bf16-d128-N4096-causal", 4, 16, 16, 4096, 4096, 128, True, "bf16"),
         ("bf16-d128-N2048-full", 8, 16, 16, 2048, 2048, 128, False, "bf16")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=12)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    result = {"what": __doc__.split("\n\n")[2].replace("\n", " "),
              "environment": environment(),
              "rows": []}
    for label, b, h, h_kv, n_q, n_k, d, causal, dtype in CASES:
        for seed in range(args.seeds):
            ours, theirs, truth = three_ways(b, h, h_kv, n_q, n_k, d, causal, dtype, seed)
            row = {"case": label, "seed": seed}
            for name, a, s, t in zip(("o", "dq", "dk", "dv"), ours, theirs, truth):
                ea, es = (a.double() - t).abs(), (s.double() - t).abs()
                row[f"{name}_max_ratio"] = float(ea.max() / es.max())
                row[f"{name}_rms_ratio"] = float(ea.pow(2).mean().sqrt() / es.pow(2).mean().sqrt())
            result["rows"].append(row)
            print({k2: round(v2, 3) if isinstance(v2, float) else v2 for k2, v2 in row.items()}, flush=True)
            with open(os.path.join(args.out, "error_spread.json"), "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
