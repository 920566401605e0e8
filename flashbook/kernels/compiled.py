"""``flashbook.flash_attention`` inside ``torch.compile``: the kernels as two PyTorch operators.

    model = torch.compile(model)       # a model that calls flashbook.flash_attention
    loss = model(x); loss.backward()   # forward and backward kernels run inside the compiled graph

Called eagerly, ``flash_attention`` checks its inputs, chooses a kernel and launches it from
Python, remembering each call signature (``launch.Plans``). None of that can be traced: the
compiler would follow Triton's launcher into code it does not know, and fail. So while
``torch.compiler.is_compiling()``, the front door calls two custom operators instead,
``flashbook::attention_forward`` (returns o and lse) and ``flashbook::attention_backward``
(returns dq, dk, dv). The compiler sees each as one opaque call whose outputs' shapes it
knows from ``register_fake``; when the compiled code runs, each call does what an eager call
does (the same checks, the same choice of backend, the same kernels), so compiled and eager
results are the same bits. The gradient is registered with ``register_autograd``, as flash-attn
does for its own kernels.

q, k and v go in contiguous (the operators' outputs then have a layout the compiler can
predict): a ``(batch, seq, heads, head_dim)`` tensor passed as ``x.transpose(1, 2)`` is copied
once, where the eager call reads it in place. There is no double backward (as eagerly);
``flash_attention_varlen`` and ``flash_decode`` are not operators yet, so the compiler breaks
its graph around them (they still run, eagerly).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import autograd, dispatch
from .inputs import NO_DOUBLE_BACKWARD
from .mask_args import masked_args


def _window(window: Optional[list[int]]):
    return None if window is None else tuple(window)


@torch.library.custom_op("flashbook::attention_forward", mutates_args=())
def attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float], backend: str,
                      dq_mode: str, window: Optional[list[int]], softcap: Optional[float], prefix: int,
                      alibi_slopes: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """(o, lse) of ``flash_attention``'s forward, with the backend it would choose eagerly."""
    chosen, why, causal, window, softcap, prefix = dispatch.resolve(
        q, k, v, causal, scale, backend, dq_mode, _window(window), softcap, prefix, alibi_slopes)
    dispatch.record_backend(chosen, why)
    if chosen == "gluon":
        from .hopper import gluon_forward

        return gluon_forward(q, k, v, causal=causal, scale=scale)
    return autograd.flash_forward(q, k, v, causal=causal, scale=scale,
                                  **masked_args(window, softcap, None, prefix, alibi_slopes))


@attention_forward.register_fake
def _(q, k, v, causal, scale, backend, dq_mode, window, softcap, prefix, alibi_slopes):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashbook::attention_backward", mutates_args=())
def attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
                       scale: Optional[float], dq_mode: str, window: Optional[list[int]], softcap: Optional[float],
                       prefix: int, alibi_slopes: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv): chapter 8's kernels, whichever forward ran."""
    causal, window, softcap, prefix = dispatch.plain_mask(causal, _window(window), softcap, prefix)
    dq, dk, dv = autograd.flash_backward(q, k, v, o, lse, do, causal=causal, scale=scale, dq_mode=dq_mode,
                                         **masked_args(window, softcap, None, prefix, alibi_slopes))
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@attention_backward.register_fake
def _(do, q, k, v, o, lse, causal, scale, dq_mode, window, softcap, prefix, alibi_slopes):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)



def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, _, dq_mode, window, softcap, prefix, alibi_slopes = inputs
    ctx.save_for_backward(q, k, v, *output, alibi_slopes)
    ctx.flags = (causal, scale, dq_mode, window, softcap, prefix)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = attention_backward(do, q, k, v, o, lse, *ctx.flags, alibi_slopes)
    return dq, dk, dv, None, None, None, None, None, None, None, None


def _no_second_order(ctx, *grads):
    raise RuntimeError(NO_DOUBLE_BACKWARD)


attention_forward.register_autograd(_backward, setup_context=_setup_context)
attention_backward.register_autograd(_no_second_order, setup_context=lambda ctx, inputs, output: None)


def attention(q, k, v, causal, scale, backend, dq_mode, window, softcap, prefix, alibi_slopes) -> Tensor:
    """``flash_attention``'s output through the operators (its arguments already in flashbook's names)."""
    q, k, v = (x.contiguous() for x in (q, k, v))
    o, _ = attention_forward(q, k, v, bool(causal), None if scale is None else float(scale), backend, dq_mode,
                             None if window is None else [int(w) for w in window],
                             None if softcap is None else float(softcap), int(prefix), alibi_slopes)
    return o
