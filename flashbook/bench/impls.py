"""The implementations the benchmark compares: plain PyTorch, PyTorch's SDPA backends,
this book's kernels; each a function ``f(q, k, v, *, causal=False, scale=None)``.
"""
from __future__ import annotations

import functools

from ..reference import torch_attention

#: Plain PyTorch attention, three steps each writing a whole N x N matrix
#: (``flashbook.reference.torch_attention``, the book's one PyTorch reference).
naive_attention = torch_attention


#: PyTorch SDPA backends, by the names the benchmark uses.
SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}

#: Every implementation name, in the order the table lists them.
IMPLEMENTATIONS = ("naive", "sdpa-math", "sdpa-efficient", "sdpa-cudnn", "sdpa-flash",
                   "flashbook")


def sdpa_attention(backend: str):
    """``torch.nn.functional.scaled_dot_product_attention`` held to one backend.

    ``backend`` is a key of ``SDPA_BACKENDS``. If that backend cannot run a
    shape, PyTorch raises (it does not fall back), and the benchmark records the
    shape as unsupported. Note SDPA's ``is_causal`` is top-left aligned: the
    benchmark only uses it with N_q == N_k, where both alignments agree.
    """
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, SDPA_BACKENDS[backend])

    def attention(q, k, v, *, causal=False, scale=None):
        kw = {"enable_gqa": True} if k.shape[-3] != q.shape[-3] else {}
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kw)

    attention.__name__ = backend.replace("-", "_")
    return attention


def flashbook_impls() -> dict:
    """This book's kernels: ``flashbook`` (separate dQ kernel), ``flashbook-<mode>``
    for every other ``dq_mode`` of ``flash_attention`` (the atomic-dQ backward), and
    ``flashbook-gluon`` (chapter 10's Gluon forward with chapter 8's backward) on a
    Hopper GPU. Raises ImportError if the kernels cannot load."""
    from ..kernels import DQ_MODES, hopper
    from ..kernels.autograd import flash_attention   # the Triton kernels, as every recorded run

    found = {"flashbook": flash_attention}
    for mode in DQ_MODES:
        if mode != "separate":
            found[f"flashbook-{mode}"] = functools.partial(flash_attention, dq_mode=mode)
    if hopper.available():
        found["flashbook-gluon"] = hopper.gluon_attention
    return found


def resolve_impl(name: str):
    """The attention function for one implementation name."""
    if name == "naive":
        return naive_attention
    if name in SDPA_BACKENDS:
        return sdpa_attention(name)
    if name == "flashbook" or name.startswith("flashbook-"):
        variants = flashbook_impls()
        if name == "flashbook-gluon" and name not in variants:
            raise ImportError("flashbook-gluon needs a Hopper GPU (sm_90) and Triton's Gluon")
        if name not in variants:
            raise ValueError(f"unknown implementation {name!r}; flashbook's are {sorted(variants)}")
        return variants[name]
    raise ValueError(f"unknown implementation {name!r}; choose from {list(IMPLEMENTATIONS)}")
