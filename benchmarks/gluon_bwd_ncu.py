"""One call of each variant of the lab's Gluon backward, for Nsight Compute: where the dQ write's time goes.

    ncu --profile-from-start off --clock-control none --csv --page raw \\
        --metrics "$(python3 benchmarks/kernel_ncu.py --metrics)" \\
        python3 benchmarks/gluon_bwd_ncu.py [--variants none,tma,red4,red4_pipe] > OUT/raw.csv

bf16, B = 2, H = 16, N = 4096, d = 128, not causal. Each variant (``hopper_bwd_experiment.VARIANTS``)
runs twice first (compiling), then once between ``cudaProfilerStart`` and ``cudaProfilerStop``;
chapter 8's backward (``triton``) last, for comparison. Every variant launches the delta kernel
and then its own; ncu's rows come in that order.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402,F401
from flashbook.kernels import autograd  # noqa: E402
from flashbook.timing import profile_once  # noqa: E402

import gluon_bwd_lab as lab  # noqa: E402  (beside this file)
from hopper_bwd_experiment import VARIANTS  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="none,tma,red4,red4_pipe")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    o, lse = autograd.flash_forward(q, k, v)
    calls = [(name, lambda kw=VARIANTS.get(name, dict(dq_mode=name)): lab.gluon_backward(q, k, v, o, lse, do, **kw))
             for name in args.variants.split(",")]
    calls.append(("triton", lambda: autograd.flash_backward(q, k, v, o, lse, do)))
    for name, fn in calls:
        profile_once(fn)
        print(f"# profiled {name}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
