"""Packed documents: ``flash_attention_varlen``, flash-attn's ``flash_attn_varlen_func`` here.

Long-context training packs several documents into one row of tokens instead of
padding each to the longest, and no token may attend across a document's edge::

    q: (total_q, heads, head_dim)        the documents' queries, one after the other
    k, v: (total_k, kv_heads, head_dim)
    cu_seqlens_q = [0, 3, 3, 7]          document b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
    o = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)

The kernels are chapter 7 and 8's, launched with ``VARLEN``: the batch axis of the grid
counts documents, and each program reads its document's start and lengths from
``cu_seqlens`` and runs exactly what a batch of one would run, with its own causal
diagonal and window (bottom-right aligned per document, as flash-attn). The grid is
documents x cdiv(max_seqlen, tile); a query tile past a short document's end visits no key,
so the tiles computed are the documents' own and only those idle programs are launched in
vain. The rows take the documents heaviest first (``longest_first``), so that a long document
packed last does not run on alone at the end. The saved lse is (heads, total_q), flash-attn's layout.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from .. import masks
from ..validation import check_count
from . import autograd, dispatch
from .inputs import flash_attn_extras, flash_attn_names, in_layout_of, operator_flags
from .launch import Plans, call_key
from .mask_args import masked_args


@dataclass(frozen=True)
class Packed:
    """Where the documents are: flash-attn's ``cu_seqlens`` (int32, on the inputs' device)
    and the longest document on each side (the launch grid's length)."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    order: torch.Tensor | None = None   # the documents heaviest first (``longest_first``)

    @property
    def documents(self) -> int:
        return self.cu_seqlens_q.numel() - 1


def _check_3d(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions (total tokens, heads, head_dim) as flash-attn's "
                             f"varlen functions take it, got shape {tuple(x.shape)}")


def check_packed(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, check_values: bool = True) -> Packed:
    """Validate the varlen arguments (the tensors' shapes are ``autograd.check_inputs``'): errors
    name the argument. ``check_values`` reads ``cu_seqlens`` on the host (one device
    synchronisation) to check that each starts at 0, never decreases, ends at the packed
    length and holds no document longer than ``max_seqlen``: a wrong value would make the
    kernels read outside the tensors."""
    pairs = (("cu_seqlens_q", cu_seqlens_q, q), ("cu_seqlens_k", cu_seqlens_k, k))
    for name, cu, x in pairs:
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32 tensor (flash-attn's cu_seqlens), "
                            f"got {cu.dtype} of shape {tuple(cu.shape)}")
        if cu.device != x.device:
            raise ValueError(f"{name} must be on the inputs' device {x.device}, got {cu.device}")
        if not cu.is_contiguous():   # the kernels read cu_seqlens[b] at offset b
            raise ValueError(f"{name} must be contiguous (as flash-attn requires), got stride {cu.stride()}: "
                             f"pass {name}.contiguous()")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must count the same documents, got "
                         f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}")
    longest = {}
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        longest[name] = check_count(value, name, 0)
    if check_values:
        for (name, cu, x), limit in zip(pairs, ("max_seqlen_q", "max_seqlen_k")):
            lengths = np.diff(masks.check_cu_seqlens(cu.cpu().numpy(), name, total=x.shape[0]))
            if lengths.size and int(lengths.max()) > longest[limit]:
                b = int(lengths.argmax())
                raise ValueError(f"document {b} has {int(lengths[b])} tokens, more than "
                                 f"{limit} = {longest[limit]}")
    return Packed(cu_seqlens_q, cu_seqlens_k, longest["max_seqlen_q"], longest["max_seqlen_k"],
                  longest_first(cu_seqlens_q, cu_seqlens_k))


#: ``longest_first``'s switch (experiments: False launches the documents in the order given)
ORDER = {"longest_first": True}
_ORDERS = {}   # id(cu_seqlens_q) -> (its weak reference, cu_seqlens_k's, their versions, the order)


def longest_first(cu_seqlens_q, cu_seqlens_k):
    """The documents by their work (queries x keys), the most first, as the int32 tensor
    ``DOC_ORDER`` of the kernels (``forward.document_of``), or None for fewer than two documents.

    The grid's rows are documents in this order, and the GPU starts a row's programs before the
    next row's: in the order given, a long document packed last started its programs after all
    the others' and ran on alone at the end (recorded run ``document_order``). Worked out on the
    device (no copy, no wait) and kept for the same ``cu_seqlens`` tensors until they change,
    as every layer of a model gets the same ones. Any order gives the same results bit for bit
    (each program computes what it would in any other), so only the time depends on it."""
    if cu_seqlens_q.numel() < 3 or not ORDER["longest_first"]:
        return None
    try:
        versions = (cu_seqlens_q._version, cu_seqlens_k._version)
    except RuntimeError:   # an inference-mode tensor keeps no version: never reuse its order
        versions = None
    kept = _ORDERS.get(id(cu_seqlens_q))
    if (versions is not None and kept is not None and kept[0]() is cu_seqlens_q and kept[1]() is cu_seqlens_k
            and kept[2] == versions):
        return kept[3]
    work = cu_seqlens_q.diff().long() * cu_seqlens_k.diff().long()
    order = torch.argsort(-work, stable=True).to(torch.int32)   # ascending: ties keep their order
    if versions is not None:
        if len(_ORDERS) >= 64:
            _ORDERS.clear()
        _ORDERS[id(cu_seqlens_q)] = (weakref.ref(cu_seqlens_q), weakref.ref(cu_seqlens_k), versions, order)
    return order


def packed_views(q, k, v):
    """(total, heads, d) tensors as the (1, heads, total, d) views the kernels take (no copy)."""
    return tuple(_batch_of_one(x) for x in (q, k, v))


def _batch_of_one(x):
    """A (total, heads, d) tensor as a (1, heads, total, d) view: one view, not two (each costs the
    host a few microseconds a call)."""
    total, heads, d = x.shape
    s_t, s_h, s_d = x.stride()
    return x.as_strided((1, heads, total, d), (total * s_t, s_h, s_t, s_d), x.storage_offset())


def _packed(x):
    """``_batch_of_one``'s inverse: a (1, heads, total, d) tensor as a (total, heads, d) view."""
    _, heads, total, d = x.shape
    _, s_h, s_t, s_d = x.stride()
    return x.as_strided((total, heads, d), (s_t, s_h, s_d), x.storage_offset())


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                           causal: bool = False, scale=None, window=None, softcap=None, prefix=0,
                           alibi_slopes=None, dq_mode: str = "separate", check_values: bool = True,
                           softmax_scale=None, window_size=None, dropout_p=0.0, deterministic=False,
                           return_attn_probs=False):
    """Attention within each of several documents packed along one sequence; differentiable.

    Args (flash-attn's ``flash_attn_varlen_func`` names and layout):
        q: (total_q, heads, head_dim) float16, bfloat16 or float32.
        k, v: (total_k, kv_heads, head_dim); kv_heads divides heads (GQA).
        cu_seqlens_q, cu_seqlens_k: contiguous int32 (documents + 1,): document b's queries are
            rows ``cu_seqlens_q[b]`` to ``cu_seqlens_q[b + 1] - 1`` (and its keys likewise); the
            last value is the packed length (every row belongs to a document, no padding after).
        max_seqlen_q, max_seqlen_k: the longest document on each side (at least as long).
        causal, scale, window, softcap, prefix: as ``flash_attention``, applied to each
            document alone (bottom-right aligned per document; a prefix counts from each
            document's start).
        alibi_slopes: float32 (heads,) or (documents, heads), flash-attn's ALiBi: within
            document b, query i and key j get -slope * |i + seq_k_b - seq_q_b - j| (positions
            counted from the document's start).
        check_values: check ``cu_seqlens``' values on the host first (``check_packed``): one device
            synchronisation a call, and none of the launch plans that skip the checks. A training
            loop whose lengths are known good passes False; then a wrong value (a document past
            the packed length, longer than ``max_seqlen``) makes the kernels read and write
            outside the tensors, as in flash-attn.
        softmax_scale, window_size: flash-attn's names for ``scale`` and ``window``.
        dropout_p, deterministic, return_attn_probs: flash-attn's, as ``flash_attention`` takes them.

    Returns:
        o of shape (total_q, heads, head_dim), q's dtype.
    """
    scale, window = flash_attn_names(scale, window, softmax_scale, window_size)
    if dropout_p != 0.0 or deterministic or return_attn_probs is not False:   # the defaults need no check
        flash_attn_extras(dropout_p, deterministic, return_attn_probs, dq_mode)
    if torch.compiler.is_compiling():   # two operators the compiler calls (below)
        _check_3d(q, k, v)   # what the arguments alone decide, checked while tracing
        autograd.check_arguments(*(x.transpose(0, 1)[None] for x in (q, k, v)), causal, dq_mode, shown=(q, k, v))
        autograd.kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)
        return varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                              *operator_flags(scale, window, softcap, prefix), alibi_slopes, dq_mode,
                              bool(check_values))[0]
    # a signature that passed the checks before passes them again (``launch``); the values in
    # cu_seqlens are not in it, so only a call without value checks is remembered
    key = None if check_values is not False else call_key(
        (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes),
        (max_seqlen_q, max_seqlen_k, causal, scale, window, softcap, prefix, dq_mode))
    if key is not None and key in _CHECKED:
        packed = Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        longest_first(cu_seqlens_q, cu_seqlens_k))
    else:
        packed = _checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window,
                          softcap, prefix, alibi_slopes, dq_mode, check_values)
        if packed.documents == 0:
            return torch.zeros_like(q) + 0 * (q.sum() + k.sum() + v.sum())   # no document: zeros, gradients 0
        _CHECKED.remember(key, True)
    o = PackedAttention.apply(q, k, v, causal, scale, dq_mode, None, window, softcap, packed, prefix, alibi_slopes)
    dispatch.record_backend("triton", "packed documents run on the Triton kernels only")
    return o


def _checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap, prefix,
             alibi_slopes, dq_mode, check_values) -> Packed:
    """Every argument checked, the errors naming it; the documents (perhaps none) as ``Packed``."""
    _check_3d(q, k, v)
    q4, k4, v4 = packed_views(q, k, v)
    autograd.check_inputs(q4, k4, v4, causal, scale, dq_mode, shown=(q, k, v))   # errors show the caller's shapes
    autograd.kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)   # the mask's arguments, checked
    packed = check_packed(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_values=check_values)
    autograd.alibi_args(alibi_slopes, q4, packed.documents)   # checked: (heads,) or (documents, heads)
    return packed


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn's ``flash_attn_varlen_func`` in its order of arguments (``flash_attention_varlen``
    takes the same tensors, but everything after the seventh by keyword): a call written for
    flash-attn runs with its import changed. ``block_table`` (flash-attn's paged KV cache for
    packed documents) must be None: ``flash_decode`` reads paged caches."""
    if block_table is not None:
        raise ValueError("block_table must be None here (packed documents read dense k and v); "
                         "flashbook.kernels.flash_decode reads a paged KV cache")
    return flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                  softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                                  alibi_slopes=alibi_slopes, dropout_p=dropout_p, deterministic=deterministic,
                                  return_attn_probs=return_attn_probs)


class PackedAttention(torch.autograd.Function):
    """``autograd.FlashAttention`` for (total, heads, head_dim) tensors: the (1, heads, total,
    head_dim) views the kernels take are made inside, so that autograd records one node for
    the call and none for the views of q, k, v, o and their gradients. Packed documents of 4K
    tokens give the GPU 0.34 ms of work a forward + backward, and the host's time decides:
    autograd's own time in the backward went from 299-322 to 141-156 us a call (cProfile on the
    H200's host, benchmarks/results/masks_h200-6, runs 1 and 2, which also dropped the
    benchmark's own views)."""

    @staticmethod
    def forward(ctx, q, k, v, *args):
        return _packed(autograd.FlashAttention.forward(ctx, *packed_views(q, k, v), *args))

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv, *rest = autograd.FlashAttention.backward(ctx, _batch_of_one(do))
        return (*(_packed(g) for g in (dq, dk, dv)), *rest)


_CHECKED = Plans()   # the signatures of calls that passed the checks


# ------------------------------------------------------------------ inside torch.compile
# As ``dispatch.attention_forward`` and ``attention_backward`` (which say why): the call as two
# custom operators, the checks and kernels of an eager call when they run, outputs in the
# inputs' layout.

@torch.library.custom_op("flashbook::varlen_forward", mutates_args=(), schema=(
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
    "bool causal, float? scale, int[]? window, float? softcap, int prefix, Tensor? alibi_slopes, str dq_mode, "
    "bool check_values) -> (Tensor, Tensor)"))
def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap,
                   prefix, alibi_slopes, dq_mode, check_values):
    """(o, lse) of ``flash_attention_varlen``: o (total_q, heads, head_dim), lse (1, heads, total_q)."""
    window = None if window is None else tuple(window)
    packed = _checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, window, softcap,
                      prefix, alibi_slopes, dq_mode, check_values)
    dispatch.record_backend("triton", "packed documents run on the Triton kernels only")
    if packed.documents == 0:
        return torch.zeros_like(q), torch.full((1, *q.shape[1::-1]), float("-inf"), device=q.device)
    o, lse = autograd.flash_forward(*packed_views(q, k, v), causal=causal, scale=scale,
                                    **masked_args(window, softcap, packed, prefix, alibi_slopes))
    return in_layout_of(_packed(o), q), lse


@varlen_forward.register_fake
def _(q, k, v, *flags):
    return torch.empty_like(q), q.new_empty((1, *q.shape[1::-1]), dtype=torch.float32)


@torch.library.custom_op("flashbook::varlen_backward", mutates_args=(), schema=(
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "int max_seqlen_q, int max_seqlen_k, bool causal, float? scale, int[]? window, float? softcap, int prefix, "
    "Tensor? alibi_slopes, str dq_mode) -> (Tensor, Tensor, Tensor)"))
def varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                    window, softcap, prefix, alibi_slopes, dq_mode):
    """(dq, dk, dv) of ``flash_attention_varlen``, each shaped and laid out as its input."""
    packed = Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, longest_first(cu_seqlens_q, cu_seqlens_k))
    if packed.documents == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    grads = autograd.flash_backward(*packed_views(q, k, v), _batch_of_one(o), lse, _batch_of_one(do), causal=causal,
                                    scale=scale, dq_mode=dq_mode, **masked_args(
                                        None if window is None else tuple(window), softcap, packed, prefix,
                                        alibi_slopes))
    return tuple(in_layout_of(_packed(g), x) for g, x in zip(grads, (q, k, v)))


@varlen_backward.register_fake
def _(do, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, prefix, alibi_slopes, dq_mode, _ = inputs
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k, alibi_slopes)
    ctx.flags = (max_q, max_k, causal, scale, window, softcap, prefix)
    ctx.dq_mode = dq_mode


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, cu_q, cu_k, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, *ctx.flags, alibi_slopes, ctx.dq_mode)
    return dq, dk, dv, *(None,) * 12


varlen_forward.register_autograd(_backward, setup_context=_setup_context)
varlen_backward.register_autograd(dispatch.no_second_order, setup_context=dispatch.no_context)
