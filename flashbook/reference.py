"""Attention, exactly as the formula says, in NumPy (chapter 1; backward: chapter 5).

    O = softmax(scale * Q K^T) V

Everything here is computed in float64 and returned as float64: it is the truth
that the tiled algorithm and the GPU kernels are measured against. It builds the
whole N_q x N_k score matrix, which is exactly what FlashAttention avoids.

``torch_attention`` is the same formula in PyTorch, the book's one PyTorch
reference: the truth on a GPU in float64, the yardstick of a kernel in its own
dtype, and the benchmark's "naive" implementation.

Shapes: ``q`` is (..., N_q, d), ``k`` is (..., N_k, d), ``v`` is (..., N_k, d_v);
the leading (batch, head) dimensions must match.
"""
from __future__ import annotations

import math
import numbers

import numpy as np


# ----------------------------------------------------------------- input checks

def check_array(x, name: str, *, shape: tuple | None = None, min_ndim: int = 2) -> np.ndarray:
    """``x`` as a floating-point array, checked; errors name the argument.

    ``shape`` demands an exact shape; otherwise at least ``min_ndim`` dimensions.
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    if shape is not None:
        if arr.shape != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}")
    elif arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions (..., N, d), "
                         f"got shape {arr.shape}")
    return arr


def resolve_scale(scale, head_dim: int) -> float:
    """``None`` means 1/sqrt(d); anything else must be a finite number > 0."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return float(scale)


def check_qkv(q, k, v, scale=None):
    """Validate q, k, v (and scale); return them as arrays plus the resolved scale.

    Raises ``TypeError``/``ValueError`` naming the argument and what was expected.
    """
    q = check_array(q, "q")
    k = check_array(k, "k")
    v = check_array(v, "v")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dimension d, "
                         f"got q {q.shape} and k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys N_k, "
                         f"got k {k.shape} and v {v.shape}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k and v must have the same leading (batch, head) dimensions, "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] == 0:
        raise ValueError(f"q must have a head dimension d >= 1, got shape {q.shape}")
    return q, k, v, resolve_scale(scale, q.shape[-1])


# ----------------------------------------------------------------- the formula

def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may attend to key j.

    The diagonal is aligned to the bottom-right corner (as FlashAttention 2.1+
    does): query i sees key j when ``j <= i + (n_k - n_q)``. With n_q == n_k this
    is the usual lower triangle; with n_q > n_k the first rows see nothing.
    """
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + (n_k - n_q)


def softmax_rows(s: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """Row softmax of scores ``s`` over the ``allowed`` entries (all if None).

    Subtracts each row's maximum first, so exp never overflows. A row with no
    allowed entry gets all-zero weights (not NaN): it attends to nothing.
    """
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # fully masked rows
    p = np.exp(s - row_max)
    row_sum = p.sum(axis=-1, keepdims=True)
    return np.divide(p, row_sum, out=np.zeros_like(p), where=row_sum > 0)


def scores(q, k, *, scale: float) -> np.ndarray:
    """The scaled score matrix S = scale * Q K^T, shape (..., N_q, N_k)."""
    return scale * (q @ np.swapaxes(k, -1, -2))


def attention(q, k, v, *, causal: bool = False, scale=None) -> np.ndarray:
    """O = softmax(scale * Q K^T) V in float64, building the whole score matrix.

    ``causal=True`` masks keys after each query (bottom-right aligned when
    N_q != N_k); rows that can see no key give zeros.
    """
    q, k, v, scale = check_qkv(q, k, v, scale)
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    allowed = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    p = softmax_rows(scores(q, k, scale=scale), allowed)
    return p @ v


def attention_backward(q, k, v, do, *, causal: bool = False, scale=None):
    """Analytic gradients (dq, dk, dv) of ``attention`` for an upstream gradient do.

    With P the attention weights and O = P V:

        dV = P^T dO
        dP = dO V^T
        dS = P * (dP - delta),   delta = rowsum(dO * O)
        dQ = scale * dS K,       dK = scale * dS^T Q
    """
    q, k, v, scale = check_qkv(q, k, v, scale)
    do = check_array(do, "do", shape=q.shape[:-1] + (v.shape[-1],))
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    allowed = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    p = softmax_rows(scores(q, k, scale=scale), allowed)
    return gradients(p, q, k, v, do, scale=scale)


def gradients(p, q, k, v, do, *, scale: float, score_slope=None):
    """The formulas of ``attention_backward`` from the attention weights ``p``: (dq, dk, dv).

    ``score_slope``: the derivative of the score the softmax saw with respect to the scaled
    score, elementwise, when it is not the scaled score itself (``masks``' soft cap:
    1 - tanh(s / c)^2); dS is multiplied by it before dQ and dK.
    """
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    delta = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if score_slope is not None:
        ds = ds * score_slope
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    return dq, dk, dv


# ----------------------------------------------------------------- the same, in PyTorch

def torch_attention(q, k, v, *, causal: bool = False, scale=None, allowed=None, softcap=None, alibi_slopes=None,
                    return_lse: bool = False):
    """The same formula as three plain PyTorch steps: S = scale Q K^T, P = softmax(S), O = P V.

    Differentiable, in q's dtype and on q's device: the one PyTorch reference of the
    book. In float64 it is the truth on a GPU (too big for NumPy); in the input dtype
    it is the yardstick of a kernel's error (``kernels.checks``); timed, it is the
    benchmark's "naive" implementation (``bench``). Each step is its own kernel and
    writes a whole (batch, heads, N_q, N_k) matrix to device memory; autograd keeps
    P for the backward: this is what FlashAttention replaces. q, k, v are torch
    tensors (..., N, d); with a heads axis (..., heads, N, d), k and v may have fewer
    heads than q (GQA). Causal is
    bottom-right aligned (``causal_mask``); a row that sees no key gives zeros.
    ``allowed``: a boolean (N_q, N_k) array or tensor of the scores kept, instead of
    ``causal`` (``masks.allowed`` builds the windows'); ``softcap=c``: the scaled scores
    become c * tanh(s / c) before the softmax; ``alibi_slopes``: a tensor (heads,) or
    (batch, heads), ALiBi's -slope * |i + N_k - N_q - j| added after the cap (``masks``).
    ``return_lse``: also each row's logsumexp of its scores, (o, lse), -inf where a row
    sees no key.
    """
    import torch

    scale = resolve_scale(scale, q.shape[-1])
    if k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    s = torch.matmul(q * scale, k.transpose(-2, -1))   # scaling Q is N*d work, not N*N
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if alibi_slopes is not None:   # in float32 at least (distances exact up to 2^24), then s's dtype
        work = torch.promote_types(s.dtype, torch.float32)
        i = torch.arange(n_q, device=q.device, dtype=work)[:, None] + (n_k - n_q)
        distance = (i - torch.arange(n_k, device=q.device, dtype=work)[None, :]).abs()
        slopes = torch.as_tensor(alibi_slopes, device=q.device, dtype=work)
        s = s - (slopes.reshape(*slopes.shape, 1, 1) * distance).to(s.dtype)
    if allowed is not None:
        s = s.masked_fill(~torch.as_tensor(allowed, dtype=torch.bool, device=q.device), float("-inf"))
    elif causal:  # the complement of causal_mask, built on q's device
        hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(n_k - n_q + 1)
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if allowed is not None or (causal and n_q > n_k):
        p = p.nan_to_num(0.0)  # rows with no key: softmax of all -inf is NaN
    if return_lse:
        return torch.matmul(p, v), torch.logsumexp(s, dim=-1)
    return torch.matmul(p, v)
