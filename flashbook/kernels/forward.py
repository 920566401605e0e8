"""The FlashAttention-2 forward pass as a Triton kernel (chapter 7).

One program owns one tile of ``BLOCK_M`` query rows of one head. It keeps that
Q tile, the running row maximum ``row_max``, the running ``row_sum`` and the
output accumulator ``acc`` on chip, and streams the K and V tiles of its head
past them (the online softmax of chapter 3). It writes O and the natural-log
``lse`` of each row, nothing else: the backward pass recomputes the rest.

Two tricks make the inner loop cheap:

* ``exp2`` instead of ``exp``: the scale is multiplied by log2(e) once, so the
  exponent costs one multiply and one ``ex2`` instruction.
* The key tiles of a query tile fall into two groups. Tiles that every row of
  the query tile may see entirely (all of them, when not causal, except a last
  partial tile) need no mask: the *main* stage. The few tiles on the causal
  diagonal, and a last tile that sticks out past ``seq_k``, need a mask: the
  *masked* stage. Both are the same loop, ``_fwd_inner``, with a constexpr
  ``STAGE`` (which ``shifted_scores`` reads); ``attend`` runs the two stages one
  after the other. Tiles that are masked entirely are never visited at all.
* Under a causal mask the query tiles with the most keys are launched first,
  so that no long program is left running alone at the end.

Chapter 10 builds this kernel up one change at a time; its slower rungs live in
``ladder.py``, so that this file holds only the kernel the library runs.

Shapes: q (batch, heads, seq_q, head_dim); k, v (batch, kv_heads, seq_k, head_dim)
with ``heads = group * kv_heads`` (GQA; group 1 is plain multi-head attention).
Any strides, except that the last dimension must be contiguous (the Python side
makes sure of that).
"""
import triton
import triton.language as tl

MAIN: tl.constexpr = tl.constexpr(1)     # tiles wholly visible to every row: no mask
MASKED: tl.constexpr = tl.constexpr(2)   # the causal diagonal and the ragged end
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * log2(e)); LOG2E.value on the host
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)    # ln(2): turns a log2 back into a natural log

#: The compile-time switches that sliding windows, soft caps, packed documents, prefixes and
#: ALiBi biases add to the kernels ("One kernel, many masks"; ``ONE_LOOP``, the backward's for a
#: short window, ``autograd.one_loop``), and the run-time arguments only
#: each one uses. Off (their defaults) they compile away, to the same instructions as before
#: they existed (tools/ptx_compare.py); chapters 7 and 8 show the kernels without them
#: (``display.source(..., without=LATER)``).
LATER = {"WINDOW": ("first", "last"), "SOFTCAP": ("cap_scale",),
         "VARLEN": ("CU_SEQLENS_Q", "CU_SEQLENS_K", "DOC_ORDER"), "PREFIX": ("prefix",),
         "ALIBI": ("ALIBI_SLOPES", "alibi_stride", "alibi_head", "alibi_diagonal"), "ONE_LOOP": (), "FUSED": ()}

#: The length arguments of the kernels. Triton compiles a separate kernel when an integer
#: argument is 1 (folding it in as a constant) or a multiple of 16. With seq_q = seq_k = 1
#: folded in, Triton 3.6 on an H200 pipelined the causal forward (128 x 64 tiles, 8 warps,
#: 3 stages, head_dim 128) so that about one run in nine read a K/V shared-memory slot no
#: copy had filled: lse -inf and o NaN, or a stale value (what the last kernel on that SM
#: left there), and the backward's dV inherited it. The same tiles with 1 or 2 stages,
#: lengths of 2, 3 or 17, or the lengths passed as run-time values were right in every
#: run. So a launch with a length of 1 takes the kernel's twin that never specialises the
#: lengths (``for_lengths``); every other launch keeps the specialised kernel, because
#: without the multiple-of-16 facts the backward ran up to 1.36x slower
#: (benchmarks/results/stress_h200/).
LENGTH_ARGS = ("seq_q", "seq_k")
_TWINS: dict = {}


def for_lengths(kernel, lengths, names=LENGTH_ARGS):
    """``kernel`` as Triton specialises it, or, when one of ``lengths`` is 1, its twin
    compiled from the same source with the arguments ``names`` never specialised."""
    if 1 not in lengths:
        return kernel
    key = (kernel, tuple(names))
    if key not in _TWINS:
        _TWINS[key] = triton.jit(kernel.fn, do_not_specialize=list(names))
    return _TWINS[key]


@triton.jit
def load_tile(base, rows, stride, n_rows, cols, n_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load the (rows x cols) tile of a matrix at ``base`` whose rows are ``stride``
    elements apart and whose columns are contiguous, masking only the dimensions
    that can run past the end.

    Unmasked loads are the fast path; a mask is added only where a constexpr says
    the tile may stick out (a ragged last tile, a head_dim padded to a power of 2).
    Out-of-range elements read as 0.
    """
    ptrs = base + rows[:, None] * stride + cols[None, :]
    if MASK_ROWS and MASK_COLS:
        x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif MASK_ROWS:
        x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif MASK_COLS:
        x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def launch_position(HEAD_GROUP: tl.constexpr = 1):
    """(tile, batch x head) of this program in a grid (tiles, batch * heads).

    The GPU starts programs in order of ``program_id(0) + program_id(1) * tiles``: with
    ``HEAD_GROUP`` = 1 that is every tile of one head, then the next head. With
    ``HEAD_GROUP`` = G > 1 the same positions are dealt out G heads at a time, tile by
    tile: tile 0 of heads 0..G-1, tile 1 of the same heads, ..., then the next G heads.
    """
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    if HEAD_GROUP > 1:
        tiles = tl.num_programs(0)
        pid = bh * tiles + tile                # the launch order
        span = HEAD_GROUP * tiles              # programs of one group of heads
        group = pid // span
        width = tl.minimum(HEAD_GROUP, tl.num_programs(1) - group * HEAD_GROUP)   # the last group may be narrower
        rest = pid - group * span
        tile = rest // width
        bh = group * HEAD_GROUP + rest - tile * width
    return tile, bh


@triton.jit
def query_tile_index(CAUSAL: tl.constexpr, HEAD_GROUP: tl.constexpr = 1, HEAVY_LAST: tl.constexpr = False):
    """Which query tile this program owns (program axis 0; ``launch_position``).

    Under a causal mask the last query tiles see the most keys: they get the first
    programs, so that no long program is left running alone at the end. ``HEAVY_LAST``
    says the same of a sliding window whose right side is limited (``autograd.heavy_last``):
    its first tiles see fewer keys than the rest.
    """
    pid_m, _ = launch_position(HEAD_GROUP)
    if CAUSAL or HEAVY_LAST:
        pid_m = tl.num_programs(0) - 1 - pid_m
    return pid_m


@triton.jit
def visible_keys(rows, cols, seq_k, diagonal, CAUSAL: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                 PREFIX: tl.constexpr = False, prefix=0):
    """(rows x cols) mask of the scores a masked-stage tile keeps: keys that exist,
    and, when causal, key j for query row i only if j <= i + (seq_k - seq_q).

    A window (``WINDOW``; chapter "One kernel, many masks") keeps key j for row i when
    i + first <= j <= i + diagonal: the caller passes ``diagonal`` = seq_k - seq_q +
    right and ``first`` = seq_k - seq_q - left (``autograd.kernel_mask``).

    ``PREFIX`` (prefix-LM, with causal): the first ``prefix`` keys are seen by every row."""
    visible = cols[None, :] < seq_k
    if CAUSAL:
        if PREFIX:
            visible = visible & ((cols[None, :] <= rows[:, None] + diagonal) | (cols[None, :] < prefix))
        else:
            visible = visible & (cols[None, :] <= rows[:, None] + diagonal)
    if WINDOW:
        visible = visible & (cols[None, :] <= rows[:, None] + diagonal) & (cols[None, :] >= rows[:, None] + first)
    return visible


@triton.jit
def causal_bounds(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):
    """Key range [0, hi) a query tile must visit, and where its masked part begins.

    Query row i sees key j when j <= i + (seq_k - seq_q) (bottom-right aligned).
    Keys below ``full_end`` are visible to every row of the tile and lie in whole
    tiles (main stage); keys in [full_end, hi) need a mask (masked stage).
    """
    if CAUSAL:
        diagonal = seq_k - seq_q
        # the last row of the tile sees keys up to start_m + BLOCK_M - 1 + diagonal
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + diagonal, 0), seq_k)
        # the first row sees keys up to start_m + diagonal: whole tiles below that are free
        full_end = tl.minimum(tl.maximum(start_m + diagonal + 1, 0), seq_k)
    else:
        hi = seq_k
        full_end = seq_k
    full_end = (full_end // BLOCK_N) * BLOCK_N
    return full_end, hi


@triton.jit
def query_bounds(start_n, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr):
    """The other side of ``causal_bounds``: which query tiles see the key tile at ``start_n``.

    Returns ``(lo, band_end, full_end, main_end, hi)``: query tiles [lo, band_end)
    straddle the causal diagonal (masked stage), [band_end, full_end) see the whole
    key tile (main stage), [main_end, hi) is a ragged last query tile (masked); tiles
    below ``lo`` see none of its keys and are never visited. All multiples of BLOCK_M.
    """
    diagonal = seq_k - seq_q
    hi = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M        # one past the last query tile
    full_end = (seq_q // BLOCK_M) * BLOCK_M       # query tiles below this are whole
    if CAUSAL:
        # row i sees key j when i >= j - diagonal: the first key of the tile sets
        # where the loop starts, the last one where the rows see the whole tile
        lo = tl.minimum((tl.maximum(start_n - diagonal, 0) // BLOCK_M) * BLOCK_M, hi)
        band_end = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diagonal, 0), BLOCK_M) * BLOCK_M
        band_end = tl.minimum(tl.maximum(band_end, lo), hi)
    else:
        lo = 0
        band_end = 0
    main_end = tl.maximum(band_end, full_end)
    return lo, band_end, full_end, main_end, hi


@triton.jit
def prefix_bounds(full_end, hi, prefix, seq_k, BLOCK_N: tl.constexpr):
    """``causal_bounds``' answer widened by a prefix every row sees: key tiles wholly inside
    the prefix join the main stage, and the loop runs at least to the prefix's end."""
    seen = tl.minimum(prefix, seq_k)
    return tl.maximum(full_end, (seen // BLOCK_N) * BLOCK_N), tl.maximum(hi, seen)


@triton.jit
def prefix_query_bounds(lo, band_end, full_end, start_n, prefix, BLOCK_N: tl.constexpr):
    """``query_bounds``' (lo, band_end, main_end) for a key tile that reaches into a prefix
    every row sees: every query tile visits it (lo = 0), and if the tile lies wholly inside
    the prefix, every row sees all of it (no masked band before the whole query tiles)."""
    lo = tl.where(start_n < prefix, 0, lo)
    band_end = tl.where(start_n + BLOCK_N <= prefix, 0, band_end)
    return lo, band_end, tl.maximum(band_end, full_end)


@triton.jit
def document(CU_SEQLENS, b):
    """Where document ``b`` of a packed batch starts and how long it is: ``cu_seqlens[b]``
    and ``cu_seqlens[b + 1] - cu_seqlens[b]`` (flash-attn's varlen layout)."""
    start = tl.load(CU_SEQLENS + b)
    return start.to(tl.int64), tl.load(CU_SEQLENS + b + 1) - start


@triton.jit
def document_of(b, DOC_ORDER):
    """The document that program row ``b`` works on: ``b`` itself, or with ``DOC_ORDER`` (int32,
    the documents by work, the most first: ``varlen.longest_first``) the b-th heaviest, so that
    the longest documents' programs start first and the short ones fill in at the end."""
    if DOC_ORDER is not None:
        b = tl.load(DOC_ORDER + b).to(tl.int64)
    return b


@triton.jit
def documents(CU_SEQLENS_Q, CU_SEQLENS_K, b, first, last):
    """Document ``b``'s queries and keys, ``(q_start, seq_q, k_start, seq_k, first, last)``:
    where each starts, how many there are, and the window's offsets moved onto this
    document's own diagonal (the host passes them relative to a diagonal of 0)."""
    q_start, seq_q = document(CU_SEQLENS_Q, b)
    k_start, seq_k = document(CU_SEQLENS_K, b)
    return q_start, seq_q, k_start, seq_k, first + seq_k - seq_q, last + seq_k - seq_q


@triton.jit
def window_bounds(start_m, seq_k, first, last, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``causal_bounds`` for a window: row i sees keys [i + first, i + last].

    Returns ``(lo, full_lo, full_hi, hi)``: key tiles [lo, full_lo) need the mask (the
    window's lower edge), [full_lo, full_hi) are seen whole by every row of the tile
    (main stage), [full_hi, hi) need the mask again (the upper edge and a ragged last
    tile). Tiles outside [lo, hi) are never visited. lo, full_lo and full_hi are
    multiples of BLOCK_N, and lo <= full_lo <= full_hi <= hi.
    """
    lo = (tl.maximum(start_m + first, 0) // BLOCK_N) * BLOCK_N
    hi = tl.maximum(tl.minimum(start_m + BLOCK_M + last, seq_k), lo)
    # every row sees keys from (last row) + first up to (first row) + last
    full_lo = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + first, 0), BLOCK_N) * BLOCK_N
    full_hi = (tl.minimum(start_m + last + 1, seq_k) // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def window_query_bounds(start_n, seq_q, first, last, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``query_bounds`` for a window: key j is seen by rows [j - last, j - first].

    Returns ``(lo, band_end, main_end, hi)``: query tiles [lo, band_end) masked,
    [band_end, main_end) see the whole key tile and are whole query tiles (main stage),
    [main_end, hi) masked (the window's far edge and a ragged last query tile).
    """
    lo = (tl.maximum(start_n - last, 0) // BLOCK_M) * BLOCK_M
    hi = tl.maximum(tl.minimum(start_n + BLOCK_N - first, seq_q), lo)
    band_end = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - last, 0), BLOCK_M) * BLOCK_M
    main_end = (tl.minimum(start_n - first + 1, seq_q) // BLOCK_M) * BLOCK_M
    band_end = tl.minimum(tl.maximum(band_end, lo), hi)
    main_end = tl.maximum(tl.minimum(main_end, hi), band_end)
    return lo, band_end, main_end, hi


@triton.jit
def soft_cap(x):
    """tanh(x), to a few float32 ulps, for the soft cap c * tanh(s / c) (Gemma 2).

    Triton has no tanh that its CPU interpreter runs, so: 1 - 2 / (e^(2x) + 1), which
    for |x| < 0.3 loses digits to cancellation; there an odd Taylor polynomial (absolute
    error below 2e-8, relative below 6e-8, about one float32 rounding) takes over."""
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    large = 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)
    return tl.where(tl.abs(x) < 0.3, small, large)


@triton.jit
def alibi_slope(ALIBI_SLOPES, alibi_head, qk_scale):
    """One head's ALiBi slope (flash-attn's ``alibi_slopes[b, h]``, at ``alibi_head`` = b *
    batch stride + h), divided by the score scale, as flash-attn's kernels divide it by theirs
    (csrc/flash_attn/src/flash_fwd_kernel.h): the bias is added to the scores before
    ``qk_scale`` multiplies them, so it comes out as slope * log2(e) in the log2 units of exp2."""
    return tl.load(ALIBI_SLOPES + alibi_head) * (LOG2E / qk_scale)


@triton.jit
def alibi_bias(i, j, diagonal, slope):
    """ALiBi's bias before ``qk_scale``, to subtract from the scores of query rows ``i`` and keys
    ``j`` (broadcast against each other): slope * |i + diagonal - j|, diagonal = seq_k - seq_q,
    bottom-right aligned as flash-attn (csrc/flash_attn/src/alibi.h)."""
    return slope * tl.abs(i + diagonal - j).to(tl.float32)


@triton.jit
def load_lse(lse_base, rows, seq_q, MASK_ROWS: tl.constexpr):
    """The saved lse of ``rows``, times log2(e) (the backward's exp2 wants it in base 2).

    A row that sees no key has lse = -inf; it becomes +inf, so that its recomputed
    P = exp2(s - lse) is exactly 0 rather than NaN. Rows past ``seq_q`` read 0.
    """
    if MASK_ROWS:
        lse = tl.load(lse_base + rows, mask=rows < seq_q, other=0.0)
        lse = tl.where(lse == float("-inf"), float("inf"), lse)
    else:
        lse = tl.load(lse_base + rows)
    return lse * LOG2E


@triton.jit
def finite(m):
    """A running maximum with -inf (no key seen yet) replaced by 0, to subtract safely."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def shifted_scores(qk, row_max, rows, cols, seq_k, diagonal, qk_scale,
                   STAGE: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                   PREFIX: tl.constexpr = False, prefix=0):
    """One tile's scaled scores minus the new running row maximum, and that maximum.

    Main stage: the scale is folded into the subtraction (one multiply-add per
    score). Masked stage: the scores a row may not see become -inf first.
    """
    if STAGE == MASKED:
        visible = visible_keys(rows, cols, seq_k, diagonal, CAUSAL, WINDOW, first, PREFIX, prefix)
        qk = tl.where(visible, qk * qk_scale, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(qk, 1))
        if WINDOW:
            # A row may see its first key only in a later tile: its maximum stays -inf
            # until then (a stand-in of 0 would floor it, and exp2 of scores far below
            # 0 would underflow); ``finite`` keeps the subtractions free of NaN.
            qk = qk - finite(new_max)[:, None]
        else:
            # A row that has seen no key yet keeps a max of -inf; use 0 instead so
            # that -inf - (-inf) never makes a NaN (its p is exp2(-inf) = 0 anyway).
            new_max = tl.where(new_max == float("-inf"), 0.0, new_max)
            qk = qk - new_max[:, None]
    else:
        new_max = tl.maximum(row_max, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - new_max[:, None]
    return qk, new_max


@triton.jit
def _fwd_inner(acc, row_max, row_sum, q,
               k_base, v_base, stride_kn, stride_vn,
               rows, offs_n, offs_d, seq_k, diagonal, lo, hi, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
               CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
               WINDOW: tl.constexpr = False, first=0, SOFTCAP: tl.constexpr = False, cap_scale=1.0,
               PREFIX: tl.constexpr = False, prefix=0, ALIBI: tl.constexpr = False, ALIBI_SLOPES=None,
               alibi_head=0, alibi_diagonal=0):
    """Fold key tiles [lo, hi) into (acc, row_max, row_sum): the online softmax, in base 2.

    ``SOFTCAP``: the scores become tanh(q.k * cap_scale) first, with cap_scale = scale / c
    and ``qk_scale`` = c * log2(e), so the softmax sees c * tanh(scale * q.k / c).

    ``ALIBI``: then the bias -slope * |i + alibi_diagonal - j| is added (after the cap, uncapped,
    as flash-attn's kernels do: apply_softcap, then the mask that adds the bias), so the
    softmax sees cap(scale * q.k) - slope * |i + seq_k - seq_q - j|."""
    if ALIBI:
        slope = alibi_slope(ALIBI_SLOPES, alibi_head, qk_scale)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_tile(k_base, cols, stride_kn, seq_k, offs_d, HEAD_DIM, STAGE == MASKED, not EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if SOFTCAP:
            qk = soft_cap(qk * cap_scale)
        if ALIBI:
            qk = qk - alibi_bias(rows[:, None], cols[None, :], alibi_diagonal, slope)
        qk, new_max = shifted_scores(qk, row_max, rows, cols, seq_k, diagonal, qk_scale, STAGE, CAUSAL,
                                     WINDOW, first, PREFIX, prefix)
        p = tl.exp2(qk)
        if WINDOW:
            alpha = tl.exp2(row_max - finite(new_max))  # row_max -inf: nothing summed yet, 0
        else:
            alpha = tl.exp2(row_max - new_max)  # rescales what was summed under the old max
        acc, row_sum = fold_values(acc, row_sum, p, alpha, v_base, cols, stride_vn, seq_k, offs_d,
                                   HEAD_DIM, STAGE == MASKED, EVEN_D, DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def fold_values(acc, row_sum, p, alpha, v_base, cols, stride_vn, seq_k, offs_d,
                HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """The second half of an online-softmax step: rescale the running sum and output
    by ``alpha``, then add this key tile's weights ``p`` and ``p @ V``."""
    row_sum = row_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = load_tile(v_base, cols, stride_vn, seq_k, offs_d, HEAD_DIM, MASK_ROWS, not EVEN_D)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, row_sum


@triton.jit
def attend(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
           rows, offs_n, offs_d, seq_k, diagonal, lo, full_end, hi, qk_scale,
           HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
           EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
           WINDOW: tl.constexpr = False, first=0, SOFTCAP: tl.constexpr = False, cap_scale=1.0,
           PREFIX: tl.constexpr = False, prefix=0, ALIBI: tl.constexpr = False, ALIBI_SLOPES=None,
           alibi_head=0, alibi_diagonal=0):
    """Both stages for one query tile: key tiles [lo, full_end) without a mask (main),
    then [full_end, hi) with one (the causal diagonal and a ragged last tile)."""
    acc, row_max, row_sum = _fwd_inner(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        rows, offs_n, offs_d, seq_k, diagonal, lo, full_end, qk_scale,
        HEAD_DIM, BLOCK_N, MAIN, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix,
        ALIBI, ALIBI_SLOPES, alibi_head, alibi_diagonal)
    acc, row_max, row_sum = _fwd_inner(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        rows, offs_n, offs_d, seq_k, diagonal, full_end, hi, qk_scale,
        HEAD_DIM, BLOCK_N, MASKED, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix,
        ALIBI, ALIBI_SLOPES, alibi_head, alibi_diagonal)
    return acc, row_max, row_sum


@triton.jit
def normalised_rows(acc, row_max, row_sum):
    """The output rows acc / row_sum and the natural-log ``lse`` of each row.

    ``row_max`` is in log2 units (the scores were scaled by log2(e) for exp2). A row
    that saw no key (causal, seq_q > seq_k; or an empty split of the keys) has
    row_sum 0: output 0, lse -inf.
    """
    seen = row_sum > 0.0
    acc = acc / tl.where(seen, row_sum, 1.0)[:, None]
    lse = tl.where(seen, (row_max + tl.log2(tl.where(seen, row_sum, 1.0))) * LN2, float("-inf"))
    return acc, lse


@triton.jit
def _attn_fwd(Q, K, V, O, LSE,
              stride_qb, stride_qh, stride_qm,
              stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn,
              stride_ob, stride_oh, stride_om,
              n_heads, group, seq_q, seq_k, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
              first=0, last=0, cap_scale=1.0, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, prefix=0,
              ALIBI_SLOPES=None, alibi_stride=0, DOC_ORDER=None,
              WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, VARLEN: tl.constexpr = False,
              PREFIX: tl.constexpr = False, ALIBI: tl.constexpr = False, HEAD_GROUP: tl.constexpr = 1,
              HEAVY_LAST: tl.constexpr = False):
    """One program: one query tile of one (batch, head). Grid (cdiv(seq_q, BLOCK_M), batch * heads).

    ``qk_scale`` is the softmax scale times log2(e), so the scores come out in log2 units.

    ``WINDOW``: row i sees keys [i + first, i + last] (``autograd.kernel_mask``), visited in
    three stages (``window_bounds``). ``SOFTCAP``: scores c * tanh(s / c) (``_fwd_inner``).

    ``VARLEN``: documents packed along one sequence (flash-attn's varlen): the batch axis of
    the grid counts documents, each with its own lengths from ``CU_SEQLENS_Q/K``; ``seq_q``
    is the packed total, lse is (heads, total), and ``first``/``last`` are relative to each
    document's own diagonal. Grid (cdiv(max_seqlen_q, BLOCK_M), documents * heads); with
    ``DOC_ORDER`` the rows take the documents heaviest first (``document_of``).

    ``PREFIX`` (with ``CAUSAL``, prefix-LM): the first ``prefix`` keys (of each document) are
    seen by every row as well (``prefix_bounds``).

    ``ALIBI`` (flash-attn's ``alibi_slopes``): float32 slopes at ``ALIBI_SLOPES``, one per query
    head, ``alibi_stride`` apart per batch entry (document, under ``VARLEN``; 0: one row for the
    whole batch); the scores get -slope * |i + seq_k - seq_q - j| (``_fwd_inner``), positions
    counted within each document. Every tile pays for it, masked or not.

    ``HEAVY_LAST``: the query tiles are taken last first, as under ``CAUSAL``
    (``query_tile_index``; a window with a right limit, ``autograd.heavy_last``).
    """
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    start_m = query_tile_index(CAUSAL, HEAD_GROUP, HEAVY_LAST) * BLOCK_M
    _, bh = launch_position(HEAD_GROUP)
    b = (bh // n_heads).to(tl.int64)
    h = bh % n_heads
    h_kv = (h // group).to(tl.int64)  # GQA: `group` query heads share one K/V head
    h = h.to(tl.int64)

    if VARLEN:
        total_q = seq_q
        b = document_of(b, DOC_ORDER)
        q_start, seq_q, k_start, seq_k, first, last = documents(CU_SEQLENS_Q, CU_SEQLENS_K, b, first, last)
        seq_k = tl.where(start_m < seq_q, seq_k, 0)   # a tile past its document's end visits no key
        q_base = Q + q_start * stride_qm + h * stride_qh
        k_base = K + k_start * stride_kn + h_kv * stride_kh
        v_base = V + k_start * stride_vn + h_kv * stride_vh
        o_base = O + q_start * stride_om + h * stride_oh
    else:
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + h_kv * stride_kh
        v_base = V + b * stride_vb + h_kv * stride_vh
        o_base = O + b * stride_ob + h * stride_oh

    rows = start_m + tl.arange(0, BLOCK_M)   # this tile's query rows (absolute)
    offs_n = tl.arange(0, BLOCK_N)           # offsets within a key tile
    offs_d = tl.arange(0, BLOCK_D)

    q = load_tile(q_base, rows, stride_qm, seq_q, offs_d, HEAD_DIM, True, not EVEN_D)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if WINDOW:
        # the window's lower edge (masked), the tiles every row sees whole, the upper edge
        lo, full_lo, full_end, hi = window_bounds(start_m, seq_k, first, last, BLOCK_M, BLOCK_N)
        acc, row_max, row_sum = _fwd_inner(
            acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
            rows, offs_n, offs_d, seq_k, last, lo, full_lo, qk_scale,
            HEAD_DIM, BLOCK_N, MASKED, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale,
            ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h, alibi_diagonal=seq_k - seq_q)
        acc, row_max, row_sum = attend(
            acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
            rows, offs_n, offs_d, seq_k, last, full_lo, full_end, hi, qk_scale,
            HEAD_DIM, BLOCK_N, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale,
            ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h, alibi_diagonal=seq_k - seq_q)
    else:
        diagonal = seq_k - seq_q
        full_end, hi = causal_bounds(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
        if PREFIX:
            full_end, hi = prefix_bounds(full_end, hi, prefix, seq_k, BLOCK_N)
        acc, row_max, row_sum = attend(
            acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
            rows, offs_n, offs_d, seq_k, diagonal, 0, full_end, hi, qk_scale,
            HEAD_DIM, BLOCK_N, CAUSAL, EVEN_D, DOT_PRECISION, WINDOW, first, SOFTCAP, cap_scale, PREFIX, prefix,
            ALIBI=ALIBI, ALIBI_SLOPES=ALIBI_SLOPES, alibi_head=b * alibi_stride + h, alibi_diagonal=diagonal)

    acc, lse = normalised_rows(acc, row_max, row_sum)
    row_ok = rows < seq_q
    if VARLEN:
        tl.store(LSE + h * total_q + q_start + rows, lse, mask=row_ok)
    else:
        tl.store(LSE + bh.to(tl.int64) * seq_q + rows, lse, mask=row_ok)
    o_ptrs = o_base + rows[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
