"""Where naive attention's time goes on a GPU, step by step (chapter 1's figure).

    PYTHONPATH=. python benchmarks/naive_breakdown.py --out DIR [--n 4096 8192] [--d 64 128]

Times the steps of softmax(Q K^T) V as separate operations, each writing its result to
memory as naive code does (``flashbook.plots.measure_naive_steps``): the two matrix
products, the bytes the softmax must move (a copy of S), and the softmax's arithmetic.
Writes DIR/naive_breakdown.json with the environment (GPU, driver, torch, triton, date,
command, git commit). Without a GPU it runs the same code on the CPU, small, so the
script can be checked anywhere; the record says which device it used.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402
from flashbook import bench, plots  # noqa: E402


def environment() -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as err:  # the record says what could not be read
            return f"unavailable: {err!r}"

    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "git_commit": bench.git_commit(),
           "python": platform.python_version(), "torch": torch.__version__,
           "flashbook": flashbook.__version__}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["driver"] = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        env["cuda"] = torch.version.cuda
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=None)
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sizes = args.n or ([1024, 2048, 4096, 8192] if cuda else [256])
    dtypes = [torch.float16, torch.bfloat16] if cuda else [torch.float32]
    os.makedirs(args.out, exist_ok=True)
    result = {"what": __doc__.split("\n\n")[2].replace("\n", " "), "environment": environment(),
              "device": device, "rows": []}
    for dtype in dtypes:
        for n in sizes:
            for d in args.d:
                row = plots.measure_naive_steps(n, d, batch_heads=args.heads if cuda else 2,
                                                device=device, dtype=dtype,
                                                repeats=args.repeats if cuda else 3)
                result["rows"].append(row)
                print({k: row[k] for k in ("n", "d", "dtype")},
                      {k: round(v, 3) for k, v in row["ms"].items()}, flush=True)
    with open(os.path.join(args.out, "naive_breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
