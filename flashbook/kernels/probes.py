"""Probes that ask the kernels what they decide (chapters 7 and 8).

``stage_map`` runs the kernels' own bounds helpers inside a tiny Triton kernel:
``forward.causal_bounds`` (what the forward and dQ kernels call: which key tiles a
query tile visits) or ``forward.query_bounds`` (what the dK/dV kernel calls: which
query tiles visit a key tile), and turns the answer into one map of (query tile,
key tile) pairs, visited how:

* ``"main"``: visited without a mask (every row of the query tile sees the whole key tile);
* ``"masked"``: visited with the mask (the causal diagonal, or a ragged last key tile);
* ``"skipped"``: never visited (the mask removes the whole tile).

``observed_stages`` asks the real backward kernels instead: it poisons inputs
(NaN in dO or V shows which tiles a program visits; lse = -inf shows whether a
visit runs unmasked) and reads the map off the gradients. Tests compare the two.

Both run wherever the kernels run: on the GPU, or in Triton's CPU interpreter.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from .. import runtime
from ..validation import check_count, check_flag
from .forward import (causal_bounds, prefix_bounds, prefix_query_bounds, query_bounds, window_bounds,
                      window_query_bounds)

STAGES = ("main", "masked", "skipped")
KERNELS = ("forward", "backward_dq", "backward_dkdv")


@triton.jit
def _bounds_probe(out_ptr, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, PREFIX: tl.constexpr = False, prefix=0):
    """One program per query tile stores (full_end, hi): where its masked stage begins, and its end."""
    pid = tl.program_id(0)
    full_end, hi = causal_bounds(pid * BLOCK_M, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    if PREFIX:
        full_end, hi = prefix_bounds(full_end, hi, prefix, seq_k, BLOCK_N)
    tl.store(out_ptr + 2 * pid, full_end)
    tl.store(out_ptr + 2 * pid + 1, hi)


@triton.jit
def _query_bounds_probe(out_ptr, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, PREFIX: tl.constexpr = False, prefix=0):
    """One program per key tile stores query_bounds' (lo, band_end, full_end, main_end, hi)."""
    pid = tl.program_id(0)
    lo, band_end, full_end, main_end, hi = query_bounds(pid * BLOCK_N, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    if PREFIX:
        lo, band_end, main_end = prefix_query_bounds(lo, band_end, full_end, pid * BLOCK_N, prefix, BLOCK_N)
    tl.store(out_ptr + 5 * pid, lo)
    tl.store(out_ptr + 5 * pid + 1, band_end)
    tl.store(out_ptr + 5 * pid + 2, full_end)
    tl.store(out_ptr + 5 * pid + 3, main_end)
    tl.store(out_ptr + 5 * pid + 4, hi)


@triton.jit
def _window_bounds_probe(out_ptr, seq_q, seq_k, first, last, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         QUERY_SIDE: tl.constexpr):
    """One program per query tile stores window_bounds' (lo, full_lo, full_hi, hi), or, with
    QUERY_SIDE, one per key tile window_query_bounds' (lo, band_end, main_end, hi)."""
    pid = tl.program_id(0)
    if QUERY_SIDE:
        a, b, c, d = window_query_bounds(pid * BLOCK_N, seq_q, first, last, BLOCK_M, BLOCK_N)
    else:
        a, b, c, d = window_bounds(pid * BLOCK_M, seq_k, first, last, BLOCK_M, BLOCK_N)
    tl.store(out_ptr + 4 * pid, a)
    tl.store(out_ptr + 4 * pid + 1, b)
    tl.store(out_ptr + 4 * pid + 2, c)
    tl.store(out_ptr + 4 * pid + 3, d)


def _stages(starts, lo, band_end, full_end, main_end, hi) -> np.ndarray:
    """The map from a kernel's loop bounds: tiles starting in [band_end, full_end) run
    unmasked, in [lo, band_end) or [main_end, hi) masked, the others are skipped (one
    program's bounds broadcast against the ``starts`` of the tiles it could visit)."""
    main = (band_end <= starts) & (starts < full_end)
    masked = ((lo <= starts) & (starts < band_end)) | ((main_end <= starts) & (starts < hi))
    return np.where(main, "main", np.where(masked, "masked", "skipped")).astype(object)


def _window_stage_map(seq_q, seq_k, block_m, block_n, extra, kernel) -> np.ndarray:
    """``stage_map`` for a window: three stages, masked / main / masked, on either side."""
    n_query_tiles, n_key_tiles = triton.cdiv(seq_q, block_m), triton.cdiv(seq_k, block_n)
    query_side = kernel == "backward_dkdv"
    programs = n_key_tiles if query_side else n_query_tiles
    out = torch.zeros(programs, 4, dtype=torch.int32, device=runtime.device())
    _window_bounds_probe[(programs,)](out, seq_q, seq_k, extra["first"], extra["last"], BLOCK_M=block_m,
                                      BLOCK_N=block_n, QUERY_SIDE=query_side)
    bounds = out.cpu().numpy()
    if query_side:   # (lo, band_end, main_end, hi) per key tile: columns of the map
        lo, band_end, main_end, hi = bounds.T[:, None, :]
        starts = np.arange(n_query_tiles)[:, None] * block_m
    else:            # (lo, full_lo, full_hi, hi) per query tile: rows of the map
        lo, band_end, main_end, hi = (bounds[:, i:i + 1] for i in range(4))
        starts = np.arange(n_key_tiles)[None, :] * block_n
    return _stages(starts, lo, band_end, main_end, main_end, hi)


def stage_map(seq_q: int, seq_k: int, block_m: int, block_n: int, causal: bool = True,
              kernel: str = "forward", window=None, prefix: int = 0) -> np.ndarray:
    """(T_r, T_c) array of "main", "masked" or "skipped" for each (query tile, key tile),
    as ``kernel``'s own bounds helper decides it.

    "forward" and "backward_dq" (one program per query tile): ``causal_bounds``, the loop
    runs [0, full_end) main, then [full_end, hi) masked. "backward_dkdv" (one program per
    key tile): ``query_bounds``, query tiles [lo, band_end) masked, [band_end, full_end)
    main, [main_end, hi) masked. ``window=(left, right)`` (flash-attn's, as
    ``flash_attention`` takes it): ``window_bounds`` or ``window_query_bounds`` instead;
    ``prefix`` (causal): with ``prefix_bounds`` or ``prefix_query_bounds`` after them.
    """
    for name, value in (("seq_q", seq_q), ("seq_k", seq_k), ("block_m", block_m), ("block_n", block_n)):
        check_count(value, name)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value & (value - 1):
            raise ValueError(f"{name} must be a power of two (a Triton tile size), got {value}")
    check_flag(causal, "causal")
    from .autograd import kernel_mask

    causal, _, extra = kernel_mask(causal, window, None, seq_q, seq_k, 1.0, prefix=prefix)
    if extra.get("WINDOW"):
        return _window_stage_map(seq_q, seq_k, block_m, block_n, extra, kernel)
    later = dict(PREFIX=True, prefix=extra["prefix"]) if extra.get("PREFIX") else {}
    n_query_tiles, n_key_tiles = triton.cdiv(seq_q, block_m), triton.cdiv(seq_k, block_n)
    if kernel == "backward_dkdv":
        out = torch.zeros(n_key_tiles, 5, dtype=torch.int32, device=runtime.device())
        _query_bounds_probe[(n_key_tiles,)](out, seq_q, seq_k, BLOCK_M=block_m, BLOCK_N=block_n,
                                            CAUSAL=causal, **later)
        lo, band_end, full_end, main_end, hi = out.cpu().numpy().T[:, None, :]  # each (1, T_c)
        starts = np.arange(n_query_tiles)[:, None] * block_m
        return _stages(starts, lo, band_end, full_end, main_end, hi)
    n_programs = n_query_tiles
    out = torch.zeros(n_programs, 2, dtype=torch.int32, device=runtime.device())
    _bounds_probe[(n_programs,)](out, seq_q, seq_k, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, **later)
    starts = np.arange(n_key_tiles) * block_n
    bounds = out.cpu().numpy()
    full_end, hi = bounds[:, :1], bounds[:, 1:]
    return _stages(starts, 0, 0, full_end, full_end, hi)   # [0, full_end) main, then masked


def observed_stages(seq_q: int, seq_k: int, config, kernel: str = "backward_dkdv", *, head_dim: int = 16,
                    seed: int = 0) -> np.ndarray:
    """The stage map read off a backward kernel's gradients, causal (see ``stage_map``).

    "backward_dkdv": NaN in dO rows of query tile i turns NaN the dV of every key tile
    that tile i visits; lse = -inf in those rows turns dV infinite only where the visit
    runs unmasked (the masked stage guards lse = -inf). "backward_dq": NaN in V's key
    tile j turns NaN the dQ of every query tile that visits it (visited or not only:
    the stages are not observable there, so visited tiles read "visited").
    ``config`` is the ``configs.Config`` of the kernel observed.
    """
    from .autograd import flash_backward, flash_forward

    if kernel not in KERNELS[1:]:
        raise ValueError(f"kernel must be one of {KERNELS[1:]}, got {kernel!r}")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, n, head_dim, generator=gen).to(runtime.device()) for n in (seq_q, seq_k, seq_k))
    o, lse = flash_forward(q, k, v, causal=True)
    do = torch.randn(o.shape, generator=gen).to(runtime.device())
    t_r, t_c = triton.cdiv(seq_q, config.block_m), triton.cdiv(seq_k, config.block_n)
    row_tile = [slice(i * config.block_m, (i + 1) * config.block_m) for i in range(t_r)]
    col_tile = [slice(j * config.block_n, (j + 1) * config.block_n) for j in range(t_c)]
    kinds = np.full((t_r, t_c), "skipped", dtype=object)
    with np.errstate(all="ignore"):  # the interpreter computes with NaN and inf on purpose here
        if kernel == "backward_dq":
            for j in range(t_c):
                v_nan = v.clone()
                v_nan[..., col_tile[j], :] = math.nan
                dq, _, _ = flash_backward(q, k, v_nan, o, lse, do, causal=True, config_dq=config)
                for i in range(t_r):
                    if torch.isnan(dq[..., row_tile[i], :]).any():
                        kinds[i, j] = "visited"
            return kinds

        def dv_tiles(lse_, do_):
            # dq_mode="atomic" only to skip the dQ kernel: the dK/dV kernel's loops are the same
            _, _, dv = flash_backward(q, k, v, o, lse_, do_, causal=True, dq_mode="atomic", config_dkdv=config)
            return [dv[..., cols, :] for cols in col_tile]

        for i in range(t_r):
            do_nan, lse_inf = do.clone(), lse.clone()
            do_nan[..., row_tile[i], :] = math.nan
            lse_inf[..., row_tile[i]] = -math.inf
            for j, (seen, main) in enumerate(zip(dv_tiles(lse, do_nan), dv_tiles(lse_inf, do))):
                if torch.isnan(seen).any():
                    kinds[i, j] = "masked" if torch.isfinite(main).all() else "main"
    return kinds
