"""The Gluon forward with part of its exponentials on the FMA units (chapter 10).

    PYTHONPATH=. python3 benchmarks/gluon_exp2_experiment.py --out DIR [--head-dim 64] [--dtypes fp16,bf16]

At d = 64 one exponential costs the special-function unit as long as the 256
multiply-adds of its score and weight cost the tensor cores, so the softmax, not
the matrix products, sets the pace. ``gluon_lab.exp2_fma`` computes 2**x with a
polynomial on the FMA units instead (FlashAttention-4's trick); ``fma_share`` 2
gives it half of every score tile, 4 a quarter, 0 none; the polynomial has degree 3
or 4. This times the kernel's
default tiles with each share at the tutorial comparison's shapes, the share-0
kernel once more at the end (the run's noise), each checked against float64 on
one head. Needs a Hopper GPU. Writes DIR/gluon_exp2.json.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
from flashbook.kernels.hopper import default_config  # noqa: E402
from gluon_lab import gluon_forward  # noqa: E402  (beside this script: share 0 is the library's kernel)
from hopper_fwd_experiment import run_tutorial_shapes  # noqa: E402  (beside this script)


#: (fma_share, polynomial degree) in the order timed; share 0 comes again last
SHARES = ((0, 4), (2, 4), (4, 4), (2, 3), (4, 3), (0, 4))


def variants_for(q, k, v, causal):
    block_m, block_n, stages, schedule = default_config(q.shape[-1], q.shape[2], causal)
    label = f"gluon {schedule} m{block_m} n{block_n} s{stages}"
    return [(f"{label} fma{share}" + (f" deg{degree}" if share else "") + (" again" if index == len(SHARES) - 1 else ""),
             lambda share=share, degree=degree: gluon_forward(
                 q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages, schedule=schedule,
                 fma_share=share, degree=degree))
            for index, (share, degree) in enumerate(SHARES)]


if __name__ == "__main__":
    run_tutorial_shapes(__doc__, "gluon_exp2_experiment.py", "gluon_exp2.json", variants_for, dtypes="fp16,bf16")
