"""The front door: ``flashbook.flash_attention``, and which kernel it runs.

    o = flashbook.flash_attention(q, k, v, causal=True)                  # the fastest that fits
    o = flashbook.flash_attention(q, k, v, causal=True, backend="triton")  # chapters 7 and 8
    flashbook.last_backend()                                            # "gluon" or "triton"

Two forward kernels compute the same function:

* ``"triton"``: chapter 7's kernel (``autograd.flash_forward``), written in plain Triton.
  It runs everywhere the book does: any CUDA GPU Triton supports, and the CPU through
  Triton's interpreter; any length, head_dim up to 256, float16/bfloat16/float32.
* ``"gluon"``: chapter 10's Hopper kernel (``hopper.gluon_forward``): TMA loads,
  asynchronous warpgroup products, warp specialisation. Only on sm_90 (H100/H200), for
  float16/bfloat16, head_dim 64 or 128, any seq_q and seq_k from one tile up, and no
  causal row without a key (``hopper.check_inputs`` says which limit).

Both save the same (o, lse), so the backward is chapter 8's kernels either way.
``backend="auto"`` (the default) takes the Gluon forward when this call is within its
limits, except where it measured slower than the Triton one
(``hopper_choices.slower_than_triton``), and the Triton one otherwise, so it never fails
where the Triton kernel would succeed; ``last_backend()`` and ``explain_backend()`` say
what the last call ran and why. Measured on an H200: the recorded runs ``front_door`` and
``gluon_lengths``. Inside ``torch.compile`` the same choice is made by two custom operators
(``attention_forward``, ``attention_backward``: the last section).
"""
from __future__ import annotations

import threading

import torch
from torch import Tensor

from .. import masks, runtime
from . import autograd
from .inputs import (NO_DOUBLE_BACKWARD, check_flash_attn_4d, flash_attn_extras, flash_attn_names, in_layout_of,
                     operator_flags)
from .launch import Plans, call_key
from .mask_args import masked_args

BACKENDS = ("auto", "triton", "gluon")

_last = threading.local()


def gluon_refusal(q, k, v, causal: bool = False, window=None, softcap=None, prefix=0,
                  alibi_slopes=None) -> str | None:
    """Why the Gluon forward cannot take this call on this machine, or None if it can.

    The inputs are assumed valid for the Triton kernel (``autograd.check_inputs``)."""
    if autograd.kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)[2] or alibi_slopes is not None:
        return "it has no sliding window, soft cap, prefix or ALiBi (the Triton kernel has them)"
    if runtime.INTERPRET or q.device.type != "cuda":
        return "no CUDA GPU (the Triton interpreter runs the Triton kernel)"
    from . import hopper

    if not hopper.HAS_GLUON:
        return "this Triton has no Gluon (triton >= 3.4)"
    try:
        hopper.check_inputs(q, k, v, causal, *hopper.default_config(q.shape[-1], q.shape[2], causal, k.shape[2]))
    except (TypeError, ValueError, RuntimeError) as exc:
        return str(exc)
    return None


def choose_backend(q, k, v, causal: bool = False, backend: str = "auto", window=None,
                   softcap=None, prefix=0, alibi_slopes=None) -> tuple[str, str]:
    """(the backend that runs, why) for these inputs; raises for a backend that cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton":
        return "triton", "asked for"
    refusal = gluon_refusal(q, k, v, causal, window, softcap, prefix, alibi_slopes)
    if backend == "gluon":
        if refusal:
            raise ValueError(f"backend='gluon' cannot run this call: {refusal}; backend='auto' or 'triton' can")
        return "gluon", "asked for"
    if refusal:
        return "triton", f"the Gluon kernel cannot: {refusal}"
    from .hopper_choices import slower_than_triton

    if slower_than_triton(q.shape[-1], q.shape[2], k.shape[2], causal):
        return "triton", ("the Gluon kernel measured slower here (a ragged last key tile in one-warpgroup "
                          "programs: hopper_choices.slower_than_triton)")
    return "gluon", "a Hopper GPU and shapes within the Gluon kernel's limits"


def flash_attention(q, k, v, *, causal: bool = False, scale=None, backend: str = "auto",
                    dq_mode: str = "separate", window=None, softcap=None, prefix=0, alibi_slopes=None,
                    softmax_scale=None, window_size=None, dropout_p=0.0, deterministic=False,
                    return_attn_probs=False):
    """softmax(scale * q k^T) v, differentiable, with the fastest kernel that takes the call.

    Args:
        q: (batch, heads, seq_q, head_dim) float16, bfloat16 or float32.
        k, v: (batch, kv_heads, seq_k, head_dim); kv_heads divides heads (GQA / MQA).
        causal: query i sees key j only when j <= i + seq_k - seq_q (bottom-right aligned,
            as FlashAttention 2.1+); a row that sees no key gives zeros.
        scale: multiplies the scores; None means 1/sqrt(head_dim).
        backend: ``"auto"`` (Gluon on an H100/H200 where its limits allow, else Triton),
            ``"triton"`` (chapters 7-8) or ``"gluon"`` (chapter 10; a clear error where it
            cannot run). ``last_backend()`` says which ran.
        dq_mode: the backward's dQ: ``"separate"`` (deterministic) or ``"atomic"``
            (chapter 8).
        window: ``(left, right)``, flash-attn's sliding window (-1: no limit on that side;
            ``causal=True`` makes right 0); the Triton kernel skips the key tiles outside it.
        softcap: ``c > 0``: scores c * tanh(s / c) (Gemma 2); None is off.
        prefix: ``p > 0`` with ``causal=True``: a prefix-LM, the first p keys seen by every query.
        alibi_slopes: flash-attn's ALiBi, float32 (heads,) or (batch, heads) on q's device: the
            scores get -slope * |i + seq_k - seq_q - j| (Triton only; ``autograd.flash_attention``).
        softmax_scale, window_size: flash-attn's names for ``scale`` and ``window`` (give one
            name of each, not both). flash-attn's tensors are (batch, seq, heads, head_dim):
            pass ``q.transpose(1, 2)`` (and k, v likewise) and transpose the result back.
        dropout_p, deterministic, return_attn_probs: flash-attn's, accepted where they ask for
            nothing flashbook lacks: ``dropout_p`` must be 0.0, ``return_attn_probs`` False, and
            ``deterministic=True`` holds with the default ``dq_mode`` (``inputs.flash_attn_extras``).

    Returns:
        o with q's shape, dtype and memory layout (a ``(batch, seq, heads, head_dim)`` tensor
        passed as ``x.transpose(1, 2)`` gives an o whose ``transpose(1, 2)`` is contiguous),
        whichever kernel ran, compiled or not.
    """
    scale, window = flash_attn_names(scale, window, softmax_scale, window_size)
    if dropout_p != 0.0 or deterministic or return_attn_probs is not False:   # the defaults need no check
        flash_attn_extras(dropout_p, deterministic, return_attn_probs, dq_mode)
    if torch.compiler.is_compiling():   # the kernels as two operators the compiler calls (below)
        return attention(q, k, v, causal, scale, backend, dq_mode, window, softcap, prefix, alibi_slopes)
    chosen, _last.reason, causal, window, softcap, prefix = resolve(q, k, v, causal, scale, backend, dq_mode, window,
                                                                    softcap, prefix, alibi_slopes)
    _last.backend = chosen
    return _apply(chosen, q, k, v, causal, scale, dq_mode, window, softcap, prefix, alibi_slopes)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_func``, in its layout and its order of arguments: a call written for
    flash-attn runs with ``from flashbook import flash_attn_func`` in place of its import.

    q: (batch, seq_q, heads, head_dim); k, v: (batch, seq_k, kv_heads, head_dim); returns o as
    (batch, seq_q, heads, head_dim), contiguous, as flash-attn does. It is ``flash_attention`` on
    ``x.transpose(1, 2)`` views (no copy; the output transposed back), with the same keywords and
    limits: ``dropout_p`` must be 0.0 and ``return_attn_probs`` False (``inputs.flash_attn_extras``)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_flash_attn_4d(x, name)
    views = [x.transpose(1, 2) for x in (q, k, v)]
    call = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                alibi_slopes=alibi_slopes, dropout_p=dropout_p, deterministic=deterministic,
                return_attn_probs=return_attn_probs)
    if torch.compiler.is_compiling():   # checked while tracing, the shapes as passed
        autograd.check_arguments(*views, causal, shown=(q, k, v))
        return flash_attention(*views, **call).transpose(1, 2).contiguous()
    try:
        o = flash_attention(*views, **call)
    except (TypeError, ValueError):
        autograd.check_arguments(*views, causal, shown=(q, k, v))   # the shapes as passed, if they are the cause
        raise
    return o.transpose(1, 2).contiguous()


def resolve(q, k, v, causal, scale, backend, dq_mode, window, softcap, prefix, alibi_slopes) -> tuple:
    """(backend, why, causal, window, softcap, prefix) for a call of ``flash_attention``: the
    inputs checked, the kernel chosen, and the mask as the kernels take it (``plain_mask``)."""
    key = call_key((q, k, v, alibi_slopes), (causal, scale, backend, dq_mode, window, softcap, prefix))
    choice = _CHOICES.get(key) if key is not None else None
    if choice is not None:   # this signature passed the checks before and would again: the same choice
        return choice
    autograd.check_inputs(q, k, v, causal, scale, dq_mode)
    autograd.alibi_args(alibi_slopes, q)   # checked here, so a bad one fails before any backend is chosen
    causal, window, softcap, prefix = plain_mask(causal, window, softcap, prefix)
    if autograd.is_empty(q, k):
        return "triton", "an empty input (nothing is launched)", causal, window, softcap, prefix
    chosen, why = choose_backend(q, k, v, causal, backend, window, softcap, prefix, alibi_slopes)
    return _CHOICES.remember(key, (chosen, why, causal, window, softcap, prefix))


def plain_mask(causal, window, softcap, prefix) -> tuple:
    """(causal, window, softcap, prefix), with a mask that is only causal or nothing (a window of
    (-1, 0) or (-1, -1), no cap, no prefix) given as the plain kernels take it: the window None."""
    plain_causal, _, extra = autograd.kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)
    return (causal, window, softcap, prefix) if extra else (plain_causal, None, None, 0)


_CHOICES = Plans()   # call signature -> (backend, why, the mask as the kernels take it)


def _apply(chosen, q, k, v, causal, scale, dq_mode, window, softcap, prefix, alibi_slopes):
    if chosen == "gluon":
        return autograd.FlashAttention.apply(q, k, v, causal, scale, dq_mode, _gluon_forward)
    return autograd.FlashAttention.apply(q, k, v, causal, scale, dq_mode, None, window, softcap, None, prefix,
                                         alibi_slopes)


def _gluon_forward(q, k, v, **kwargs):
    """``hopper.gluon_forward`` with o in q's memory layout, as the Triton forward gives it (the
    Gluon kernel writes it contiguous): code written on one backend runs on the other."""
    from .hopper import gluon_forward

    o, lse = gluon_forward(q, k, v, **kwargs)
    return in_layout_of(o, q), lse


def last_backend() -> str | None:
    """The forward kernel of this thread's last ``flash_attention`` or
    ``flash_attention_varlen`` call: "gluon" or "triton" (None before the first)."""
    return getattr(_last, "backend", None)


def record_backend(backend: str, why: str) -> None:
    """What an entry point other than ``flash_attention`` ran, for ``last_backend``."""
    _last.backend, _last.reason = backend, why


def explain_backend() -> tuple[str | None, str | None]:
    """(``last_backend()``, why it was chosen): e.g. the Gluon kernel's refusal."""
    return getattr(_last, "backend", None), getattr(_last, "reason", None)


# ------------------------------------------------------------------ inside torch.compile
#
# Called eagerly, flash_attention checks its inputs, chooses a kernel and launches it from Python,
# remembering each call signature (launch.Plans). None of that can be traced: the compiler would
# follow Triton's launcher into code it does not know, and fail. So while
# torch.compiler.is_compiling(), flash_attention checks what the arguments alone decide (shapes,
# dtypes, flags, the mask: inputs.check_arguments, kernel_mask), which the compiler traces, so a
# bad call fails while compiling, and then calls two custom operators,
# flashbook::attention_forward (o and lse) and flashbook::attention_backward (dq, dk, dv);
# flash_attention_varlen has two of its own (varlen.py), flash_decode one (decode.py, no gradient).
# The compiler sees each as one opaque call whose outputs it knows from register_fake: the
# inputs' shapes, in the inputs' memory layout (inputs.in_layout_of), as eagerly. When the
# compiled code runs, each does what an eager call does (the same checks, the same choice of
# backend, the same kernels), so compiled and eager results are the same bits. The gradient is
# registered with register_autograd, as flash-attn does for its own kernels. The schemas are
# written out (PyTorch infers them from type annotations, which this module's postponed
# annotations would make strings).

@torch.library.custom_op("flashbook::attention_forward", mutates_args=(), schema=(
    "(Tensor q, Tensor k, Tensor v, bool causal, float? scale, int[]? window, float? softcap, int prefix, "
    "Tensor? alibi_slopes, str backend, str dq_mode) -> (Tensor, Tensor)"))
def attention_forward(q, k, v, causal, scale, window, softcap, prefix, alibi_slopes, backend, dq_mode):
    """(o, lse) of ``flash_attention``'s forward, with the backend it would choose eagerly."""
    chosen, why, causal, window, softcap, prefix = resolve(
        q, k, v, causal, scale, backend, dq_mode, None if window is None else tuple(window), softcap, prefix,
        alibi_slopes)
    record_backend(chosen, why)
    forward = _gluon_forward if chosen == "gluon" else autograd.flash_forward
    o, lse = forward(q, k, v, causal=causal, scale=scale, **masked_args(window, softcap, None, prefix, alibi_slopes))
    return in_layout_of(o, q), lse


@attention_forward.register_fake
def _(q, k, v, *flags):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashbook::attention_backward", mutates_args=(), schema=(
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float? scale, int[]? window, "
    "float? softcap, int prefix, Tensor? alibi_slopes, str dq_mode) -> (Tensor, Tensor, Tensor)"))
def attention_backward(do, q, k, v, o, lse, causal, scale, window, softcap, prefix, alibi_slopes, dq_mode):
    """(dq, dk, dv): chapter 8's kernels, whichever forward ran."""
    causal, window, softcap, prefix = plain_mask(causal, None if window is None else tuple(window), softcap, prefix)
    grads = autograd.flash_backward(q, k, v, o, lse, do, causal=causal, scale=scale, dq_mode=dq_mode,
                                    **masked_args(window, softcap, None, prefix, alibi_slopes))
    return tuple(in_layout_of(g, x) for g, x in zip(grads, (q, k, v)))


@attention_backward.register_fake
def _(do, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, window, softcap, prefix, alibi_slopes, _, dq_mode = inputs
    ctx.save_for_backward(q, k, v, *output, alibi_slopes)
    ctx.flags = (causal, scale, window, softcap, prefix)
    ctx.dq_mode = dq_mode


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = attention_backward(do, q, k, v, o, lse, *ctx.flags, alibi_slopes, ctx.dq_mode)
    return dq, dk, dv, *(None,) * 8


def no_second_order(ctx, *grads):
    """The backward operators' own gradient: refused, as the eager backward refuses it."""
    raise RuntimeError(NO_DOUBLE_BACKWARD)


def no_context(ctx, inputs, output) -> None:
    """A backward operator keeps nothing for a gradient it refuses."""


attention_forward.register_autograd(_backward, setup_context=_setup_context)
attention_backward.register_autograd(no_second_order, setup_context=no_context)


def attention(q, k, v, causal, scale, backend, dq_mode, window, softcap, prefix, alibi_slopes) -> Tensor:
    """``flash_attention``'s output through the operators (its arguments already in flashbook's names)."""
    autograd.check_arguments(q, k, v, causal, dq_mode)
    autograd.kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)
    return attention_forward(q, k, v, causal, *operator_flags(scale, window, softcap, prefix), alibi_slopes,
                             backend, dq_mode)[0]
