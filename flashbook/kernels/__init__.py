"""Triton kernels for FlashAttention and the autograd Function around them (chapters 7-9, 11).

- ``forward``:   the FlashAttention-2 forward kernel (online softmax, exp2, causal tile skipping)
- ``backward``:  delta preprocess, the dK/dV kernel, the dQ kernel (or atomic dQ)
- ``configs``:   block sizes, warps and stages per chip and head_dim, with a shared-memory filter
- ``autograd``:  input checks, kernel launches (``flash_forward``, ``flash_backward``)
                 and the autograd Function around the Triton kernels
- ``dispatch``:  the front door ``flash_attention(..., backend="auto" | "triton" | "gluon")``:
                 which forward kernel runs a call (``last_backend``, ``explain_backend``);
                 ``window=``, ``softcap=``, ``prefix=`` and ``alibi_slopes=`` (the Triton kernels'
                 WINDOW, SOFTCAP, PREFIX and ALIBI switches); inside ``torch.compile``, two
                 PyTorch custom operators (``flashbook::attention_forward``, ``_backward``)
- ``varlen``:    ``flash_attention_varlen``: documents packed along one sequence (cu_seqlens)
- ``decode``:    flash-decoding: a few new tokens against a KV cache, split over the keys,
                 the splits merged with chapter 3's merge (``flash_decode``, chapter 11)
- ``hopper``:    a second forward kernel for Hopper GPUs in Triton's Gluon dialect (TMA,
                 asynchronous warpgroup products, warp specialisation; chapter 10):
                 ``gluon_forward``, ``gluon_attention``
- ``targets``:   compiling for sm_75 / sm_80 / sm_90 without that GPU (shared memory per config)
- ``checks``:    references and error yardsticks for tests and self-checks
- ``stress``:    every shape class run with many seeds, outputs poisoned with NaN first
- ``probes``:    ``stage_map``: which (query tile, key tile) pairs each kernel visits, as its
                 own ``causal_bounds`` / ``query_bounds`` decides (the stage figures of
                 chapters 7 and 8); ``observed_stages``: the same read off poisoned gradients
"""
from . import configs
from .autograd import (
    DQ_MODES,
    FlashAttention,
    check_inputs,
    dot_precision,
    flash_backward,
    flash_forward,
    set_autotune,
    set_fp32_precision,
)
from .decode import flash_decode
from .kvcache import flash_attn_with_kvcache
from .dispatch import BACKENDS, explain_backend, flash_attention, flash_attn_func, last_backend
from .varlen import flash_attention_varlen, flash_attn_varlen_func

__all__ = [
    "flash_attention", "FlashAttention", "flash_forward", "flash_backward", "check_inputs", "dot_precision",
    "flash_decode", "set_autotune", "set_fp32_precision", "DQ_MODES", "configs",
    "BACKENDS", "last_backend", "explain_backend", "flash_attention_varlen", "flash_attn_func",
    "flash_attn_varlen_func", "flash_attn_with_kvcache",
]
