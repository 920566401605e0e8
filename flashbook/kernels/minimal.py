"""The smallest FlashAttention kernels worth reading: the forward (chapter 7, first
section) and the backward (chapter 8, first section).

The forward, :func:`minimal_fwd`: one program owns ``BLOCK_M`` query rows of one (batch, head): program axis 0 walks
the query tiles, axis 1 the ``batch * heads`` pairs. It keeps its Q tile, the running
row maximum ``m``, the running sum ``l`` and the output accumulator ``acc`` on chip,
streams every K and V tile of its head past them with chapter 3's online softmax, and
writes the output once. Nothing else: no exp2, no tile skipping, no GQA, no saved
log-sum-exp, no tuning switches. Rows and keys past the end of the sequence are masked
in the simplest way (a load mask, and -inf scores for keys that do not exist), so any
sequence length works; ``head_dim`` must be a power of two (16 or more) so that it is
one tile wide.

:func:`minimal_attention` is the Python side: checks, the output buffer, the grid.

Chapter 8 reads the backward pass the same way first: :func:`minimal_bwd_dkdv` (one
program per key tile, summing dK and dV over the query tiles) and :func:`minimal_bwd_dq`
(one program per query tile, summing dQ over the key tiles), with
:func:`minimal_backward` as their Python side. They take the forward's output and its
saved log-sum-exp (``flash_forward`` returns both) and rebuild P = exp(S - lse) tile by
tile; no GQA, no stages, no atomics, float32 sums.
"""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def minimal_fwd(Q, K, V, O, seq_len, scale,
                CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Which tile am I? Inputs are contiguous (batch * heads, seq_len, HEAD_DIM).
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64) * seq_len * HEAD_DIM   # offset of my (batch, head)
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)

    # My Q tile stays on chip for the whole loop (rows past the end read as 0).
    q = tl.load(Q + head + rows[:, None] * HEAD_DIM + cols[None, :], mask=rows[:, None] < seq_len, other=0.0)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # running row maximum
    l = tl.zeros([BLOCK_M], dtype=tl.float32)                  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)      # running sum of exp(s - m) v

    end = tl.minimum(seq_len, start_m + BLOCK_M) if CAUSAL else seq_len   # keys any of my rows may see
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        kv_mask = keys[:, None] < seq_len
        k = tl.load(K + head + keys[:, None] * HEAD_DIM + cols[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + head + keys[:, None] * HEAD_DIM + cols[None, :], mask=kv_mask, other=0.0)

        s = tl.dot(q, tl.trans(k)) * scale                      # (BLOCK_M, BLOCK_N) scores, fp32
        visible = keys[None, :] < seq_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        s = tl.where(visible, s, float("-inf"))

        # The online softmax: new maximum, rescale what we have, add this tile.
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)                               # how much the old maximum was off
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    o = acc / l[:, None]
    tl.store(O + head + rows[:, None] * HEAD_DIM + cols[None, :], o.to(O.dtype.element_ty),
             mask=rows[:, None] < seq_len)


def _checked(tensors: dict, block_m, block_n) -> tuple:
    """Check the Python side's inputs, naming the bad one: every tensor 4-d (batch, heads,
    seq_len, head_dim) and like the first (``q``) in shape, dtype and device, a float dtype, a
    head_dim and block sizes that are powers of two >= 16. Returns q's shape."""
    q = next(iter(tensors.values()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d (batch, heads, seq_len, head_dim), got shape {tuple(t.shape)}")
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must match q in shape, dtype and device: q is {tuple(q.shape)} "
                             f"{q.dtype} on {q.device}, {name} is {tuple(t.shape)} {t.dtype} on {t.device}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    return tuple(q.shape)


def minimal_attention(q, k, v, *, causal: bool = False, block_m: int = 32, block_n: int = 32):
    """Attention of ``q``, ``k``, ``v`` (batch, heads, seq_len, head_dim), all of one
    float dtype on one device, with :func:`minimal_fwd`. Returns a tensor like ``q``."""
    batch, heads, seq_len, head_dim = _checked(dict(q=q, k=k, v=v), block_m, block_n)
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)
    grid = (triton.cdiv(seq_len, block_m), batch * heads)
    minimal_fwd[grid](q, k, v, o, seq_len, 1.0 / math.sqrt(head_dim),
                      CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)
    return o


# ----------------------------------------------------------------------------- backward
# Chapter 8's first section: the backward pass of chapter 5 in two small kernels. Both
# recompute P = exp(S - lse) from the forward's saved lse (natural log, one float32 per
# row), with the same masking as minimal_fwd, and keep their sums in float32.


@triton.jit
def minimal_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, seq_len, scale,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Which key tile am I? Inputs are contiguous (batch * heads, seq_len, HEAD_DIM).
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)                         # my (batch, head)
    keys = start_n + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)
    kv = bh * seq_len * HEAD_DIM + keys[:, None] * HEAD_DIM + cols[None, :]   # my rows of K, V
    k = tl.load(K + kv, mask=keys[:, None] < seq_len, other=0.0)   # K_j and V_j stay on chip
    v = tl.load(V + kv, mask=keys[:, None] < seq_len, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)       # summed over the query tiles
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    first = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0    # earlier rows see none of my keys
    for start_m in range(first, seq_len, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)                 # rows past the end read as 0
        qo = bh * seq_len * HEAD_DIM + rows[:, None] * HEAD_DIM + cols[None, :]
        q = tl.load(Q + qo, mask=rows[:, None] < seq_len, other=0.0)
        do = tl.load(DO + qo, mask=rows[:, None] < seq_len, other=0.0)
        lse = tl.load(LSE + bh * seq_len + rows, mask=rows < seq_len, other=0.0)
        delta = tl.load(DELTA + bh * seq_len + rows, mask=rows < seq_len, other=0.0)

        s = tl.dot(q, tl.trans(k)) * scale                     # (BLOCK_M, BLOCK_N) scores, fp32
        visible = keys[None, :] < seq_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        p = tl.exp(tl.where(visible, s, float("-inf")) - lse[:, None])   # P recomputed from lse
        dv += tl.dot(tl.trans(p).to(do.dtype), do)             # dV_j += P^T dO_i
        dp = tl.dot(do, tl.trans(v))                           # dP = dO_i V_j^T
        ds = p * (dp - delta[:, None])                         # dS = P o (dP - delta)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q)              # dK_j += dS^T Q_i

    tl.store(DK + kv, (dk * scale).to(DK.dtype.element_ty), mask=keys[:, None] < seq_len)
    tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=keys[:, None] < seq_len)


@triton.jit
def minimal_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, seq_len, scale,
                   CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Which query tile am I? The grid of minimal_fwd.
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)                         # my (batch, head)
    rows = start_m + tl.arange(0, BLOCK_M)                     # rows past the end read as 0
    cols = tl.arange(0, HEAD_DIM)
    qo = bh * seq_len * HEAD_DIM + rows[:, None] * HEAD_DIM + cols[None, :]   # my rows of Q, dO, dQ
    q = tl.load(Q + qo, mask=rows[:, None] < seq_len, other=0.0)   # these four stay on chip
    do = tl.load(DO + qo, mask=rows[:, None] < seq_len, other=0.0)
    lse = tl.load(LSE + bh * seq_len + rows, mask=rows < seq_len, other=0.0)
    delta = tl.load(DELTA + bh * seq_len + rows, mask=rows < seq_len, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)       # summed over the key tiles

    end = tl.minimum(seq_len, start_m + BLOCK_M) if CAUSAL else seq_len   # keys any of my rows may see
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        kv = bh * seq_len * HEAD_DIM + keys[:, None] * HEAD_DIM + cols[None, :]
        k = tl.load(K + kv, mask=keys[:, None] < seq_len, other=0.0)
        v = tl.load(V + kv, mask=keys[:, None] < seq_len, other=0.0)

        s = tl.dot(q, tl.trans(k)) * scale                     # the same scores, recomputed
        visible = keys[None, :] < seq_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        p = tl.exp(tl.where(visible, s, float("-inf")) - lse[:, None])   # P recomputed from lse
        dp = tl.dot(do, tl.trans(v))                           # dP = dO_i V_j^T
        ds = p * (dp - delta[:, None])                         # dS = P o (dP - delta)
        dq += tl.dot(ds.to(k.dtype), k)                        # dQ_i += dS K_j

    tl.store(DQ + qo, (dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None] < seq_len)


def minimal_backward(q, k, v, o, lse, do, *, causal: bool = False, block_m: int = 32, block_n: int = 32):
    """Gradients (dq, dk, dv) of attention, with :func:`minimal_bwd_dkdv` and
    :func:`minimal_bwd_dq`. ``q``, ``k``, ``v``, the forward's output ``o`` and the
    output's gradient ``do`` are (batch, heads, seq_len, head_dim), all of one float dtype
    on one device; ``lse`` is the forward's float32 log-sum-exp of each scaled score row,
    (batch, heads, seq_len), as ``flash_forward`` returns it with ``o``."""
    batch, heads, seq_len, head_dim = _checked(dict(q=q, k=k, v=v, o=o, do=do), block_m, block_n)
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor, got {type(lse).__name__}")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(f"lse must be float32 of shape {tuple(q.shape[:3])} (batch, heads, seq_len) on "
                         f"{q.device}, got {tuple(lse.shape)} {lse.dtype} on {lse.device}")
    q, k, v, do, lse = (t.contiguous() for t in (q, k, v, do, lse))
    delta = (o.float() * do.float()).sum(-1).contiguous()      # rowsum(dO o O), chapter 5's delta
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale, flags = 1.0 / math.sqrt(head_dim), dict(CAUSAL=bool(causal), HEAD_DIM=head_dim,
                                                   BLOCK_M=block_m, BLOCK_N=block_n)
    minimal_bwd_dkdv[(triton.cdiv(seq_len, block_n), batch * heads)](
        q, k, v, do, lse, delta, dk, dv, seq_len, scale, **flags)
    minimal_bwd_dq[(triton.cdiv(seq_len, block_m), batch * heads)](
        q, k, v, do, lse, delta, dq, seq_len, scale, **flags)
    return dq, dk, dv
