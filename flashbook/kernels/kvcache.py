"""flash-attn's ``flash_attn_with_kvcache`` on ``flash_decode``: its layout, its order of
arguments, its in-place append of the step's keys and values (chapter 11).

    o = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lengths,
                                causal=True)          # q: (batch, new tokens, heads, head_dim)

A decoding step of a model written for flash-attn makes this one call: the new token's keys
and values go into the cache at each sequence's length, then its query attends to the cache
up to there. Here the writes are one kernel (``append``: k rotated, k and v stored, on the
dense cache or through ``block_table`` into its pages; q rotated by a second launch of it)
and the attention is ``flash_decode`` on ``x.transpose(1, 2)`` views of q and the caches (no
copy of the cache: the kernel reads any strides). Every check runs before the writes, so a
refused call leaves the caches as they were. flash-attn does the writes inside its attention
kernel; here they are a launch or two before it.

Rotary embeddings (``rotary_cos``, ``rotary_sin``) are applied as flash-attn applies them, in
float32 (``append``): k at its positions in the cache, q at the same positions (causal or
windowed) or all at the cache's length (neither). ``apply_rotary`` is the same rotation on
its own. ``cache_batch_idx`` (row b of the batch reads cache row ``cache_batch_idx[b]``) reads a dense
cache through a page table over it (``batch_index_pages``), so no cache is copied. What
flash-attn's call has and this one refuses, naming the argument: ``cache_leftpad``,
``alibi_slopes``; and more than ``decode.MAX_NEW_TOKENS`` new tokens (a prompt goes through
``flash_attn_func`` or ``flash_attn_varlen_func``).
"""
from __future__ import annotations

import numbers

import torch

from . import decode
from .decode import MAX_NEW_TOKENS, flash_decode
from .decode_choices import (PAGE_SIZES, _check_block_table, _check_index_tensor, _check_range, _check_same_shape,
                             _lengths_from_int, run_plan)
from .append import (append_kv, append_kv_operator, append_tensors, check_here, rotate, rotate_into, rotate_operator,
                     rotate_tensors)
from .inputs import check_flash_attn_4d, check_shapes
from .launch import Plans, call_key

__all__ = ["flash_attn_with_kvcache", "append_to_cache", "apply_rotary", "batch_index_pages"]

_CHECKED = Plans()   # call signatures of flash_attn_with_kvcache that passed every check -> _Known


class _Known:
    """What a checked call signature launches: the decode plan, the append's and the rotation's
    launches (None where the call has none). The same signature binds the same way, so a known
    call runs these without building the three lookup keys they would each need."""

    __slots__ = ("plan", "append", "rotate")

    def __init__(self, plan, append, rotate):
        self.plan, self.append, self.rotate = plan, append, rotate


def _refuse(name: str, value, why: str) -> None:
    if value is not None:
        raise NotImplementedError(f"flashbook's flash_attn_with_kvcache does not take {name} (got a value): {why}")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            *, check_values=False):
    """flash-attn's ``flash_attn_with_kvcache``, in its layout and its order of arguments: a
    decoding step written for flash-attn runs with this function's import in place of its own.

    Args:
        q: (batch, new tokens, heads, head_dim), 1 to 16 new tokens, float16, bfloat16 or float32.
        k_cache, v_cache: (batch, capacity, kv_heads, head_dim), kv_heads dividing heads; or, with
            ``block_table``, pages (num_pages, page_size, kv_heads, head_dim), page_size one of
            ``decode.PAGE_SIZES``. The last axis contiguous (as flash-attn asserts).
        k, v: the step's keys and values, (batch, new keys, kv_heads, head_dim), or None. Given,
            they are written into the caches *in place* at positions cache_seqlens[b] + i (through
            ``block_table`` into its pages), and attention sees cache_seqlens + new keys.
        cache_seqlens: int, or (batch,) int32/int64 on q's device: each cache's length before
            this step (needed with k and v). None: every cache is full.
        block_table: (batch, pages per sequence) int32/int64: a paged cache, as ``flash_decode``.
        softmax_scale: None is 1/sqrt(head_dim). causal: False by default, as flash-attn's
            (bottom-right aligned: new token i sits at position length - new tokens + i).
        window_size: (left, right), -1 no limit. softcap: c > 0 for c * tanh(s / c); 0 off.
        num_splits: 0 chooses (``decode.choose_num_splits``), else 1 to 128.
        return_softmax_lse: also return the rows' lse, (batch, heads, new tokens), float32.
        rotary_cos, rotary_sin: (positions, rotary_dim / 2), rotary_dim <= head_dim and even: the
            first rotary_dim features of k (and of q) are rotated at their positions, pairs (0, 1),
            (2, 3), ... with ``rotary_interleaved`` (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX).
            Only with k and v. q's positions: as k's when causal or windowed, else all
            cache_seqlens (flash-attn's rule). The caches hold the rotated keys.
        cache_batch_idx: (batch,) int32/int64: sequence b reads (and appends to) dense cache row
            ``cache_batch_idx[b]``; the caches may then have more rows than the batch.
        check_values: (flashbook's, keyword only) check the lengths, page indices, cache rows and
            rotary positions on the host first: one device synchronisation. Off, as flash-attn
            never checks them: lengths are clamped by the kernel, but a write past the cache's end
            is an indexing error on the GPU.
        cache_leftpad, alibi_slopes: refused unless None.

    Returns:
        out, (batch, new tokens, heads, head_dim), q's dtype, contiguous; ``(out, lse)`` with
        ``return_softmax_lse``. Inference only, as flash-attn's.
    """
    _refuse("cache_leftpad", cache_leftpad, "caches that start at position 0 only")
    _refuse("alibi_slopes", alibi_slopes, "flash_decode has no ALiBi; flash_attn_func does")
    # Everything is checked before the caches are written: a refused call leaves them as they were. A
    # call whose signature passed every check before (``_CHECKED``) passes them again: only its values
    # (an int length, cache_batch_idx) are checked each time.
    int_lengths = isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool)
    key = None
    if check_values is False and not torch.compiler.is_compiling():
        key = call_key((q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, None if int_lengths else cache_seqlens,
                        cache_batch_idx, block_table),
                       (int_lengths, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
                        return_softmax_lse))
    known = _CHECKED.get(key) if key is not None else None   # a _Known: the signature's launches
    if known is None:
        _check_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_batch_idx, block_table, num_splits)
    batch = q.shape[0]
    if cache_batch_idx is not None:
        block_table, k_cache, v_cache = batch_index_pages(k_cache, v_cache, cache_batch_idx, batch, q.device,
                                                          check_values=check_values)
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[-1])
    if int_lengths:
        new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else 0
        cache_seqlens = _lengths_from_int(int(cache_seqlens), q, capacity - new,
                                          f"the cache holds {capacity} positions{f' and k adds {new}' if new else ''}")
    lengths = cache_seqlens
    if k is not None:
        if known is None:
            _check_new_keys(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, capacity,
                            check_values)
        lengths = (cache_seqlens + k.shape[1]).to(torch.int32)
    rotary = rotary_cos is not None
    step = 1 if causal or tuple(window_size) != (-1, -1) else 0   # flash-attn's rule for q's positions
    if torch.compiler.is_compiling():   # traced: the writes, then the decode operator (which checks when it runs)
        if k is not None:
            append_kv_operator(k, v, k_cache, v_cache, cache_seqlens, block_table, rotary_cos, rotary_sin,
                               rotary_interleaved)
        if rotary:
            q = rotate_operator(q, rotary_cos, rotary_sin, cache_seqlens, step, rotary_interleaved)
        result = flash_decode(*(x.transpose(1, 2) for x in (q, k_cache, v_cache)), cache_seqlens=lengths,
                              block_table=block_table, num_splits=num_splits or None, causal=causal,
                              window_size=window_size, softmax_scale=softmax_scale, softcap=softcap,
                              check_values=check_values, return_softmax_lse=True)
    else:   # the rotated q gets its memory first, so the plan (every check of the attention) sees its layout
        q_seen = torch.empty(q.shape, dtype=q.dtype, device=q.device) if rotary else q
        views = [x.transpose(1, 2) for x in (q_seen, k_cache, v_cache)]
        if known is None:
            plan = decode.plan_of(*views, lengths, block_table, num_splits or None, causal, softmax_scale,
                                  check_values, window_size, softcap, True, warn=False)
            written = rotated = None
            if k is not None:
                written = append_kv(k, v, k_cache, v_cache, cache_seqlens, block_table, rotary_cos, rotary_sin,
                                    rotary_interleaved)
            if rotary:   # q itself is left as it is
                rotated = rotate_into(q, q_seen, rotary_cos, rotary_sin, cache_seqlens, step, rotary_interleaved)
            _CHECKED.remember(key, _Known(plan, written, rotated))   # every check passed (None: not remembered)
        else:   # the signature's own launches: no lookup key is built again
            plan = known.plan
            if known.append is not None:
                known.append(*append_tensors(k, v, k_cache, v_cache, cache_seqlens, block_table, rotary_cos,
                                             rotary_sin))
            if known.rotate is not None:
                known.rotate(*rotate_tensors(q, q_seen, rotary_cos, rotary_sin, cache_seqlens))
        result = run_plan(plan, *views, lengths, block_table, True)
    o, lse = result
    o = o.transpose(1, 2).contiguous()
    return (o, lse) if return_softmax_lse else o


def _check_call(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_batch_idx, block_table, num_splits) -> None:
    """The checks of a call's shapes and flags that come before the caches' views are made."""
    check_flash_attn_4d(q, "q", "(batch, new tokens, heads, head_dim)")
    paged = block_table is not None
    cache_meaning = ("(num_pages, page_size, kv_heads, head_dim)" if paged
                     else "(batch, capacity, kv_heads, head_dim)")
    check_flash_attn_4d(k_cache, "k_cache", cache_meaning)
    check_flash_attn_4d(v_cache, "v_cache", cache_meaning)
    if q.shape[1] > MAX_NEW_TOKENS:
        raise ValueError(f"q must hold 1 to {MAX_NEW_TOKENS} new tokens per sequence (axis 1 in flash-attn's layout), "
                         f"got shape {tuple(q.shape)}; a prompt goes through flash_attn_func or flash_attn_varlen_func")
    if not isinstance(num_splits, numbers.Integral) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 chooses), got {num_splits!r}")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the step's keys and values) or both be None")
    if (rotary_cos is None) != (rotary_sin is None) or rotary_cos is not None and k is None:
        raise ValueError("rotary_cos and rotary_sin must be given together, and only with k and v (as flash-attn's)")
    if cache_batch_idx is not None and paged:
        raise ValueError("cache_batch_idx and block_table cannot be given together: the page table already "
                         "says where each sequence's cache is")
    _check_caches(q, k_cache, v_cache, block_table, rows_free=paged or cache_batch_idx is not None)


def _check_new_keys(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, capacity,
                    check_values) -> None:
    """The checks of the step's keys and values, their positions and the rotary tables."""
    if cache_seqlens is None:
        raise ValueError("k and v need cache_seqlens: the position in each cache where they are written")
    _check_append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    if check_values:   # then every position written (and rotated) is in the cache (and the tables)
        _check_room(cache_seqlens, capacity, k.shape[1])
    if rotary_cos is not None:
        _check_rotary(q, rotary_cos, rotary_sin)
        if rotary_cos.shape[0] < capacity:
            raise ValueError(f"rotary_cos and rotary_sin must hold at least the cache's {capacity} positions "
                             f"(axis 0, as flash-attn asks), got shape {tuple(rotary_cos.shape)}")


def _check_caches(q, k_cache, v_cache, block_table, *, rows_free: bool) -> None:
    """The caches against q, the shapes printed as passed (flash-attn's layout): one dtype and device,
    kv_heads dividing heads, q's head_dim, a contiguous last axis (as flash-attn asserts), and for
    pages a page size ``flash_decode`` reads and a 2-D table. ``rows_free``: the caches' rows are
    not the batch (pages, or ``cache_batch_idx``)."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last axis (stride 1, as flash-attn asserts), got "
                             f"strides {x.stride()}")
    _check_same_shape(k_cache, v_cache, "k_cache and v_cache")
    if block_table is not None:
        if k_cache.shape[1] not in PAGE_SIZES:
            raise ValueError(f"k_cache's page_size (axis 1 of (num_pages, page_size, kv_heads, head_dim)) must be one "
                             f"of {PAGE_SIZES}, got shape {tuple(k_cache.shape)} (pages laid out (num_pages, kv_heads, "
                             f"page_size, head_dim) are flash_decode's layout)")
        _check_block_table(block_table, q.shape[0], q.device)
    caches = [x.transpose(1, 2) for x in (k_cache, v_cache)]
    if rows_free:   # the rows' count is not checked against the batch
        caches = [x[:1].expand(q.shape[0], -1, -1, -1) for x in caches]
    check_shapes(q.transpose(1, 2), *caches, names=("q", "k_cache", "v_cache"), shown=(q, k_cache, v_cache))


def append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table=None, *, check_values=False):
    """Write the step's keys and values into the caches in place, in flash-attn's layout, at
    positions cache_seqlens[b] + i; returns the new lengths, cache_seqlens + new keys (int32).

    Dense caches (batch, capacity, kv_heads, head_dim): row b at those positions. Paged caches
    (num_pages, page_size, kv_heads, head_dim): position p of sequence b is slot p % page_size of
    page block_table[b, p // page_size]. One kernel (``append``), no synchronisation; with
    ``check_values`` the positions are checked against the capacity first (one); without, a
    position past the capacity is not written."""
    capacity = _check_append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    if check_values:
        _check_room(cache_seqlens, capacity, k.shape[1])
    check_here(k, "k")
    append_kv(k, v, k_cache, v_cache, cache_seqlens, block_table)
    return (cache_seqlens + k.shape[1]).to(torch.int32)


def _check_append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> int:
    """k and v against the caches (flash-attn's layout), the lengths and the page table; returns
    the positions each sequence's cache holds."""
    batch = k_cache.shape[0] if block_table is None else len(block_table)
    if block_table is not None:
        _check_block_table(block_table, batch, k_cache.device)
    for name, x in (("k", k), ("v", v)):
        check_flash_attn_4d(x, name, "(batch, new keys, kv_heads, head_dim)")
        if x.shape[0] != batch or x.shape[2:] != k_cache.shape[2:]:
            raise ValueError(f"{name} must have shape ({batch}, new keys, {k_cache.shape[2]}, {k_cache.shape[3]}) "
                             f"(batch, new keys, kv_heads, head_dim of the cache), got {tuple(x.shape)}")
        if x.dtype != k_cache.dtype or x.device != k_cache.device:
            raise ValueError(f"{name} must have the cache's dtype and device ({k_cache.dtype}, {k_cache.device}), "
                             f"got {x.dtype}, {x.device}")
    _check_same_shape(k, v, "k and v")
    _check_same_shape(k_cache, v_cache, "k_cache and v_cache")
    _check_index_tensor(cache_seqlens, "cache_seqlens", (batch,), k_cache.device, "one length per sequence")
    return k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])


def _check_room(cache_seqlens, capacity: int, new: int) -> None:
    """Every cache has room for the ``new`` keys after its length: one device synchronisation."""
    _check_range(cache_seqlens, "cache_seqlens", 0, capacity - new,
                 f"the cache holds {capacity} positions and k adds {new}")


def _check_rotary(x, cos, sin) -> None:
    """The rotary tables for x (..., head_dim): 2-D float (positions, rotary_dim / 2) on x's device,
    the same shape, rotary_dim even and at most head_dim."""
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 2-D float tensor (positions, rotary_dim / 2), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"{name} must be on {x.device}, got {t.device}")
    _check_same_shape(cos, sin, "rotary_cos and rotary_sin")
    half = cos.shape[1]
    if not 0 < 2 * half <= x.shape[-1]:
        raise ValueError(f"rotary_cos must have 1 to head_dim / 2 = {x.shape[-1] // 2} columns (rotary_dim / 2), "
                         f"got {half}")


def apply_rotary(x, cos, sin, positions, interleaved: bool = True, *, check_values=False):
    """x (batch, n, heads, head_dim) with its first rotary_dim = 2 * cos.shape[1] features rotated
    by the angles of ``positions`` (batch, n): a new contiguous tensor in x's dtype, computed in
    float32 (or float64 for float64 x) by one kernel (``append``). Pairs (2i, 2i + 1) when
    ``interleaved`` (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX); each pair (a, b) becomes
    (a cos - b sin, a sin + b cos). A position outside the tables is left unturned unless
    ``check_values`` refuses it (one synchronisation)."""
    check_flash_attn_4d(x, "x", "(batch, n, heads, head_dim)")
    _check_rotary(x, cos, sin)
    _check_index_tensor(positions, "positions", (x.shape[0], x.shape[1]), x.device, "one position per token")
    check_here(x, "x")
    if check_values:
        _check_range(positions, "the rotary positions (cache_seqlens + i)", 0, cos.shape[0] - 1,
                     f"rotary_cos holds {cos.shape[0]} positions")
    return rotate(x, cos, sin, positions, 0, interleaved)


def batch_index_pages(k_cache, v_cache, cache_batch_idx, batch: int, device, *, check_values=False):
    """flash-attn's ``cache_batch_idx`` as a page table: the dense caches (rows, capacity, kv_heads,
    head_dim) viewed as pages of P tokens (the largest of ``PAGE_SIZES`` that divides the capacity;
    a view, no copy) and the table that gives sequence b the pages of row cache_batch_idx[b].
    Returns (block_table, k_pages, v_pages)."""
    _check_index_tensor(cache_batch_idx, "cache_batch_idx", (batch,), device, "one cache row per sequence")
    rows, capacity = k_cache.shape[:2]
    fits = [p for p in PAGE_SIZES if capacity % p == 0]
    if not fits:
        raise ValueError(f"with cache_batch_idx the caches' capacity (axis 1) must be a multiple of {PAGE_SIZES[0]}, "
                         f"got {capacity}")
    if check_values:
        _check_range(cache_batch_idx, "cache_batch_idx", 0, rows - 1, "rows of k_cache")
    page = max(fits)
    per_row = capacity // page
    pages = []
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        try:
            pages.append(x.view(rows * per_row, page, *x.shape[2:]))
        except RuntimeError:
            raise ValueError(f"with cache_batch_idx, {name} must be one block per row (stride(0) = capacity x "
                             f"stride(1)), got strides {x.stride()}") from None
    table = cache_batch_idx.to(torch.int32)[:, None] * per_row + torch.arange(per_row, dtype=torch.int32,
                                                                               device=device)
    return table, *pages
