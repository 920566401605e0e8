"""The Gluon forward's variants that chapter 10 measured slower, runnable beside their recorded runs.

    from gluon_lab import gluon_forward      # benchmarks/ on sys.path, as the scripts here have it
    o, lse = gluon_forward(q, k, v, causal=True, schedule="persistent")
    TRITON_INTERPRET=0 python3 benchmarks/gluon_lab.py [--out FILE] < jobs.json   # compiled for sm_90, no GPU

``flashbook.kernels.hopper`` ships the schedules that won ("overlap" and "producer"). What
lost on the H200 stays here, built on the library's pieces (the loads, the plans, the
output), with its own copy of the loop, ``attend_tiles``, generalised for all three:

* ``schedule="pingpong"``: as "producer", and the two consumer warpgroups take turns to
  issue their matrix products (``take_turn``, ``pass_turn``), so that one's softmax runs
  while the other's products occupy the tensor cores. It added nothing to the producer
  schedule: ``benchmarks/gluon_experiment.py``, recorded in
  ``benchmarks/results/gluon_h200/gluon_d128.json`` (and ``_run2``, ``gluon_d64.json``).
* ``schedule="persistent"``: as "overlap", but only as many programs as the GPU holds
  (``resident_programs``), each walking from query tile to query tile (``work_item``) with
  one stream of K/V tiles (``refill``): 0.80-1.00x the same tiles launched one program
  per tile, ``benchmarks/results/gluon_h200/gluon_d64_persistent_graph.json``
  (``gluon_experiment.py --graph``).
* ``fma_share`` 2 or 4: a half or a quarter of each score tile's exponentials computed
  with a polynomial on the FMA units (``exp2_fma``, FlashAttention-4's trick): from 4K on, a
  half was slower at every shape and a quarter never faster than the run's noise,
  ``benchmarks/results/gluon_exp2_h200/`` (``gluon_exp2_experiment.py``).

Chapter 10 reads those runs and shows this code. What the library ships
(``hopper.SCHEDULES``, no FMA share) runs the library's own kernel through here too,
so an experiment's baseline is the shipped kernel. ``tests/test_hopper_gpu.py`` checks
every variant against float64 on a Hopper GPU, ``tests/test_hopper.py`` compiles them
for sm_90 anywhere (``main`` below: ``python -m flashbook.kernels.targets`` for them).
"""
from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
from flashbook.kernels import hopper  # noqa: E402
from flashbook.kernels.hopper import (  # noqa: E402
    HAS_GLUON, WG_ROWS, _jit, allocate_ring, allocate_ws, empty_rows, finish_rows, item_plan, load_first, load_kv,
    on_diagonal, producer, shifted_scores, tile_plan, write_rows)
from flashbook.validation import check_choice  # noqa: E402

if HAS_GLUON:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier, warpgroup_mma, warpgroup_mma_wait)

    from flashbook.kernels.hopper import WG_ROWS_C, cta_barrier, tma_load

#: the library's schedules and this lab's:
#: "pingpong"   as "producer", and the consumers take turns on the tensor cores
#: "persistent" as "overlap", but as many programs as fit on the GPU, each going from one query
#:              tile to the next without a pause (the next tile's K/V and Q load during this one)
SCHEDULES = (*hopper.SCHEDULES, "pingpong", "persistent")
#: the library schedule whose limits each of this lab's keeps
BUILDS_ON = {"pingpong": "producer", "persistent": "overlap"}
#: 1/share of each score tile's exponentials computed on the FMA units (0: none; exp2_fma)
FMA_SHARES = (0, 2, 4)
EXP2_DEGREES = (3, 4)  # degrees of exp2_fma's polynomial
#: registers per thread of the persistent schedule's 64-row programs: three fit on an SM
PERSISTENT_REGS = 168


def exp2_polynomial(degree: int = 4):
    """Coefficients c1..c_degree of 1 + c1 f + ... + c_degree f**degree, close to 2**f on
    [-1/2, 1/2] in relative error: least squares on Chebyshev points, weighted by
    1/2**f (near the minimax fit), with 2**0 = 1 exactly."""
    import numpy as np

    f = 0.5 * np.cos(np.linspace(0.0, np.pi, 1025))
    target = np.exp2(f)
    powers = np.vander(f, degree + 1, increasing=True)[:, 1:]
    coeffs, *_ = np.linalg.lstsq(powers / target[:, None], 1.0 - 1.0 / target, rcond=None)
    return tuple(float(c) for c in coeffs)


def exp2_fma_error(degree: int = 4) -> float:
    """The largest relative error of ``exp2_polynomial(degree)`` against 2**f on [-1/2, 1/2]
    (a fine grid, in float64): what ``exp2_fma`` adds to each weight, float32 rounding aside."""
    import numpy as np

    f = np.linspace(-0.5, 0.5, 100001)
    value = 1.0 + np.polynomial.polynomial.polyval(f, (0.0, *exp2_polynomial(degree)))
    return float(np.abs(value / np.exp2(f) - 1.0).max())


if HAS_GLUON:
    P3_1, P3_2, P3_3 = (gl.constexpr(c) for c in exp2_polynomial(3))
    P4_1, P4_2, P4_3, P4_4 = (gl.constexpr(c) for c in exp2_polynomial(4))
    EXP2_FLOOR = gl.constexpr(-125.0)
    ROUNDER = gl.constexpr(1.5 * 2.0**23)


@_jit
def exp2_fma(x, DEGREE: gl.constexpr):
    """2**x for x <= 0 without the special-function unit (FlashAttention-4's trick).

    x = j + f, j a whole number and f in [-1/2, 1/2]: 2**f is a polynomial of
    degree DEGREE (3 or 4, ``exp2_polynomial``) on the FMA units, and j goes
    straight into the exponent bits. Chapter 10 measures it.
    """
    # 2**-125 stands in for 0: the exponent bits must not underflow
    x = gl.maximum(x, EXP2_FLOOR)
    # adding 1.5 * 2**23 rounds x to j and leaves j in the low bits
    shifted = x + ROUNDER
    j = shifted - ROUNDER
    f = x - j
    if DEGREE == 3:
        p = ((P3_3 * f + P3_2) * f + P3_1) * f + 1.0
    else:
        p = (((P4_4 * f + P4_3) * f + P4_2) * f + P4_1) * f + 1.0
    # multiply by 2**j: add j to the exponent field (bits 23 to 30)
    bits = p.to(gl.int32, bitcast=True) + (shifted.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@_jit
def exp2_shared(x, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr):
    """2**x of a score tile, 1/FMA_SHARE of it on the FMA units (0: none), the
    rest on the special-function unit; the split columns are registers of the same thread."""
    if FMA_SHARE == 0:
        y = gl.exp2(x)
    else:
        ROWS: gl.constexpr = x.shape[0]
        COLS: gl.constexpr = x.shape[1]
        if FMA_SHARE == 2:
            even, odd = gl.split(gl.reshape(x, [ROWS, COLS // 2, 2]))
            y = gl.reshape(gl.join(gl.exp2(even), exp2_fma(odd, DEGREE)), [ROWS, COLS])
        else:
            # columns whose bit 3 is set, then of those the odd ones: a quarter
            x4 = gl.reshape(gl.permute(gl.reshape(x, [ROWS, COLS // 16, 2, 8]), (0, 1, 3, 2)), [ROWS, COLS // 2, 2])
            lo, hi = gl.split(x4)
            hi_even, hi_odd = gl.split(gl.reshape(hi, [ROWS, COLS // 4, 2]))
            hi = gl.reshape(gl.join(gl.exp2(hi_even), exp2_fma(hi_odd, DEGREE)), [ROWS, COLS // 2])
            hi = gl.convert_layout(hi, lo.type.layout)
            y4 = gl.reshape(gl.join(gl.exp2(lo), hi), [ROWS, COLS // 16, 8, 2])
            y = gl.reshape(gl.permute(y4, (0, 1, 3, 2)), [ROWS, COLS])
        y = gl.convert_layout(y, x.type.layout)   # the same registers: no data moves
    return y


@_jit
def softmax_step(s, row_max, row_sum, rows, cols, diagonal, qk_scale, masked, FMA_SHARE: gl.constexpr,
                 DEGREE: gl.constexpr):
    """``hopper.softmax_step`` with the tile's exponentials shared with the FMA units (``exp2_shared``)."""
    s, new_max = shifted_scores(s, row_max, rows, cols, diagonal, qk_scale, masked)
    p = exp2_shared(s, FMA_SHARE, DEGREE)
    alpha = gl.exp2(row_max - new_max)
    return p, new_max, row_sum * alpha + gl.sum(p, 1), alpha


@_jit
def work_item(w, seq_q, seq_k, n_heads, group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr):
    """``item_plan`` for work item ``w`` of the persistent schedule: the query tiles of one head
    after another (its K/V stay in L2 while they are read), the longest first when causal."""
    n_m = gl.cdiv(seq_q, BLOCK_M)
    pid_m = w % n_m
    if CAUSAL:
        pid_m = n_m - 1 - pid_m
    return item_plan(pid_m, w // n_m, seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)


@_jit
def take_turn(turns, step, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until it is this warpgroup's turn to issue its matrix products."""
    if PINGPONG:
        mbarrier.wait(turns.index(WG), step & 1)


@_jit
def pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: this warpgroup's products are issued; the other one may issue its own."""
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - WG))


@_jit
def refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, limit, g, n_tiles, kv_row, kv_row_next,
           BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Load the key/value tile numbered ``issued`` in this program's stream, if ``issued < limit``;
    returns the next number to load.

    The stream is every key tile this program visits, in order: the current query tile's
    ``n_tiles`` tiles (numbers ``g`` on, keys from row ``kv_row``), then the next query
    tile's (from ``kv_row_next``; the persistent schedule). Tile number t goes to ring
    slot t % STAGES, so its barriers' phase is (t // STAGES) & 1.
    """
    here = (issued < g + n_tiles).to(gl.int32)
    tile = issued - g - n_tiles * (1 - here)
    row = kv_row_next + (kv_row - kv_row_next) * here + tile * BLOCK_N
    pred = issued < limit
    load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row, issued % STAGES, pred)
    return issued + pred.to(gl.int32)


@_jit
def attend_tiles(q_smem, k_smem, v_smem, q_bar, q_phase, k_bars, v_bars, kv_empty, turns,
                 k_desc, v_desc, kv_row, first_row, n_tiles, diagonal, qk_scale, g, issued, kv_row_next, n_next,
                 ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, WG: gl.constexpr,
                 PRODUCER: gl.constexpr, PINGPONG: gl.constexpr, FMA_SHARE: gl.constexpr,
                 DEGREE: gl.constexpr):
    """``hopper.attend_tiles`` for every variant here: its key tiles are numbers ``g`` to
    ``g + n_tiles - 1`` of the program's stream (``refill``; Q's barrier in phase ``q_phase``),
    warpgroup ``WG`` takes its ``turns`` (PINGPONG), and the exponentials are shared with
    the FMA units (FMA_SHARE). Returns (o, row_max, row_sum, issued)."""
    dtype: gl.constexpr = k_smem.dtype
    row_max, row_sum, o, s_zero, rows, offs_n, full_end = empty_rows(first_row, diagonal, n_tiles, ROWS, HEAD_DIM,
                                                                     BLOCK_N)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o.type.layout, k_width=2)

    mbarrier.wait(q_bar, q_phase)
    mbarrier.wait(k_bars.index(g % STAGES), (g // STAGES) & 1)
    take_turn(turns, 0, WG, PINGPONG)
    s = warpgroup_mma(q_smem, k_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    pass_turn(turns, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s,))
    p, row_max, row_sum, alpha = softmax_step(s, row_max, row_sum, rows, offs_n, diagonal, qk_scale,
                                              on_diagonal(0, full_end, BLOCK_N, CAUSAL), FMA_SHARE, DEGREE)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        slot = (g + j) % STAGES
        prev = (g + j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), ((g + j) // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((g + j - 1) // STAGES) & 1)
        take_turn(turns, j, WG, PINGPONG)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o = warpgroup_mma(p, v_smem.index(prev), o, is_async=True)
        pass_turn(turns, WG, PINGPONG)
        s = warpgroup_mma_wait(1, deps=(s,))
        p_next, row_max, row_sum, alpha = softmax_step(
            s, row_max, row_sum, rows, j * BLOCK_N + offs_n, diagonal, qk_scale,
            on_diagonal(j * BLOCK_N, full_end, BLOCK_N, CAUSAL), FMA_SHARE, DEGREE)
        o = warpgroup_mma_wait(0, deps=(o,))
        if PRODUCER:   # hopper.release_tile, with the stream's next tile to load
            mbarrier.arrive(kv_empty.index(prev))
        else:
            cta_barrier()
            issued = refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, g + n_tiles + n_next, g,
                            n_tiles, kv_row, kv_row_next, BLOCK_N, STAGES)
        o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout)), 1)
        p = gl.convert_layout(p_next.to(dtype), p_layout)

    last = g + n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    take_turn(turns, n_tiles, WG, PINGPONG)
    o = warpgroup_mma(p, v_smem.index(last % STAGES), o, is_async=True)
    pass_turn(turns, WG, PINGPONG)
    o = warpgroup_mma_wait(0, deps=(o,))
    if PRODUCER:
        mbarrier.arrive(kv_empty.index(last % STAGES))
    return o, row_max, row_sum, issued


@_jit
def store_rows(o, row_max, row_sum, O, o_row, LSE):
    """``finish_rows``, then O straight from the registers to global memory (the persistent
    schedule: Q's buffer is already taking the next tile's Q)."""
    o = finish_rows(o, row_max, row_sum, LSE, o_row)
    rows = gl.arange(0, o.shape[0], layout=gl.SliceLayout(1, o.type.layout))
    cols = gl.arange(0, o.shape[1], layout=gl.SliceLayout(0, o.type.layout))
    offsets = (o_row + gl.expand_dims(rows, 1)).to(gl.int64) * o.shape[1] + gl.expand_dims(cols, 0)
    gl.store(O + offsets, o.to(O.dtype.element_ty))


@_jit
def _gluon_attn_fwd(q_desc, k_desc, v_desc, o_desc, LSE,
                    n_heads, group, seq_q, seq_k, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, FMA_SHARE: gl.constexpr,
                    DEGREE: gl.constexpr):
    """The library's "overlap" kernel (``hopper._gluon_attn_fwd``) with FMA_SHARE."""
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars = allocate_ring(q_desc, k_desc, v_desc, BLOCK_M, HEAD_DIM, BLOCK_N,
                                                                  STAGES)
    load_first(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, q_row, kv_row, n_tiles,
               seq_k, BLOCK_N, STAGES)
    o, row_max, row_sum, issued = attend_tiles(
        q_smem, k_smem, v_smem, q_bar, 0, k_bars, v_bars, k_bars, k_bars, k_desc, v_desc, kv_row,
        start_m, n_tiles, seq_k - seq_q, qk_scale, 0, gl.minimum(n_tiles, STAGES), kv_row, 0,
        BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, 0, False, False, FMA_SHARE, DEGREE)
    write_rows(o, row_max, row_sum, q_smem, o_desc, q_row, LSE)


@_jit
def _gluon_attn_fwd_persistent(q_desc, k_desc, v_desc, O, LSE,
                               n_heads, group, seq_q, seq_k, qk_scale, n_items,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, FMA_SHARE: gl.constexpr,
                               DEGREE: gl.constexpr):
    """Persistent: as many programs as fit on the GPU at once, each taking work items
    (query tiles) w = program, program + programs, ... of ``n_items``, with the
    "overlap" schedule's warps. Nothing waits between two items: the next tile's K/V
    arrive in the ring while the last ones are used (``refill``), and its Q lands while
    this tile's O leaves."""
    q_smem, k_smem, v_smem, q_bar, k_bars, v_bars = allocate_ring(q_desc, k_desc, v_desc, BLOCK_M, HEAD_DIM, BLOCK_N,
                                                                  STAGES)

    first = gl.program_id(0)
    step = gl.num_programs(0)
    start_m, q_row, kv_row, n_tiles = work_item(first, seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    g = gl.to_tensor(0)        # this item's first key tile in the program's stream
    issued = gl.to_tensor(0)   # the stream's next key tile to load
    for w in range(first, n_items, step):
        has_next = w + step < n_items
        start_next, q_row_next, kv_row_next, n_next = work_item(w + step, seq_q, seq_k, n_heads, group,
                                                                BLOCK_M, BLOCK_N, CAUSAL)
        n_next = n_next * has_next.to(gl.int32)
        # the first tiles of this item that the last one had no free slot for
        cta_barrier()
        for i in gl.static_range(STAGES):
            issued = refill(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, issued, g + gl.minimum(n_tiles, STAGES),
                            g, n_tiles, kv_row, kv_row_next, BLOCK_N, STAGES)
        o, row_max, row_sum, issued = attend_tiles(
            q_smem, k_smem, v_smem, q_bar, ((w - first) // step) & 1, k_bars, v_bars, k_bars, k_bars, k_desc,
            v_desc, kv_row, start_m, n_tiles, seq_k - seq_q, qk_scale, g, issued, kv_row_next, n_next,
            BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, 0, False, False, FMA_SHARE, DEGREE)
        cta_barrier()   # every warp's products have read Q: the next item's Q may land
        mbarrier.expect(q_bar, q_desc.block_type.nbytes, has_next)
        tma_load(q_desc, [q_row_next, 0], q_bar, q_smem, has_next)
        store_rows(o, row_max, row_sum, O, q_row, LSE)
        g += n_tiles
        start_m, q_row, kv_row, n_tiles = start_next, q_row_next, kv_row_next, n_next


@_jit
def consumer(shared, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr,
             WG: gl.constexpr):
    """``hopper.consumer`` with its turns (PINGPONG) and FMA_SHARE."""
    (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, turns, k_desc, v_desc, o_desc, LSE,
     kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale) = shared
    o, row_max, row_sum, issued = attend_tiles(
        q_smem.index(WG), k_smem, v_smem, q_bars.index(WG), 0, k_bars, v_bars, kv_empty, turns,
        k_desc, v_desc, kv_row, start_m + WG * ROWS, n_tiles, seq_k - seq_q, qk_scale, 0, n_tiles, kv_row, 0,
        ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, WG, True, PINGPONG, FMA_SHARE, DEGREE)
    write_rows(o, row_max, row_sum, q_smem.index(WG), o_desc, q_row + WG * ROWS, LSE)


@_jit
def _gluon_attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, LSE,
                       n_heads, group, seq_q, seq_k, qk_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, FMA_SHARE: gl.constexpr, DEGREE: gl.constexpr):
    """The library's "producer" kernel (``hopper._gluon_attn_fwd_ws``) with FMA_SHARE, and with
    PINGPONG the two consumers taking turns to issue their matrix products, so that one's
    softmax runs while the other's products occupy the tensor cores."""
    ROWS: gl.constexpr = WG_ROWS_C
    NUM_WG: gl.constexpr = BLOCK_M // WG_ROWS_C
    start_m, q_row, kv_row, n_tiles = tile_plan(seq_q, seq_k, n_heads, group, BLOCK_M, BLOCK_N, CAUSAL)
    q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, turns = allocate_ws(q_desc, k_desc, v_desc, NUM_WG,
                                                                                  HEAD_DIM, BLOCK_N, STAGES)
    if PINGPONG:
        mbarrier.arrive(turns.index(0))   # warpgroup 0 takes the first turn
    shared = (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty, turns, k_desc, v_desc, o_desc, LSE,
              kv_row, q_row, start_m, n_tiles, seq_q, seq_k, qk_scale)
    if NUM_WG == 2:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 1)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, seq_k, ROWS, BLOCK_N, STAGES, NUM_WG))], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 0)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 1)),
            (consumer, (shared, ROWS, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, FMA_SHARE, DEGREE, 2)),
            (producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, kv_empty,
                        q_row, kv_row, n_tiles, seq_k, ROWS, BLOCK_N, STAGES, NUM_WG))],
            [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


_RESIDENT: dict = {}


def resident_programs(kernel, args, constants: dict, options: dict, device, dtype) -> int:
    """How many programs of ``kernel`` (compiled for these arguments) fit on ``device`` at
    once: SMs times what one SM holds by registers, shared memory and threads. Compiles
    without launching the first time, then remembers."""
    key = (kernel, device, dtype, tuple(sorted(constants.items())), tuple(sorted(options.items())))
    if key not in _RESIDENT:
        warps = options["num_warps"]
        compiled = kernel.warmup(*args, grid=(1,), **constants, **options)
        compiled._init_handles()
        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256   # allocated 256 at a time
        per_sm = min(smem // (compiled.metadata.shared + 1024),   # 1 KB of each block's is the system's
                     regs // regs_per_warp // warps, 2048 // (32 * warps))
        _RESIDENT[key] = max(1, per_sm) * props.multi_processor_count
    return _RESIDENT[key]


def _launch_plan(schedule: str, block_m: int):
    """``hopper._launch_plan`` for this lab's kernels. The persistent kernel stores O without
    TMA and takes the number of work items after the scale (``gluon_forward``)."""
    if schedule == "overlap":
        return _gluon_attn_fwd, {"num_warps": block_m // 16}, block_m, {}
    if schedule == "persistent":   # left alone, ptxas takes 255 registers for the causal loop: one program per SM
        options = {"num_warps": block_m // 16, **({"maxnreg": PERSISTENT_REGS} if block_m == 64 else {})}
        return _gluon_attn_fwd_persistent, options, block_m, {}
    extra = dict(PINGPONG=schedule == "pingpong", CONSUMER_REGS=hopper.CONSUMER_REGS[block_m // WG_ROWS])
    return _gluon_attn_fwd_ws, {"num_warps": 4}, WG_ROWS, extra


def check_inputs(q, k, v, causal: bool, block_m: int = 64, block_n: int = 128, stages: int = 3,
                 schedule: str = "overlap", fma_share: int = 0, degree: int = 4, programs: int | None = None) -> None:
    """This lab's arguments, each with an error that names it, then ``hopper.check_inputs``
    (for pingpong and persistent with the limits of the schedule each builds on)."""
    check_choice(schedule, "schedule", SCHEDULES)
    if schedule == "pingpong" and block_m != 128:
        raise ValueError(f"schedule={schedule!r} splits a 128-row tile between two warpgroups: block_m must be "
                         f"128, got {block_m}")
    if schedule == "persistent" and block_m == 192:
        raise ValueError(f"schedule={schedule!r} takes block_m 64 or 128 (one program, its own warps), got 192")
    if programs is not None:
        if schedule != "persistent":
            raise ValueError(f"programs sets how many programs the persistent schedule launches; "
                             f"schedule={schedule!r} launches one per query tile")
        if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
            raise ValueError(f"programs must be a positive int (or None: as many as fit on the GPU), got {programs!r}")
    if isinstance(fma_share, bool):   # False == 0 and True == 1 would slip through the choice
        raise TypeError(f"fma_share must be one of {FMA_SHARES}, got {fma_share!r}")
    check_choice(fma_share, "fma_share", FMA_SHARES)
    check_choice(degree, "degree", EXP2_DEGREES)
    hopper.check_inputs(q, k, v, causal, block_m, block_n, stages, BUILDS_ON.get(schedule, schedule),
                        whole_tiles=not shipped(schedule, fma_share))


def shipped(schedule: str, fma_share: int) -> bool:
    """Whether the library's own kernel is this variant (one of its schedules, no FMA share)."""
    return schedule in hopper.SCHEDULES and fma_share == 0


def gluon_forward(q, k, v, *, causal: bool = False, scale=None, block_m: int | None = None,
                  block_n: int | None = None, stages: int | None = None, schedule: str | None = None,
                  fma_share: int = 0, degree: int = 4, programs: int | None = None):
    """``hopper.gluon_forward`` with this lab's variants: ``schedule`` one of ``SCHEDULES``
    ("pingpong" takes block_m=128; "persistent" block_m 64 or 128, and launches ``programs``
    programs, by default as many as fit on the GPU at once), ``fma_share`` (one of
    ``FMA_SHARES``): 1/fma_share of each score tile's exponentials on the FMA units (0: none),
    by a polynomial of ``degree`` 3 or 4 (relative error ``exp2_fma_error(degree)``).
    Returns ``(o, lse)``; what is not given comes from ``hopper.default_config``."""
    block_m, block_n, stages, schedule = hopper.configuration(q, causal, block_m, block_n, stages, schedule)
    check_inputs(q, k, v, causal, block_m, block_n, stages, schedule, fma_share, degree, programs)
    if shipped(schedule, fma_share):
        return hopper.gluon_forward(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n,
                                    stages=stages, schedule=schedule)
    kernel, options, q_rows, extra = _launch_plan(schedule, block_m)
    o, lse, descriptors, numbers = hopper.operands(q, k, v, scale, q_rows, block_n)
    d = q.shape[-1]
    n_m, n_bh = -(-q.shape[2] // block_m), q.shape[0] * q.shape[1]
    constants = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                     FMA_SHARE=fma_share, DEGREE=degree, **extra)
    if schedule == "persistent":   # O leaves without TMA; one program per slot, walking the tiles
        args = (*descriptors, o, lse, *numbers, n_m * n_bh)
        grid = (min(programs or resident_programs(kernel, args, constants, options, q.device, q.dtype), n_m * n_bh),)
    else:
        args, grid = (*descriptors, hopper._descriptor(o.view(-1, d), (q_rows, d)), lse, *numbers), (n_m, n_bh)
    kernel[grid](*args, **constants, **options)
    return o, lse


def compile_for(cc: int = 90, *, head_dim: int = 128, block_m: int = 128, block_n: int = 128, stages: int = 3,
                schedule: str = "producer", causal: bool = True, dtype: str = "fp16", fma_share: int = 0,
                degree: int = 4):
    """``hopper.compile_for`` with this lab's variants (needs TRITON_INTERPRET=0; ``main``)."""
    if shipped(schedule, fma_share):
        return hopper.compile_for(cc, head_dim=head_dim, block_m=block_m, block_n=block_n, stages=stages,
                                  schedule=schedule, causal=causal, dtype=dtype)
    fn, options, q_rows, extra = _launch_plan(schedule, block_m)
    signature = hopper.signature(dtype, head_dim, q_rows, block_n)
    if schedule == "persistent":   # O itself in o_desc's place, and the number of work items last
        names = list(signature)
        signature = {**{name: signature[name] for name in names[:3]}, "O": f"*{dtype}",
                     **{name: signature[name] for name in names[4:]}, "n_items": "i32"}
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
                  "FMA_SHARE": fma_share, "DEGREE": degree, **extra}
    return hopper.compile_kernel(cc, fn, options, signature, constexprs)


def main(argv=None) -> int:
    """``python3 benchmarks/gluon_lab.py [--workers N] [--out FILE]``: compile the jobs on stdin
    as ``python -m flashbook.kernels.targets`` does (``targets.compile_elsewhere(jobs,
    script=this file)``), its "gluon_forward" jobs with ``compile_for`` above, so that a
    job's ``options`` may hold ``fma_share`` and ``degree``."""
    from flashbook.kernels import targets

    return targets.main(argv, run=functools.partial(targets.run_job, compile_gluon=compile_for))


if __name__ == "__main__":
    sys.exit(main())
