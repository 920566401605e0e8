"""Chapter 10's PTX table, recorded: chapter 7's forward and the Gluon kernel compiled for sm_90.

Chapter 10 counts, in the PTX of the two forwards (bf16, d = 128, causal, each with its default
configuration), the wgmma instructions, how many products each ``wgmma.wait_group`` leaves
running, and the TMA copy instructions (``chapter10_beyond.ptx_jobs``, compiled by
``targets.run_job``). This script compiles them with the Triton installed here and writes the
compile records; the chapter reads them (``chapter10_why.ptx_recorded``), so the counts are those
of the Triton that timed the kernels, not of whichever Triton builds the book. No GPU is needed.

    TRITON_INTERPRET=0 python3 benchmarks/ptx_counts.py --out OUT/ptx_compare.json
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loop_sass import checkout_commit, write_record  # noqa: E402  (beside this script)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("set TRITON_INTERPRET=0 to compile for sm_90", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(HERE))
    import triton

    from flashbook.bench.chapter10_beyond import ptx_jobs
    from flashbook.kernels.targets import run_job

    compiled = [run_job(job) for job in ptx_jobs()]
    for r in compiled:
        print({k: r[k] for k in ("kernel", "tensor_core_ops", "wgmma_waits", "tma_copies", "error")}, file=sys.stderr)
    out = {"about": "chapter 7's forward and the Gluon kernel compiled for sm_90 (bf16, d = 128, causal, default "
                    "configurations): targets.run_job's records, wgmma instructions, wait counts and TMA copies in the PTX",
           "triton": triton.__version__, "target": "sm_90",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "TRITON_INTERPRET=0 python3 benchmarks/ptx_counts.py --out " + os.path.relpath(args.out, HERE),
           "commit": checkout_commit(),
           "compiled": compiled}
    write_record(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
