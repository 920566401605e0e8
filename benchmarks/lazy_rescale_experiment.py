"""Does rescaling the output only when a row maximum really grows speed up the forward kernel?

    PYTHONPATH=. python3 benchmarks/lazy_rescale_experiment.py --out DIR

The online softmax multiplies the output accumulator (B_r x d numbers) and the row sums by
alpha = 2^(m_old - m_new) at every key tile. Once the first tiles have been seen, the
maxima rarely move much, and the result stays exact whichever maximum the rows use, as
long as the exponentials cannot overflow: the sum and the output are both kept relative
to the same (stale) maximum, and the final division cancels it. So this variant keeps
the old maxima until some row's maximum has grown by more than TAU (in log2 units; the
weights then stay below 2^TAU, far inside fp16 and fp32), and only then rescales the
whole tile. The test is one comparison per tile (a maximum over the tile's rows), in
exchange for B_r x d multiplies skipped on most tiles.

The variant is the library's kernel, ``forward._attn_fwd``, compiled with its helper
``attend`` swapped (``ladder.kernel_with``), so everything else is the same code. It is
timed beside the library's kernel and cuDNN at the shapes of the Triton-tutorial
comparison (batch 1, heads = 262144 / N, d = 128), fp16 and bf16, causal or not, and
checked against the library's output and against float64 on one head.

Writes DIR/lazy_rescale.json (provenance as every flashbook run records it, command,
every timing and error).
"""
from __future__ import annotations

import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashbook.kernels import flash_forward  # noqa: E402
from flashbook.kernels.autograd import forward_with  # noqa: E402
from flashbook.kernels.configs import Config  # noqa: E402
from flashbook.kernels.forward import MASKED, load_tile, visible_keys  # noqa: E402
from flashbook.kernels.ladder import kernel_with  # noqa: E402
from hopper_fwd_experiment import run_tutorial_shapes  # noqa: E402  (beside this script)

TAU: tl.constexpr = tl.constexpr(8.0)   # rescale when a row maximum grows by more than 2^8


@triton.jit
def _lazy_inner(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn, rows, offs_n, offs_d,
                seq_k, diagonal, lo, hi, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                STAGE: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``forward._fwd_inner`` with the rescaling of acc and row_sum done only when needed."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_tile(k_base, cols, stride_kn, seq_k, offs_d, HEAD_DIM, STAGE == MASKED, not EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if STAGE == MASKED:
            qk = tl.where(visible_keys(rows, cols, seq_k, diagonal, CAUSAL), qk * qk_scale, float("-inf"))
            tile_max = tl.max(qk, 1)
        else:
            tile_max = tl.max(qk, 1) * qk_scale
        new_max = tl.maximum(row_max, tile_max)
        new_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row that has seen no key yet
        if tl.max(new_max - row_max, 0) > TAU:  # one test per tile: rescale every row, or none
            alpha = tl.exp2(row_max - new_max)
            acc = acc * alpha[:, None]
            row_sum = row_sum * alpha
            row_max = new_max
        if STAGE == MASKED:
            p = tl.exp2(qk - row_max[:, None])
        else:
            p = tl.exp2(qk * qk_scale - row_max[:, None])
        row_sum = row_sum + tl.sum(p, 1)
        v = load_tile(v_base, cols, stride_vn, seq_k, offs_d, HEAD_DIM, STAGE == MASKED, not EVEN_D)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, row_max, row_sum


@triton.jit
def attend_lazy(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
                rows, offs_n, offs_d, seq_k, diagonal, lo, full_end, hi, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                SOFTCAP: tl.constexpr = False, cap_scale=1.0, PREFIX: tl.constexpr = False,
                prefix=0, ALIBI: tl.constexpr = False, ALIBI_SLOPES=None, alibi_head=0,
                alibi_diagonal=0):   # attend's arguments (no window, cap, prefix or ALiBi here)
    tl.static_assert(not WINDOW and not SOFTCAP and not PREFIX and not ALIBI,
                     "the lazy-rescale experiment knows no window, cap, prefix or ALiBi")
    acc, row_max, row_sum = _lazy_inner(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
                                        rows, offs_n, offs_d, seq_k, diagonal, lo, full_end, qk_scale,
                                        HEAD_DIM, BLOCK_N, 1, CAUSAL, EVEN_D, DOT_PRECISION)
    acc, row_max, row_sum = _lazy_inner(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
                                        rows, offs_n, offs_d, seq_k, diagonal, full_end, hi, qk_scale,
                                        HEAD_DIM, BLOCK_N, 2, CAUSAL, EVEN_D, DOT_PRECISION)
    return acc, row_max, row_sum


LAZY = kernel_with({"attend": attend_lazy})
#: (name, kernel or None for the library's, config): the library's kernel with the lazy
#: variant's larger tiles, and the lazy variant with the library's tiles and two larger ones
VARIANTS = [("flashbook BN128 s3", None, Config(128, 128, 8, 3)),
            ("lazy", LAZY, None), ("lazy BN128 s2", LAZY, Config(128, 128, 8, 2)),
            ("lazy BN128 s3", LAZY, Config(128, 128, 8, 3))]


def variants_for(q, k, v, causal):
    return [(name, (lambda cfg=cfg: flash_forward(q, k, v, causal=causal, config=cfg)) if kernel is None else
             (lambda kernel=kernel, cfg=cfg: forward_with(kernel, q, k, v, causal=causal, config=cfg)))
            for name, kernel, cfg in VARIANTS]


if __name__ == "__main__":
    run_tutorial_shapes(__doc__, "lazy_rescale_experiment.py", "lazy_rescale.json", variants_for, "fp16,bf16")
