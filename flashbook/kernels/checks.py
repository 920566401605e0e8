"""Checking the kernels against references: what the tests and the chapters' self-checks use.

Two references, for two questions:

* ``reference_grads``: the truth, in float64 (``flashbook.reference``, NumPy),
  for the output and the three gradients; grouped-query K/V heads are repeated
  for the formula and their gradients summed back over the group.
* ``torch_attention`` (``flashbook.reference.torch_attention``): plain PyTorch math
  (the whole score matrix, causal mask aligned bottom-right, rows that see nothing
  give zeros) in any dtype. Computed
  in the input dtype, its error against the truth is the yardstick for a kernel's
  error: the FlashAttention repository's tests ask a kernel to stay within twice
  the error of such a same-dtype PyTorch implementation, and so do ours. On a GPU,
  torch's own fused kernel (SDPA) is the other yardstick.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import masks, reference
from ..reference import torch_attention


def _group(q, k) -> int:
    return q.shape[1] // k.shape[1]


def reference_grads(q, k, v, do, *, causal=False, scale=None):
    """(o, dq, dk, dv) in float64 from flashbook.reference, as CPU torch tensors."""
    g = _group(q, k)
    to64 = lambda x: x.detach().cpu().double().numpy()  # noqa: E731
    qn, don = to64(q), to64(do)
    kn = np.repeat(to64(k), g, axis=1)
    vn = np.repeat(to64(v), g, axis=1)
    o = reference.attention(qn, kn, vn, causal=causal, scale=scale)
    dq, dk, dv = reference.attention_backward(qn, kn, vn, don, causal=causal, scale=scale)
    b, hkv, nk, d = k.shape
    dk = dk.reshape(b, hkv, g, nk, d).sum(axis=2)  # each K/V head served `g` query heads
    dv = dv.reshape(b, hkv, g, nk, v.shape[-1]).sum(axis=2)
    return tuple(torch.from_numpy(x) for x in (o, dq, dk, dv))


def torch_grads(q, k, v, do, *, causal=False, scale=None, dtype=torch.float32, window=None, softcap=None,
                prefix=0, alibi_slopes=None):
    """(o, dq, dk, dv) of ``torch_attention``, computed and returned in ``dtype``; ``window``,
    ``softcap``, ``prefix`` and ``alibi_slopes`` as ``flash_attention``'s (the mask from
    ``masks.allowed``)."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    o = torch_attention(*leaves, **_torch_mask(q, k, causal, scale, window, softcap, prefix, alibi_slopes))
    o.backward(do.detach().to(dtype))
    return (o.detach(), *(t.grad for t in leaves))


def _torch_mask(q, k, causal, scale, window, softcap, prefix, alibi_slopes) -> dict:
    """``torch_attention``'s mask arguments for ``flash_attention``'s (``masks.allowed`` for a
    window or a prefix)."""
    allowed = None
    if masks.check_window(window) != masks.NO_WINDOW or masks.check_prefix(prefix):
        allowed = masks.allowed(q.shape[-2], k.shape[-2], causal=causal, window=window, prefix=prefix)
    return dict(causal=causal, scale=scale, allowed=allowed, softcap=masks.check_softcap(softcap),
                alibi_slopes=alibi_slopes)


def output_error_grads(q, k, v, do, o, *, causal=False, scale=None, window=None, softcap=None, prefix=0,
                       alibi_slopes=None) -> tuple:
    """(dQ, dK) in float64: the part of a FlashAttention backward's dQ and dK that the
    error of its forward's output ``o`` explains.

    The backward does not recompute O: it reads the forward's rounded o for
    delta_i = rowsum(dO_i * o_i) (chapter 5), so dS_ij = P_ij (dP_ij - delta_i) carries
    P_ij e_i with e_i = rowsum(dO_i * (o_i - O_i)), the output's error seen through dO.
    That is exactly the gradient of -sum_i e_i lse_i (d lse_i / d S_ij = P_ij), returned
    here (the soft cap's slope and the masks included, as in the kernels). PyTorch's
    backward, the yardstick, takes delta from P and dP instead, so it has no such term.
    """
    leaves = [x.detach().double().requires_grad_() for x in (q, k)]
    o_true, lse = torch_attention(*leaves, v.detach().double(), return_lse=True,
                                  **_torch_mask(q, k, causal, scale, window, softcap, prefix, alibi_slopes))
    seen = torch.isfinite(lse)   # a row that sees no key has lse = -inf, o = 0 and no error
    e = ((o.detach().double() - o_true.detach()) * do.detach().double()).sum(-1)
    loss = -(torch.where(seen, e, 0.0) * torch.where(seen, lse, 0.0)).sum()
    return tuple(g.nan_to_num(0.0) for g in torch.autograd.grad(loss, leaves))


def max_error(got, want) -> tuple[float, tuple]:
    """Largest |got - want| and where it is (an index tuple); NaN counts as infinite."""
    # on got's device: a GPU check then copies two numbers to the host, not whole tensors
    diff = (got.detach().double() - want.detach().to(got.device).double()).abs()
    if diff.numel() == 0:
        return 0.0, ()
    diff = torch.nan_to_num(diff, nan=float("inf")).reshape(-1)
    flat = int(diff.argmax())
    where = tuple(int(i) for i in np.unravel_index(flat, got.shape))
    return float(diff[flat]), where


def within_twice_yardstick(name, got, want, yardstick, *, head_dim: int, factor: float = 2.0,
                           terms: int = 1, allow: float = 0.0) -> str | None:
    """None if ``got`` is within ``factor`` (2) x the yardstick's error of ``want``, else what differs.

    ``yardstick`` is another computation of the same value (PyTorch math in the
    input dtype, or torch's own fused kernel). Two small floors are added:

    * a few float32 ulps per sqrt(head_dim x terms): values the yardstick gets exactly by
      luck, such as gradients that are exactly 0 with a single key (the kernel's
      float32 dot products of length head_dim round there, torch's formula cancels).
      ``terms``: how many such roundings one element sums, 1 but for dK, which sums
      over the query rows that see its key alone. Such a row has P = 1 and
      dS = dP - delta = 0 exactly, but the kernel forms dP as a dot product and
      delta = rowsum(dO * O) in another order, so dS is a few ulps of |dO||v| and
      the sum over the rows walks like sqrt(rows). With one key (not causal) every
      row sees it alone: the GPU stress suite saw dK errors of 0.9e-5 to 1.5e-5 in
      float32 at 64 query rows (head_dim 80; 25 of 60 runs), above the floor of one
      term (8.6e-6), below this one (6.8e-5 for 64 rows);
    * half a rounding step of the output's dtype at the largest magnitude of the truth
      (eps / 2 x max|want|, at least eps / 4): the result is rounded to that dtype once
      more at the end, so this much error is unavoidable, and on a small tensor the
      yardstick's largest error may fall on a small value while the kernel's falls on a
      large one, a difference of rounding luck, not accuracy (the FlashAttention
      repository's tests add such a term too). The stress tests found it needed: one of
      about 700 fp16 runs at seq_q = seq_k = 2 put a dQ element 0.9 of a step off at
      magnitude 2 where the yardstick was 0.37 of a step off.

    ``allow``: error the yardstick does not have and the rule grants for a known reason,
    added as it is: for dQ and dK, the largest element of ``output_error_grads`` (the
    forward's output error carried into the backward through delta). The GPU stress
    suite needed it once in 11,520 mask runs: fp16, a document of 14 queries x 3 keys
    under a window of 3, whose dK was 1.11 x the rule's bound; 1.4e-3 of its 1.8e-3
    error was that term (``benchmarks/results/stress_h200``, run 14).
    """
    err, where = max_error(got, want)
    base, floor = error_bound(got, want, yardstick, head_dim=head_dim, terms=terms)
    if err <= factor * base + floor + allow:
        return None
    extra = f" + {allow:.1e} (the output's error)" if allow else ""
    return (f"{name}: max error {err:.3e} at {where} (got {float(got[where]):.6g}, want "
            f"{float(want[where]):.6g}) exceeds {factor:g} x {base:.3e} (yardstick) + {floor:.1e} (floors){extra}")


def error_bound(got, want, yardstick, *, head_dim: int, terms: int = 1) -> tuple[float, float]:
    """``within_twice_yardstick``'s two parts: (the yardstick's max error, the floors). The
    rule passes ``got`` when its max error is at most factor x the first plus the second."""
    base, _ = max_error(yardstick, want)
    largest = float(want.abs().max()) if want.numel() else 0.0
    floor = (8 * torch.finfo(torch.float32).eps * math.sqrt(head_dim * max(1, terms)) * (1 + largest)
             + torch.finfo(got.dtype).eps * max(0.25, largest / 2))
    return base, floor


GRADS = ("o", "dq", "dk", "dv")


def head_chunks(q, k, budget: int = 2**31):
    """(batch, query-head, K/V-head) slices of (batch, heads, N, d) tensors, one batch entry
    and whole GQA groups at a time, each chunk's float64 score matrices (autograd keeps about
    six N_q x N_k of them) within ``budget`` bytes: a float64 reference of a long sequence
    in pieces the GPU holds (at N = 4096, 32 heads and batch 4 the whole needs ~100 GB)."""
    b, h, n_q = q.shape[:3]
    g = _group(q, k)
    fit = max(1, budget // (max(1, n_q * k.shape[2]) * 8 * 6))
    per = max(1, fit // g) * g
    for i in range(b):
        for h0 in range(0, h, per):
            h1 = min(h, h0 + per)
            yield slice(i, i + 1), slice(h0, h1), slice(h0 // g, h1 // g)


def output_error_allowance(q, k, v, do, o, **mask) -> tuple:
    """(o, dq, dk, dv)'s ``allow`` for ``within_twice_yardstick``: for dQ and dK the largest
    element of the part of their error that the kernel's own output error explains
    (``output_error_grads``; ``mask``: its keyword arguments), 0 for o and dV. Computed
    over ``head_chunks`` (the largest element is the largest of the chunks')."""
    if q.dim() != 4:
        dq, dk = output_error_grads(q, k, v, do, o, **mask)
        return 0.0, float(dq.abs().max()), float(dk.abs().max()), 0.0
    slopes, worst = mask.pop("alibi_slopes", None), [0.0, 0.0]
    slopes = None if slopes is None else torch.as_tensor(slopes, device=q.device)
    for bs, hq, hk in head_chunks(q, k):
        if slopes is not None:   # (heads,) or (batch, heads)
            mask["alibi_slopes"] = slopes[hq] if slopes.dim() == 1 else slopes[bs, hq]
        grads = output_error_grads(q[bs, hq], k[bs, hk], v[bs, hk], do[bs, hq], o[bs, hq], **mask)
        worst = [max(w, float(x.abs().max()) if x.numel() else 0.0) for w, x in zip(worst, grads)]
    return 0.0, worst[0], worst[1], 0.0


def compare(names, got, truth, yardstick, head_dim, terms=None, allow=None) -> list:
    """Each output against the truth by the book's rule; ``terms``: for each, how many
    rounded products an element sums, 1 by default; ``allow``: for each, the error granted
    beyond the yardstick's, 0 by default (``within_twice_yardstick``). A list of problems."""
    problems = []
    for name, g, t, y, n, a in zip(names, got, truth, yardstick, terms or [1] * len(names),
                                   allow or [0.0] * len(names)):
        if g.shape != t.shape:
            problems.append(f"{name}: shape {tuple(g.shape)}, want {tuple(t.shape)}")
            continue
        problem = within_twice_yardstick(name, g, t, y, head_dim=head_dim, terms=n, allow=a)
        if problem:
            problems.append(problem)
    return problems


def backward_problems(got, truth, yardstick, q, k, v, do, *, head_dim: int, terms=None, **mask) -> list:
    """(o, dq, dk, dv) against the truth by the book's rule, dQ and dK granted the error that
    the kernel's own rounded output carries into them (``output_error_allowance``), as the
    stress suite grants it: every gradient test asks the same. A list of problems."""
    allow = output_error_allowance(q, k, v, do, got[0], **mask)
    return compare(GRADS, got, truth, yardstick, head_dim, terms=terms, allow=allow)
