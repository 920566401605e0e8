"""The FlashAttention-2 backward pass as Triton kernels (chapter 8).

Nothing N x N is stored: each kernel recomputes its tile of the attention
weights from Q, K and the saved ``lse``,

    P = exp(scale * Q K^T - lse)        (here: exp2(qk_scale * Q K^T - lse * log2 e))

and then applies the gradient formulas of chapter 5:

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = scale dS K,   dK = scale dS^T Q

with ``delta = rowsum(dO * O)``. Three kernels:

1. ``_bwd_delta``: delta for every query row (a tiny preprocess pass).
2. ``_bwd_dkdv``: one program owns a K/V tile and loops over the query tiles
   (of every query head that shares it, for GQA), accumulating dK and dV on chip.
3. ``_bwd_dq``: one program owns a query tile and loops over the K/V tiles,
   accumulating dQ on chip.

``_bwd_fused`` runs kernels 2 and 3 as one grid, each head's dK/dV programs and then its
dQ programs (FlexAttention's order; ``autograd.fuse_backward`` says when: packed documents).

Kernels 2 and 3 each recompute P: that is the price of writing every gradient
exactly once, with no atomics, so the result is deterministic. The alternative,
``ATOMIC_DQ``, lets kernel 2 also add its share ``dS K`` of dQ straight into an
fp32 buffer with ``tl.atomic_add``: one kernel and one recomputation fewer, but
the order of the additions (and so the last bits of dQ) may change from run to
run, and even relaxed atomics cost more than the recomputation they save (measured
on an H200, benchmarks/results/atomic_dq_h200: the backward took 1.08-1.86x as long, 1.13-1.24x
with 64 x 128 dK/dV tiles; with Triton's default acq_rel adds it took 2.4-6.8x).

Causal masking skips whole tiles exactly as the forward does: a key tile owned
by ``_bwd_dkdv`` is seen only by query rows ``i >= j - (seq_k - seq_q)``, so its
loop starts there (``forward.query_bounds``, the mirror of the forward's and dQ
kernel's ``causal_bounds``); the tiles on the diagonal go through the same loop
with the constexpr ``STAGE = MASKED``. Names, in all three kernels: ``rows`` and
``cols`` are absolute query and key indices, ``offs_m``, ``offs_n``, ``offs_d``
offsets within a tile.
"""
import triton
import triton.language as tl

from .forward import (MAIN, MASKED, alibi_bias, alibi_slope, causal_bounds, document_of, documents, launch_position,
                      load_lse, load_tile, prefix_bounds, prefix_query_bounds, query_bounds, query_tile_index, soft_cap,
                      visible_keys, window_bounds, window_query_bounds)


@triton.jit
def _bwd_delta(O, DO, DELTA,
               stride_ob, stride_oh, stride_om,
               stride_dob, stride_doh, stride_dom,
               n_heads, seq_q,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O) in fp32, for BLOCK_M rows of one (batch, head)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(O + b * stride_ob + h * stride_oh, rows, stride_om, seq_q,
                  offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    do = load_tile(DO + b * stride_dob + h * stride_doh, rows, stride_dom, seq_q,
                   offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * seq_q + rows, delta, mask=rows < seq_q)


@triton.jit
def load_tile_pair(base_a, base_b, rows, stride_a, stride_b, n_rows, offs_d, HEAD_DIM: tl.constexpr,
                   MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """The two tiles a backward step streams, rows ``rows`` of both: Q and dO (dK/dV
    kernel), or K and V (dQ kernel)."""
    a = load_tile(base_a, rows, stride_a, n_rows, offs_d, HEAD_DIM, MASK_ROWS, not EVEN_D)
    b = load_tile(base_b, rows, stride_b, n_rows, offs_d, HEAD_DIM, MASK_ROWS, not EVEN_D)
    return a, b


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, cols, q_base, do_base, lse_base, delta_base, dq_base,
                    stride_qm, stride_dom, stride_dqm, offs_m, offs_d, seq_q, seq_k, diagonal, lo, hi,
                    qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, STAGE: tl.constexpr,
                    CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    WINDOW: tl.constexpr = False, first=0, SOFTCAP: tl.constexpr = False, cap_scale=1.0,
                    PREFIX: tl.constexpr = False, prefix=0, ALIBI: tl.constexpr = False, ALIBI_SLOPES=None,
                    alibi_head=0, alibi_diagonal=0):
    """Add query tiles [lo, hi) into this K/V tile's (dk, dv); optionally push dq out.

    ``WINDOW``: key j is kept for row i when i + first <= j <= i + diagonal. ``SOFTCAP``:
    P is recomputed from the capped scores, and dS picks up the cap's derivative,
    d(c tanh(s / c)) / ds = 1 - tanh(s / c)^2.

    ``PREFIX``: keys below ``prefix`` are kept for every row as well.

    ``ALIBI``: P is recomputed with the forward's bias (``forward._fwd_inner``); the bias does
    not depend on q or k, so dS = P * (dP - delta) is unchanged, and the cap's derivative is
    still taken at the capped score before the bias (flash-attn's dtanh, flash_bwd_kernel.h)."""
    if ALIBI:
        slope = alibi_slope(ALIBI_SLOPES, alibi_head, qk_scale)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        q, do = load_tile_pair(q_base, do_base, rows, stride_qm, stride_dom, seq_q, offs_d, HEAD_DIM,
                               STAGE == MASKED, EVEN_D)
        lse = load_lse(lse_base, rows, seq_q, STAGE == MASKED)  # in base 2, as in the dQ kernel
        if STAGE == MASKED:
            delta = tl.load(delta_base + rows, mask=rows < seq_q, other=0.0)
        else:
            delta = tl.load(delta_base + rows)
        # Work with the transposed tile (keys x queries): dK and dV want P^T and dS^T.
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        if SOFTCAP:
            qkT = soft_cap(qkT * cap_scale)
        if ALIBI:
            pT = tl.exp2((qkT - alibi_bias(rows[None, :], cols[:, None], alibi_diagonal, slope)) * qk_scale
                         - lse[None, :])
        else:
            pT = tl.exp2(qkT * qk_scale - lse[None, :])
        if STAGE == MASKED and CAUSAL:
            if PREFIX:
                pT = tl.where((cols[:, None] <= rows[None, :] + diagonal) | (cols[:, None] < prefix), pT, 0.0)
            else:
                pT = tl.where(cols[:, None] <= rows[None, :] + diagonal, pT, 0.0)
        if STAGE == MASKED and WINDOW:
            pT = tl.where((cols[:, None] <= rows[None, :] + diagonal) & (cols[:, None] >= rows[None, :] + first),
                          pT, 0.0)
        if ATOMIC_DQ:
            # keys past seq_k would only pollute dq (their own dk/dv are never stored)
            pT = tl.where(cols[:, None] < seq_k, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:
            dsT = dsT * (1.0 - qkT * qkT)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(dsT).to(k.dtype), k, input_precision=DOT_PRECISION)
            # relaxed: only the sum must come out right, not the order of the adds. Triton's
            # default (acq_rel) makes every add a fence as well (the book times both orderings)
            tl.atomic_add(dq_base + rows[:, None] * stride_dqm + offs_d[None, :], dq,
                          mask=(rows[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
              stride_qb, stride_qh, stride_qm,
              stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn,
              stride_dob, stride_doh, stride_dom,
              stride_dkb, stride_dkh, stride_dkn,
              stride_dvb, stride_dvh, stride_dvn,
              stride_dqb, stride_dqh, stride_dqm,
              n_heads, n_kv_heads, group, seq_q, seq_k, qk_scale, scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
              first=0, last=0, cap_scale=1.0, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, prefix=0,
              ALIBI_SLOPES=None, alibi_stride=0, DOC_ORDER=None,
              WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, VARLEN: tl.constexpr = False,
              PREFIX: tl.constexpr = False, ALIBI: tl.constexpr = False, HEAD_GROUP: tl.constexpr = 1,
              ONE_LOOP: tl.constexpr = False, FUSED: tl.constexpr = False):
    """One program: one K/V tile of one (batch, kv head). Grid (cdiv(seq_k, BLOCK_N), batch * kv_heads).

    ``WINDOW``, ``SOFTCAP``, ``VARLEN``, ``PREFIX``, ``ALIBI`` and their arguments: as in
    ``forward._attn_fwd`` (varlen: grid (cdiv(max_seqlen_k, BLOCK_N), documents * kv_heads);
    ALiBi: each query head of the group its own slope).

    ``ONE_LOOP``: every query tile in one masked loop instead of three (``autograd.one_loop``:
    a short sliding window's programs, whose few tiles paid for three pipelined loops).
    ``FUSED``: a dK/dV program of ``_bwd_fused`` (``fused_position``)."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    if FUSED:
        _, tile, bh_kv = fused_position()
    else:
        tile, bh_kv = launch_position(HEAD_GROUP)
    start_n = tile * BLOCK_N
    b = (bh_kv // n_kv_heads).to(tl.int64)
    h_kv = (bh_kv % n_kv_heads).to(tl.int64)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    cols = start_n + tl.arange(0, BLOCK_N)
    if VARLEN:   # this document's keys and queries (forward._attn_fwd)
        total_q = seq_q
        b = document_of(b, DOC_ORDER)   # the heaviest documents first (forward._attn_fwd)
        q_start, seq_q, k_start, seq_k, first, last = documents(CU_SEQLENS_Q, CU_SEQLENS_K, b, first, last)
        seq_q = tl.where(start_n < seq_k, seq_q, 0)   # a key tile past its document's end: no query sees it
        k = load_tile(K + k_start * stride_kn + h_kv * stride_kh, cols, stride_kn, seq_k,
                      offs_d, HEAD_DIM, True, not EVEN_D)
        v = load_tile(V + k_start * stride_vn + h_kv * stride_vh, cols, stride_vn, seq_k,
                      offs_d, HEAD_DIM, True, not EVEN_D)
    else:
        k = load_tile(K + b * stride_kb + h_kv * stride_kh, cols, stride_kn, seq_k,
                      offs_d, HEAD_DIM, True, not EVEN_D)
        v = load_tile(V + b * stride_vb + h_kv * stride_vh, cols, stride_vn, seq_k,
                      offs_d, HEAD_DIM, True, not EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # Which query tiles see this key tile, and which of them need the causal mask.
    if WINDOW:
        diagonal = last
        lo, band_end, full_end, hi = window_query_bounds(start_n, seq_q, first, last, BLOCK_M, BLOCK_N)
        main_end = full_end
    else:
        diagonal = seq_k - seq_q
        lo, band_end, full_end, main_end, hi = query_bounds(start_n, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
        if PREFIX:
            lo, band_end, main_end = prefix_query_bounds(lo, band_end, full_end, start_n, prefix, BLOCK_N)
    if ONE_LOOP:   # the masked band runs to the last tile, and the other two loops are not compiled
        band_end = hi

    for g in range(0, group):  # the query heads that share this K/V head (GQA)
        h = h_kv * group + g
        bh = b * n_heads + h
        if VARLEN:   # lse and delta are (heads, total_q)
            q_base = Q + q_start * stride_qm + h * stride_qh
            do_base = DO + q_start * stride_dom + h * stride_doh
            dq_base = DQ + q_start * stride_dqm + h * stride_dqh
            lse_base = LSE + h * total_q + q_start
            delta_base = DELTA + h * total_q + q_start
        else:
            q_base = Q + b * stride_qb + h * stride_qh
            do_base = DO + b * stride_dob + h * stride_doh
            dq_base = DQ + b * stride_dqb + h * stride_dqh
            lse_base = LSE + bh * seq_q
            delta_base = DELTA + bh * seq_q
        # the causal diagonal band, then the whole tiles, then a ragged last query tile
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, cols, q_base, do_base, lse_base, delta_base, dq_base,
                                 stride_qm, stride_dom, stride_dqm,
                                 offs_m, offs_d, seq_q, seq_k, diagonal, lo, band_end, qk_scale,
                                 HEAD_DIM, BLOCK_M, MASKED, CAUSAL, EVEN_D, ATOMIC_DQ, DOT_PRECISION,
                                 WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix, ALIBI=ALIBI,
                                 ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                                 alibi_diagonal=seq_k - seq_q)
        if not ONE_LOOP:
            dk, dv = _bwd_dkdv_inner(dk, dv, k, v, cols, q_base, do_base, lse_base, delta_base, dq_base,
                                     stride_qm, stride_dom, stride_dqm,
                                     offs_m, offs_d, seq_q, seq_k, diagonal, band_end, full_end, qk_scale,
                                     HEAD_DIM, BLOCK_M, MAIN, CAUSAL, EVEN_D, ATOMIC_DQ, DOT_PRECISION,
                                     WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix, ALIBI=ALIBI,
                                     ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                                     alibi_diagonal=seq_k - seq_q)
            dk, dv = _bwd_dkdv_inner(dk, dv, k, v, cols, q_base, do_base, lse_base, delta_base, dq_base,
                                     stride_qm, stride_dom, stride_dqm,
                                     offs_m, offs_d, seq_q, seq_k, diagonal, main_end, hi, qk_scale,
                                     HEAD_DIM, BLOCK_M, MASKED, CAUSAL, EVEN_D, ATOMIC_DQ, DOT_PRECISION,
                                     WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix, ALIBI=ALIBI,
                                     ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                                     alibi_diagonal=seq_k - seq_q)

    dk = dk * scale  # dK = scale * dS^T Q: the scale is applied once, at the end
    keep = (cols[:, None] < seq_k) & (offs_d[None, :] < HEAD_DIM)
    if VARLEN:
        tl.store(DK + k_start * stride_dkn + h_kv * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :],
                 dk.to(DK.dtype.element_ty), mask=keep)
        tl.store(DV + k_start * stride_dvn + h_kv * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=keep)
    else:
        tl.store(DK + b * stride_dkb + h_kv * stride_dkh + cols[:, None] * stride_dkn + offs_d[None, :],
                 dk.to(DK.dtype.element_ty), mask=keep)
        tl.store(DV + b * stride_dvb + h_kv * stride_dvh + cols[:, None] * stride_dvn + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=keep)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, rows, offs_n, offs_d,
                  seq_k, diagonal, lo, hi, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  STAGE: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                  SOFTCAP: tl.constexpr = False, cap_scale=1.0, PREFIX: tl.constexpr = False, prefix=0,
                  ALIBI: tl.constexpr = False, ALIBI_SLOPES=None, alibi_head=0, alibi_diagonal=0):
    """Add key tiles [lo, hi) into this query tile's dq.

    ``WINDOW``, ``SOFTCAP``, ``PREFIX``, ``ALIBI``: as in ``_bwd_dkdv_inner``."""
    if ALIBI:
        slope = alibi_slope(ALIBI_SLOPES, alibi_head, qk_scale)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k, v = load_tile_pair(k_base, v_base, cols, stride_kn, stride_vn, seq_k, offs_d, HEAD_DIM,
                              STAGE == MASKED, EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SOFTCAP:
            qk = soft_cap(qk * cap_scale)
        if ALIBI:
            p = tl.exp2((qk - alibi_bias(rows[:, None], cols[None, :], alibi_diagonal, slope)) * qk_scale
                        - lse[:, None])
        else:
            p = tl.exp2(qk * qk_scale - lse[:, None])
        if STAGE == MASKED:
            p = tl.where(visible_keys(rows, cols, seq_k, diagonal, CAUSAL, WINDOW, first, PREFIX, prefix), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - qk * qk)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
            stride_qb, stride_qh, stride_qm,
            stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn,
            stride_dob, stride_doh, stride_dom,
            stride_dqb, stride_dqh, stride_dqm,
            n_heads, group, seq_q, seq_k, qk_scale, scale,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
            first=0, last=0, cap_scale=1.0, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, prefix=0,
            ALIBI_SLOPES=None, alibi_stride=0, DOC_ORDER=None,
            WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, VARLEN: tl.constexpr = False,
            PREFIX: tl.constexpr = False, ALIBI: tl.constexpr = False, HEAD_GROUP: tl.constexpr = 1,
            HEAVY_LAST: tl.constexpr = False, ONE_LOOP: tl.constexpr = False, FUSED: tl.constexpr = False):
    """One program: one query tile of one (batch, head). Grid (cdiv(seq_q, BLOCK_M), batch * heads).

    ``WINDOW``, ``SOFTCAP``, ``VARLEN``, ``PREFIX``, ``ALIBI``, ``HEAVY_LAST`` and their
    arguments: as in ``forward._attn_fwd``; ``ONE_LOOP``: as in ``_bwd_dkdv``; ``FUSED``: a
    dQ program of ``_bwd_fused`` (``fused_position``)."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    if FUSED:
        start_m = fused_query_tile(CAUSAL, HEAVY_LAST) * BLOCK_M
        _, _, bh = fused_position()
    else:
        start_m = query_tile_index(CAUSAL, HEAD_GROUP, HEAVY_LAST) * BLOCK_M  # the heaviest query tiles first, as in the forward
        _, bh = launch_position(HEAD_GROUP)
    b = (bh // n_heads).to(tl.int64)
    h = bh % n_heads
    h_kv = (h // group).to(tl.int64)
    h = h.to(tl.int64)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if VARLEN:   # this document's queries and keys (forward._attn_fwd); lse, delta: (heads, total_q)
        total_q = seq_q
        b = document_of(b, DOC_ORDER)   # the heaviest documents first (forward._attn_fwd)
        q_start, seq_q, k_start, seq_k, first, last = documents(CU_SEQLENS_Q, CU_SEQLENS_K, b, first, last)
        seq_k = tl.where(start_m < seq_q, seq_k, 0)   # a tile past its document's end visits no key
        q = load_tile(Q + q_start * stride_qm + h * stride_qh, rows, stride_qm, seq_q, offs_d, HEAD_DIM, True,
                      not EVEN_D)
        do = load_tile(DO + q_start * stride_dom + h * stride_doh, rows, stride_dom, seq_q,
                       offs_d, HEAD_DIM, True, not EVEN_D)
        row_ok = rows < seq_q
        lse = load_lse(LSE + h * total_q + q_start, rows, seq_q, True)
        delta = tl.load(DELTA + h * total_q + q_start + rows, mask=row_ok, other=0.0)
    else:
        q = load_tile(Q + b * stride_qb + h * stride_qh, rows, stride_qm, seq_q, offs_d, HEAD_DIM, True, not EVEN_D)
        do = load_tile(DO + b * stride_dob + h * stride_doh, rows, stride_dom, seq_q,
                       offs_d, HEAD_DIM, True, not EVEN_D)
        row_ok = rows < seq_q
        lse = load_lse(LSE + bh.to(tl.int64) * seq_q, rows, seq_q, True)  # in base 2; no key seen: P = 0
        delta = tl.load(DELTA + bh.to(tl.int64) * seq_q + rows, mask=row_ok, other=0.0)

    if WINDOW:   # the forward's three stages (forward.window_bounds)
        diagonal = last
        lo, full_lo, full_end, hi = window_bounds(start_m, seq_k, first, last, BLOCK_M, BLOCK_N)
    else:
        diagonal = seq_k - seq_q
        full_end, hi = causal_bounds(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
        if PREFIX:
            full_end, hi = prefix_bounds(full_end, hi, prefix, seq_k, BLOCK_N)
        full_lo = 0
    if VARLEN:
        k_base = K + k_start * stride_kn + h_kv * stride_kh
        v_base = V + k_start * stride_vn + h_kv * stride_vh
    else:
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if ONE_LOOP:   # as in _bwd_dkdv: the first masked loop takes every key tile
        if not WINDOW:
            lo = 0
        full_lo = hi
    if WINDOW or ONE_LOOP:
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                           rows, offs_n, offs_d, seq_k, diagonal, lo, full_lo, qk_scale,
                           HEAD_DIM, BLOCK_N, MASKED, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale,
                           PREFIX, prefix, ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                           alibi_diagonal=seq_k - seq_q)
    if not ONE_LOOP:
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                           rows, offs_n, offs_d, seq_k, diagonal, full_lo, full_end, qk_scale,
                           HEAD_DIM, BLOCK_N, MAIN, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale,
                           PREFIX, prefix, ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                           alibi_diagonal=seq_k - seq_q)
        dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn,
                           rows, offs_n, offs_d, seq_k, diagonal, full_end, hi, qk_scale,
                           HEAD_DIM, BLOCK_N, MASKED, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale,
                           PREFIX, prefix, ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h,
                           alibi_diagonal=seq_k - seq_q)
    dq = dq * scale  # dQ = scale * dS K
    if VARLEN:
        tl.store(DQ + q_start * stride_dqm + h * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :],
                 dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    else:
        tl.store(DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :],
                 dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def fused_position():
    """(dK/dV or not, t, batch x head) of a program of ``_bwd_fused``'s grid (2T, rows): programs
    0..T-1 of axis 0 are the row's dK/dV programs (key tile t), T..2T-1 its dQ programs (the t-th
    query tile, heaviest first: ``fused_query_tile``). The GPU starts them in order of
    ``program_id(0) + program_id(1) * 2T``: a row's dK/dV programs, then its dQ programs, row
    after row. (benchmarks/fused_bwd_experiment.py swaps this helper for other orders.)"""
    tiles = tl.num_programs(0) // 2
    x = tl.program_id(0)
    return x < tiles, tl.where(x < tiles, x, x - tiles), tl.program_id(1)


@triton.jit
def fused_query_tile(CAUSAL: tl.constexpr, HEAVY_LAST: tl.constexpr = False):
    """``forward.query_tile_index`` for a dQ program of ``_bwd_fused`` (``fused_position``): its
    t-th query tile, the heaviest first."""
    _, tile, _ = fused_position()
    if CAUSAL or HEAVY_LAST:
        tile = tl.num_programs(0) // 2 - 1 - tile
    return tile


@triton.jit
def _bwd_fused(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
               stride_qb, stride_qh, stride_qm,
               stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn,
               stride_dob, stride_doh, stride_dom,
               stride_dkb, stride_dkh, stride_dkn,
               stride_dvb, stride_dvh, stride_dvn,
               stride_dqb, stride_dqh, stride_dqm,
               n_heads, n_kv_heads, group, seq_q, seq_k, qk_scale, scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
               first=0, last=0, cap_scale=1.0, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, prefix=0,
               ALIBI_SLOPES=None, alibi_stride=0, DOC_ORDER=None,
               WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, VARLEN: tl.constexpr = False,
               PREFIX: tl.constexpr = False, ALIBI: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
               BLOCK_M2: tl.constexpr = 128, BLOCK_N2: tl.constexpr = 64, HEAVY_LAST: tl.constexpr = False):
    """``_bwd_dkdv`` and ``_bwd_dq`` in one launch, as FlexAttention's backward runs them. Grid
    (2T, batch * heads) where both kernels' grids are (T, batch * heads) (no GQA): programs
    0..T-1 of a head are its dK/dV programs (``BLOCK_M`` x ``BLOCK_N`` tiles), T..2T-1 its dQ
    programs (``BLOCK_M2`` x ``BLOCK_N2``), so the dQ programs of a head run beside the dK/dV
    programs of the next ones, not after every head's (why that is faster was not profiled).
    The same programs as the two launches, so the same gradients bit for bit
    (``autograd.fuse_backward``: when the library launches it, and what it measured)."""
    is_dkdv, _, _ = fused_position()
    if is_dkdv:
        _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                  stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                  stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                  stride_dqb, stride_dqh, stride_dqm,
                  n_heads, n_kv_heads, group, seq_q, seq_k, qk_scale, scale,
                  HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, ATOMIC_DQ, DOT_PRECISION,
                  first, last, cap_scale, CU_SEQLENS_Q, CU_SEQLENS_K, prefix, ALIBI_SLOPES, alibi_stride, DOC_ORDER,
                  WINDOW=WINDOW, SOFTCAP=SOFTCAP, VARLEN=VARLEN, PREFIX=PREFIX, ALIBI=ALIBI, ONE_LOOP=ONE_LOOP,
                  FUSED=True)
    else:
        _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                stride_dqb, stride_dqh, stride_dqm,
                n_heads, group, seq_q, seq_k, qk_scale, scale,
                HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, DOT_PRECISION,
                first, last, cap_scale, CU_SEQLENS_Q, CU_SEQLENS_K, prefix, ALIBI_SLOPES, alibi_stride, DOC_ORDER,
                WINDOW=WINDOW, SOFTCAP=SOFTCAP, VARLEN=VARLEN, PREFIX=PREFIX, ALIBI=ALIBI, HEAVY_LAST=HEAVY_LAST,
                ONE_LOOP=ONE_LOOP, FUSED=True)
