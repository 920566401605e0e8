"""The lab's Hopper backward in Gluon: dK, dV and dQ in one pass over the scores (it lost, so far).

Chapter 8's backward runs two kernels after the small delta kernel: one program per key
tile computes dK and dV, one per query tile computes dQ, and the second recomputes S and
dP. That is 7 matrix products per tile pair where the FLOP convention credits 5. This
kernel does what FlashAttention-2 and -3 do instead: the key-tile program that has dS in
hand also forms its part of dQ, dS Kᵀ's transpose, and adds it into an fp32 dQ buffer, so
S and dP are computed once.

One program: one BLOCK_N-key tile of one (batch, kv head), its K and V in shared memory
for the whole program; every query tile that sees those keys (the whole group of query
heads, GQA) arrives by TMA into a ring of STAGES slots, Q and dO together. Each step:

* ``Sᵀ = K Qᵢᵀ`` and ``dPᵀ = V dOᵢᵀ`` are issued as asynchronous wgmma; the softmax weights
  ``Pᵀ = exp2(Sᵀ·scale·log2 e − lseᵢ·log2 e)`` are recomputed while ``dPᵀ`` still runs;
* ``dV += Pᵀ dOᵢ`` and ``dK += dSᵀ Qᵢ`` take ``Pᵀ`` and ``dSᵀ = Pᵀ ⊙ (dPᵀ − δᵢ)`` from
  registers;
* ``dSᵀ`` goes to shared memory once, and ``dQᵢ = dS K`` (the same tile, read transposed)
  leaves by ``DQ_MODE``: "tma", one TMA reduce-add of the fp32 tile (what FA3 does), or
  "atomic", relaxed fp32 atomics per element (what FA2 does).

A last key tile or query tile that runs past its sequence is masked, not overlapped (the
forward overlaps, but here a row counted twice would add twice). dQ's order of additions
depends on which program gets there first, so its last bits can change from run to run.

sm_90 only, float16 and bfloat16, head_dim 64 or 128, any length, GQA, causal or not.
``benchmarks/hopper_bwd_experiment.py`` checks it against float64 and times it (run
``gluon_bwd``, benchmarks/results/gluon_bwd_h200/): correct at every checked shape, but
0.5-0.75x cuDNN's backward and slower than chapter 8's kernels in every dQ mode. "none"
(dQ not written) ran at 1.06-1.21x cuDNN for d = 128, N >= 4K, but it is no bound of this
design: with dQ unused the compiler drops the dQ products as well (ncu counts 13.1 M wgmma
instructions against 16.8 M for the modes that write dQ, run ``gluon_bwd_rows``), so "none"
times a four-product kernel. So it stays here, not in the library, until a dQ path closes
the gap to chapter 8's kernels.

``rows=True`` runs ``_gluon_attn_bwd_rows`` instead: the same five products and numbers on
FA3's register plan (S and dP in rows of queries, P and dS through shared memory), and with
``dq_split=True`` dQ in two head_dim halves; at d = 128 that is the variant ptxas assembles
without spilling (Triton 3.6's ptxas, sm_90a), where every writing mode above spills. Run
``gluon_bwd_rows`` (benchmarks/results/gluon_bwd_h200-2/) measured it: no local-memory
traffic, 1.29-1.42x the old plan's ``red4`` at d = 128, 0.86-1.02 of chapter 8's kernels.
"""
from __future__ import annotations

import functools
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from flashbook.kernels.hopper import HAS_GLUON, cta_barrier, tma_load, _descriptor, _shared_layout  # noqa: E402
from flashbook.kernels.forward import LOG2E  # noqa: E402

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    if hasattr(tma, "async_atomic_add"):
        TMA_ADD = tma.async_atomic_add
    elif hasattr(_ir, "DESCRIPTOR_REDUCE_KIND"):
        @_builtin
        def TMA_ADD(tensor_desc, coord, src, _semantic=None):
            """The TMA reduce-add of a shared-memory tile into global memory
            (``cp.reduce.async.bulk.tensor``): Triton 3.6 has the operation but not Gluon's
            name for it (``tma.async_atomic_add`` from 3.7 on), so it is called by hand here."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)
    else:  # pragma: no cover
        TMA_ADD = None
    _jit = gluon.jit
else:  # pragma: no cover
    TMA_ADD = None

    def _jit(fn):
        return fn

DQ_MODES = ("tma", "atomic", "red2", "red4")
LAB_DQ_MODES = ("none",)   # dQ not written (the compiler then drops its products: no bound)
BWD_HEAD_DIMS = (64, 128)


@_jit
def _load_step(q_desc, do_desc, q_smem, do_smem, bars, row, slot, pred):
    """Q and dO rows from ``row`` into ring slot ``slot`` (if ``pred``); one barrier for both."""
    mbarrier.expect(bars.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred)
    tma_load(q_desc, [row, 0], bars.index(slot), q_smem.index(slot), pred)
    tma_load(do_desc, [row, 0], bars.index(slot), do_smem.index(slot), pred)


@_jit
def _step_row(t, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M: gl.constexpr):
    """Step ``t`` of a program: (its query tile's first row in its head, that row in the
    (batch*heads*seq_q) view of Q). The group's query heads one after the other; within a
    head the tiles start ``shift`` tiles in and wrap around, so that the programs of one head
    do not all add into the same dQ rows at the same time."""
    g = t // tiles_per_head
    start_m = m_lo + ((t - g * tiles_per_head + shift) % tiles_per_head) * BLOCK_M
    return start_m, (q_head0 + g) * seq_q + start_m


@_jit
def _program_tile(n_heads, group, seq_q, seq_k, BLOCK_N: gl.constexpr):
    """This program's key tile: (its index, batch x kv head, batch, kv head, first key, the
    head's first row of K and V, the diagonal). Key j is visible to query i when
    j <= i + diagonal (causal, bottom-right aligned)."""
    pid_n = gl.program_id(0)
    bhk = gl.program_id(1)
    kv_heads = n_heads // group
    return pid_n, bhk, bhk // kv_heads, bhk % kv_heads, pid_n * BLOCK_N, bhk.to(gl.int64) * seq_k, seq_k - seq_q


@_jit
def _query_walk(q_desc, do_desc, q_smem, do_smem, bars, start_n, diagonal, seq_q, pid_n, b, n_heads, hk, group,
                CAUSAL: gl.constexpr, STAGGER: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr):
    """Which query tiles see this program's keys (causal: rows from start_n - diagonal on),
    over every query head of the group, and the first STAGES of them loaded into the ring.
    Returns (m_lo, tiles_per_head, n_steps, shift, q_head0) for ``_step_row``. The ring's
    barriers are initialised here first."""
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    if CAUSAL:
        m_lo = (gl.maximum(start_n - diagonal, 0) // BLOCK_M) * BLOCK_M
    else:
        m_lo = 0
    tiles_per_head = gl.maximum(gl.cdiv(seq_q - m_lo, BLOCK_M), 0)
    n_steps = group * tiles_per_head
    if STAGGER:
        shift = pid_n % gl.maximum(tiles_per_head, 1)
    else:
        shift = 0
    q_head0 = b * n_heads + hk * group
    for i in gl.static_range(STAGES):
        _, row = _step_row(i, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M)
        _load_step(q_desc, do_desc, q_smem, do_smem, bars, row, i, i < n_steps)
    return m_lo, tiles_per_head, n_steps, shift, q_head0


@_jit
def _kv_to_shared(K_PTR, V_PTR, k_smem, v_smem, kv_row, start_n, seq_k, layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """The program's K and V tile into shared memory by plain loads (keys past seq_k read
    zeros), then a fence and a barrier so every warp's products may read them. Returns the
    tile's offsets and row mask in ``layout`` (the dK/dV store may reuse them)."""
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    offs = (kv_row + gl.expand_dims(keys, 1)) * HEAD_DIM + gl.expand_dims(cols, 0)
    ok = gl.expand_dims(keys < seq_k, 1)
    k_smem.store(gl.load(K_PTR + offs, mask=ok, other=0.0))
    v_smem.store(gl.load(V_PTR + offs, mask=ok, other=0.0))
    fence_async_shared()
    cta_barrier()
    return offs, ok


@_jit
def _tile_state(start_n, key_of: gl.constexpr, query_of: gl.constexpr, score_layout: gl.constexpr,
                dq_layout: gl.constexpr, kd_layout: gl.constexpr, SCORE_M: gl.constexpr, SCORE_N: gl.constexpr,
                DQ_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """What a program starts its loop with: its keys' indices, the query tile's offsets, a zero
    score tile and a zero dQ tile (the fresh accumulators of S, dP and dQ each step), and dK, dV
    at zero."""
    return (start_n + gl.arange(0, BLOCK_N, layout=key_of), gl.arange(0, BLOCK_M, layout=query_of),
            gl.zeros([SCORE_M, SCORE_N], gl.float32, score_layout), gl.zeros([BLOCK_M, DQ_N], gl.float32, dq_layout),
            gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kd_layout), gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kd_layout))


@_jit
def _red_add(ptrs, x, VEC: gl.constexpr):
    """Add fp32 ``x`` into global memory at ``ptrs`` with relaxed vector reductions (``red.v2/.v4.f32``,
    no value returned), VEC neighbouring elements a thread holds per instruction. No mask: the
    buffer has room for a whole last tile, whose rows past the sequence add zeros."""
    addr = ptrs.to(gl.int64)   # (an address, not a pointer: inline assembly mixes no pointers with floats)
    if VEC == 2:
        gl.inline_asm_elementwise(
            "red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5}; mov.b32 $0, 0; mov.b32 $1, 0;",
            "=r,=r,l,l,f,f", [addr, x], dtype=gl.int32, is_pure=False, pack=2)
    else:
        gl.inline_asm_elementwise(
            "red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11}; mov.b32 $0, 0; mov.b32 $1, 0; "
            "mov.b32 $2, 0; mov.b32 $3, 0;",
            "=r,=r,=r,=r,l,l,l,l,f,f,f,f", [addr, x], dtype=gl.int32, is_pure=False, pack=4)


@_jit
def _step_scores(t, bars, q_smem, do_smem, k_smem, v_smem, st_zero, tiles_per_head, m_lo, q_head0, seq_q, shift,
                 BLOCK_M: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr = False):
    """Step ``t``: wait for its Q and dO in the ring, then issue Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
    (``ROWS``: S = Q Kᵀ and dP = dO Vᵀ) without waiting. Returns the slot, the tile's rows
    (``_step_row``), Q's and dO's shared memory and the two products in flight."""
    slot = t % STAGES
    start_m, q_row = _step_row(t, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M)
    mbarrier.wait(bars.index(slot), (t // STAGES) & 1)
    qs = q_smem.index(slot)
    dos = do_smem.index(slot)
    if ROWS:
        st = warpgroup_mma(qs, k_smem.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(dos, v_smem.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    else:
        st = warpgroup_mma(k_smem, qs.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, dos.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    return slot, start_m, q_row, qs, dos, st, dpt


@_jit
def _weights(st, LSE, q_row, offs_m, start_m, rows_k, seq_q, seq_k, start_n, diagonal, qk_scale, key_tile_ragged,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, ROWS: gl.constexpr = False):
    """Pᵀ recomputed from the raw scores Sᵀ (keys down, queries across) and the forward's lse
    (chapter 8, in base 2), zero where the mask hides a key from a query or where a tile runs
    past its sequence: masked only on tiles that need it. ``ROWS``: P from S (queries down,
    keys across; ``rows_k`` then holds the tile's keys along the columns), the same numbers,
    element for element, one lse value per row."""
    queries = start_m + offs_m
    q_ok = queries < seq_q
    lse = gl.load(LSE + (q_row + offs_m), mask=q_ok, other=0.0) * 1.4426950408889634
    if ROWS:
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 1))
    else:
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
    if CAUSAL:
        masked = key_tile_ragged | (start_m + BLOCK_M > seq_q) | (start_m + diagonal < start_n + BLOCK_N - 1)
    else:
        masked = key_tile_ragged | (start_m + BLOCK_M > seq_q)
    if masked:
        if ROWS:
            visible = gl.expand_dims(rows_k < seq_k, 0) & gl.expand_dims(q_ok, 1)
            if CAUSAL:
                visible = visible & (gl.expand_dims(rows_k, 0) <= gl.expand_dims(queries, 1) + diagonal)
        else:
            visible = gl.expand_dims(rows_k < seq_k, 1) & gl.expand_dims(q_ok, 0)
            if CAUSAL:
                visible = visible & (gl.expand_dims(rows_k, 1) <= gl.expand_dims(queries, 0) + diagonal)
        pt = gl.where(visible, pt, 0.0)
    return pt


@_jit
def _gluon_attn_bwd(q_desc, do_desc, dq_desc, K_PTR, V_PTR, LSE, DELTA, DQ, DK, DV,
                    n_heads, group, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, DQ_MODE: gl.constexpr,
                    K_LAYOUT: gl.constexpr, DS_LAYOUT: gl.constexpr, STAGGER: gl.constexpr,
                    DQ_BUFS: gl.constexpr, PIPE: gl.constexpr):
    warps: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = q_desc.dtype
    pid_n, bhk, b, hk, start_n, kv_row, diagonal = _program_tile(n_heads, group, seq_q, seq_k, BLOCK_N)

    # layouts: the key-tile products (BLOCK_N rows, one warp per 16) and dQ's (BLOCK_M rows)
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, BLOCK_M, 16])
    kd_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, warps // 4], instr_shape=[16, HEAD_DIM // (warps // 4), 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kd_layout, k_width=2)
    key_of: gl.constexpr = gl.SliceLayout(1, st_layout)
    query_of: gl.constexpr = gl.SliceLayout(0, st_layout)

    # shared memory: K and V for the whole program, the Q/dO ring, dSᵀ, the dQ tile
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], K_LAYOUT)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], K_LAYOUT)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], DS_LAYOUT)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())

    m_lo, tiles_per_head, n_steps, shift, q_head0 = _query_walk(
        q_desc, do_desc, q_smem, do_smem, bars, start_n, diagonal, seq_q, pid_n, b, n_heads, hk, group,
        CAUSAL, STAGGER, STAGES, BLOCK_M)

    # K and V by plain loads (a last tile past seq_k reads zeros), once
    kd_offs, key_ok = _kv_to_shared(K_PTR, V_PTR, k_smem, v_smem, kv_row, start_n, seq_k, kd_layout,
                                    BLOCK_N, HEAD_DIM)

    rows_k, offs_m, st_zero, dq_zero, dk, dv = _tile_state(
        start_n, key_of, query_of, st_layout, dq_layout, kd_layout, BLOCK_N, BLOCK_M, HEAD_DIM, BLOCK_M, BLOCK_N,
        HEAD_DIM)
    if DQ_MODE == "tma":
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, BLOCK_M, HEAD_DIM], dq_desc.layout)
    else:
        dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    red_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[128 // HEAD_DIM, HEAD_DIM // 4],
                                                warps_per_cta=[warps, 1], order=[1, 0])
    red_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, red_layout))
    red_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, red_layout))
    key_tile_ragged = start_n + BLOCK_N > seq_k

    if PIPE:
        # dQ one step late: step t issues the dQ product of step t - 1 (its dSᵀ is still in
        # shared memory) beside S_t and dP_t, so the tensor cores have it while the softmax runs
        prev_row = q_head0 * seq_q
        for t in range(n_steps):
            slot, start_m, q_row, qs, dos, st, dpt = _step_scores(
                t, bars, q_smem, do_smem, k_smem, v_smem, st_zero, tiles_per_head, m_lo, q_head0, seq_q, shift,
                BLOCK_M, STAGES)
            dqp = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False, is_async=True)
            queries = start_m + offs_m
            q_ok = queries < seq_q
            st = warpgroup_mma_wait(2, deps=(st,))
            pt = _weights(st, LSE, q_row, offs_m, start_m, rows_k, seq_q, seq_k, start_n, diagonal, qk_scale,
                          key_tile_ragged, BLOCK_M, BLOCK_N, CAUSAL)
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), dos, dv, is_async=True)
            dpt, dqp = warpgroup_mma_wait(1, deps=(dpt, dqp))
            if DQ_MODE == "tma":
                dq_smem = dq_bufs.index(0)
                tma.store_wait(0)
                dq_smem.store(dqp)
                fence_async_shared()
            delta = gl.load(DELTA + (q_row + offs_m), mask=q_ok, other=0.0)
            dst = pt * (dpt - gl.expand_dims(delta, 0))
            cta_barrier()   # both warpgroups' dQ products have read dSᵀ of step t - 1
            ds_smem.store(dst.to(dtype))
            fence_async_shared()
            cta_barrier()
            if t > 0:
                if DQ_MODE == "tma":
                    TMA_ADD(dq_desc, [prev_row, 0], dq_smem)
                else:
                    dq4 = gl.convert_layout(dqp, red_layout)
                    offs = (prev_row.to(gl.int64) + gl.expand_dims(red_rows, 1)) * HEAD_DIM + gl.expand_dims(red_cols, 0)
                    _red_add(DQ + offs, dq4, 4)
            dk = warpgroup_mma(ds_smem, qs, dk, is_async=True)
            dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
            cta_barrier()
            nxt = t + STAGES
            _, nrow = _step_row(nxt, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M)
            _load_step(q_desc, do_desc, q_smem, do_smem, bars, nrow, slot, nxt < n_steps)
            prev_row = q_row
        if n_steps > 0:   # the last step's dQ
            dqp = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False, is_async=True)
            dqp = warpgroup_mma_wait(0, deps=(dqp,))
            if DQ_MODE == "tma":
                dq_smem = dq_bufs.index(0)
                tma.store_wait(0)
                dq_smem.store(dqp)
                fence_async_shared()
                cta_barrier()
                TMA_ADD(dq_desc, [prev_row, 0], dq_smem)
            else:
                dq4 = gl.convert_layout(dqp, red_layout)
                offs = (prev_row.to(gl.int64) + gl.expand_dims(red_rows, 1)) * HEAD_DIM + gl.expand_dims(red_cols, 0)
                _red_add(DQ + offs, dq4, 4)
    else:
        for t in range(n_steps):
            slot, start_m, q_row, qs, dos, st, dpt = _step_scores(
                t, bars, q_smem, do_smem, k_smem, v_smem, st_zero, tiles_per_head, m_lo, q_head0, seq_q, shift,
                BLOCK_M, STAGES)
            queries = start_m + offs_m
            q_ok = queries < seq_q
            st = warpgroup_mma_wait(1, deps=(st,))
            pt = _weights(st, LSE, q_row, offs_m, start_m, rows_k, seq_q, seq_k, start_n, diagonal, qk_scale,
                          key_tile_ragged, BLOCK_M, BLOCK_N, CAUSAL)
            p16 = pt.to(dtype)
            dv = warpgroup_mma(gl.convert_layout(p16, a_layout), dos, dv, is_async=True)
            dpt = warpgroup_mma_wait(1, deps=(dpt,))
            delta = gl.load(DELTA + (q_row + offs_m), mask=q_ok, other=0.0)
            dst = pt * (dpt - gl.expand_dims(delta, 0))
            # dSᵀ to shared memory once: dK's product reads it as it is, dQ's transposed
            ds_smem.store(dst.to(dtype))
            fence_async_shared()
            cta_barrier()
            dk = warpgroup_mma(ds_smem, qs, dk, is_async=True)
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False, is_async=True)
            dq, dk, dv = warpgroup_mma_wait(0, deps=(dq, dk, dv))
            if DQ_MODE == "tma":
                dq_smem = dq_bufs.index(t % DQ_BUFS)
                tma.store_wait(DQ_BUFS - 1)   # the reduce-add that read this buffer last is done
                dq_smem.store(dq)
                fence_async_shared()
                cta_barrier()            # every warp has read this slot and ds_smem, and written dq_smem
                TMA_ADD(dq_desc, [q_row, 0], dq_smem)
            elif DQ_MODE == "atomic":
                cta_barrier()
                offs = (q_row.to(gl.int64) + gl.expand_dims(dq_rows, 1)) * HEAD_DIM + gl.expand_dims(dq_cols, 0)
                ok = gl.expand_dims(start_m + dq_rows < seq_q, 1)
                gl.atomic_add(DQ + offs, dq, mask=ok, sem="relaxed")
            elif DQ_MODE == "red2":   # two neighbouring columns per instruction, in the product's own layout
                cta_barrier()
                offs = (q_row.to(gl.int64) + gl.expand_dims(dq_rows, 1)) * HEAD_DIM + gl.expand_dims(dq_cols, 0)
                _red_add(DQ + offs, dq, 2)
            elif DQ_MODE == "red4":   # four per instruction: one row of a warp per instruction
                cta_barrier()
                dq4 = gl.convert_layout(dq, red_layout)
                offs = (q_row.to(gl.int64) + gl.expand_dims(red_rows, 1)) * HEAD_DIM + gl.expand_dims(red_cols, 0)
                _red_add(DQ + offs, dq4, 4)
            else:   # "none": dQ not written, so its product is dropped too
                cta_barrier()
            nxt = t + STAGES
            _, nrow = _step_row(nxt, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M)
            _load_step(q_desc, do_desc, q_smem, do_smem, bars, nrow, slot, nxt < n_steps)
    if DQ_MODE == "tma":
        tma.store_wait(0)
    gl.store(DK + kd_offs, (dk * sm_scale).to(dtype), mask=key_ok)
    gl.store(DV + kd_offs, dv.to(dtype), mask=key_ok)


@_jit
def _gluon_attn_bwd_rows(q_desc, do_desc, dq_desc, K_PTR, V_PTR, LSE, DELTA, DQ, DK, DV,
                         n_heads, group, seq_q, seq_k, qk_scale, sm_scale,
                         HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, DQ_MODE: gl.constexpr,
                         K_LAYOUT: gl.constexpr, DS_LAYOUT: gl.constexpr, STAGGER: gl.constexpr,
                         DQ_BUFS: gl.constexpr, PIPE: gl.constexpr, DQ_SPLIT: gl.constexpr):
    """``_gluon_attn_bwd`` (``rows=True``) with FA3's register plan for the same tile. S = Q Kᵀ
    and dP = dO Vᵀ come out in rows of queries, each warpgroup holding 64 of the 128 keys:
    a thread then holds 2 query rows (one lse and one δ each) where Sᵀ's layout gives it 16
    query columns (16 lse and 16 δ values live beside the score tiles). P and dS go to shared
    memory as soon as they are formed, and every product after the scores reads them there
    (dV = (Pᵀ) dO, dK = (dSᵀ) Q, dQ = dS K), so no 16-bit copy is held by a product in
    flight. K and V arrive by vector loads whose addresses are dead before the loop (the dK
    and dV stores compute theirs after it). ``DQ_SPLIT``: dQ as two head_dim halves, one
    after the other, into the same shared tile (16 registers live instead of 32); at
    head_dim 128 only (a half of 64 is 32 columns, less than a swizzle atom; d = 64 does not
    need it: 219 registers, no spill)."""
    warps: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = q_desc.dtype
    pid_n, bhk, b, hk, start_n, kv_row, diagonal = _program_tile(n_heads, group, seq_q, seq_k, BLOCK_N)

    wg: gl.constexpr = warps // 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, BLOCK_N // wg, 16])
    kd_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, HEAD_DIM, 16])
    SPLIT: gl.constexpr = DQ_SPLIT and HEAD_DIM >= 128   # halves of 64 columns: whole 128-byte swizzle atoms
    DQ_N: gl.constexpr = HEAD_DIM // 2 if SPLIT else HEAD_DIM
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, DQ_N // wg, 16])
    query_of: gl.constexpr = gl.SliceLayout(1, s_layout)
    key_of: gl.constexpr = gl.SliceLayout(0, s_layout)
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[256 // HEAD_DIM, HEAD_DIM // 8],
                                               warps_per_cta=[warps, 1], order=[1, 0])

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], K_LAYOUT)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], K_LAYOUT)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], DS_LAYOUT)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], DS_LAYOUT)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())

    m_lo, tiles_per_head, n_steps, shift, q_head0 = _query_walk(
        q_desc, do_desc, q_smem, do_smem, bars, start_n, diagonal, seq_q, pid_n, b, n_heads, hk, group,
        CAUSAL, STAGGER, STAGES, BLOCK_M)

    # K and V by vector loads whose addresses die here (the dK/dV stores compute theirs after the loop)
    _kv_to_shared(K_PTR, V_PTR, k_smem, v_smem, kv_row, start_n, seq_k, ld_layout, BLOCK_N, HEAD_DIM)

    cols_k, offs_m, s_zero, dq_zero, dk, dv = _tile_state(
        start_n, key_of, query_of, s_layout, dq_layout, kd_layout, BLOCK_M, BLOCK_N, DQ_N, BLOCK_M, BLOCK_N,
        HEAD_DIM)
    if DQ_MODE == "tma":
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, BLOCK_M, HEAD_DIM], dq_desc.layout)
    red_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[128 // DQ_N, DQ_N // 4],
                                                warps_per_cta=[warps, 1], order=[1, 0])
    key_tile_ragged = start_n + BLOCK_N > seq_k

    for t in range(n_steps):
        slot, start_m, q_row, qs, dos, s, dp = _step_scores(
            t, bars, q_smem, do_smem, k_smem, v_smem, s_zero, tiles_per_head, m_lo, q_head0, seq_q, shift,
            BLOCK_M, STAGES, True)
        s = warpgroup_mma_wait(1, deps=(s,))
        p = _weights(s, LSE, q_row, offs_m, start_m, cols_k, seq_q, seq_k, start_n, diagonal, qk_scale,
                     key_tile_ragged, BLOCK_M, BLOCK_N, CAUSAL, True)
        p_smem.store(p.to(dtype))
        fence_async_shared()
        cta_barrier()
        dv = warpgroup_mma(p_smem.permute((1, 0)), dos, dv, is_async=True)
        delta = gl.load(DELTA + (q_row + offs_m), mask=start_m + offs_m < seq_q, other=0.0)
        dp = warpgroup_mma_wait(1, deps=(dp,))
        ds = p * (dp - gl.expand_dims(delta, 1))
        ds_smem.store(ds.to(dtype))
        fence_async_shared()
        cta_barrier()
        dk = warpgroup_mma(ds_smem.permute((1, 0)), qs, dk, is_async=True)
        if DQ_MODE == "tma":
            dq_smem = dq_bufs.index(t % DQ_BUFS)
        for h in gl.static_range(HEAD_DIM // DQ_N):
            if SPLIT:
                dq = warpgroup_mma(ds_smem, k_smem.slice(h * DQ_N, DQ_N, dim=1), dq_zero, use_acc=False, is_async=True)
            else:
                dq = warpgroup_mma(ds_smem, k_smem, dq_zero, use_acc=False, is_async=True)
            if h == 0:
                dq, dk, dv = warpgroup_mma_wait(0, deps=(dq, dk, dv))
            else:
                dq = warpgroup_mma_wait(0, deps=(dq,))
            if DQ_MODE == "tma":
                if h == 0:
                    tma.store_wait(DQ_BUFS - 1)   # the reduce-add that read this buffer last is done
                if SPLIT:
                    dq_smem.slice(h * DQ_N, DQ_N, dim=1).store(dq)
                else:
                    dq_smem.store(dq)
            elif DQ_MODE == "red4":
                dq4 = gl.convert_layout(dq, red_layout)
                red_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, red_layout))
                red_cols = h * DQ_N + gl.arange(0, DQ_N, layout=gl.SliceLayout(0, red_layout))
                offs = (q_row.to(gl.int64) + gl.expand_dims(red_rows, 1)) * HEAD_DIM + gl.expand_dims(red_cols, 0)
                _red_add(DQ + offs, dq4, 4)
            elif DQ_MODE == "red2":   # in the product's own layout: no trip through shared memory
                dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
                dq_cols = h * DQ_N + gl.arange(0, DQ_N, layout=gl.SliceLayout(0, dq_layout))
                offs = (q_row.to(gl.int64) + gl.expand_dims(dq_rows, 1)) * HEAD_DIM + gl.expand_dims(dq_cols, 0)
                _red_add(DQ + offs, dq, 2)
        if DQ_MODE == "tma":
            fence_async_shared()
            cta_barrier()            # every warp has read this slot, p_smem and ds_smem, and written dq_smem
            TMA_ADD(dq_desc, [q_row, 0], dq_smem)
        else:
            cta_barrier()
        nxt = t + STAGES
        _, nrow = _step_row(nxt, tiles_per_head, m_lo, q_head0, seq_q, shift, BLOCK_M)
        _load_step(q_desc, do_desc, q_smem, do_smem, bars, nrow, slot, nxt < n_steps)
    if DQ_MODE == "tma":
        tma.store_wait(0)
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kd_layout))
    cols_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kd_layout))
    kd_offs = (kv_row + gl.expand_dims(keys, 1)) * HEAD_DIM + gl.expand_dims(cols_d, 0)
    key_ok = gl.expand_dims(keys < seq_k, 1)
    gl.store(DK + kd_offs, (dk * sm_scale).to(dtype), mask=key_ok)
    gl.store(DV + kd_offs, dv.to(dtype), mask=key_ok)


@functools.lru_cache(maxsize=None)
def _fp32_layout(block: tuple):
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float32)


def default_bwd_config(head_dim: int) -> dict:
    """(block_m, block_n, stages, num_warps): FA3's tile for its backward (64 query rows,
    128 keys, two warpgroups)."""
    return dict(block_m=64, block_n=128, stages=2, num_warps=8)


def check_bwd_inputs(q, k, v, o, lse, do, dq_mode: str) -> None:
    if dq_mode not in DQ_MODES + LAB_DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    if dq_mode == "tma" and TMA_ADD is None:
        raise RuntimeError("dq_mode='tma' needs Gluon's TMA reduce-add (tma.async_atomic_add), which this "
                           "Triton lacks; use dq_mode='atomic'")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q, k and v must be float16 or bfloat16 for the Gluon backward, got {q.dtype}")
    if q.shape[-1] not in BWD_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {BWD_HEAD_DIMS} for the Gluon backward, got {q.shape[-1]}")


def _check_rows(rows: bool, dq_split: bool, pipe: bool, dq_mode: str) -> None:
    if dq_split and not rows:
        raise ValueError("dq_split needs rows=True")
    if rows and (pipe or dq_mode not in ("tma", "red4", "red2", "none")):
        raise ValueError(f"rows=True takes dq_mode 'tma', 'red4', 'red2' or 'none' and no pipe, got {dq_mode!r}, "
                         f"pipe={pipe}")


def _kernel_for(rows: bool, dq_split: bool, block_m: int, block_n: int):
    """(kernel, the block its DS_LAYOUT is for, its extra compile-time constants)."""
    if rows:
        return _gluon_attn_bwd_rows, (block_m, block_n), dict(DQ_SPLIT=bool(dq_split))
    return _gluon_attn_bwd, (block_n, block_m), {}


def gluon_backward(q, k, v, o, lse, do, *, causal: bool = False, scale=None, dq_mode: str = "tma",
                   block_m: int | None = None, block_n: int | None = None, stages: int | None = None,
                   num_warps: int | None = None, stagger: bool = False, dq_bufs: int = 1,
                   pipe: bool = False, rows: bool = False, dq_split: bool = False):
    """(dq, dk, dv) for upstream gradient ``do``, from the forward's ``o`` and ``lse``.
    ``rows``: ``_gluon_attn_bwd_rows`` (FA3's register plan), ``dq_split`` with it."""
    from flashbook.reference import resolve_scale
    from flashbook.kernels.backward import _bwd_delta
    from flashbook.kernels.autograd import new_buffer

    check_bwd_inputs(q, k, v, o, lse, do, dq_mode)
    _check_rows(rows, dq_split, pipe, dq_mode)
    cfg = default_bwd_config(q.shape[-1])
    block_m = block_m or cfg["block_m"]
    block_n = block_n or cfg["block_n"]
    stages = stages or cfg["stages"]
    num_warps = num_warps or block_n // 16
    batch, heads, seq_q, d = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    scale = resolve_scale(scale, d)
    q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do.to(q.dtype)))
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    _bwd_delta[(triton.cdiv(seq_q, 64), batch * heads)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        heads, seq_q, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
    # room for a whole last query tile: its rows past the sequence add zeros (``_red_add``)
    dq32 = torch.zeros((batch * heads * seq_q + block_m, d), device=q.device, dtype=torch.float32)
    dk = new_buffer(k.shape, device=k.device, dtype=k.dtype)
    dv = new_buffer(v.shape, device=v.device, dtype=v.dtype)
    q_desc = _descriptor(q.view(-1, d), (block_m, d))
    do_desc = _descriptor(do.view(-1, d), (block_m, d))
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dq_desc = TensorDescriptor.from_tensor(dq32, [block_m, d], _fp32_layout((block_m, d)))
    grid = (triton.cdiv(seq_k, block_n), batch * kv_heads)
    kernel, ds_block, extra = _kernel_for(rows, dq_split, block_m, block_n)
    kernel[grid](
        q_desc, do_desc, dq_desc, k, v, lse, delta, dq32, dk, dv,
        heads, heads // kv_heads, seq_q, seq_k, scale * LOG2E.value, scale,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal), DQ_MODE=dq_mode,
        K_LAYOUT=_shared_layout((block_n, d), q.dtype), DS_LAYOUT=_shared_layout(ds_block, q.dtype),
        STAGGER=bool(stagger), DQ_BUFS=dq_bufs, PIPE=bool(pipe), num_warps=num_warps, **extra)
    dq = (dq32[:batch * heads * seq_q].view(q.shape) * scale).to(q.dtype)
    return dq, dk, dv


def compile_bwd_for(cc: int = 90, *, head_dim: int = 128, block_m: int = 64, block_n: int = 128, stages: int = 2,
                    causal: bool = True, dtype: str = "bf16", dq_mode: str = "tma", num_warps: int | None = None,
                    stagger: bool = False, dq_bufs: int = 1, pipe: bool = False, rows: bool = False,
                    dq_split: bool = False):
    """Compile the backward for ``cc`` without that GPU (as ``hopper.compile_for``)."""
    from flashbook.kernels.hopper import compile_kernel
    _check_rows(rows, dq_split, pipe, dq_mode)
    kernel, ds_block, extra = _kernel_for(rows, dq_split, block_m, block_n)
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def desc(rows, dt, layout):
        return f"tensordesc<{dt}[{rows}, {head_dim}],{layout!r}>"

    sig = {"q_desc": desc(block_m, dtype, _shared_layout((block_m, head_dim), torch_dtype)),
           "do_desc": desc(block_m, dtype, _shared_layout((block_m, head_dim), torch_dtype)),
           "dq_desc": desc(block_m, "fp32", _fp32_layout((block_m, head_dim))),
           "K_PTR": f"*{dtype}", "V_PTR": f"*{dtype}", "LSE": "*fp32", "DELTA": "*fp32", "DQ": "*fp32",
           "DK": f"*{dtype}", "DV": f"*{dtype}", "n_heads": "i32", "group": "i32", "seq_q": "i32", "seq_k": "i32",
           "qk_scale": "fp32", "sm_scale": "fp32"}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                      DQ_MODE=dq_mode, K_LAYOUT=_shared_layout((block_n, head_dim), torch_dtype),
                      DS_LAYOUT=_shared_layout(ds_block, torch_dtype), STAGGER=stagger, DQ_BUFS=dq_bufs, PIPE=pipe,
                      **extra)
    return compile_kernel(cc, kernel, {"num_warps": num_warps or block_n // 16}, sig, constexprs)
