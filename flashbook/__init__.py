"""flashbook: the companion library of the FlashAttention book.

One module per idea, in the order the book teaches them:

- ``reference``: naive attention and its gradients in NumPy (float64 truth), and in PyTorch
- ``softmax``:   stable and online softmax, merging partial statistics
- ``tiled``:     FlashAttention forward/backward in NumPy, with I/O accounting (``io_counter``)
- ``split``:     split-K: the keys cut into splits, merged (``tiled.split_forward``)
- ``kernels``:   Triton kernels and the autograd Function behind ``flash_attention``
                 (the front door: ``backend="auto" | "triton" | "gluon"``, ``last_backend``; sliding
                 windows and soft caps); ``flash_attn_func`` (flash-attn's layout and order of
                 arguments); ``flash_attention_varlen`` (packed documents; ``flash_attn_varlen_func``
                 in flash-attn's order);
                 ``flash_decode`` (dense or paged KV cache; ``flash_attn_with_kvcache`` in flash-attn's
                 layout, appending the step's keys and values); ``stress`` (many seeds, poisoned outputs)
- ``masks``:     windows, soft caps, documents, prefixes in NumPy: the float64 truth, tiles skipped
- ``distributed``: ring attention over ``torch.distributed`` (chapter 11)
- ``runtime``:   GPU or Triton interpreter (decided before triton is imported)
- ``explorers``: the explorers, their Python and their JavaScript side by side (a package;
                 ``widgets`` and ``live`` are its older names)
- ``bench``, ``plots``: benchmarks (a package), shared figures
- ``timing``:    the one GPU timer (below both ``kernels`` and ``bench``)
- ``validation``, ``display``: shared argument checks; showing source in a chapter
"""
import importlib as _importlib
import pkgutil as _pkgutil

from . import runtime  # first: it decides TRITON_INTERPRET before triton is imported
from .display import show_source

__version__ = "0.34.0"  # the one version: pyproject reads it; releases are tagged v<version>
__all__ = ["runtime", "show_source", "flash_attention", "flash_attn_func", "flash_attention_varlen",
           "flash_attn_varlen_func", "flash_decode", "flash_attn_with_kvcache", "last_backend"]


#: The subpackages and modules, each imported on first use as ``flashbook.NAME`` (``flashbook.kernels``
#: imports triton, so a NumPy chapter that never names it never imports triton).
_SUBMODULES = frozenset(m.name for m in _pkgutil.iter_modules(__path__))


def __dir__():
    return sorted((set(globals()) | set(__all__) | _SUBMODULES) - {"_importlib", "_pkgutil"})


def __getattr__(name):
    # Loaded on first use, so the NumPy chapters never import triton.
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    if name in ("flash_attention", "flash_attn_func", "last_backend"):
        from .kernels import dispatch

        return getattr(dispatch, name)
    if name in ("flash_attention_varlen", "flash_attn_varlen_func"):
        from .kernels import varlen

        return getattr(varlen, name)
    if name in ("flash_decode", "flash_attn_with_kvcache"):
        from .kernels import kvcache

        return getattr(kvcache, name)
    raise AttributeError(f"module 'flashbook' has no attribute {name!r}")
