"""Probes that ask the kernels' own helpers what they decide (chapters 7 and 8).

``stage_map`` runs ``forward.causal_bounds``, the function the forward and dQ
kernels call, inside a tiny Triton kernel and turns its answer into a map of
which key tiles each query tile visits, and how:

* ``"main"``: visited without a mask (every row of the query tile sees the whole key tile);
* ``"masked"``: visited with the mask (the causal diagonal, or a ragged last key tile);
* ``"skipped"``: never visited (the mask removes the whole tile).

It runs wherever the kernels run: on the GPU, or in Triton's CPU interpreter.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .. import runtime
from .forward import causal_bounds

STAGES = ("main", "masked", "skipped")


@triton.jit
def _bounds_probe(out_ptr, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):
    """One program per query tile stores (full_end, hi): where its masked stage begins, and its end."""
    pid = tl.program_id(0)
    full_end, hi = causal_bounds(pid * BLOCK_M, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    tl.store(out_ptr + 2 * pid, full_end)
    tl.store(out_ptr + 2 * pid + 1, hi)


def stage_map(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool = True) -> np.ndarray:
    """(T_r, T_c) array of "main", "masked" or "skipped" for each (query tile, key tile),
    as ``causal_bounds`` decides it (the loop runs [0, full_end) main, then [full_end, hi) masked)."""
    for name, value in (("seq_q", seq_q), ("seq_k", seq_k), ("block_m", block_m), ("block_n", block_n)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value & (value - 1):
            raise ValueError(f"{name} must be a power of two (a Triton tile size), got {value}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    n_programs, n_key_tiles = triton.cdiv(seq_q, block_m), triton.cdiv(seq_k, block_n)
    out = torch.zeros(n_programs, 2, dtype=torch.int32, device=runtime.device())
    _bounds_probe[(n_programs,)](out, seq_q, seq_k, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    starts = np.arange(n_key_tiles) * block_n
    bounds = out.cpu().numpy()
    full_end, hi = bounds[:, :1], bounds[:, 1:]
    return np.where(starts < full_end, "main", np.where(starts < hi, "masked", "skipped")).astype(object)
