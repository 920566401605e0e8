"""The checks every attention entry point runs on its inputs, once, with errors that name the
argument (``autograd.flash_attention``, the front door, varlen, decode, the Gluon kernel).
``autograd`` re-exports each name, where the chapters and older code find them."""
from __future__ import annotations

import functools
import numbers

import torch

from .. import runtime
from ..reference import resolve_scale
from . import configs

DQ_MODES = ("separate", "atomic")

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_shapes(q, k, v, *, names=("q", "k", "v"), shown=None) -> None:
    """The checks every attention kernel here shares (``check_inputs``, and the Gluon
    kernel's ``hopper.check_inputs``): three 4-D tensors of one supported dtype on one
    device, k and v shaped (batch, kv_heads, seq_k, head_dim) with kv_heads dividing q's
    heads. The batch and the sequence lengths may be 0 (an empty result, as
    ``scaled_dot_product_attention`` gives); heads and head_dim may not. Raises
    TypeError / ValueError naming the argument. ``shown``: the tensors as the caller passed
    them, when q, k, v are views of them (``flash_attention_varlen``'s (total, heads, head_dim)
    tensors, as (1, heads, total, head_dim)): the errors print their shapes, and the heads
    error gives no transpose advice (the caller's layout is flash-attn's already)."""
    qn, kn, vn = names
    for i, (name, x) in enumerate(((qn, q), (kn, k), (vn, v))):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, heads, seq, head_dim), "
                             f"got shape {tuple(x.shape)}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
        if x.shape[1] == 0 or x.shape[3] == 0:
            raise ValueError(f"{name} must have at least one head and a head_dim of at least 1, "
                             f"got shape {tuple((shown[i] if shown else x).shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{qn}, {kn} and {vn} must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{qn}, {kn} and {vn} must be on the same device, got {q.device}, {k.device}, {v.device}")

    sq, sk, sv = (tuple(x.shape) for x in (shown or (q, k, v)))
    batch, heads, _, head_dim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"{kn} and {vn} must have {qn}'s batch size {batch}, got {kn} {sk}, {vn} {sv}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"{kn} and {vn} must have the same number of heads, got {kn} {sk}, {vn} {sv}")
    if heads % k.shape[1] != 0:
        hint = "" if shown else ("; the layout is (batch, heads, seq, head_dim): for flash-attn's "
                                 "(batch, seq, heads, head_dim) pass x.transpose(1, 2)")
        raise ValueError(f"{kn}'s number of heads ({k.shape[1]}) must divide {qn}'s ({heads}) "
                         f"(grouped-query attention), got {qn} {sq}, {kn} {sk}{hint}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"{kn} and {vn} must have the same sequence length, got {kn} {sk}, {vn} {sv}")
    if k.shape[3] != head_dim:
        raise ValueError(f"{kn} must have {qn}'s head_dim {head_dim}, got {kn} {sk}")
    if v.shape[3] != head_dim:
        raise ValueError(f"{vn} must have {qn}'s head_dim {head_dim}, got {vn} {sv}")


def check_inputs(q, k, v, causal, scale, dq_mode="separate", *, names=("q", "k", "v"), shown=None):
    """Validate the arguments of ``flash_attention``; return the resolved scale.

    ``names`` are the arguments' names in the errors (``flash_decode`` calls k and v
    ``k_cache`` and ``v_cache``); ``shown``, the caller's tensors (``check_shapes``).

    Raises TypeError / ValueError naming the argument and what was expected.
    """
    qn, kn, vn = names
    check_arguments(q, k, v, causal, dq_mode, names=names, shown=shown)
    head_dim = q.shape[3]

    check_runs_here(q, f"{qn}, {kn} and {vn}", "are")
    return resolve_scale(scale, head_dim)


def check_runs_here(x, names: str, verb: str = "is") -> None:
    """The tensor(s) ``names`` (``x`` stands for them all: one device and dtype, checked before)
    can run where the kernels run: CUDA tensors on a GPU machine; CPU tensors, not bfloat16,
    in Triton's interpreter (which the process must have been started with)."""
    if runtime.device() == "cuda":
        if x.device.type != "cuda":
            raise ValueError(f"{names} must be CUDA tensors on this machine (the kernels run on "
                             f"the GPU), got device {x.device}; move them with .cuda()")
    else:
        if x.device.type != "cpu":
            raise ValueError(f"{names} must be CPU tensors here (the kernels run in Triton's "
                             f"interpreter), got device {x.device}")
        problem = _interpreter_problem()
        if problem:
            raise RuntimeError(problem)
        if not runtime.INTERPRET:   # triton was imported first, without a GPU: its own error names no cause
            raise RuntimeError(f"{runtime.describe()} Restart Python and import flashbook before triton, or set "
                               "TRITON_INTERPRET=1 before importing triton.")
        if x.dtype == torch.bfloat16:
            raise TypeError(f"{names} {verb} bfloat16, which Triton's CPU interpreter cannot compute "
                            "correctly; use float16 or float32 here, or run on a CUDA GPU")


def check_arguments(q, k, v, causal, dq_mode="separate", *, names=("q", "k", "v"), shown=None) -> None:
    """``check_inputs``' checks that read only the arguments (shapes, dtypes, flags), not the
    machine: the compiled path runs them while it traces, so a bad call fails there."""
    check_shapes(q, k, v, names=names, shown=shown)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    if q.shape[3] > configs.MAX_HEAD_DIM:
        raise ValueError(f"{names[0]}'s head_dim must be at most {configs.MAX_HEAD_DIM}, got {q.shape[3]}")


def in_layout_of(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` (shaped as ``like``) in ``torch.empty_like(like)``'s memory layout: ``x`` itself when
    its strides are ``like``'s already, else a copy. The front door's outputs and gradients have
    their input's layout whichever kernel made them, as SDPA's do."""
    if x.stride() == like.stride():
        return x
    out = torch.empty_like(like)
    return x if x.stride() == out.stride() else out.copy_(x)


@functools.lru_cache(maxsize=1)
def _interpreter_problem() -> str | None:
    """``runtime.interpreter_problem()``, asked once: it reads the installed packages'
    metadata (0.4 ms a call, more than a small kernel takes in the interpreter), and
    what is installed does not change under a running process (its fix says to restart)."""
    return runtime.interpreter_problem()


def is_empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether there is no score to compute: no batch, no query or no key (the output is
    then all zeros, or empty, and nothing is launched)."""
    return q.shape[0] == 0 or q.shape[2] == 0 or k.shape[2] == 0


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels assume the head_dim axis has stride 1 (so a row loads as one vector);
    # every other stride is passed to them. A transposed (batch, seq, heads, head_dim)
    # tensor already satisfies this and is used as it is.
    return x if x.stride(-1) == 1 else x.contiguous()


def no_double_backward() -> None:
    """Called first in the backward: with ``create_graph=True`` autograd records the backward to
    differentiate it again, and the kernels' gradients would come back as constants, silently
    dropping the second-order terms. Refused instead (flash-attn has no double backward either)."""
    if torch.is_grad_enabled():
        raise RuntimeError(NO_DOUBLE_BACKWARD)


NO_DOUBLE_BACKWARD = ("flash_attention has no double backward (a gradient of its gradient, create_graph=True): "
                      "use torch's scaled_dot_product_attention with the math backend for that")


def flash_attn_extras(dropout_p, deterministic, return_attn_probs, dq_mode) -> None:
    """flash-attn's keywords that change nothing here at their values that ask for nothing
    (``dropout_p=0.0``, ``deterministic``, ``return_attn_probs=False``), accepted so that a call
    written for ``flash_attn_func`` keeps them; a value that asks for what flashbook does not do
    is refused, naming it."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or dropout_p != 0:
        raise ValueError(f"dropout_p must be 0.0: flashbook has no dropout (flash-attn's dropout_p), got {dropout_p!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    if deterministic and dq_mode == "atomic":
        raise ValueError("deterministic=True needs dq_mode='separate' (the default, deterministic): "
                         "dq_mode='atomic' adds dQ in no fixed order")
    if return_attn_probs is not False:
        raise ValueError(f"return_attn_probs must be False: flashbook never forms the attention weights "
                         f"(flashbook.kernels.flash_forward returns each row's lse), got {return_attn_probs!r}")


def check_flash_attn_4d(x, name: str, meaning: str = "(batch, seq, heads, head_dim)") -> None:
    """``x`` a 4-D tensor, in the words of flash-attn's layout (``flash_attn_func``,
    ``flash_attn_with_kvcache``): the error names the argument and the layout ``meaning``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a 4-D tensor in flash-attn's layout {meaning}, got {shape}")


def flash_attn_names(scale, window, softmax_scale=None, window_size=None) -> tuple:
    """(scale, window) from this library's names or flash-attn's (``softmax_scale``,
    ``window_size``), so a call written for ``flash_attn_func`` keeps its keywords. Giving
    both names of one argument is refused, naming the two."""
    for ours, theirs, a, b in (("scale", "softmax_scale", scale, softmax_scale),
                               ("window", "window_size", window, window_size)):
        if a is not None and b is not None:
            raise TypeError(f"give {ours}= or flash-attn's {theirs}=, not both (got {a!r} and {b!r})")
    return (softmax_scale if scale is None else scale), (window_size if window is None else window)


def operator_flags(scale, window, softcap, prefix) -> tuple:
    """(scale, window, softcap, prefix) as the operators' schemas type them: float or None, a list
    of two ints or None, float or None, int."""
    return (None if scale is None else float(scale), None if window is None else [int(w) for w in window],
            None if softcap is None else float(softcap), int(prefix))
