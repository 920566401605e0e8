"""The Gluon forward kernel (chapter 10) beside the library's Triton kernel and cuDNN.

    PYTHONPATH=. python3 benchmarks/gluon_experiment.py --out DIR [--head-dim 128] [--dtypes fp16,bf16] [--graph]

``flashbook.kernels.hopper`` issues the next tile's Q K^T and the previous tile's
P V as asynchronous warpgroup MMAs and runs the softmax while they compute, with K/V
arriving by TMA into a ring of ``stages`` slots. This times its schedules and those of
the lab (``gluon_lab.py``: "pingpong", "persistent") with key tiles of 64
and 128 and rings of 2 and 3 slots at the tutorial comparison's shapes (batch 1,
heads = 262144 / N, causal or not), each checked against the library's output and
float64 on one head. Needs a Hopper GPU.

Writes DIR/gluon.json (provenance, command, every timing and error).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
from gluon_lab import gluon_forward  # noqa: E402  (beside this script: the library's schedules and the lab's)
from hopper_fwd_experiment import run_tutorial_shapes  # noqa: E402  (beside this script)

#: (block_m, block_n, stages, schedule) of the Gluon kernel by head_dim: 128 rows are two warpgroups
#: in one program; 64 rows one warpgroup, with shared memory small enough for two programs per SM
GLUON_CONFIGS = {
    128: ((64, 64, 3, "overlap"), (128, 128, 3, "overlap"),
          (128, 128, 2, "producer"), (128, 128, 3, "producer"), (128, 64, 3, "producer"),
          (128, 128, 2, "pingpong"), (128, 128, 3, "pingpong"), (128, 64, 3, "pingpong"), (128, 64, 4, "pingpong")),
    64: ((64, 64, 2, "overlap"), (64, 64, 3, "overlap"), (64, 128, 2, "overlap"), (64, 128, 3, "overlap"),
         (64, 64, 2, "persistent"), (64, 64, 3, "persistent"), (64, 64, 4, "persistent"), (64, 128, 2, "persistent"),
         (128, 64, 2, "persistent"), (128, 128, 2, "persistent"),
         (192, 128, 3, "producer"), (192, 128, 4, "producer"), (192, 64, 4, "producer"),
         (128, 128, 3, "producer"), (128, 128, 3, "pingpong"))}


def variants_for(q, k, v, causal):
    return [(f"gluon {schedule} m{block_m} n{block_n} s{stages}",
             lambda block_m=block_m, block_n=block_n, stages=stages, schedule=schedule: gluon_forward(
                 q, k, v, causal=causal, block_m=block_m, block_n=block_n, stages=stages, schedule=schedule))
            for block_m, block_n, stages, schedule in GLUON_CONFIGS[q.shape[-1]]]


if __name__ == "__main__":
    run_tutorial_shapes(__doc__, "gluon_experiment.py", "gluon.json", variants_for, dtypes="fp16,bf16")
