"""The smallest FlashAttention forward kernel worth reading (chapter 7, first section).

One program owns ``BLOCK_M`` query rows of one (batch, head): program axis 0 walks
the query tiles, axis 1 the ``batch * heads`` pairs. It keeps its Q tile, the running
row maximum ``m``, the running sum ``l`` and the output accumulator ``acc`` on chip,
streams every K and V tile of its head past them with chapter 3's online softmax, and
writes the output once. Nothing else: no exp2, no tile skipping, no GQA, no saved
log-sum-exp, no tuning switches. Rows and keys past the end of the sequence are masked
in the simplest way (a load mask, and -inf scores for keys that do not exist), so any
sequence length works; ``head_dim`` must be a power of two (16 or more) so that it is
one tile wide.

:func:`minimal_attention` is the Python side: checks, the output buffer, the grid.
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


def minimal_attention(q, k, v, *, causal: bool = False, block_m: int = 32, block_n: int = 32):
    """Attention of ``q``, ``k``, ``v`` (batch, heads, seq_len, head_dim), all of one
    float dtype on one device, with :func:`minimal_fwd`. Returns a tensor like ``q``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d (batch, heads, seq_len, head_dim), got shape {tuple(t.shape)}")
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must match q in shape, dtype and device: q is {tuple(q.shape)} "
                             f"{q.dtype} on {q.device}, {name} is {tuple(t.shape)} {t.dtype} on {t.device}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    batch, heads, seq_len, head_dim = q.shape
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)
    grid = (triton.cdiv(seq_len, block_m), batch * heads)
    minimal_fwd[grid](q, k, v, o, seq_len, 1.0 / math.sqrt(head_dim),
                      CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)
    return o
