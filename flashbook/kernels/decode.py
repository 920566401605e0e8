"""Flash-decoding: a few new tokens against a long KV cache, split over the keys (chapter 11).

    o = flash_decode(q, k_cache, v_cache, cache_seqlens=lengths)   # q: (batch, heads, n_new, d)

While a model generates text, each step brings one new token (or a few, 1 to 16,
with speculative decoding) whose query must read the whole KV cache. The forward
kernel of chapter 7 gives one program a tile of query rows; here there is one
query row per head, so it would start batch x heads programs, each walking the
whole cache alone: at batch 1 a handful of programs on a GPU of 132 SMs, most
of the chip idle. Decoding is limited by how fast the cache can be read, and
reading it fast needs every SM.

So the keys are cut into ``num_splits`` ranges (split-K, ``flashbook.split`` in
NumPy): one program per (split, batch, KV head) folds its range of keys into
its own (o, lse) with the forward kernel's two stages (``attend``: exp2,
unmasked main stage, masked last tile), and a second small kernel merges the
splits with chapter 3's merge. Three choices make the cache be read once, at
full speed:

* GQA: the ``group = heads / kv_heads`` query heads that share a KV head are
  the rows of one tile (``group * n_new`` rows, padded to 16 for the tensor
  cores), so each K/V tile is loaded once for all of them;
* the number of splits is chosen from the number of SMs and the work
  (``choose_num_splits``, a pure function), so that batch x kv_heads x splits
  programs fill the GPU in whole waves; ``num_splits=`` overrides it;
* ragged batches: ``cache_seqlens[b]`` is sequence b's length; its keys are cut
  into splits of its own length (whole key tiles), so the programs of one
  sequence share its work evenly, and only its last tile is masked.

The combine is a second small kernel rather than torch operations: merging with
torch takes about six launches (max, subtract, exp, multiply, two sums, divide)
of a few microseconds each, which at batch 1 is as long as reading a 32K-token
cache, and writes intermediates; one kernel reads each partial result once.
With one split there is nothing to merge: the kernel writes the output itself.
More than ``MAX_ROWS`` query rows per KV head (MQA with many heads and new
tokens) take several row tiles, each reading the cache.

The host's part: a decoding loop makes the same call every step with new values in the
same tensors. The first call of a *signature* (``_signature``: shapes, strides, dtypes,
devices, flags, pointer alignment) checks everything and launches through Triton; the plan
it made is kept, and later calls of that signature launch from the compiled kernels' own
launchers with no checks (on the H200's host 37 us a call where the checked path took
130 us; ``benchmarks/decode_host.py``). The lengths and page indices are values on the
GPU, not part of the signature.

Causal (the default): the new tokens are the last ``n_new`` positions of each
sequence, so new token i sees cache positions j <= length - n_new + i: the
book's bottom-right alignment, with seq_k = length. Only the last n_new - 1
keys are hidden from any row: they fall in the masked last tile.

A sliding window (``window=(left, right)``, flash-attn's convention: the token at
position p sees keys [p - left, p + right]) is a compile-time switch of the split kernel
(``WINDOW``, off by default: without a window the kernels are the same instructions as
before). With it the splits cut only the window's key tiles, from
max(0, length - n_new - left) to length, which each program finds from the length on the
GPU: a 4K window over a 128K cache reads 4K keys per sequence, never the rest.
"""
from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl

from .. import masks, runtime
from ..validation import check_flag
from .autograd import LOG2E, check_inputs, dot_precision, last_dim_contiguous, new_buffer
from .configs import block_d
from .inputs import flash_attn_names, operator_flags
from .launch import Launch, Plans
from .decode_choices import (MAX_ROWS, MAX_SPLITS, PAGE_SIZES, PAGED_EXTRA_STAGES, _check_index_tensor,  # noqa: F401
                             _cache_length, _check_paged, _check_range, _contiguous_strides, _lengths_from_int,
                             _signature, check_num_splits, choose_num_splits, decode_tiles, paginate, run_plan,
                             sm_count, warn_if_flash_attn_layout, window_offsets)
from .forward import (MAIN, MASKED, attend, finite, fold_values, for_lengths, load_tile, normalised_rows,
                      shifted_scores, soft_cap, window_bounds)

MAX_NEW_TOKENS = 16   # new tokens per step that flash_decode accepts
#: Pages of at least a key tile's tokens take one page index per tile (``_paged_stage``'s
#: ``TILE_IN_PAGE``); False reads an index per key row, as smaller pages must.
TILE_IN_PAGE = True
#: The compile-time switch a window adds to the split kernel, and the run-time values only it
#: uses (as ``forward.LATER``): ``display.source(_decode_fwd, without=LATER)`` shows it without.
LATER = {"WINDOW": ("first", "last"), "SOFTCAP": ("cap_scale",)}


# ------------------------------------------------------------------ the kernels

@triton.jit
def _paged_stage(acc, row_max, row_sum, q, k_head, v_head, table, stride_kp, stride_vp, stride_kn, stride_vn,
                 rows, offs_n, offs_d, seq_k, diagonal, lo, hi, qk_scale, PAGE_SIZE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr, CAUSAL: tl.constexpr,
                 EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                 TILE_IN_PAGE: tl.constexpr = False, SOFTCAP: tl.constexpr = False, cap_scale=1.0):
    """``_fwd_inner`` over a paged cache: key tiles [lo, hi) of a sequence whose
    positions [p * PAGE_SIZE, (p + 1) * PAGE_SIZE) live in physical page ``table[p]``.

    The same loop and the same online-softmax step as ``_fwd_inner``; only the tiles'
    rows are gathered: key position n is row n % PAGE_SIZE of page table[n // PAGE_SIZE],
    so each row of a tile gets its own address (a pointer per row, passed to
    ``load_tile`` with a row stride of 0), and a tile of BLOCK_N keys may span several
    small pages. The page indices are loads of the loop like K and V, so Triton pipelines
    all three across page boundaries. (A loop over pages around a loop over a page's
    tiles has an inner loop of one tile at 64-token pages, which is not pipelined: 1.0-1.3x
    the dense cache's time, benchmarks/results/decode_paged_h200. This flat loop, in CUDA
    graphs at 64-token pages: 1.01-1.09x at batch 1 and 8 with caches of 32K and 128K, but
    1.20-1.21x at 2K (batch 1 and 64) and at batch 64 x 128K; decode_short_path_h200.)

    ``TILE_IN_PAGE`` (pages of at least BLOCK_N tokens): a tile never spans pages, so it
    reads one page index and addresses its rows as the dense cache does, from one base
    pointer and a row stride: 1-13% less time than the row gather at the same split counts
    on the H200, and called from Python the paged cache then took 1.01-1.04x the dense
    one's time (medians of three runs, batch 1-64 x 2K-128K; decode_h200-3)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if TILE_IN_PAGE:   # start_n < hi <= seq_k: its page is in the table
            page = tl.load(table + start_n // PAGE_SIZE).to(tl.int64)
            # key position n at row n - page_start of the page: base + n * stride
            page_start = ((start_n // PAGE_SIZE) * PAGE_SIZE).to(tl.int64)
            k_rows, k_stride = k_head + page * stride_kp - page_start * stride_kn, stride_kn
            v_rows, v_stride = v_head + page * stride_vp - page_start * stride_vn, stride_vn
        else:
            if STAGE == MASKED:   # positions past the sequence read no page index (and load 0)
                page = tl.load(table + cols // PAGE_SIZE, mask=cols < seq_k, other=0).to(tl.int64)
            else:
                page = tl.load(table + cols // PAGE_SIZE).to(tl.int64)
            slot = cols % PAGE_SIZE
            k_rows, k_stride = k_head + (page * stride_kp + slot * stride_kn)[:, None], 0
            v_rows, v_stride = v_head + (page * stride_vp + slot * stride_vn)[:, None], 0
        k = load_tile(k_rows, cols, k_stride, seq_k, offs_d, HEAD_DIM, STAGE == MASKED, not EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SOFTCAP:   # as _fwd_inner
            qk = soft_cap(qk * cap_scale)
        qk, new_max = shifted_scores(qk, row_max, rows, cols, seq_k, diagonal, qk_scale, STAGE, CAUSAL,
                                     WINDOW, first)
        p = tl.exp2(qk)
        if WINDOW:
            alpha = tl.exp2(row_max - finite(new_max))  # row_max -inf: nothing summed yet, 0
        else:
            alpha = tl.exp2(row_max - new_max)
        acc, row_sum = fold_values(acc, row_sum, p, alpha, v_rows, cols, v_stride, seq_k, offs_d,
                                   HEAD_DIM, STAGE == MASKED, EVEN_D, DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _window_edge(acc, row_max, row_sum, q, k_head, v_head, table, stride_kp, stride_vp, stride_kn, stride_vn,
                 rows, offs_n, offs_d, seq_k, diagonal, first, lo, hi, qk_scale, PAGE_SIZE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 SOFTCAP: tl.constexpr = False, cap_scale=1.0):
    """A window's lower edge, key tiles [lo, hi) masked, of a dense cache at ``k_head`` (PAGE_SIZE
    0) or a paged one (as ``_paged_stage``): token t sees keys [t + first, t + diagonal].

    Its first tile starts at a multiple of BLOCK_N, below the window's first key ``first``; the
    keys there are not read at all (nor their page indices): they may be stale, or NaN, in a
    cache whose keys left the window, and p = 0 times a NaN value would still be NaN."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        read = (cols >= first) & (cols < seq_k)
        if PAGE_SIZE == 0:
            k_rows, v_rows = k_head + cols[:, None] * stride_kn, v_head + cols[:, None] * stride_vn
        else:
            page = tl.load(table + cols // PAGE_SIZE, mask=read, other=0).to(tl.int64)
            slot = cols % PAGE_SIZE
            k_rows = k_head + (page * stride_kp + slot * stride_kn)[:, None]
            v_rows = v_head + (page * stride_vp + slot * stride_vn)[:, None]
        kept = tl.where(read, cols, seq_k)   # load_tile reads the rows below seq_k
        k = load_tile(k_rows, kept, 0, seq_k, offs_d, HEAD_DIM, True, not EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SOFTCAP:
            qk = soft_cap(qk * cap_scale)
        qk, new_max = shifted_scores(qk, row_max, rows, cols, seq_k, diagonal, qk_scale, MASKED, False,
                                     True, first)
        p = tl.exp2(qk)
        alpha = tl.exp2(row_max - finite(new_max))  # row_max -inf: nothing summed yet, 0
        acc, row_sum = fold_values(acc, row_sum, p, alpha, v_rows, kept, 0, seq_k, offs_d,
                                   HEAD_DIM, True, EVEN_D, DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _decode_fwd(Q, K, V, O, LSE, SEQLENS, TABLE,
                stride_qb, stride_qh, stride_qm,
                stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn,
                stride_ob, stride_oh, stride_os, stride_om, stride_tb,
                kv_heads, n_rows, seq_max, num_splits, qk_scale, first, last, cap_scale,
                N_NEW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_SEQLENS: tl.constexpr, PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                WINDOW: tl.constexpr = False, TILE_IN_PAGE: tl.constexpr = False, SOFTCAP: tl.constexpr = False):
    """One program: one split of the keys, one tile of query rows, one (batch, KV head).

    Grid (num_splits, cdiv(n_rows, BLOCK_M), batch * kv_heads). Q is viewed as
    (batch, kv_heads, n_rows, d) with n_rows = group * n_new: row r is new token
    r % N_NEW of query head r // N_NEW of the group. Writes the split's normalised
    output rows to O (indexed by split with stride_os) and their lse to LSE
    (batch, kv_heads, num_splits, n_rows). ``PAGE_SIZE`` 0: K and V are (batch,
    kv_heads, seq_max, d); otherwise they are pages (num_pages, kv_heads, PAGE_SIZE, d)
    (``stride_kb`` is then the page stride) and TABLE (batch, pages per sequence)
    says which page holds each sequence's positions. A length read from SEQLENS is
    clamped to [0, seq_max], so no value makes the kernel read outside the cache.

    ``WINDOW`` (a sliding window, ``decode_choices.window_offsets``): new token t sees keys
    [t + first, t + last], ``first`` and ``last`` given relative to a diagonal of 0 and
    moved onto each sequence's own, seq_k - N_NEW. The splits cut only the key tiles the
    window touches (``window_bounds``, its rows being the N_NEW tokens), in three stages:
    the masked lower edge, the tiles every token sees whole, the masked upper edge. The
    tiles outside are never loaded.

    ``SOFTCAP`` (Gemma 2's c * tanh(s / c), as ``forward._fwd_inner``): ``qk_scale`` is then
    c * log2(e) and ``cap_scale`` scale / c (``mask_args.kernel_mask``).
    """
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    split = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    bh = tl.program_id(2)
    b = (bh // kv_heads).to(tl.int64)
    h_kv = (bh % kv_heads).to(tl.int64)
    if HAS_SEQLENS:
        seq_k = tl.minimum(tl.maximum(tl.load(SEQLENS + b).to(tl.int32), 0), seq_max)
    else:
        seq_k = seq_max

    if WINDOW:   # this split's share [lo, hi) of the window's tiles [w_lo, w_hi)
        first, diagonal = seq_k - N_NEW + first, seq_k - N_NEW + last
        w_lo, full_lo, full_end, w_hi = window_bounds(0, seq_k, first, diagonal, N_NEW, BLOCK_N)
        split_len = tl.cdiv(tl.cdiv(w_hi - w_lo, num_splits), BLOCK_N) * BLOCK_N
        lo = w_lo + split * split_len
        hi = tl.minimum(lo + split_len, w_hi)
        edge = tl.minimum(tl.maximum(full_lo, lo), hi)   # [lo, edge): the lower edge, masked
        mid = tl.minimum(tl.maximum(full_end, edge), hi)
    else:
        # This split's keys [lo, hi): whole tiles of this sequence's own length.
        split_len = tl.cdiv(tl.cdiv(seq_k, num_splits), BLOCK_N) * BLOCK_N
        lo = split * split_len
        hi = tl.minimum(lo + split_len, seq_k)
        # Keys below full_end are seen by every row (main stage, no mask): all but the
        # last n_new - 1 keys when causal, all keys but a ragged last tile otherwise.
        diagonal = seq_k - N_NEW
        if CAUSAL:
            full_end = tl.maximum(diagonal + 1, 0)
        else:
            full_end = seq_k
        full_end = (full_end // BLOCK_N) * BLOCK_N
        mid = tl.minimum(tl.maximum(full_end, lo), hi)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    token = rows % N_NEW   # the row's new token: its causal diagonal is token + seq_k - N_NEW

    q = load_tile(Q + b * stride_qb + h_kv * stride_qh, rows, stride_qm, n_rows, offs_d, HEAD_DIM,
                  True, not EVEN_D)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Where this (sequence, KV head)'s keys and values are, then the loops that read them.
    if PAGE_SIZE == 0:
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh
        table = TABLE
    else:   # the cache is pages: the head's first page, and this sequence's row of the table
        k_base, v_base, table = K + h_kv * stride_kh, V + h_kv * stride_vh, TABLE + b * stride_tb
    if WINDOW:   # the lower edge [lo, edge): no key below the window is read
        acc, row_max, row_sum = _window_edge(
            acc, row_max, row_sum, q, k_base, v_base, table, stride_kb, stride_vb, stride_kn, stride_vn,
            token, offs_n, offs_d, seq_k, diagonal, first, lo, edge, qk_scale, PAGE_SIZE,
            HEAD_DIM, BLOCK_N, EVEN_D, DOT_PRECISION, SOFTCAP, cap_scale)
        lo = edge
    if PAGE_SIZE == 0:
        acc, row_max, row_sum = attend(
            acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
            token, offs_n, offs_d, seq_k, diagonal, lo, mid, hi, qk_scale,
            HEAD_DIM, BLOCK_N, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale)
    else:   # the two stages of attend, page by page
        acc, row_max, row_sum = _paged_stage(
            acc, row_max, row_sum, q, k_base, v_base, table, stride_kb, stride_vb, stride_kn, stride_vn,
            token, offs_n, offs_d, seq_k, diagonal, lo, mid, qk_scale, PAGE_SIZE,
            HEAD_DIM, BLOCK_N, MAIN, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, TILE_IN_PAGE, SOFTCAP, cap_scale)
        acc, row_max, row_sum = _paged_stage(
            acc, row_max, row_sum, q, k_base, v_base, table, stride_kb, stride_vb, stride_kn, stride_vn,
            token, offs_n, offs_d, seq_k, diagonal, mid, hi, qk_scale, PAGE_SIZE,
            HEAD_DIM, BLOCK_N, MASKED, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, TILE_IN_PAGE, SOFTCAP,
            cap_scale)
    acc, lse = normalised_rows(acc, row_max, row_sum)

    row_ok = rows < n_rows
    tl.store(LSE + (bh.to(tl.int64) * num_splits + split) * n_rows + rows, lse, mask=row_ok)
    o_ptrs = (O + b * stride_ob + h_kv * stride_oh + split.to(tl.int64) * stride_os
              + rows[:, None] * stride_om + offs_d[None, :])
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _decode_combine(O_PART, LSE, O, LSE_OUT, stride_ob, stride_oh, stride_om, kv_heads, n_rows, num_splits,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                    WRITE_LSE: tl.constexpr = False):
    """Chapter 3's merge of every split's (o_s, lse_s) for one query row.

    Grid (n_rows, batch * kv_heads). With m = max_s lse_s (0 if every split is empty):

        o = sum_s exp(lse_s - m) o_s / sum_s exp(lse_s - m)

    the merge of the states (m, l, o) = (lse_s, 1, o_s). An empty split has lse_s =
    -inf, weight 0; a row that no split saw gets 0. ``WRITE_LSE``: the row's own lse,
    m + log(sum_s exp(lse_s - m)), goes to LSE_OUT (batch * kv_heads, n_rows); -inf for a row
    no split saw.
    """
    r = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(LSE + (bh * num_splits + offs_s) * n_rows + r, mask=offs_s < num_splits,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    weight = tl.exp(lse - tl.where(m == float("-inf"), 0.0, m))   # <= 1; 0 for an empty split
    row_sum = tl.sum(weight, 0)
    o_part = load_tile(O_PART + (bh * num_splits * n_rows + r) * HEAD_DIM, offs_s, n_rows * HEAD_DIM,
                       num_splits, offs_d, HEAD_DIM, True, HEAD_DIM != BLOCK_D)
    o = tl.sum(weight[:, None] * o_part, 0) / tl.where(row_sum > 0.0, row_sum, 1.0)
    b, h_kv = bh // kv_heads, bh % kv_heads
    tl.store(O + b * stride_ob + h_kv * stride_oh + r * stride_om + offs_d, o.to(O.dtype.element_ty),
             mask=offs_d < HEAD_DIM)
    if WRITE_LSE:
        tl.store(LSE_OUT + bh * n_rows + r, tl.where(row_sum > 0.0, m + tl.log(tl.where(row_sum > 0.0, row_sum, 1.0)), float("-inf")))


# ------------------------------------------------------------------ the entry point

def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, num_splits=None,
                 causal: bool = True, window=None, scale=None, softcap=None, check_values: bool = False,
                 return_softmax_lse: bool = False, softmax_scale=None, window_size=None):
    """Attention of a few new tokens over a KV cache, split over the keys: returns o.

    Args:
        q: (batch, heads, n_new, head_dim), 1 <= n_new <= 16, float16, bfloat16 or float32.
        k_cache, v_cache: (batch, kv_heads, n_max, head_dim), same dtype and device;
            kv_heads divides heads (GQA; 1 is multi-query). The last axis contiguous
            is best (anything else is copied). With ``block_table``: pages
            (num_pages, kv_heads, page_size, head_dim), page_size one of ``PAGE_SIZES``.
        cache_seqlens: (batch,) int32/int64 tensor on q's device, each sequence's length
            in [0, n_max] (the keys past it are never read); an int is that length for every
            sequence (as flash-attn); None means n_max for all.
        block_table: (batch, pages per sequence) int32/int64 on q's device: sequence b's
            positions [p * page_size, (p + 1) * page_size) are in page ``block_table[b, p]``
            of the caches (a paged KV cache, as vLLM and flash-attn >= 2.5; ``paginate``
            builds one). n_max is then pages per sequence x page_size. Pages may be shared
            between sequences (a common prefix).
        num_splits: how many ranges the keys of each sequence are cut into, 1 to 128;
            None chooses from the GPU's SM count (``choose_num_splits``).
        causal: new token i (of n_new) sits at position length - n_new + i and sees the
            cache up to there (bottom-right alignment); rows that see no key give 0.
        window: ``(left, right)``, a sliding window as flash-attn's ``flash_attn_with_kvcache
            (..., window_size=)``: the token at position p sees key j when p - left <= j <=
            p + right; -1 is no limit on that side (None: ``(-1, -1)``, no window), and
            ``causal=True`` makes right 0. The kernel reads only the keys of the window,
            [max(0, length - n_new - left), length) of each sequence (computed on the GPU
            from ``cache_seqlens``): a 4K window over a 128K cache reads about 4K keys. A
            model with a window of W keys including the token's own (Mistral's and Gemma's
            ``sliding_window = W``, as vLLM passes it to flash-attn) is ``window=(W - 1, 0)``.
        scale: multiplies the scores; None means 1/sqrt(head_dim).
        softcap: c > 0 makes the scores c * tanh(scale * q.k / c) (Gemma 2's soft cap, as
            ``flash_attention`` and flash-attn's ``softcap``); None or 0 is off.
        check_values: also check the *values* of ``cache_seqlens`` (in [0, n_max]) and
            ``block_table`` (in [0, num_pages)), which costs a device synchronisation, so
            it is off by default (a decoding loop calls this once per layer and token).
            Without it, the kernel clamps each length to [0, n_max], so no length makes it
            read outside the cache; the page indices are the caller's promise, as in vLLM.
        return_softmax_lse: also return each row's log-sum-exp of its scaled (and capped)
            scores, natural log, float32, (batch, heads, n_new): -inf for a row that sees no
            key. With it, attention over two parts of a cache merges exactly (chapter 3).
        softmax_scale, window_size: flash-attn's names for ``scale`` and ``window``.

    Returns:
        o, (batch, heads, n_new, head_dim), q's dtype, contiguous; ``(o, lse)`` with
        ``return_softmax_lse``. Inference only, as flash-attn's
        ``flash_attn_with_kvcache``: no backward, so inputs that require a gradient are refused
        while autograd records (``flash_attention`` is the differentiable call).
    """
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k_cache, v_cache)):
        raise RuntimeError("flash_decode has no backward (as flash-attn's flash_attn_with_kvcache), and q, k_cache "
                           "or v_cache requires a gradient: call it under torch.no_grad() or torch.inference_mode(), "
                           "or use flash_attention, which is differentiable")
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool) and isinstance(q, torch.Tensor):
        cache_seqlens = _lengths_from_int(int(cache_seqlens), q, _cache_length(k_cache, block_table))
    scale, window = flash_attn_names(scale, window, softmax_scale, window_size)
    if torch.compiler.is_compiling():   # one operator the compiler calls (below; dispatch.py says why)
        check_flag(return_softmax_lse, "return_softmax_lse")
        o, lse = decode_operator(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, bool(causal),
                                 *operator_flags(scale, window, softcap, 0)[:3], bool(check_values))
        return (o, lse) if return_softmax_lse else o
    plan = plan_of(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values, window,
                   softcap, return_softmax_lse)
    return run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, return_softmax_lse)


def plan_of(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values, window,
            softcap, return_lse, *, warn: bool = True):
    """A call's plan (``_Plan``): the one kept for its signature, or checked and made (every check
    of the call runs here, before anything is launched); None when there is nothing to compute.
    ``warn``: ``warn_if_flash_attn_layout`` (off for callers that transposed flash-attn's layout)."""
    key = _signature(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values,
                     window, softcap, return_lse)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        if warn:
            warn_if_flash_attn_layout(q, k_cache)
        plan = _plan(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values,
                     window, softcap, return_lse)
        if plan is not None:
            _PLANS.remember(key, plan)
    return plan


@torch.library.custom_op("flashbook::decode", mutates_args=(), schema=(
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, Tensor? block_table, int? num_splits, "
    "bool causal, float? scale, int[]? window, float? softcap, bool check_values) -> (Tensor, Tensor)"))
def decode_operator(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, window, softcap,
                    check_values):
    """``flash_decode`` inside ``torch.compile`` (its schema written out: dispatch.py says why): the
    eager call's checks and kernels when it runs, returning (o, lse) whichever the caller keeps.
    The layout warning is left to eager calls (``flash_attn_with_kvcache`` calls this on views of
    flash-attn's layout, where it would misfire)."""
    window = None if window is None else tuple(window)
    plan = plan_of(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values, window,
                   softcap, True, warn=False)
    return run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, True)


@decode_operator.register_fake
def _(q, *rest):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


# ------------------------------------------------------------------ the launch of a call signature

_PLANS = Plans()   # at most launch.MAX_PLANS call signatures; forgotten all at once past it


class _Plan:
    """What one call signature launches: the buffers' sizes, the two kernels, and which
    inputs the kernel can read as they are (``as_is``: q, k_cache, v_cache, cache_seqlens,
    block_table; fixed by the signature's shapes, strides and dtypes), and whether the call
    returns the rows' lse (``lse_rows``, (batch, heads, n_new)) too."""

    __slots__ = ("rows", "out", "n_part", "n_lse", "split", "combine", "as_is", "lse_rows")

    def __init__(self, rows, out, n_part, n_lse, split, combine, as_is, lse_rows=None):
        self.rows, self.out, self.n_part, self.n_lse = rows, out, n_part, n_lse
        self.split, self.combine, self.as_is, self.lse_rows = split, combine, as_is, lse_rows

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table):
        q_ok, k_ok, v_ok, seqlens_ok, table_ok = self.as_is
        # q as (batch, kv_heads, group * n_new, d): its own memory when that is a view
        q_rows = q if q_ok else last_dim_contiguous(q.reshape(self.rows))
        k_cache = k_cache if k_ok else last_dim_contiguous(k_cache)
        v_cache = v_cache if v_ok else last_dim_contiguous(v_cache)
        # (batch, heads, n_new, d) is the memory of (batch, kv_heads, group * n_new, d)
        o = new_buffer(self.out, device=q.device, dtype=q.dtype)
        # the splits' results and their lse, float32, in one allocation (one split: no o_part)
        work = new_buffer((self.n_part + self.n_lse,), device=q.device, dtype=torch.float32)
        o_part, lse = (work[:self.n_part] if self.combine else o), work[self.n_part:]
        seqlens = (lse if cache_seqlens is None else cache_seqlens if seqlens_ok
                   else cache_seqlens.to(torch.int32).contiguous())
        table = lse if block_table is None else block_table if table_ok else block_table.contiguous()
        self.split(q_rows, k_cache, v_cache, o_part, lse, seqlens, table)
        if self.lse_rows is None:
            if self.combine:
                self.combine(o_part, lse, o, lse)   # the last: a stand-in, unused without WRITE_LSE
            return o
        if self.combine:   # one split: its lse is the rows' own
            lse_out = new_buffer(self.lse_rows, device=q.device, dtype=torch.float32)
            self.combine(o_part, lse, o, lse_out)
            lse = lse_out
        return o, lse.view(self.lse_rows)


def _plan(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, check_values, window=None,
          softcap=None, return_lse=False):
    """Check a call's arguments (errors name them) and decide its launch; None when there
    is nothing to compute (no batch or no new token)."""
    names = ("q", "k_cache", "v_cache")
    page_size = 0
    if block_table is not None:
        (k_seen, v_seen), page_size, per_seq = _check_paged(q, k_cache, v_cache, block_table)
        scale = check_inputs(q, k_seen, v_seen, causal, scale, names=names)
        n_max = per_seq * page_size
    else:
        scale = check_inputs(q, k_cache, v_cache, causal, scale, names=names)
        n_max = k_cache.shape[2]
    check_flag(check_values, "check_values")
    check_flag(return_lse, "return_softmax_lse")
    cap = masks.check_softcap(softcap)
    batch, heads, n_new, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if n_new > MAX_NEW_TOKENS:
        raise ValueError(f"q must hold 1 to {MAX_NEW_TOKENS} new tokens per sequence (axis 2), "
                         f"got shape {tuple(q.shape)}; use flash_attention for longer queries")
    if cache_seqlens is not None:
        _check_index_tensor(cache_seqlens, "cache_seqlens", (batch,), q.device, "one length per sequence")
        if check_values:
            _check_range(cache_seqlens, "cache_seqlens", 0, n_max,
                         "the pages of block_table hold" if page_size else "the cache's length")
    if page_size and check_values:
        _check_range(block_table, "block_table", 0, k_cache.shape[0] - 1, "pages of k_cache")
    causal, windowed, first, last, keys = window_offsets(window, causal, n_new, n_max)
    if batch == 0 or n_new == 0:
        return None
    group = heads // kv_heads
    n_rows = group * n_new
    block_m, block_n, num_warps, num_stages = decode_tiles(head_dim, q.element_size(), n_rows,
                                                           page_size=page_size)
    if num_splits is None:   # a window's keys span at most one tile more than its length
        num_splits = choose_num_splits(batch, kv_heads, min(n_max, keys + block_n - 1), sm_count=sm_count(q.device),
                                       block_n=block_n)
    else:
        num_splits = check_num_splits(num_splits)

    # (batch, heads, n_new, d) -> (batch, kv_heads, group * n_new, d): a group's rows side by side
    rows = (batch, kv_heads, n_rows, head_dim)
    q_rows = last_dim_contiguous(q.reshape(rows))
    as_is = (q_rows.data_ptr() == q.data_ptr(), k_cache.stride(-1) == 1, v_cache.stride(-1) == 1,
             cache_seqlens is None or (cache_seqlens.dtype == torch.int32 and cache_seqlens.is_contiguous()),
             block_table is None or block_table.is_contiguous())
    k_cache, v_cache = last_dim_contiguous(k_cache), last_dim_contiguous(v_cache)
    o_strides = _contiguous_strides(rows)
    if num_splits == 1:   # one split: the kernel writes the output itself
        n_part, part_strides = 0, (o_strides[0], o_strides[1], 0, o_strides[2])
    else:
        part_shape = (batch, kv_heads, num_splits, n_rows, head_dim)
        n_part, part_strides = math.prod(part_shape), _contiguous_strides(part_shape)[:4]
    n_lse = batch * kv_heads * num_splits * n_rows
    table_stride = block_table.contiguous().stride(0) if page_size else 0

    grid = (num_splits, triton.cdiv(n_rows, block_m), batch * kv_heads)
    lengths = (n_rows, n_max, num_splits)   # a length of 1 takes the unspecialised twin (forward.LENGTH_ARGS)
    split = Launch(
        for_lengths(_decode_fwd, lengths, ("n_rows", "seq_max", "num_splits")), grid,
        [None] * 7 + [q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
                      k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                      v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                      *part_strides, table_stride, kv_heads, n_rows, n_max, num_splits, (cap or scale) * LOG2E,
                      first, last, scale / cap if cap else 1.0],
        dict(N_NEW=n_new, HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
             CAUSAL=causal, HAS_SEQLENS=cache_seqlens is not None, PAGE_SIZE=page_size,
             DOT_PRECISION=dot_precision(q.dtype), WINDOW=windowed,
             TILE_IN_PAGE=TILE_IN_PAGE and page_size >= block_n,   # no pages: page_size 0
             SOFTCAP=bool(cap), num_warps=num_warps, num_stages=num_stages),
        slots=range(7))
    combine = None
    if num_splits > 1:
        combine = Launch(
            for_lengths(_decode_combine, (n_rows, num_splits), ("n_rows", "num_splits")), (n_rows, batch * kv_heads),
            [None] * 4 + [o_strides[0], o_strides[1], o_strides[2], kv_heads, n_rows, num_splits],
            dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), BLOCK_S=triton.next_power_of_2(num_splits),
                 WRITE_LSE=bool(return_lse), num_warps=4),
            slots=range(4))
    return _Plan(rows, (batch, heads, n_new, head_dim), n_part, n_lse, split, combine, as_is,
                 (batch, heads, n_new) if return_lse else None)
