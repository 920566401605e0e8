"""Does knowing the sequence lengths at compile time speed up the forward kernel?

    PYTHONPATH=. python3 benchmarks/static_shape_experiment.py --out DIR

Triton's fused-attention tutorial, which our forward trails by up to 14% at N = 1K,
compiles its sequence length in (``N_CTX: tl.constexpr``) and never masks a load. This
experiment gives the library's own kernel the same two things, one at a time, through
``ladder.kernel_with``: ``seq_q`` and ``seq_k`` as compile-time constants (one compiled
kernel per length: loop trip counts and bounds become constants), and then also the
query tile loaded without a row mask (valid here, where N is a multiple of the tile).
Everything else is the library's kernel. Timed beside the library kernel and cuDNN at
the tutorial comparison's shapes (batch 1, heads = 262144 / N, d = 128, fp16, causal or
not), each checked against the library's output and float64 on one head.

Writes DIR/static_shape.json (provenance, command, every timing and error).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashbook.kernels.autograd import forward_with  # noqa: E402
from flashbook.kernels.ladder import kernel_with  # noqa: E402
from hopper_fwd_experiment import run_tutorial_shapes  # noqa: E402  (beside this script)


@triton.jit
def load_rows_unmasked(base, rows, stride, n_rows, cols, n_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """``forward.load_tile`` without the row mask: only for a length that is a multiple of the tile."""
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if MASK_COLS:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    return tl.load(ptrs)


STATIC = kernel_with({}, constexprs=("seq_q", "seq_k"))
STATIC_UNMASKED_Q = kernel_with({"load_tile": load_rows_unmasked}, constexprs=("seq_q", "seq_k"))
VARIANTS = [("constexpr lengths", STATIC), ("constexpr lengths, unmasked Q", STATIC_UNMASKED_Q)]


def variants_for(q, k, v, causal):
    return [(name, lambda kernel=kernel: forward_with(kernel, q, k, v, causal=causal)) for name, kernel in VARIANTS]


if __name__ == "__main__":
    run_tutorial_shapes(__doc__, "static_shape_experiment.py", "static_shape.json", variants_for)
