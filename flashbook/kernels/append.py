"""A decoding step's writes, before its attention, as one kernel: rotate k by its positions
(rotary embeddings), write k and v into the caches in place, and rotate q.

    append_kv(k, v, k_cache, v_cache, cache_seqlens, block_table, cos, sin)   # k rotated, k and v stored
    rotate_into(q, q_rot, cos, sin, cache_seqlens, step=1)                    # q rotated at its positions

flash-attn's ``flash_attn_with_kvcache`` does these inside its attention kernel. Written as
PyTorch operations they are about forty small launches (gather the table rows, convert,
split the pairs, multiply, stack, index, copy): on a GPU each is a few microseconds of work
and more of the host's time, many times the attention's own for a short cache
(``benchmarks/decode_bench.py``'s ``kvcache-*`` rows). Here one program handles one head of
one new token: it reads the row, turns each pair of features (2i, 2i + 1) (GPT-J,
``interleaved``) or (i, i + rotary_dim / 2) (GPT-NeoX) by the angle of its position,
``(a, b) -> (a cos - b sin, a sin + b cos)`` in float32, rounds once to the cache's dtype
and stores it at its position: row b of a dense cache, or slot p % page_size of page
``block_table[b, p // page_size]``. The arithmetic is PyTorch's, operation for operation
(products rounded before the sum: the kernel is compiled without fused multiply-adds), so
the result is the same bits as the same formula in PyTorch float32.

Positions come from a (batch,) tensor of lengths plus the token's index (``STEP`` 1: k, and q
under a causal mask or a window) or from the lengths alone (``STEP`` 0: q otherwise,
flash-attn's rule), or from a (batch, n) tensor of positions (``apply_rotary``). A position
outside the cache is not written and one outside the rotary tables is not turned: with
``check_values`` the callers check both first (one synchronisation); without, flash-attn
does not check them either.

Each call signature's launches are kept (``launch.Plans``): a repeated call launches from
the compiled kernel's own launcher. Inside ``torch.compile`` the writes are two operators,
``flashbook::append_kv`` (mutates the caches) and ``flashbook::rotate``, so compiled and
eager calls run the same kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import block_d
from .inputs import check_runs_here
from .launch import Launch, Plans, call_key

__all__ = ["append_kv", "rotate", "rotate_into", "append_kv_operator", "rotate_operator"]


@triton.jit
def _rotate_write(src, v_src, dst, v_dst, cos, sin, pos, table,
                  stride_sb, stride_sn, stride_sh, stride_vb, stride_vn, stride_vh,
                  stride_db, stride_dn, stride_dh, stride_wb, stride_wn, stride_wh,
                  stride_cr, stride_cc, stride_tr, stride_tc, stride_pb, stride_pn, stride_table,
                  n_tok, n_rot, capacity,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                  STEP: tl.constexpr, TO_CACHE: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_V: tl.constexpr,
                  F64: tl.constexpr):
    """One program: head ``program_id(1)`` of token i of sequence b (``program_id(0)`` = b * n_tok + i).
    ``src`` rotated (HALF > 0 pairs) goes to ``dst``: at position p of the cache (``TO_CACHE``;
    through ``table`` if ``PAGE_SIZE``), or at (b, i) of a tensor like src. ``v_src`` is copied to
    ``v_dst`` at the same place (``HAS_V``). p = pos[b, i] + STEP * i (pos's stride along i may be 0)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    b = (row // n_tok).to(tl.int64)
    i = row % n_tok
    p = tl.load(pos + b * stride_pb + i * stride_pn).to(tl.int64) + STEP * i
    d = tl.arange(0, BLOCK_D)
    inside = d < HEAD_DIM
    p_d = p + d * 0   # the position as a block: masks are formed block by block (the interpreter needs it)
    src_row = src + b * stride_sb + i * stride_sn + head * stride_sh
    x = tl.load(src_row + d, mask=inside, other=0.0)
    if HALF > 0:
        if F64:
            x = x.to(tl.float64)
        else:
            x = x.to(tl.float32)
        turned = d < 2 * HALF
        if INTERLEAVED:   # pairs (2i, 2i + 1)
            first = (d % 2) == 0
            partner = d ^ 1
            freq = d // 2
        else:             # pairs (i, i + HALF)
            first = d < HALF
            partner = tl.where(first, d + HALF, d - HALF)
            freq = tl.where(first, d, d - HALF)
        y = tl.load(src_row + partner, mask=turned, other=0.0).to(x.dtype)
        known = turned & (p_d >= 0) & (p_d < n_rot)
        c = tl.load(cos + p * stride_cr + freq * stride_cc, mask=known, other=1.0).to(x.dtype)
        s = tl.load(sin + p * stride_tr + freq * stride_tc, mask=known, other=0.0).to(x.dtype)
        ys = y * s
        x = tl.where(turned, x * c + tl.where(first, -ys, ys), x)   # a c - b s and b c + a s
    out = x.to(dst.dtype.element_ty)
    if TO_CACHE:
        valid = inside & (p_d >= 0) & (p_d < capacity)
        if PAGE_SIZE > 0:
            page = tl.load(table + b * stride_table + p // PAGE_SIZE, mask=(p >= 0) & (p < capacity),
                           other=0).to(tl.int64)
            at, v_at = page * stride_db + (p % PAGE_SIZE) * stride_dn, page * stride_wb + (p % PAGE_SIZE) * stride_wn
        else:
            at, v_at = b * stride_db + p * stride_dn, b * stride_wb + p * stride_wn
        tl.store(dst + at + head * stride_dh + d, out, mask=valid)
        if HAS_V:
            v = tl.load(v_src + b * stride_vb + i * stride_vn + head * stride_vh + d, mask=inside, other=0.0)
            tl.store(v_dst + v_at + head * stride_wh + d, v, mask=valid)
    else:
        tl.store(dst + b * stride_db + i * stride_dn + head * stride_dh + d, out, mask=inside)


_PLANS = Plans()


def _tensors(x, dst, pos, cos=None, sin=None, v=None, v_dst=None, block_table=None) -> tuple:
    """``_rotate_write``'s eight tensor arguments, in order (x standing in for an absent one)."""
    return (x, x if v is None else v, dst, dst if v_dst is None else v_dst, x if cos is None else cos,
            x if sin is None else sin, pos, pos if block_table is None else block_table)


def _launch_of(x, dst, pos, step: int, cos=None, sin=None, interleaved=True, *, v=None, v_dst=None, block_table=None,
               to_cache=False):
    """The ``Launch`` of ``_rotate_write`` for this call's signature (kept in ``_PLANS``), or
    None when there is nothing to write; and the call's tensors for it."""
    tensors = _tensors(x, dst, pos, cos, sin, v, v_dst, block_table)
    flags = (step, bool(interleaved), to_cache, cos is None, v is None, block_table is None)
    key = call_key(tensors, flags)
    launch = _PLANS.get(key) if key is not None else None
    if launch is None:
        batch, n, heads, head_dim = x.shape
        src_v, dst_v, c, s, table = tensors[1], tensors[3], tensors[4], tensors[5], tensors[7]
        pos_strides = (pos.stride(0), pos.stride(1) if pos.dim() == 2 else 0)
        page_size = dst.shape[1] if block_table is not None else 0
        capacity = dst.shape[1] * (block_table.shape[1] if block_table is not None else 1)
        half = 0 if cos is None else cos.shape[1]
        launch = Launch(
            _rotate_write, (batch * n, heads),
            [None] * 8 + [*x.stride()[:3], *src_v.stride()[:3], *dst.stride()[:3], *dst_v.stride()[:3],
                          *(c.stride()[:2] if cos is not None else (0, 0)),
                          *(s.stride()[:2] if sin is not None else (0, 0)),
                          *pos_strides, table.stride(0) if block_table is not None else 0,
                          n, 0 if cos is None else cos.shape[0], capacity],
            dict(HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim), HALF=half, INTERLEAVED=bool(interleaved),
                 STEP=step, TO_CACHE=to_cache, PAGE_SIZE=page_size, HAS_V=v is not None,
                 F64=x.dtype == torch.float64, num_warps=1 if head_dim <= 128 else 2, enable_fp_fusion=False),
            slots=range(8))
        _PLANS.remember(key, launch)
    return (launch if x.shape[0] * x.shape[1] and x.shape[2] else None), tensors


def _write(x, dst, pos, step: int, cos=None, sin=None, interleaved=True, **where):
    """Launch ``_rotate_write`` for x (batch, n, heads, head_dim) (and v beside it): rotated by
    ``cos``/``sin`` if given, into ``dst``. ``pos``: (batch,) lengths or (batch, n) positions.
    Returns the launch (None: nothing to write), for a caller that keeps it."""
    launch, tensors = _launch_of(x, dst, pos, step, cos, sin, interleaved, **where)
    if launch is not None:
        launch(*tensors)
    return launch


def rotate_into(x, out, cos, sin, positions, step: int, interleaved=True):
    """x (batch, n, heads, head_dim) turned by the angles of its positions, written to ``out`` (a
    tensor of x's shape and dtype). ``positions``: (batch,) lengths (token i at length + step * i)
    or (batch, n) positions (step 0). Returns the launch, which ``rotate_tensors`` feeds again."""
    return _write(x, out, positions, step, cos, sin, interleaved)


def rotate_tensors(x, out, cos, sin, positions) -> tuple:
    """The tensors of ``rotate_into``'s launch, for a caller that kept the launch."""
    return _tensors(x, out, positions, cos, sin)


def rotate(x, cos, sin, positions, step: int, interleaved=True):
    """``rotate_into`` a new contiguous tensor, returned."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rotate_into(x, out, cos, sin, positions, step, interleaved)
    return out


def append_kv(k, v, k_cache, v_cache, cache_seqlens, block_table=None, cos=None, sin=None, interleaved=True):
    """k (rotated if cos/sin) and v written in place into the caches at cache_seqlens[b] + i.
    Returns the launch, which ``append_tensors`` feeds again."""
    return _write(k, k_cache, cache_seqlens, 1, cos, sin, interleaved, v=v, v_dst=v_cache, block_table=block_table,
                  to_cache=True)


def append_tensors(k, v, k_cache, v_cache, cache_seqlens, block_table=None, cos=None, sin=None) -> tuple:
    """The tensors of ``append_kv``'s launch, for a caller that kept the launch."""
    return _tensors(k, k_cache, cache_seqlens, cos, sin, v, v_cache, block_table)


def check_here(x, name: str) -> None:
    """x can go through this module's kernel: fp16, bf16, fp32 (or fp64) where the kernels run."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    check_runs_here(x, name)


@torch.library.custom_op("flashbook::append_kv", mutates_args=("k_cache", "v_cache"), schema=(
    "(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? block_table, "
    "Tensor? cos, Tensor? sin, bool interleaved) -> ()"))
def append_kv_operator(k, v, k_cache, v_cache, cache_seqlens, block_table, cos, sin, interleaved):
    """``append_kv`` inside ``torch.compile``: the caches are written in place (the compiler knows)."""
    append_kv(k, v, k_cache, v_cache, cache_seqlens, block_table, cos, sin, interleaved)


@append_kv_operator.register_fake
def _(*args):
    return None


@torch.library.custom_op("flashbook::rotate", mutates_args=(), schema=(
    "(Tensor x, Tensor cos, Tensor sin, Tensor positions, int step, bool interleaved) -> Tensor"))
def rotate_operator(x, cos, sin, positions, step, interleaved):
    """``rotate`` inside ``torch.compile``: a new tensor like x."""
    return rotate(x, cos, sin, positions, step, interleaved)


@rotate_operator.register_fake
def _(x, *rest):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
