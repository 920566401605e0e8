"""Every rung of chapter 10's ladder, and both dQ strategies of the backward, run in float32
and held to float64 (``flashbook.reference``): the ladder changes how fast the kernel is,
never what it computes. On a CPU the kernels run in Triton's interpreter."""
from __future__ import annotations

import numpy as np

from .. import reference, runtime
from ..kernels import DQ_MODES, flash_attention, set_fp32_precision
from ..kernels.ladder import run_rung

# float32 inputs, float32 products (set_fp32_precision: no TF32 on a GPU either). Each output
# sums at most N terms of size ~1 in float32: 1e-5 is ~100 ulps of 1.0, far above the
# rounding (measured ~4 ulps) and far below any real bug (a wrong mask or scale errs by ~0.1).
TOL = 1e-5
BACKWARD_TOL = 10 * TOL   # dQ, dK, dV: sums over a whole row or column of tiles


def reference_lse(q64, k64, causal):
    """The natural-log logsumexp of each scaled score row, in float64."""
    s = reference.scores(q64, k64, scale=q64.shape[-1] ** -0.5)
    if causal:
        s = np.where(reference.causal_mask(s.shape[-2], s.shape[-1]), s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(s - top).sum(axis=-1, keepdims=True)))[..., 0]


def check_rungs(rungs, *, batch, heads, n, d, backward=True):
    """Run each rung (and both dQ strategies) in float32; assert each is exact; return one row
    per run with its largest error (a backward row: the largest of dQ's, dK's and dV's; it
    has no lse, so its lse error is NaN)."""
    import pandas as pd
    import torch

    device = runtime.device()
    gen = torch.Generator().manual_seed(10)
    q, k, v, do = (torch.randn(batch, heads, n, d, generator=gen).to(device) for _ in range(4))
    q64, k64, v64, do64 = (x.double().cpu().numpy() for x in (q, k, v, do))
    rows = []
    set_fp32_precision("ieee")
    try:
        for causal in (False, True):
            o_ref, lse_ref = reference.attention(q64, k64, v64, causal=causal), reference_lse(q64, k64, causal)
            for rung in rungs:
                o, lse = run_rung(rung, q, k, v, causal=causal)
                err_o = np.abs(o.double().cpu().numpy() - o_ref)
                err_l = float(np.abs(lse.double().cpu().numpy() - lse_ref).max())
                where = np.unravel_index(err_o.argmax(), err_o.shape)
                assert err_o.max() <= TOL and err_l <= TOL, (
                    f"{rung.name}, causal={causal}: max |O error| {err_o.max():.2e} at (b, h, row, col) "
                    f"= {tuple(int(i) for i in where)}, max |lse error| {err_l:.2e}")
                rows.append({"mask": "causal" if causal else "full", "rung": rung.name,
                             "max |O error|": float(err_o.max()), "max |lse error|": err_l})
            if not backward:
                continue
            grads_ref = reference.attention_backward(q64, k64, v64, do64, causal=causal)
            for mode in DQ_MODES:
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                out = flash_attention(*leaves, causal=causal, dq_mode=mode, backend="triton")
                grads = torch.autograd.grad(out, leaves, do)
                errs = {name: float(np.abs(gr.double().cpu().numpy() - ref).max())
                        for name, gr, ref in zip(("dQ", "dK", "dV"), grads, grads_ref)}
                # gradients sum up to N products of two unit-size numbers: 10x the forward's bound
                assert max(errs.values()) <= BACKWARD_TOL, f"backward, dQ {mode}, causal={causal}: {errs}"
                rows.append({"mask": "causal" if causal else "full", "rung": f"backward, dQ {mode}",
                             "max |O error|": max(errs.values()), "max |lse error|": float("nan")})
    finally:
        set_fp32_precision(None)   # back to following PyTorch's switch (the library's default)
    return pd.DataFrame(rows)
