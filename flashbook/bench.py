"""Benchmarks: what attention costs, on paper and on a GPU (chapter 9).

Two halves, in the order chapter 9 uses them.

**On paper** (pure functions, no GPU, no torch): how many floating-point operations
attention does, how many bytes it must move through device memory (HBM), how much
memory it must hold at its peak, and therefore the fastest it could possibly run on
a chip (``flashbook.runtime.CHIPS``). ``check_seed_table`` uses them to check the
performance table of one of the articles this book grew from.

**On a GPU** (``python -m flashbook.bench``): the same attention computed by plain
PyTorch (``naive_attention``), by each of PyTorch's fused SDPA backends and by this
book's Triton kernel, forward and backward, timed and measured, with provenance::

    python -m flashbook.bench                 # the full sweep (a few minutes on an H200)
    python -m flashbook.bench --quick         # four shapes
    python -m flashbook.bench --impl naive,sdpa-flash,flashbook,flashbook-atomic --seq 4K,8K
    python -m flashbook.bench --sweep-blocks  # block sizes of our forward kernel

**Read back** (Part 8, pandas, no GPU): the newest recorded run and its provenance
(``latest_results``, ``latest_blocks``, ``load_results``), our kernel's ratios to the
SDPA backends judged against ``PERFORMANCE_TARGETS`` (``speedup_table``,
``target_table``), roofline points and ceilings, and the block-size explorer's state
(``block_state``).

Conventions (those of the FlashAttention papers, so numbers compare across them):

- forward FLOPs = 4 * batch * heads * N_q * N_k * d (two matrix products of
  2 * N_q * N_k * d each), halved when causal;
- backward FLOPs = 2.5 * forward (five matrix products: S recomputed, dV, dP, dQ,
  dK); a backward that keeps P instead of recomputing it needs only 2 * forward;
- TFLOP/s = those FLOPs / the measured time, whatever an implementation really does
  (a naive causal implementation computes the masked half and throws it away);
- GB are 10**9 bytes; times are medians in milliseconds.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import functools
import gc
import inspect
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import runtime

GB = 1e9


# =============================================================================
# Part 1. Counting: FLOPs, bytes moved, bytes held
# =============================================================================

PASSES = ("fwd", "bwd", "fwd+bwd")


def _check_dims(**dims):
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_pass(pass_):
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")


def causal_pairs(n_q: int, n_k: int) -> int:
    """How many (query, key) pairs a causal mask keeps.

    The diagonal is aligned bottom-right (as ``flashbook.reference.causal_mask``):
    query i sees key j when ``j <= i + (n_k - n_q)``. For n_q == n_k that is
    N (N + 1) / 2, a little more than the half that the FLOP convention counts.
    """
    _check_dims(n_q=n_q, n_k=n_k)
    offset = n_k - n_q
    return sum(min(n_k, max(0, i + offset + 1)) for i in range(n_q))


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int,
                    causal: bool = False, pass_: str = "fwd", *,
                    recompute: bool = True, exact: bool = False) -> int:
    """Floating-point operations of attention (a multiply-add counts as 2).

    Forward: S = Q K^T and O = P V, each 2 * n_q * n_k * d per head.
    Backward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, plus S = Q K^T
    again when ``recompute`` (FlashAttention keeps no P, so it recomputes it).

    ``causal`` halves the pairs, by the usual convention; ``exact=True`` counts
    the pairs the mask really keeps (``causal_pairs``). Softmax's exp, max and
    sums are O(n_q * n_k), not O(n_q * n_k * d), and are left out, as usual.
    """
    _check_dims(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d)
    _check_pass(pass_)
    if causal and exact:
        pairs2 = 2 * causal_pairs(n_q, n_k)   # twice the pairs, to stay an integer
    elif causal:
        pairs2 = n_q * n_k                    # half of all pairs, times two
    else:
        pairs2 = 2 * n_q * n_k
    # matrix products per pass, each 2 * pairs * d FLOPs
    products = {"fwd": 2, "bwd": 5 if recompute else 4}
    n_products = (products["fwd"] if pass_ in ("fwd", "fwd+bwd") else 0) + \
                 (products["bwd"] if pass_ in ("bwd", "fwd+bwd") else 0)
    return batch * heads * n_products * pairs2 * d  # = n_products * 2 * pairs * d


def attention_hbm_bytes(batch: int, heads: int, n_q: int, n_k: int, d: int, *,
                        impl: str = "flash", pass_: str = "fwd", dtype_bytes: int = 2,
                        heads_kv: int | None = None) -> int:
    """The fewest bytes attention must move between HBM and the chip.

    Every input read once, every output written once; nothing else.

    - ``impl="flash"`` keeps S and P on chip. Forward: read Q, K, V; write O and
      lse (fp32, one per row). Backward: read Q, K, V, O, dO and lse; write dQ, dK,
      dV.
    - ``impl="naive"`` runs one kernel per step, so each N_q x N_k matrix goes
      through HBM: forward writes S, reads it (softmax), writes P, reads it (P V):
      4 matrices. Backward reads P (dV = P^T dO), writes dP, reads P and dP and
      writes dS (softmax backward), reads dS twice (dQ, dK): 7 matrices, plus Q, K,
      V, dO read and dQ, dK, dV written. A plain implementation materialises the
      whole matrix whether or not it is causal, so ``causal`` does not change this.

    ``heads_kv`` (default ``heads``): K and V may have fewer heads (GQA).
    """
    heads_kv = heads if heads_kv is None else heads_kv
    _check_dims(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d,
                dtype_bytes=dtype_bytes, heads_kv=heads_kv)
    _check_pass(pass_)
    if impl not in ("flash", "naive"):
        raise ValueError(f"impl must be 'flash' or 'naive', got {impl!r}")
    q_like = batch * heads * n_q * d * dtype_bytes        # Q, O, dO, dQ
    kv_like = batch * heads_kv * n_k * d * dtype_bytes    # K, V, dK, dV
    rows = batch * heads * n_q * 4                        # lse: one fp32 per query row
    matrix = batch * heads * n_q * n_k * dtype_bytes      # one N_q x N_k matrix
    total = 0
    if pass_ in ("fwd", "fwd+bwd"):
        total += 2 * q_like + 2 * kv_like                 # Q, O; K, V
        total += rows if impl == "flash" else 4 * matrix
    if pass_ in ("bwd", "fwd+bwd"):
        if impl == "flash":
            total += 4 * q_like + 4 * kv_like + rows       # Q, O, dO, dQ; K, V, dK, dV; lse
        else:
            total += 3 * q_like + 4 * kv_like + 7 * matrix  # Q, dO, dQ; K, V, dK, dV
    return total


def attention_memory_bytes(batch: int, heads: int, n_q: int, n_k: int, d: int, *,
                           impl: str = "flash", pass_: str = "fwd", dtype_bytes: int = 2,
                           include_inputs: bool = True, heads_kv: int | None = None) -> int:
    """A lower bound on the peak device memory attention must hold.

    Inputs are Q, K, V (and dO for a backward). ``include_inputs=False`` gives
    the memory on top of them, which is what the GPU benchmark measures.

    - flash, forward: O and lse. Forward + backward: O, lse, dQ, dK, dV and delta
      (fp32, one per row), all alive when the backward returns.
    - naive, forward: O and at least one whole N_q x N_k matrix per head (P, kept
      for the backward; S before it). Forward + backward: the softmax backward
      dS = P * (dP - delta) needs P and dP at the same time, so at least two
      matrices (and at least dQ, dK, dV at the end).

    Real implementations hold more (PyTorch's naive attention holds S and P at
    once in the forward); this is the floor, which is what makes it a proof.
    """
    heads_kv = heads if heads_kv is None else heads_kv
    _check_dims(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d,
                dtype_bytes=dtype_bytes, heads_kv=heads_kv)
    _check_pass(pass_)
    if impl not in ("flash", "naive"):
        raise ValueError(f"impl must be 'flash' or 'naive', got {impl!r}")
    if pass_ == "bwd":
        raise ValueError("pass_ must be 'fwd' or 'fwd+bwd' for memory: the backward "
                         "alone holds what the forward left behind")
    q_like = batch * heads * n_q * d * dtype_bytes
    kv_like = batch * heads_kv * n_k * d * dtype_bytes
    rows = batch * heads * n_q * 4
    matrix = batch * heads * n_q * n_k * dtype_bytes
    backward = pass_ == "fwd+bwd"
    inputs = (q_like + 2 * kv_like + (q_like if backward else 0)) if include_inputs else 0
    if impl == "flash":
        extra = q_like + rows                                  # O, lse
        if backward:
            extra += q_like + 2 * kv_like + rows               # dQ, dK, dV, delta
    else:
        extra = q_like + matrix                                # O, P
        if backward:
            extra = q_like + max(2 * matrix, q_like + 2 * kv_like)
    return inputs + extra


def roofline_ms(flops: float, hbm_bytes: float, chip: str = "A100",
                dtype: str = "fp16") -> dict:
    """The fastest possible time on ``chip``: the larger of compute and memory time.

    Uses the dense tensor-core peak for ``dtype`` ("fp16" or "bf16") and the HBM
    bandwidth from ``flashbook.runtime.CHIPS``. Returns ``compute_ms``,
    ``memory_ms``, ``floor_ms`` and ``bound`` ("compute" or "memory").
    """
    c = runtime.chip(chip)
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    peak = c.fp16_tflops if dtype == "fp16" else c.bf16_tflops
    if peak is None:
        raise ValueError(f"{chip} has no {dtype} tensor cores")
    compute_ms = flops / (peak * 1e12) * 1e3
    memory_ms = hbm_bytes / (c.hbm_tb_s * 1e12) * 1e3
    return {"compute_ms": compute_ms, "memory_ms": memory_ms,
            "floor_ms": max(compute_ms, memory_ms),
            "bound": "compute" if compute_ms >= memory_ms else "memory"}


def tflops(flops: float, ms: float) -> float:
    """FLOPs done in ``ms`` milliseconds, as TFLOP/s."""
    return flops / (ms * 1e-3) / 1e12


def naive_memory_estimate(batch: int, heads: int, n_q: int, n_k: int, d: int, *,
                          elem_bytes: int = 2, matrices: int = 4) -> int:
    """What plain PyTorch attention really needs for forward + backward, beyond
    its inputs (used to skip shapes that would not fit).

    Not a floor but an estimate: O, dQ, dK, dV, and ``matrices`` N_q x N_k
    matrices of ``elem_bytes`` each (4 for SDPA's math backend, which computes
    half-precision inputs in fp32). Four is what PyTorch's autograd was seen to
    hold at the peak of the backward (P, dP, dS and one temporary): measured
    peaks of ``naive_attention`` and ``sdpa-math`` on an H200 were 4.0 to 4.4
    such matrices (``benchmarks/results/``).
    """
    _check_dims(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d, elem_bytes=elem_bytes)
    vectors = 4 * batch * heads * max(n_q, n_k) * d * 2
    return matrices * batch * heads * n_q * n_k * elem_bytes + vectors


# =============================================================================
# Part 2. The seed article's table, checked
# =============================================================================
#
# The article (in Chinese) reports, "on an A100", seq 4096, batch 8, 32 heads:
#
#     implementation     memory   forward   backward
#     naive attention    2.1 GB   4.2 ms    8.5 ms
#     FlashAttention     0.3 GB   3.8 ms    9.1 ms
#
# It uses d = 128 elsewhere and FP16, and its formula has no mask (O =
# softmax(QK^T) V), so the check takes the shape as non-causal and says what a
# causal reading would change. It also says a [4096, 4096] score matrix is "about
# 64MB (FP16)", that recomputation "doubles the compute", that memory "drops
# 7x", and that at 8K FlashAttention uses "about 1/10" of the memory.

SEED_SHAPE = {"batch": 8, "heads": 32, "n": 4096, "d": 128}
SEED_CHIP = "A100"

#: Verdicts a claim can get.
VERDICTS = ("consistent", "impossible", "wrong", "understated")


@dataclass(frozen=True)
class Claim:
    """One figure from the seed table, and what arithmetic says about it."""

    key: str
    text: str           # the claim, in English
    claimed: float
    unit: str
    computed: float     # the bound or value that arithmetic gives, same unit
    relation: str       # how claimed must relate to computed: ">=" (floor) or "=="/"<="
    verdict: str        # one of VERDICTS
    why: str            # one or two sentences with the numbers

    @property
    def possible(self) -> bool:
        return self.verdict == "consistent"

    def line(self) -> str:
        words = {">=": "at least ", "<=": "at most ", "==": ""}[self.relation]
        return (f"{self.verdict.upper():>11}  {self.text}: claimed {self.claimed:g} "
                f"{self.unit}, arithmetic gives {words}{self.computed:.3g} "
                f"{self.unit}. {self.why}")


@dataclass(frozen=True)
class SeedCheck:
    """The numbers behind the verdicts (all exact counts or simple quotients)."""

    chip: str
    batch: int
    heads: int
    n: int
    d: int
    dtype_bytes: int
    flops: dict            # "fwd", "bwd" (recompute), "bwd_no_recompute", "*_causal"
    hbm_bytes: dict        # ("naive"|"flash", "fwd"|"bwd")
    memory_bytes: dict     # name -> lower bound
    floor_ms: dict         # ("naive"|"flash", "fwd"|"bwd", causal) -> ms
    implied_tflops: dict   # ("naive"|"flash", "fwd"|"bwd") -> TFLOP/s the claim implies
    claims: dict           # key -> Claim

    @property
    def impossible(self) -> list:
        return [k for k, c in self.claims.items() if c.verdict == "impossible"]

    def report(self) -> str:
        return "\n".join(c.line() for c in self.claims.values())


def _ratio_floor(n: int, d: int, dtype_bytes: int) -> dict:
    """Lower bounds of naive / flash memory, per (batch, head) (they cancel)."""
    out = {}
    for pass_ in ("fwd", "fwd+bwd"):
        for inputs in (True, False):
            kw = dict(pass_=pass_, dtype_bytes=dtype_bytes, include_inputs=inputs)
            naive = attention_memory_bytes(1, 1, n, n, d, impl="naive", **kw)
            flash = attention_memory_bytes(1, 1, n, n, d, impl="flash", **kw)
            out[(pass_, inputs)] = naive / flash
    return out


def check_seed_table(chip: str = SEED_CHIP) -> SeedCheck:
    """Check every figure of the seed's performance table against arithmetic.

    A time below the chip's floor (FLOPs at peak tensor-core rate, or the
    fewest bytes at full HBM bandwidth) is impossible; so is a memory figure
    below what the matrices it must hold take. Returns a ``SeedCheck``; its
    ``claims`` hold one ``Claim`` per figure, with a verdict and the numbers.
    """
    B, H, N, d = (SEED_SHAPE[k] for k in ("batch", "heads", "n", "d"))
    db = 2  # FP16
    c = runtime.chip(chip)
    peak = c.fp16_tflops

    flops = {
        "fwd": attention_flops(B, H, N, N, d, False, "fwd"),
        "bwd": attention_flops(B, H, N, N, d, False, "bwd"),
        "bwd_no_recompute": attention_flops(B, H, N, N, d, False, "bwd", recompute=False),
        "fwd_causal": attention_flops(B, H, N, N, d, True, "fwd"),
        "bwd_causal": attention_flops(B, H, N, N, d, True, "bwd"),
        "bwd_no_recompute_causal": attention_flops(B, H, N, N, d, True, "bwd",
                                                   recompute=False),
    }
    hbm = {(impl, p): attention_hbm_bytes(B, H, N, N, d, impl=impl, pass_=p, dtype_bytes=db)
           for impl in ("naive", "flash") for p in ("fwd", "bwd")}

    # The least work each claimed run had to do: the naive backward keeps P and
    # needs no recomputation, so it is held to 4 products, not 5.
    def need_flops(impl, p, causal):
        key = p if (impl == "flash" or p == "fwd") else "bwd_no_recompute"
        return flops[key + ("_causal" if causal else "")]

    floor_ms = {}
    for impl in ("naive", "flash"):
        for p in ("fwd", "bwd"):
            for causal in (False, True):
                floor_ms[(impl, p, causal)] = roofline_ms(
                    need_flops(impl, p, causal), hbm[(impl, p)], chip, "fp16")["floor_ms"]

    claimed_ms = {("naive", "fwd"): 4.2, ("naive", "bwd"): 8.5,
                  ("flash", "fwd"): 3.8, ("flash", "bwd"): 9.1}
    implied = {k: tflops(need_flops(k[0], k[1], False), ms) for k, ms in claimed_ms.items()}

    score_one_head = N * N * db
    mem = {
        "score_matrix_one_head": score_one_head,
        "score_matrices_all_heads": B * H * N * N * db,
        "naive_fwd_extra": attention_memory_bytes(B, H, N, N, d, impl="naive",
                                                  include_inputs=False),
        "naive_fwd_total": attention_memory_bytes(B, H, N, N, d, impl="naive"),
        "flash_fwd_extra": attention_memory_bytes(B, H, N, N, d, impl="flash",
                                                  include_inputs=False),
        "flash_fwd_total": attention_memory_bytes(B, H, N, N, d, impl="flash"),
        "flash_fwd_bwd_extra": attention_memory_bytes(B, H, N, N, d, impl="flash",
                                                      pass_="fwd+bwd", include_inputs=False),
        "inputs_qkv": 3 * B * H * N * d * db,
    }

    claims = {}

    def add(key, text, claimed, unit, computed, relation, verdict, why):
        assert verdict in VERDICTS
        claims[key] = Claim(key, text, claimed, unit, computed, relation, verdict, why)

    # "a [4096, 4096] score matrix, about 64MB (FP16)"
    mb = score_one_head / 1e6
    add("score_matrix_mb", "one head's 4096 x 4096 score matrix in FP16", 64.0, "MB",
        mb, "==", "wrong" if abs(64.0 - mb) / mb > 0.25 else "consistent",
        f"4096 * 4096 * 2 bytes = {score_one_head:,} bytes = {mb:.1f} MB "
        f"({score_one_head / 2**20:.0f} MiB); 64 MiB is its size in FP32.")

    # Memory column. The naive figure cannot even hold S once for every head.
    s_all = mem["score_matrices_all_heads"]
    add("naive_memory", "naive attention's memory", 2.1, "GB", mem["naive_fwd_extra"] / GB,
        ">=", "impossible" if 2.1 * GB < s_all else "consistent",
        f"S alone is B*H*N*N*2 = {s_all / GB:.2f} GB, {s_all / (2.1 * GB):.1f}x the "
        f"claimed total; with O it is at least {mem['naive_fwd_extra'] / GB:.2f} GB on "
        f"top of the {mem['inputs_qkv'] / GB:.2f} GB of Q, K, V.")
    flash_lo = mem["flash_fwd_extra"]
    add("flash_memory", "FlashAttention's memory, beyond Q, K, V", 0.3, "GB", flash_lo / GB, ">=",
        "consistent" if 0.3 * GB >= flash_lo else "impossible",
        f"Only as memory beyond the inputs: O and lse take {flash_lo / GB:.3f} GB, so 0.3 GB "
        f"fits a forward pass. As a total it is impossible: Q, K, V and O alone take "
        f"{(mem['inputs_qkv'] + B * H * N * d * db) / GB:.2f} GB (chapter 5). Counted "
        f"the same way, a forward + backward needs at least "
        f"{mem['flash_fwd_bwd_extra'] / GB:.2f} GB on top of its inputs.")
    r4 = _ratio_floor(N, d, db)
    r4_min = min(r4.values())
    add("memory_ratio_4k", "memory saving at 4K (2.1 GB / 0.3 GB)", 2.1 / 0.3, "x",
        r4_min, ">=", "understated" if 2.1 / 0.3 < r4_min else "consistent",
        f"naive needs at least {r4_min:.1f}x FlashAttention's memory at N = {N}, "
        f"d = {d} (counting inputs; {r4[('fwd', False)]:.0f}x for the forward's memory "
        f"beyond its inputs).")

    # Time columns: the floor is max(FLOPs / peak, bytes / bandwidth).
    names = {"naive": "naive", "flash": "FlashAttention"}
    for (impl, p), ms in claimed_ms.items():
        fl = floor_ms[(impl, p, False)]
        flc = floor_ms[(impl, p, True)]
        r = roofline_ms(need_flops(impl, p, False), hbm[(impl, p)], chip, "fp16")
        verdict = "impossible" if ms < fl else "consistent"
        causal_note = (f"even causal (half the FLOPs) it needs {flc:.1f} ms"
                       if ms < flc else
                       f"only a causal run (half the FLOPs, floor {flc:.2f} ms) could take "
                       f"{ms} ms, at {tflops(need_flops(impl, p, True), ms) / peak:.0%} "
                       f"of peak")
        add(f"{impl}_{p}_time", f"{names[impl]} {'forward' if p == 'fwd' else 'backward'} time",
            ms, "ms", fl, ">=", verdict,
            f"{need_flops(impl, p, False) / 1e12:.2f} TFLOP in {ms} ms is "
            f"{implied[(impl, p)]:.0f} TFLOP/s, {implied[(impl, p)] / peak:.0%} of the "
            f"{c.name}'s {peak:g}; the FLOPs need {r['compute_ms']:.1f} ms and its "
            f"{hbm[(impl, p)] / GB:.1f} GB of HBM traffic {r['memory_ms']:.1f} ms; "
            f"{causal_note}.")

    # "the compute does double" (recomputing S and P in the backward)
    fa_total = flops["fwd"] + flops["bwd"]
    naive_total = flops["fwd"] + flops["bwd_no_recompute"]
    add("recompute_doubles", "recomputation doubles the compute", 2.0, "x",
        flops["bwd"] / flops["bwd_no_recompute"], "==", "wrong",
        f"the backward does 5 matrix products instead of 4: "
        f"{flops['bwd'] / flops['bwd_no_recompute']:.2f}x; forward + backward "
        f"{fa_total / naive_total:.2f}x.")

    # "at 8K, FlashAttention's memory is about 1/10 of the traditional one"
    r8 = _ratio_floor(8192, d, db)
    r8_min = min(r8.values())
    add("memory_ratio_8k", "memory saving at 8K (about 10x)", 10.0, "x", r8_min, ">=",
        "understated" if 10.0 < r8_min else "consistent",
        f"at N = 8192, d = {d} naive needs at least {r8_min:.1f}x FlashAttention's "
        f"memory in every accounting (forward or forward + backward, with or without "
        f"inputs; {max(r8.values()):.0f}x at most); 10x fits only if more than "
        f"attention was measured.")

    return SeedCheck(chip=c.name, batch=B, heads=H, n=N, d=d, dtype_bytes=db,
                     flops=flops, hbm_bytes=hbm, memory_bytes=mem, floor_ms=floor_ms,
                     implied_tflops=implied, claims=claims)


# =============================================================================
# Part 3. The implementations being compared
# =============================================================================

def naive_attention(q, k, v, *, causal: bool = False, scale=None):
    """Attention as three plain PyTorch steps: S = scale Q K^T, P = softmax(S), O = P V.

    Each step is its own kernel and writes a whole (batch, heads, N_q, N_k)
    matrix to device memory; autograd keeps P for the backward. This is what
    FlashAttention replaces. Causal is bottom-right aligned, as everywhere in
    this book; a row that sees no key gives zeros. k and v may have fewer heads
    than q (GQA).
    """
    import torch

    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    s = torch.matmul(q * scale, k.transpose(-2, -1))   # scaling Q is N*d work, not N*N
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(n_k - n_q + 1)
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if causal and q.shape[-2] > k.shape[-2]:
        p = p.nan_to_num(0.0)  # rows with no key: softmax of all -inf is NaN
    return torch.matmul(p, v)


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


def flashbook_variants() -> dict:
    """This book's kernels: ``flashbook``, plus ``flashbook-<mode>`` for each
    ``dq_mode`` other than "separate" that ``flash_attention`` accepts (the
    atomic-dQ backward), plus any ``kernels.BENCH_VARIANTS`` (a dict mapping a
    name to a function with ``flash_attention``'s signature).
    Raises ImportError if the kernels cannot load.
    """
    from . import kernels
    from .kernels import flash_attention

    found = {"flashbook": flash_attention}
    # other ways to compute dQ (e.g. "atomic"), when flash_attention offers them
    if "dq_mode" in inspect.signature(flash_attention).parameters:
        for mode in getattr(kernels, "DQ_MODES", ()):
            if mode != "separate":
                found[f"flashbook-{mode}"] = functools.partial(flash_attention, dq_mode=mode)
    for name, fn in dict(getattr(kernels, "BENCH_VARIANTS", {}) or {}).items():
        found[f"flashbook-{name}"] = fn
    return found


def resolve_impl(name: str):
    """The attention function for one implementation name."""
    if name == "naive":
        return naive_attention
    if name in SDPA_BACKENDS:
        return sdpa_attention(name)
    if name == "flashbook" or name.startswith("flashbook-"):
        variants = flashbook_variants()
        if name not in variants:
            raise ImportError(f"flashbook.kernels has no variant {name!r}; it has "
                              f"{sorted(variants)}")
        return variants[name]
    raise ValueError(f"unknown implementation {name!r}; choose from {list(IMPLEMENTATIONS)}")


# =============================================================================
# Part 4. Shapes and the command line
# =============================================================================

@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool

    @property
    def flops_fwd(self) -> int:
        return attention_flops(self.batch, self.heads, self.seq, self.seq, self.head_dim,
                               self.causal, "fwd")

    @property
    def flops_bwd(self) -> int:
        return attention_flops(self.batch, self.heads, self.seq, self.seq, self.head_dim,
                               self.causal, "bwd")

    def label(self) -> str:
        return (f"d={self.head_dim} N={self.seq} {'causal' if self.causal else 'full'} "
                f"B={self.batch} H={self.heads}")


DEFAULT_SEQS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_HEAD_DIMS = (64, 128)
QUICK_SEQS = (1024, 4096)
QUICK_HEAD_DIMS = (128,)
TOKENS = 32768        # batch * seq: every shape does work on the same number of tokens
MODEL_WIDTH = 2048    # heads * head_dim: 16 heads at d=128, 32 at d=64
SWEEP_SEQS = (4096,)


def heads_for(head_dim: int, model_width: int = MODEL_WIDTH) -> int:
    return max(1, model_width // head_dim)


def make_shapes(seqs, head_dims, causals, *, tokens=TOKENS, heads=None) -> list:
    """Every (head_dim, seq, causal) shape; batch = tokens // seq."""
    shapes = []
    for d in head_dims:
        for n in seqs:
            batch = tokens // n
            if batch < 1:
                raise ValueError(f"seq {n} is longer than --tokens {tokens}: batch would be 0")
            for causal in causals:
                shapes.append(Shape(batch, heads or heads_for(d), n, d, causal))
    return shapes


_SEQ_RE = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


def parse_seq_list(text: str) -> tuple:
    """``"1K,2k,4096"`` -> (1024, 2048, 4096). K means 1024."""
    out = []
    for part in str(text).split(","):
        m = _SEQ_RE.match(part)
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated positive sequence lengths such as "
                f"'1024,4K' (K = 1024), got {text!r}")
        out.append(value)
    return tuple(out)


def parse_int_list(text: str) -> tuple:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated positive integers such as '64,128', got {text!r}")
        out.append(int(part))
    return tuple(out)


def parse_causal(text: str) -> tuple:
    choices = {"both": (False, True), "yes": (True,), "true": (True,), "no": (False,),
               "false": (False,)}
    try:
        return choices[str(text).strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"expected one of both, yes, no; got {text!r}") from None


def parse_impl_list(text: str) -> tuple:
    if str(text).strip() == "all":
        return ("all",)
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if part not in IMPLEMENTATIONS and not re.fullmatch(r"flashbook-[\w.-]+", part):
            raise argparse.ArgumentTypeError(
                f"unknown implementation {part!r}; choose from "
                f"{', '.join(IMPLEMENTATIONS)} (comma-separated) or 'all'")
        out.append(part)
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flashbook.bench",
        description="Time attention forward and backward on this GPU: naive PyTorch, "
                    "PyTorch SDPA backends and flashbook's Triton kernel.")
    p.add_argument("--quick", action="store_true",
                   help="a short run: d=128, seq 1K and 4K, causal and not")
    p.add_argument("--seq", type=parse_seq_list, default=None,
                   help="sequence lengths, e.g. 1K,2K,4K,8K,16K (the default)")
    p.add_argument("--head-dim", type=parse_int_list, default=None,
                   help="head dimensions, e.g. 64,128 (the default)")
    p.add_argument("--causal", type=parse_causal, default=None,
                   help="both (default), yes or no")
    p.add_argument("--impl", type=parse_impl_list, default=("all",),
                   help=f"implementations, comma-separated: {', '.join(IMPLEMENTATIONS)}, "
                        f"flashbook-atomic (the atomic-dQ backward) (default: all)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--tokens", type=int, default=TOKENS,
                   help=f"batch * seq for every shape (default {TOKENS})")
    p.add_argument("--heads", type=int, default=None,
                   help=f"heads (default {MODEL_WIDTH} // head_dim)")
    p.add_argument("--warmup-ms", type=float, default=25.0,
                   help="warm-up time per measurement, ms (default 25)")
    p.add_argument("--rep-ms", type=float, default=None,
                   help="timed repetitions per measurement, ms (default 100, 50 with "
                        "--quick; at least 5 reps)")
    p.add_argument("--max-naive-gb", type=float, default=60.0,
                   help="skip naive and sdpa-math where they would need more memory "
                        "than this, recording 'oom-skipped' (default 60)")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default benchmarks/results/<date>-<gpu>/)")
    p.add_argument("--sweep-blocks", action="store_true",
                   help="instead: sweep block sizes of flashbook's forward kernel "
                        "(default seq 4K, d 64 and 128, not causal)")
    p.add_argument("--ladder", action="store_true",
                   help="time each rung of chapter 10's performance ladder (forward) and "
                        "the two dQ strategies (backward); writes ladder.csv")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and complete the arguments; bad values exit with a clear message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"--tokens must be a positive integer, got {args.tokens}")
    if args.heads is not None and args.heads < 1:
        parser.error(f"--heads must be a positive integer, got {args.heads}")
    if args.rep_ms is None:
        args.rep_ms = 50.0 if args.quick else 100.0
    if args.rep_ms <= 0 or args.warmup_ms < 0:
        parser.error("--rep-ms must be > 0 and --warmup-ms >= 0")
    if args.ladder:
        seqs = args.seq or LADDER_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False, True)
    elif args.sweep_blocks:
        seqs = args.seq or SWEEP_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False,)
    elif args.quick:
        seqs = args.seq or QUICK_SEQS
        head_dims = args.head_dim or QUICK_HEAD_DIMS
        causals = args.causal or (False, True)
    else:
        seqs = args.seq or DEFAULT_SEQS
        head_dims = args.head_dim or DEFAULT_HEAD_DIMS
        causals = args.causal or (False, True)
    try:
        args.shapes = make_shapes(seqs, head_dims, causals, tokens=args.tokens,
                                  heads=args.heads)
    except ValueError as err:
        parser.error(f"--seq: {err}")
    return args


# =============================================================================
# Part 5. Measuring on the GPU
# =============================================================================

STATUSES = ("ok", "unsupported", "oom", "oom-skipped", "error", "unavailable",
            "cuda-error", "not-run")

# Relative error (Frobenius) against a float64 reference on one (batch, head)
# slice. bf16 keeps 8 significant bits (unit roundoff 2**-8 = 0.0039): rounding
# Q, K, V, P and O alone gives errors of a few 1e-3, and gradients pass through
# more rounded products; these bounds are several times what a correct kernel
# shows and far below what a wrong one does.
TOLERANCE = {"out": 2e-2, "grad": 5e-2}


@dataclass
class Result:
    """One implementation on one shape. Times in ms, memory in bytes."""

    impl: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    dtype: str
    status: str = "ok"
    fwd_ms: float | None = None
    bwd_ms: float | None = None
    fwd_tflops: float | None = None
    bwd_tflops: float | None = None
    peak_fwd_bytes: int | None = None       # peak beyond the inputs, forward (with grad)
    peak_fwd_bwd_bytes: int | None = None   # peak beyond the inputs, forward + backward
    floor_fwd_bwd_bytes: int | None = None  # attention_memory_bytes lower bound, same terms
    err_out: float | None = None
    err_grad: float | None = None
    check: str = ""                         # "pass", "FAIL" or "" (not checked)
    note: str = ""


RESULT_FIELDS = [f.name for f in dataclasses.fields(Result)]


def classify_error(exc: BaseException, impl: str) -> tuple:
    """(status, note) for an exception raised while running ``impl``.

    Out of memory is "oom"; an SDPA backend that refuses a shape is
    "unsupported"; kernels that cannot be imported are "unavailable"; a CUDA
    error that poisons the context is "cuda-error" (the sweep stops); anything
    else is "error".
    """
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:300] if text else type(exc).__name__
    low = text.lower()
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in low:
        return "oom", first
    if type(exc).__name__ == "OutOfResources":
        return "error", first
    if ("illegal memory access" in low or "device-side assert" in low
            or "unspecified launch failure" in low or "cuda error: an illegal" in low):
        return "cuda-error", first
    if isinstance(exc, ImportError):
        return "unavailable", first
    if impl in SDPA_BACKENDS:
        return "unsupported", first
    return "error", first


def _rel_err(x, ref) -> float:
    x = x.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


class CudaTimer:
    """Median time of ``fn`` in ms, timed with CUDA events.

    Warm-up first (``warmup_ms`` worth of calls), then at least ``min_reps``
    timed calls (``rep_ms`` worth, at most ``max_reps``), each after writing a
    256 MB buffer so that no input sits in the L2 cache from the call before.
    """

    def __init__(self, warmup_ms=25.0, rep_ms=100.0, min_reps=5, max_reps=200):
        import torch

        self.torch = torch
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps = min_reps, max_reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def __call__(self, fn) -> float:
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            self.flush.zero_()
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 3, 1e-3)
        n_warm = min(self.max_reps, max(1, int(self.warmup_ms / estimate)))
        n_rep = min(self.max_reps, max(self.min_reps, int(self.rep_ms / estimate)))
        for _ in range(n_warm):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


class CudaMemory:
    """Peak device memory beyond what was allocated when ``start`` was called."""

    def __init__(self):
        import torch

        self.torch = torch
        self.base = 0

    def start(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        self.base = self.torch.cuda.memory_allocated()

    def peak(self) -> int:
        self.torch.cuda.synchronize()
        return int(self.torch.cuda.max_memory_allocated() - self.base)

    def free_bytes(self) -> int:
        free, _total = self.torch.cuda.mem_get_info()
        return int(free)

    def release(self):
        gc.collect()
        self.torch.cuda.empty_cache()


def make_inputs(shape: Shape, dtype, device, generator=None):
    """Fresh standard-normal q, k, v (requiring grad) and dO for one shape."""
    import torch

    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    q, k, v, do = (torch.randn(size, dtype=dtype, device=device, generator=generator)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def reference_slice(q, k, v, do, causal, heads=1):
    """float64 output and gradients of batch 0, the first ``heads`` heads."""
    import torch

    sl = (slice(0, 1), slice(0, heads))
    q64, k64, v64 = (t.detach()[sl].double().requires_grad_(True) for t in (q, k, v))
    o = naive_attention(q64, k64, v64, causal=causal)
    grads = torch.autograd.grad(o, (q64, k64, v64), do[sl].double())
    return o.detach(), [g.detach() for g in grads]


def skip_reason(impl: str, shape: Shape, dtype_bytes: int, limit_bytes: float):
    """Why ``impl`` is not even tried on ``shape`` (None: try it)."""
    if impl not in ("naive", "sdpa-math"):
        return None
    # sdpa-math computes half-precision inputs in fp32 (PyTorch's default)
    elem = 4 if impl == "sdpa-math" else dtype_bytes
    need = naive_memory_estimate(shape.batch, shape.heads, shape.seq, shape.seq,
                                 shape.head_dim, elem_bytes=elem)
    if need > limit_bytes:
        return (f"needs about {need / GB:.1f} GB (4 N x N matrices of {elem} bytes), "
                f"over the {limit_bytes / GB:.0f} GB limit")
    return None


def bench_case(name, fn, shape: Shape, inputs, *, dtype_name, timer, memory,
               ref=None, skip=None) -> Result:
    """Measure one implementation on one shape. Never raises for the kernel's
    sake: failures become a status and a note.

    Steps: one forward + backward (compiles, warms up, shows unsupported shapes
    early); one more to measure peak memory (beyond the inputs) and check the
    result against ``ref``; then the forward time and the backward alone
    (``torch.autograd.grad`` on a kept graph, ``retain_graph=True``).
    """
    import torch

    q, k, v, do = inputs
    res = Result(impl=name, batch=shape.batch, heads=shape.heads, seq=shape.seq,
                 head_dim=shape.head_dim, causal=shape.causal, dtype=dtype_name)
    res.floor_fwd_bwd_bytes = attention_memory_bytes(
        shape.batch, shape.heads, shape.seq, shape.seq, shape.head_dim,
        impl="naive" if name in ("naive", "sdpa-math") else "flash", pass_="fwd+bwd",
        dtype_bytes=q.element_size(), include_inputs=False)
    if skip:
        res.status, res.note = "oom-skipped", skip
        return res

    def forward():
        return fn(q, k, v, causal=shape.causal)

    stage = "first run"
    out = grads = None
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = forward()
            grads = torch.autograd.grad(out, (q, k, v), do)
            out = grads = None

            stage = "memory"
            memory.start()
            out = forward()
            res.peak_fwd_bytes = memory.peak()
            grads = torch.autograd.grad(out, (q, k, v), do)
            res.peak_fwd_bwd_bytes = memory.peak()
            if ref is not None:
                o_ref, g_ref = ref
                hs = o_ref.shape[1]
                res.err_out = _rel_err(out.detach()[:1, :hs], o_ref)
                res.err_grad = max(_rel_err(g[:1, :hs], r) for g, r in zip(grads, g_ref))
                ok = (math.isfinite(res.err_out) and math.isfinite(res.err_grad)
                      and res.err_out < TOLERANCE["out"] and res.err_grad < TOLERANCE["grad"])
                res.check = "pass" if ok else "FAIL"
            out = grads = None

            stage = "forward timing"
            res.fwd_ms = timer(forward)
            res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)

            stage = "backward timing"
            out = forward()
            res.bwd_ms = timer(lambda: torch.autograd.grad(out, (q, k, v), do,
                                                           retain_graph=True))
            res.bwd_tflops = tflops(shape.flops_bwd, res.bwd_ms)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none stops the sweep
        res.status, res.note = classify_error(exc, name)
        # SDPA says why a backend refused a shape in warnings, before it raises
        reasons = [str(w.message).strip().splitlines()[0] for w in caught
                   if str(w.message).strip()]
        if res.status == "unsupported" and reasons:
            res.note = "; ".join(dict.fromkeys(reasons + [res.note]))[:400]
        res.note = f"{stage}: {res.note}"
    finally:
        out = grads = None
        memory.release()
    return res


def run_sweep(args, impls, *, progress=True):
    """Run every shape x implementation; returns the list of ``Result``."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer = CudaTimer(args.warmup_ms, args.rep_ms)
    memory = CudaMemory()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    total_mem = torch.cuda.get_device_properties(0).total_memory

    functions, unavailable = {}, {}
    for name in impls:
        try:
            functions[name] = resolve_impl(name)
        except Exception as exc:  # noqa: BLE001
            unavailable[name] = classify_error(exc, name)

    cases = [(s, name) for s in args.shapes for name in impls]
    bar = _progress(len(cases), progress)
    results, stop = [], None
    for shape in args.shapes:
        inputs = make_inputs(shape, dtype, "cuda", gen)
        try:
            ref = reference_slice(*inputs, shape.causal)
        except Exception:  # noqa: BLE001 - no check for this shape rather than no run
            ref = None
        memory.release()
        limit = min(args.max_naive_gb * GB, 0.9 * total_mem)
        for name in impls:
            bar.set_description(f"{shape.label()} {name}")
            if stop:
                res = Result(name, shape.batch, shape.heads, shape.seq, shape.head_dim,
                             shape.causal, args.dtype, status="not-run", note=stop)
            elif name in unavailable:
                status, note = unavailable[name]
                res = Result(name, shape.batch, shape.heads, shape.seq, shape.head_dim,
                             shape.causal, args.dtype, status=status, note=note)
            else:
                res = bench_case(name, functions[name], shape, inputs, dtype_name=args.dtype,
                                 timer=timer, memory=memory, ref=ref,
                                 skip=skip_reason(name, shape, inputs[0].element_size(), limit))
                if res.status == "cuda-error":
                    stop = f"not run: an earlier CUDA error ({name}, {shape.label()})"
            results.append(res)
            bar.update(1)
        del inputs, ref
        memory.release()
    bar.close()
    return results


class _NoBar:
    def set_description(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def _progress(total, enabled):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr)


# =============================================================================
# Part 6. Block sizes of our forward kernel
# =============================================================================

#: The grid the sweep walks: B_r (block_m), B_c (block_n), warps, pipeline stages.
BLOCK_GRID = {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8),
              "num_stages": (2, 3, 4)}


@dataclass
class ShapeRow:
    """The shape columns a sweep or ladder row starts with."""

    seq: int
    head_dim: int
    batch: int
    heads: int
    causal: bool
    dtype: str


@dataclass
class BlockResult(ShapeRow):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    status: str = "ok"
    fwd_ms: float | None = None
    fwd_tflops: float | None = None
    n_regs: int | None = None
    n_spills: int | None = None
    shared_bytes: int | None = None
    err_out: float | None = None
    note: str = ""


BLOCK_FIELDS = [f.name for f in dataclasses.fields(BlockResult)]


def block_configs(grid=None) -> list:
    """Every combination of the grid, as dicts."""
    grid = grid or BLOCK_GRID
    keys = list(grid)
    combos = [{}]
    for key in keys:
        combos = [dict(c, **{key: v}) for c in combos for v in grid[key]]
    return combos


def kernel_resources(launched) -> dict:
    """Registers, spills and shared memory of a compiled Triton kernel.

    ``launched`` is what ``forward_with_config`` returned: a compiled kernel, a
    tuple holding one (e.g. ``(o, lse, kernel)``), or a dict with the keys. A
    Triton ``CompiledKernel`` has ``n_regs`` and ``n_spills`` (after its first
    launch) and ``metadata.shared`` (bytes). Missing values are None.
    """
    found = {"n_regs": None, "n_spills": None, "shared_bytes": None}
    items = list(launched) if isinstance(launched, (tuple, list)) else [launched]
    for item in items:
        if isinstance(item, dict):
            if any(k in item for k in ("n_regs", "n_spills", "shared", "shared_bytes")):
                found["n_regs"] = item.get("n_regs")
                found["n_spills"] = item.get("n_spills")
                found["shared_bytes"] = item.get("shared_bytes", item.get("shared"))
                return found
            continue
        meta = getattr(item, "metadata", None)
        if meta is not None or hasattr(item, "n_regs"):
            found["n_regs"] = getattr(item, "n_regs", None)
            found["n_spills"] = getattr(item, "n_spills", None)
            shared = getattr(meta, "shared", None) if meta is not None else None
            if shared is None and isinstance(meta, dict):
                shared = meta.get("shared")
            found["shared_bytes"] = shared if shared is not None else getattr(item, "shared", None)
            return found
    return found


def _first_tensor(launched):
    import torch

    if isinstance(launched, torch.Tensor):
        return launched
    if isinstance(launched, (tuple, list)):
        for item in launched:
            if isinstance(item, torch.Tensor):
                return item
    return None


def _compiled_kernels(functions) -> list:
    """Every compiled kernel in the caches of these Triton JIT functions."""
    found = []
    for fn in functions:
        try:
            for cache in fn.device_caches.values():
                found.extend(cache[0].values())
        except Exception:  # noqa: BLE001 - another Triton version keeps its cache elsewhere
            pass
    return found


def block_sweep_hook(kernels):
    """``(hook, how)``: the function the block sweep calls, or ``(None, why not)``.

    The hook is ``kernels.forward_with_config(q, k, v, causal, scale, block_m,
    block_n, num_warps, num_stages)`` when the kernels define it. Otherwise, when
    ``kernels.forward`` takes a ``config=kernels.configs.Config(...)``, an adapter
    around it, which finds the kernel each config compiled in the Triton JIT
    caches of ``forward``'s module (so registers and shared memory can be read).
    """
    hook = getattr(kernels, "forward_with_config", None)
    if callable(hook):
        return hook, "flashbook.kernels.forward_with_config"
    forward = getattr(kernels, "flash_forward", None) or getattr(kernels, "forward", None)
    config_cls = getattr(getattr(kernels, "configs", None), "Config", None)
    try:
        takes_config = "config" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        takes_config = False
    if not (callable(forward) and config_cls and takes_config):
        return None, ("flashbook.kernels has no forward_with_config(q, k, v, causal, scale, "
                      "block_m, block_n, num_warps, num_stages), nor a flash_forward(..., config=) "
                      "with configs.Config")
    jit_functions = [v for v in getattr(forward, "__globals__", {}).values()
                     if hasattr(v, "device_caches")]
    seen = {}

    def forward_with_config(q, k, v, causal, scale, block_m, block_n, num_warps, num_stages):
        before = {id(x) for x in _compiled_kernels(jit_functions)}
        o, lse = forward(q, k, v, causal=causal, scale=scale,
                         config=config_cls(block_m, block_n, num_warps, num_stages))
        new = [x for x in _compiled_kernels(jit_functions) if id(x) not in before]
        key = (block_m, block_n, num_warps, num_stages, q.shape[-1], q.dtype, bool(causal))
        if len(new) == 1:
            seen[key] = new[0]
        return (o, lse, seen[key]) if key in seen else (o, lse)

    return forward_with_config, "flashbook.kernels.forward(config=...)"


def run_block_sweep(args, hook, *, progress=True) -> list:
    """Time ``hook(q, k, v, causal, scale, block_m, block_n, num_warps, num_stages)``
    for every config of ``BLOCK_GRID`` on every shape."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer = CudaTimer(args.warmup_ms, args.rep_ms)
    memory = CudaMemory()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    configs = block_configs()
    bar = _progress(len(configs) * len(args.shapes), progress)
    results = []
    for shape in args.shapes:
        q, k, v, _do = make_inputs(shape, dtype, "cuda", gen)
        q, k, v = (t.detach() for t in (q, k, v))
        with torch.no_grad():
            o_ref = naive_attention(q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double(),
                                    causal=shape.causal)
        scale = 1.0 / math.sqrt(shape.head_dim)
        for cfg in configs:
            bar.set_description(f"{shape.label()} {cfg}")
            res = BlockResult(shape.seq, shape.head_dim, shape.batch, shape.heads,
                              shape.causal, args.dtype, **cfg)

            def launch(cfg=cfg):
                return hook(q, k, v, shape.causal, scale, cfg["block_m"], cfg["block_n"],
                            cfg["num_warps"], cfg["num_stages"])
            try:
                with torch.no_grad():
                    launched = launch()
                    torch.cuda.synchronize()
                    res.__dict__.update(kernel_resources(launched))
                    o = _first_tensor(launched)
                    if o is not None:
                        res.err_out = _rel_err(o[:1, :1], o_ref)
                    del launched, o
                    res.fwd_ms = timer(launch)
                res.fwd_tflops = tflops(shape.flops_fwd, res.fwd_ms)
            except Exception as exc:  # noqa: BLE001
                res.status, res.note = classify_error(exc, "flashbook")
                if type(exc).__name__ == "OutOfResources":
                    res.status = "out-of-resources"
            finally:
                memory.release()
            results.append(res)
            bar.update(1)
            if res.status == "cuda-error":
                bar.close()
                return results
        del q, k, v
    bar.close()
    return results


LADDER_SEQS = (4096, 16384)


@dataclass
class LadderResult(ShapeRow):
    """One rung of chapter 10's ladder on one shape (``pass_`` "fwd" or "bwd")."""

    rung: int
    name: str
    pass_: str
    status: str = "ok"
    ms: float | None = None
    tflops: float | None = None
    err_out: float | None = None
    note: str = ""


LADDER_FIELDS = [f.name for f in dataclasses.fields(LadderResult)]


def run_ladder(args, *, progress=True) -> list:
    """Time every forward rung of ``kernels.ladder.RUNGS`` and both backward dQ
    strategies on every shape; each output is checked against float64."""
    import torch

    from .kernels import flash_attention
    from .kernels.ladder import RUNGS, run_rung

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    timer = CudaTimer(args.warmup_ms, args.rep_ms)
    memory = CudaMemory()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    steps = [("fwd", i, r.name) for i, r in enumerate(RUNGS)]
    steps += [("bwd", len(RUNGS) + i, f"dQ {mode}") for i, mode in enumerate(("atomic", "separate"))]
    bar = _progress(len(steps) * len(args.shapes), progress)
    results = []
    for shape in args.shapes:
        q, k, v, do = make_inputs(shape, dtype, "cuda", gen)
        with torch.no_grad():
            o_ref = naive_attention(q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double(),
                                    causal=shape.causal)
        for pass_, index, name in steps:
            bar.set_description(f"{shape.label()} {name}")
            res = LadderResult(shape.seq, shape.head_dim, shape.batch, shape.heads,
                               shape.causal, args.dtype, index, name, pass_)
            try:
                if pass_ == "fwd":
                    rung = RUNGS[index]
                    with torch.no_grad():
                        def call(rung=rung):
                            return run_rung(rung, q, k, v, causal=shape.causal)
                        res.err_out = _rel_err(call()[0][:1, :1], o_ref)
                        res.ms = timer(call)
                    res.tflops = tflops(shape.flops_fwd, res.ms)
                else:
                    mode = name.split()[-1]
                    out = flash_attention(q, k, v, causal=shape.causal, dq_mode=mode)
                    res.err_out = _rel_err(out[:1, :1].detach(), o_ref)
                    res.ms = timer(lambda out=out: torch.autograd.grad(out, (q, k, v), do,
                                                                       retain_graph=True))
                    res.tflops = tflops(2.5 * shape.flops_fwd, res.ms)
                    del out
            except Exception as exc:  # noqa: BLE001
                res.status, res.note = classify_error(exc, "flashbook")
            finally:
                memory.release()
            results.append(res)
            bar.update(1)
        del q, k, v, do
    bar.close()
    return results


def format_ladder_table(results) -> str:
    lines = [f"{'shape':<28} {'pass':<4} {'rung':<22} {'ms':>9} {'TFLOP/s':>8} {'err':>9}"]
    for r in results:
        shape = shape_label(r.head_dim, r.seq, r.causal)
        lines.append(f"{shape:<28} {r.pass_:<4} {r.name:<22} {_fmt(r.ms, '.3f'):>9} "
                     f"{_fmt(r.tflops, '.1f'):>8} {_fmt(r.err_out, '.1e'):>9}"
                     + ("" if r.status == "ok" else f"  {r.status}: {r.note[:60]}"))
    return "\n".join(lines)


# =============================================================================
# Part 7. Writing down what was measured, and where
# =============================================================================

#: Keys every provenance.json has.
PROVENANCE_KEYS = ("date_utc", "command", "gpu", "driver", "cuda", "cudnn", "torch",
                   "triton", "python", "flashbook", "git_commit", "source_sha256",
                   "settings", "timing", "conventions", "files")


def _driver_version():
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - not installed, or no GPU
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, check=False)
        first = done.stdout.strip().splitlines()
        return first[0].strip() if done.returncode == 0 and first else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_commit():
    """HEAD's commit, with "+changes" when the package's sources differ from it
    (``source_sha256`` then names the sources that ran)."""
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
        commit = (done.stdout.strip() or None) if done.returncode == 0 else None
        if commit:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "flashbook"],
                                   capture_output=True, text=True, timeout=10, check=False)
            if dirty.returncode == 0 and dirty.stdout.strip():
                commit += "+changes"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest() -> str:
    """SHA-256 of flashbook's Python sources: ties results to the code that made
    them, also where the checkout has no git history."""
    import hashlib

    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def gpu_info() -> dict | None:
    """Name, compute capability, SMs, memory of GPU 0 (None without one)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    info = {"name": props.name, "capability": f"sm_{props.major}{props.minor}",
            "sms": props.multi_processor_count, "memory_bytes": int(props.total_memory)}
    for attr in ("shared_memory_per_block_optin", "L2_cache_size"):
        if hasattr(props, attr):
            info[attr] = int(getattr(props, attr))
    chip = match_chip(props.name)
    if chip:
        c = runtime.chip(chip)
        info["datasheet"] = {"chip": chip, "bf16_tflops": c.bf16_tflops,
                             "fp16_tflops": c.fp16_tflops, "hbm_tb_s": c.hbm_tb_s}
    return info


def match_chip(gpu_name: str):
    """The ``runtime.CHIPS`` key whose name appears in a GPU's name, if any."""
    for key in runtime.CHIPS:
        if key.lower() in str(gpu_name).lower():
            return key
    return None


def command_line(argv) -> str:
    """The command that reproduces this run (no paths of this machine in it)."""
    return " ".join(shlex.quote(a) for a in ["python", "-m", "flashbook.bench", *argv])


def collect_provenance(argv, args=None) -> dict:
    """Everything needed to judge or repeat a run. No hostname, no user name."""
    versions = {}
    for mod in ("torch", "triton"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    cuda = cudnn = None
    math_upcasts = None
    try:
        import torch

        cuda = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        math_upcasts = not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    except Exception:  # noqa: BLE001
        pass
    from . import __version__

    settings = {}
    if args is not None:
        settings = {
            "dtype": args.dtype, "tokens": args.tokens, "seed": args.seed,
            "max_naive_gb": args.max_naive_gb, "sweep_blocks": bool(args.sweep_blocks),
            "shapes": [dataclasses.asdict(s) for s in args.shapes],
            "impl": list(args.impl),
        }
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(argv),
        "gpu": gpu_info(),
        "driver": _driver_version(),
        "cuda": cuda,
        "cudnn": cudnn,
        "torch": versions["torch"],
        "triton": versions["triton"],
        "python": sys.version.split()[0],
        "flashbook": __version__,
        "git_commit": _git_commit(),
        "source_sha256": source_digest(),
        "settings": settings,
        "timing": {
            "method": "CUDA events around each call, a 256 MB buffer written before each "
                      "timed call (L2 flushed)",
            "statistic": "median",
            "warmup_ms": getattr(args, "warmup_ms", None),
            "rep_ms": getattr(args, "rep_ms", None),
            "min_reps": 5,
            "forward": "inputs require grad (a training forward)",
            "backward": "torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) alone",
            "memory": "torch.cuda.max_memory_allocated after reset, minus memory "
                      "allocated before the call (inputs q, k, v, dO)",
            "sdpa_math_upcasts_to_fp32": math_upcasts,
        },
        "conventions": {
            "flops_fwd": "4 * batch * heads * seq**2 * head_dim, halved when causal",
            "flops_bwd": "2.5 * flops_fwd",
            "check": f"relative Frobenius error of batch 0, head 0 against float64; "
                     f"pass if out < {TOLERANCE['out']} and grads < {TOLERANCE['grad']}",
        },
        "files": {},
    }


def _to_cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_csv(rows, path, fields) -> Path:
    """Write dataclass rows (or dicts) to CSV, None as an empty cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        writer.writeheader()
        for row in rows:
            data = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
            writer.writerow({k: _to_cell(data.get(k)) for k in fields})
    return path


def _from_cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def read_csv(path) -> list:
    """Rows of a CSV written by ``write_csv``, as dicts of Python values."""
    with Path(path).open(newline="") as fh:
        return [{k: _from_cell(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def write_provenance(prov: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    missing = [k for k in PROVENANCE_KEYS if k not in prov]
    if missing:
        raise ValueError(f"provenance is missing keys {missing}")
    path.write_text(json.dumps(prov, indent=2, sort_keys=False) + "\n")
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "gpu"


def default_out_dir(gpu_name: str, date: str | None = None, base=None) -> Path:
    """``benchmarks/results/<date>-<gpu>/`` in this checkout (or the current
    directory when flashbook is installed elsewhere); ``-2``, ``-3``... when
    that directory already holds results."""
    date = date or _dt.date.today().isoformat()
    if base is None:
        repo = Path(__file__).resolve().parents[1]
        base = repo / "benchmarks" / "results" if (repo / "benchmarks").is_dir() \
            else Path.cwd() / "benchmarks" / "results"
    base = Path(base)
    name = f"{date}-{_slug(gpu_name)}"
    out, n = base / name, 1
    while out.exists() and any(out.iterdir()):
        n += 1
        out = base / f"{name}-{n}"
    return out


def _fmt(value, spec):
    """``value`` formatted by ``spec`` ("9.3f"), or blanks of the same width."""
    if value is None:
        return " " * int(re.match(r"\d*", spec).group() or 0)
    return format(value, spec)


def format_table(results) -> str:
    """The results as a fixed-width text table, one block per shape."""
    head = (f"{'impl':<16}{'fwd ms':>9}{'TFLOP/s':>9}{'bwd ms':>9}{'TFLOP/s':>9}"
            f"{'peak GB':>9}{'floor GB':>9}  {'check':<6}status")
    lines, last = [], None
    for r in results:
        key = (r.head_dim, r.seq, r.causal, r.batch, r.heads)
        if key != last:
            lines += ["", f"d={r.head_dim}  N={r.seq}  {'causal' if r.causal else 'not causal'}"
                          f"  batch={r.batch}  heads={r.heads}  {r.dtype}", head]
            last = key
        peak = None if r.peak_fwd_bwd_bytes is None else r.peak_fwd_bwd_bytes / GB
        floor = None if r.floor_fwd_bwd_bytes is None else r.floor_fwd_bwd_bytes / GB
        status = r.status if r.status == "ok" else f"{r.status}: {r.note}"[:70]
        lines.append(f"{r.impl:<16}{_fmt(r.fwd_ms, '9.3f')}{_fmt(r.fwd_tflops, '9.1f')}"
                     f"{_fmt(r.bwd_ms, '9.3f')}{_fmt(r.bwd_tflops, '9.1f')}"
                     f"{_fmt(peak, '9.2f')}{_fmt(floor, '9.2f')}  {r.check:<6}{status}")
    return "\n".join(lines).lstrip("\n")


def format_block_table(results) -> str:
    head = (f"{'B_r':>5}{'B_c':>5}{'warps':>6}{'stages':>7}{'ms':>9}{'TFLOP/s':>9}"
            f"{'regs':>6}{'spills':>7}{'smem KiB':>9}  status")
    lines, last = [], None
    for r in results:
        key = (r.head_dim, r.seq, r.causal)
        if key != last:
            lines += ["", f"d={r.head_dim}  N={r.seq}  {'causal' if r.causal else 'not causal'}"
                          f"  batch={r.batch}  heads={r.heads}", head]
            last = key
        smem = None if r.shared_bytes is None else r.shared_bytes / 1024
        status = r.status if r.status == "ok" else f"{r.status}: {r.note}"[:60]
        lines.append(f"{r.block_m:>5}{r.block_n:>5}{r.num_warps:>6}{r.num_stages:>7}"
                     f"{_fmt(r.fwd_ms, '9.3f')}{_fmt(r.fwd_tflops, '9.1f')}"
                     f"{_fmt(r.n_regs, '6d')}{_fmt(r.n_spills, '7d')}{_fmt(smem, '9.1f')}"
                     f"  {status}")
    return "\n".join(lines).lstrip("\n")


# =============================================================================
# Part 8. Reading what was recorded (chapter 9)
# =============================================================================
#
# Chapter 9 draws every figure from the files that Part 7 wrote, never from the
# machine that builds the book. These functions find the newest run, read it back
# with its provenance, and turn its rows into the ratios, targets and roofline
# points the chapter shows. They need pandas, and no GPU.

from .resources import RESULTS_ENV, results_dir  # noqa: E402  (where recorded runs live)

#: The columns that name one shape: a row is one implementation on one shape.
SHAPE_KEYS = ("batch", "heads", "seq", "head_dim", "causal", "dtype")

_TEXT_COLUMNS = ("impl", "dtype", "status", "check", "note")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def results_root(root=None):
    """The directory that holds recorded runs, or None: ``flashbook.resources.results_dir``."""
    return results_dir(root)


def provenance_for(csv_path) -> dict:
    """The provenance of one CSV: a JSON file beside it, with "provenance" in its
    name, whose ``files`` names that CSV (or names no file at all). ``{}`` if none.

    Two runs written into one directory leave one provenance.json, the second's:
    it names only its own CSV, so the other CSV is not given the wrong machine.
    """
    csv_path = Path(csv_path)
    candidates = sorted(csv_path.parent.glob("*provenance*.json"),
                        key=lambda p: (p.name != "provenance.json", p.name))
    fallback = {}
    for path in candidates:
        try:
            prov = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(prov, dict):
            continue
        files = prov.get("files") or {}
        if csv_path.name in files:
            return prov
        if not files and not fallback:
            fallback = prov
    return fallback


def provenance_summary(prov: dict) -> dict:
    """What a chapter shows beside measured numbers, read from one provenance dict:
    GPU, driver, CUDA, cuDNN, torch, triton, date and command, each as text
    ("not recorded" where the provenance lacks it)."""
    prov = prov or {}
    gpu = prov.get("gpu") or {}
    name = gpu.get("name") if isinstance(gpu, dict) else gpu
    if name and isinstance(gpu, dict) and (gpu.get("capability") or gpu.get("sms")):
        extras = [str(gpu["capability"])] if gpu.get("capability") else []
        extras += [f"{gpu['sms']} SMs"] if gpu.get("sms") else []
        name = f"{name} ({', '.join(extras)})"
    values = {"GPU": name, "driver": prov.get("driver"), "CUDA": prov.get("cuda"),
              "cuDNN": prov.get("cudnn"), "torch": prov.get("torch"),
              "triton": prov.get("triton"), "date (UTC)": prov.get("date_utc"),
              "command": prov.get("command")}
    return {k: "not recorded" if v in (None, "") else str(v) for k, v in values.items()}


def run_date(csv_path) -> str:
    """When a CSV was measured, as text that sorts in time order: the provenance's
    ``date_utc``, else a YYYY-MM-DD in the directory names, else the file's mtime."""
    csv_path = Path(csv_path)
    date = provenance_for(csv_path).get("date_utc")
    if date:
        return str(date)
    for part in reversed(csv_path.parent.parts):
        found = _DATE_RE.search(part)
        if found:
            return found.group()
    mtime = _dt.datetime.fromtimestamp(csv_path.stat().st_mtime, _dt.timezone.utc)
    return mtime.isoformat(timespec="seconds")


def find_runs(root=None, csv_name: str = "results.csv") -> list:
    """Every ``csv_name`` under the results root (at any depth), newest first."""
    root = results_root(root)
    if root is None:
        return []
    found = [p for p in root.rglob(csv_name) if p.is_file()]
    return sorted(found, key=lambda p: (run_date(p), str(p)), reverse=True)


def latest_results(root=None, csv_name: str = "results.csv"):
    """The newest recorded ``results.csv`` (a Path), or None when nothing is recorded."""
    runs = find_runs(root, csv_name)
    return runs[0] if runs else None


def latest_blocks(root=None):
    """The newest recorded ``blocks.csv`` (from ``--sweep-blocks``), or None."""
    return latest_results(root, "blocks.csv")


def latest_ladder(root=None):
    """The newest recorded ``ladder.csv`` (from ``--ladder``), or None."""
    return latest_results(root, "ladder.csv")


#: The columns that name one shape of the ladder (a pass is a ladder of its own).
LADDER_KEYS = ("pass_", "batch", "heads", "seq", "head_dim", "causal", "dtype")


def ladder_speedups(ladder):
    """The ladder (``load_results`` of a ``ladder.csv``) sorted by pass, shape and
    rung, with two columns added per row: ``vs_prev``, the previous rung's time
    over this one's, and ``vs_first``, the pass's first rung's time over this
    one's (> 1: this rung is faster; the same as the ratio of TFLOP/s, since every
    rung of a pass does the same FLOPs). NaN where either did not run."""
    keys = [k for k in LADDER_KEYS if k in ladder.columns]
    out = ladder.sort_values(keys + ["rung"]).reset_index(drop=True)
    ms = out["ms"].where(out["status"].eq("ok")).astype(float)
    groups = ms.groupby([out[k] for k in keys], sort=False)
    out["vs_prev"] = groups.shift(1) / ms
    out["vs_first"] = groups.transform(lambda s: s.iloc[0]) / ms
    return out


def _typed_frame(df):
    """Text columns as text ("" for empty), ``causal`` as bool, numbers as numbers
    (NaN for empty); a column this module does not know stays text unless every
    value in it is a number."""
    import pandas as pd

    for col in df.columns:
        if col in _TEXT_COLUMNS:
            df[col] = df[col].fillna("").astype(str)
        elif col == "causal":
            df[col] = df[col].astype(str).str.strip().str.lower().eq("true")
        else:
            numbers = pd.to_numeric(df[col], errors="coerce")
            given = df[col].notna() & df[col].map(lambda v: v != "")
            known = col in RESULT_FIELDS or col in BLOCK_FIELDS
            df[col] = numbers if known or numbers[given].notna().all() \
                else df[col].fillna("").astype(str)
    return df


def load_results(path):
    """``(DataFrame, provenance dict)`` of one recorded CSV (``results.csv`` or
    ``blocks.csv``; a directory means the ``results.csv`` in it). Empty cells are
    NaN in number columns and "" in text columns; provenance is ``{}`` if none."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"path must be a recorded CSV or a directory holding "
                                f"results.csv, got {str(path)!r}")
    df = _typed_frame(pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""]))
    return df, provenance_for(path)


def results_frame(results):
    """A DataFrame of ``Result`` or ``BlockResult`` rows (a live run), typed like
    ``load_results`` gives them."""
    import pandas as pd

    rows = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in results]
    fields = BLOCK_FIELDS if rows and "block_m" in rows[0] else RESULT_FIELDS
    return _typed_frame(pd.DataFrame(rows, columns=fields))


def shape_label(head_dim, seq, causal, batch=None, heads=None) -> str:
    """``"d=128 N=4096 causal"`` (with ``B=.. H=..`` when given)."""
    text = f"d={int(head_dim)} N={int(seq)} {'causal' if causal else 'full'}"
    if batch is not None and heads is not None:
        text += f" B={int(batch)} H={int(heads)}"
    return text


def _by_shape(df, impl):
    keys = [k for k in SHAPE_KEYS if k in df.columns]
    rows = df[df["impl"] == impl]
    if rows.empty:
        raise ValueError(f"the results have no rows for impl {impl!r}; they have "
                         f"{sorted(set(df['impl']))}")
    rows = rows.set_index(keys)
    if rows.index.duplicated().any():
        raise ValueError(f"impl {impl!r} has more than one row for a shape")
    return rows


def speedup_table(df, baseline: str = "sdpa-flash", impl: str = "flashbook"):
    """Our kernel against ``baseline``, one row per shape ``impl`` was run on.

    ``fwd`` and ``bwd``: the baseline's time over ours (> 1: ours is faster; the
    same as the ratio of TFLOP/s, since both do the same FLOPs). ``memory``: our
    peak memory beyond the inputs over the baseline's (< 1: ours holds less).
    NaN where either was not measured (a status other than "ok").
    """
    import pandas as pd

    mine, base = _by_shape(df, impl), _by_shape(df, baseline)
    base = base.reindex(mine.index)
    ok_m, ok_b = mine["status"].eq("ok"), base["status"].eq("ok")
    out = pd.DataFrame(index=mine.index)
    out["fwd"] = (base["fwd_ms"].where(ok_b) / mine["fwd_ms"].where(ok_m)).astype(float)
    out["bwd"] = (base["bwd_ms"].where(ok_b) / mine["bwd_ms"].where(ok_m)).astype(float)
    out["memory"] = (mine["peak_fwd_bwd_bytes"].where(ok_m)
                     / base["peak_fwd_bwd_bytes"].where(ok_b)).astype(float)
    order = [k for k in ("head_dim", "seq", "causal", "batch", "heads") if k in out.index.names]
    return out.sort_index(level=order)


@dataclass(frozen=True)
class Target:
    """One performance target for our kernel, against one baseline.

    ``metric`` is a column of ``speedup_table``: "fwd" and "bwd" must reach at
    least ``threshold``, "memory" must stay at most ``threshold``. It applies to
    the shapes with a head_dim in ``head_dims`` (None: any) and ``seq >= min_seq``.
    ``kind`` is "target" (what the kernel must do) or "goal" (what it aims at).
    """

    label: str
    metric: str
    baseline: str
    threshold: float
    kind: str = "target"
    head_dims: tuple | None = None
    min_seq: int = 0

    def applies(self, head_dim, seq) -> bool:
        return ((self.head_dims is None or int(head_dim) in self.head_dims)
                and int(seq) >= self.min_seq)

    def met(self, ratio):
        """True or False; None when the ratio is missing (not measured)."""
        if ratio is None or not math.isfinite(ratio):
            return None
        return bool(ratio <= self.threshold if self.metric == "memory"
                    else ratio >= self.threshold)


#: The kernel's targets (every shape) and goals (d = 128, N >= 4K).
PERFORMANCE_TARGETS = (
    Target("forward >= 1.15x SDPA-flash", "fwd", "sdpa-flash", 1.15),
    Target("backward >= 1.0x SDPA-flash", "bwd", "sdpa-flash", 1.0),
    Target("peak memory <= 1.1x SDPA-flash", "memory", "sdpa-flash", 1.1),
    Target("forward >= 0.9x SDPA-cuDNN", "fwd", "sdpa-cudnn", 0.9, kind="goal",
           head_dims=(128,), min_seq=4096),
    Target("backward >= 0.8x SDPA-cuDNN", "bwd", "sdpa-cudnn", 0.8, kind="goal",
           head_dims=(128,), min_seq=4096),
)


def target_table(df, impl: str = "flashbook", targets=PERFORMANCE_TARGETS):
    """One row per (shape, target) where the target applies: the ratio (from
    ``speedup_table``), the threshold and ``met`` (True, False, or None when
    ``impl`` or the baseline was not measured on that shape)."""
    import pandas as pd

    rows, tables = [], {}
    for t in targets:
        if t.baseline not in tables:
            tables[t.baseline] = speedup_table(df, t.baseline, impl).reset_index()
        for rec in tables[t.baseline].to_dict("records"):
            if not t.applies(rec["head_dim"], rec["seq"]):
                continue
            ratio = float(rec[t.metric])
            shape = {k: rec[k] for k in SHAPE_KEYS if k in rec}
            rows.append({**shape, "target": t.label, "kind": t.kind, "baseline": t.baseline,
                         "metric": t.metric, "threshold": t.threshold, "ratio": ratio,
                         "met": t.met(ratio)})
    columns = [k for k in SHAPE_KEYS if k in df.columns] + [
        "target", "kind", "baseline", "metric", "threshold", "ratio", "met"]
    return pd.DataFrame(rows, columns=columns)


def target_summary(table, targets=PERFORMANCE_TARGETS):
    """Per target: the shapes it applies to, how many were measured, met and
    missed, and the worst ratio with its shape."""
    import pandas as pd

    out = []
    for t in targets:
        rows = table[table["target"] == t.label]
        measured = rows[rows["met"].notna()]
        worst = None
        if not measured.empty:
            ratio = measured["ratio"]
            worst = measured.loc[ratio.idxmax() if t.metric == "memory" else ratio.idxmin()]
        out.append({"target": t.label, "kind": t.kind, "shapes": len(rows),
                    "measured": len(measured),
                    "met": int((measured["met"] == True).sum()),       # noqa: E712
                    "missed": int((measured["met"] == False).sum()),   # noqa: E712
                    "worst_ratio": None if worst is None else float(worst["ratio"]),
                    "worst_shape": None if worst is None else shape_label(
                        worst["head_dim"], worst["seq"], worst["causal"])})
    return pd.DataFrame(out).set_index("target")


#: The algorithm whose fewest bytes bound each implementation (naive: the N x N
#: matrices go through HBM; every fused kernel: they never do).
_ALGORITHM = {"naive": "naive", "sdpa-math": "naive"}
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def roofline_points(df, impls=None):
    """Each measured row as two roofline points (forward, backward).

    ``intensity`` = FLOPs / the fewest HBM bytes of the implementation's algorithm
    (``attention_hbm_bytes``: "naive" for ``naive`` and ``sdpa-math``, which also
    computes in fp32, so 4 bytes an element; "flash" for the fused kernels). The
    FLOPs are the harness's convention (backward 2.5x forward), the same ones its
    TFLOP/s divide by, so a point sits under the roof exactly when its time is
    above the floor ``roofline_ms`` gives.
    """
    import pandas as pd

    rows = df[df["status"] == "ok"]
    if impls is not None:
        rows = rows[rows["impl"].isin(list(impls))]
    out = []
    for rec in rows.to_dict("records"):
        b, h, n, d = (int(rec[k]) for k in ("batch", "heads", "seq", "head_dim"))
        algorithm = _ALGORITHM.get(rec["impl"], "flash")
        elem = 4 if rec["impl"] == "sdpa-math" else _DTYPE_BYTES.get(rec.get("dtype"), 2)
        for pass_ in ("fwd", "bwd"):
            measured = rec.get(f"{pass_}_tflops")
            if measured is None or not math.isfinite(measured):
                continue
            flops = attention_flops(b, h, n, n, d, bool(rec["causal"]), pass_)
            moved = attention_hbm_bytes(b, h, n, n, d, impl=algorithm, pass_=pass_,
                                        dtype_bytes=elem)
            out.append({"impl": rec["impl"], "algorithm": algorithm, "pass": pass_,
                        **{k: rec[k] for k in SHAPE_KEYS if k in rec},
                        "flops": flops, "hbm_bytes": moved, "intensity": flops / moved,
                        "tflops": float(measured)})
    columns = ["impl", "algorithm", "pass", *[k for k in SHAPE_KEYS if k in df.columns],
               "flops", "hbm_bytes", "intensity", "tflops"]
    return pd.DataFrame(out, columns=columns)


def roofline_ceilings(provenance=None, chip: str | None = None, dtype: str = "bf16") -> dict:
    """The roof of one chip: peak tensor TFLOP/s, HBM TB/s and the ridge point.

    Measured ceilings are used where the provenance records them (a ``measured``
    dict, at the top or under ``gpu``, with ``<dtype>_tflops`` or
    ``matmul_tflops``, and ``hbm_tb_s``); otherwise the datasheet's, from
    ``runtime.CHIPS``. ``peak_source`` and ``hbm_source`` say which.
    The chip is ``chip``, else the provenance's GPU.
    """
    prov = provenance or {}
    gpu = prov.get("gpu") or {}
    name = chip or (gpu.get("datasheet") or {}).get("chip") or match_chip(gpu.get("name", ""))
    if name is None:
        raise ValueError(f"chip must name one of {sorted(runtime.CHIPS)} when the provenance "
                         f"names no known GPU (it names {gpu.get('name')!r})")
    c = runtime.chip(name)
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    peak = c.bf16_tflops if dtype == "bf16" else c.fp16_tflops
    out = {"chip": c.name, "dtype": dtype, "peak_tflops": peak, "hbm_tb_s": c.hbm_tb_s,
           "peak_source": "datasheet", "hbm_source": "datasheet"}
    measured = prov.get("measured") or gpu.get("measured") or {}
    for key in (f"{dtype}_tflops", "matmul_tflops"):
        if measured.get(key):
            out["peak_tflops"], out["peak_source"] = float(measured[key]), "measured"
            break
    if measured.get("hbm_tb_s"):
        out["hbm_tb_s"], out["hbm_source"] = float(measured["hbm_tb_s"]), "measured"
    if out["peak_tflops"] is None:
        raise ValueError(f"{c.name} has no {dtype} tensor cores")
    out["ridge"] = out["peak_tflops"] / out["hbm_tb_s"]   # FLOP per byte
    return out


def seed_shape_rows(df, shape=None):
    """The measured rows (every implementation, no mask) of the shape closest to
    the seed table's (``SEED_SHAPE``: B=8, H=32, N=4096, d=128), and one phrase
    saying how close.

    The article states N, B and H; d = 128 is only inferred from its text. So
    the closest shape has the same N if any does, then the same B x H, then the
    same B, and only then the nearest d.
    """
    shape = shape or SEED_SHAPE
    full = df[~df["causal"].astype(bool)]
    if full.empty:
        return full, "no shape without a mask was measured"
    shapes = full[["batch", "heads", "seq", "head_dim"]].drop_duplicates()

    def distance(r):
        return (abs(math.log2(r.seq / shape["n"])),
                abs(r.batch * r.heads - shape["batch"] * shape["heads"]),
                abs(r.batch - shape["batch"]), abs(r.head_dim - shape["d"]))

    best = min(shapes.itertuples(index=False), key=distance)
    rows = full[(full["batch"] == best.batch) & (full["heads"] == best.heads)
                & (full["seq"] == best.seq) & (full["head_dim"] == best.head_dim)]
    want = {"B": shape["batch"], "H": shape["heads"], "N": shape["n"], "d": shape["d"]}
    got = {"B": int(best.batch), "H": int(best.heads), "N": int(best.seq),
           "d": int(best.head_dim)}
    here = ", ".join(f"{k}={v}" for k, v in got.items())
    same = [k for k in want if got[k] == want[k]]
    differ = [k for k in want if got[k] != want[k]]
    if not differ:
        return rows, f"{here}: the seed's own shape"
    kept = (f"the seed's {', '.join(same[:-1])} and {same[-1]}" if len(same) > 1
            else f"the seed's {same[0]}" if same else "none of the seed's sizes")
    return rows, (f"{here}, the closest measured shape: {kept}, but "
                  + ", ".join(f"{k}={got[k]} instead of {want[k]}" for k in differ))


def block_shared_bytes(row) -> float:
    """Shared memory a swept config used, bytes: the compiled kernel's number, or
    for a config that did not fit, the number the compiler's error gives. NaN if
    neither was recorded."""
    try:
        value = float(row.get("shared_bytes"))
    except (TypeError, ValueError):
        value = float("nan")
    if math.isfinite(value):
        return value
    found = re.search(r"Required:\s*(\d+)", str(row.get("note") or ""))
    return float(found.group(1)) if found else float("nan")


def block_fits(block_m: int, block_n: int, num_warps: int, num_stages: int, head_dim: int, *,
               dtype_bytes: int = 2, shared_bytes=None, measured_arch: str | None = None) -> dict:
    """Whether one forward-kernel config fits each chip of ``runtime.CHIPS``.

    Per chip: ``bytes`` of shared memory one program needs, the chip's ``limit``
    per program, ``fits``, and ``how`` the bytes were found: "measured" (the
    compiled kernel's ``shared_bytes``, on a chip of ``measured_arch``) or
    "model" (``kernels.configs.smem_estimate`` for that chip's architecture).
    """
    from .kernels import configs

    cfg = configs.Config(int(block_m), int(block_n), int(num_warps), int(num_stages))
    tile_d = configs.block_d(int(head_dim))
    have = shared_bytes is not None and math.isfinite(float(shared_bytes))
    out = {}
    for name, c in runtime.CHIPS.items():
        if have and c.arch == measured_arch:
            need, how = int(shared_bytes), "measured"
        else:
            cc = int(c.arch.split("_")[1])
            need, how = configs.smem_estimate("forward", cfg, tile_d, dtype_bytes, cc), "model"
        out[name] = {"bytes": need, "limit": c.smem_per_block_bytes,
                     "fits": need <= c.smem_per_block_bytes, "how": how}
    return out


def best_blocks(blocks):
    """For each shape and (B_r, B_c): the measured config with the most TFLOP/s
    (over warps and stages). Configs that did not run are left out."""
    ok = blocks[(blocks["status"] == "ok") & blocks["fwd_tflops"].notna()]
    keys = ["head_dim", "seq", "causal", "block_m", "block_n"]
    best = ok.loc[ok.groupby(keys)["fwd_tflops"].idxmax()]
    return best.sort_values(keys).reset_index(drop=True)


@dataclass(frozen=True)
class BlockState:
    """What the chapter-9 explorer shows for one config of the recorded sweep."""

    head_dim: int
    seq: int
    config: tuple               # (block_m, block_n, num_warps, num_stages)
    row: dict | None            # the measured row, None if the sweep lacks it
    rank: int | None            # 1 = fastest of the configs that ran
    n_ran: int                  # configs of this shape that ran
    n_configs: int              # configs of this shape in the sweep
    best: dict | None           # the fastest row
    shared_bytes: float         # measured (or from the compiler's error), NaN if unknown
    fits: dict                  # block_fits(...) per chip
    ranking: tuple = ()         # ((config, TFLOP/s), ...) fastest first

    @property
    def tflops(self):
        return None if self.row is None else self.row.get("fwd_tflops")

    def summary(self) -> str:
        bm, bn, w, s = self.config
        head = f"B_r={bm}, B_c={bn}, {w} warps, {s} stages (d={self.head_dim}, N={self.seq})"
        if self.row is None:
            return f"{head}: not in the recorded sweep"
        r = self.row
        if r["status"] != "ok":
            return f"{head}: {r['status']} ({r['note'][:90]})"
        best = self.best

        def count(value):
            return "?" if value is None or not math.isfinite(value) else f"{int(value)}"

        return (f"{head}: {r['fwd_tflops']:.0f} TFLOP/s, number {self.rank} of {self.n_ran} "
                f"(best {best['fwd_tflops']:.0f}: B_r={int(best['block_m'])}, "
                f"B_c={int(best['block_n'])}, {int(best['num_warps'])} warps, "
                f"{int(best['num_stages'])} stages); {count(r.get('n_regs'))} registers per "
                f"thread, {count(r.get('n_spills'))} spilled; "
                f"{count(self.shared_bytes / 1024)} KiB of shared memory")


def block_state(blocks, head_dim: int, block_m: int, block_n: int, num_warps: int,
                num_stages: int, *, seq: int | None = None, measured_arch: str | None = None,
                dtype_bytes: int = 2) -> BlockState:
    """The explorer's state for one config of a recorded block sweep (``blocks.csv``):
    its measured row, its rank, the best config, and whether it fits each chip.
    ``seq`` picks the shape when the sweep has several (default: the longest)."""
    rows = blocks[blocks["head_dim"] == head_dim]
    if rows.empty:
        raise ValueError(f"head_dim must be one of {sorted(set(blocks['head_dim']))}, "
                         f"got {head_dim!r}")
    seq = int(rows["seq"].max()) if seq is None else int(seq)
    rows = rows[rows["seq"] == seq]
    if rows["causal"].nunique() > 1:      # the sweep's default is without a mask
        rows = rows[~rows["causal"]]
    config = (int(block_m), int(block_n), int(num_warps), int(num_stages))
    mine = rows[(rows["block_m"] == block_m) & (rows["block_n"] == block_n)
                & (rows["num_warps"] == num_warps) & (rows["num_stages"] == num_stages)]
    ran = rows[(rows["status"] == "ok") & rows["fwd_tflops"].notna()].sort_values(
        "fwd_tflops", ascending=False)
    keys = ["block_m", "block_n", "num_warps", "num_stages"]
    ranking = tuple((tuple(int(x) for x in r[keys]), float(r["fwd_tflops"]))
                    for _, r in ran.iterrows())
    order = [c for c, _ in ranking]
    row = mine.iloc[0].to_dict() if not mine.empty else None
    shared = block_shared_bytes(row) if row is not None else float("nan")
    fits = block_fits(*config, head_dim, dtype_bytes=dtype_bytes,
                      shared_bytes=shared if math.isfinite(shared) else None,
                      measured_arch=measured_arch)
    return BlockState(head_dim=int(head_dim), seq=seq, config=config, row=row,
                      rank=order.index(config) + 1 if config in order else None,
                      n_ran=len(ran), n_configs=len(rows),
                      best=ran.iloc[0].to_dict() if not ran.empty else None,
                      shared_bytes=shared, fits=fits, ranking=ranking)


# =============================================================================
# The command
# =============================================================================

NO_GPU_MESSAGE = (
    "No CUDA GPU on this machine: there is nothing to time here, so nothing was run.\n"
    "Run `python -m flashbook.bench` on a machine with an NVIDIA GPU; results measured "
    "on real GPUs, with their provenance, are in benchmarks/results/.")


#: Where ``benchmarks/hopper_fwd_experiment.py``'s recorded run lives, under the results root.
HOPPER_EXPERIMENT = "hopper_fwd_h200.json"


#: ``benchmarks/gpu_check.py --autotune``'s recorded run, under the results root.
AUTOTUNE_RUN = "autotune_h200.json"


def load_recorded_json(name: str, root=None):
    """One recorded JSON file of the results root (a dict), or None when it is not there."""
    base = results_root(root)
    path = base / name if base is not None else None
    if path is None or not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def load_hopper_experiment(root=None):
    """``(DataFrame, environment dict)`` of the recorded Hopper forward experiment
    (tensor descriptors and automatic warp specialisation; chapter 10), or
    ``(None, {})`` when none is recorded. One row per shape and variant, with
    ``tma`` and ``ws`` flags and ``tflops`` (NaN where the variant failed)."""
    import pandas as pd

    data = load_recorded_json(HOPPER_EXPERIMENT, root)
    if data is None:
        return None, {}
    df = pd.DataFrame(data["rows"])
    if "tflops" not in df:  # no variant ran at all
        df["tflops"] = float("nan")
    df["tma"] = df["variant"].str.startswith("tma ")
    df["ws"] = df["variant"].str.endswith(" ws")
    return df, data.get("environment", {})


def hopper_experiment_table(rows):
    """Per shape: the library kernel's and cuDNN's TFLOP/s, the best descriptor (TMA)
    variant without and with warp specialisation, each over the library kernel, and how
    many variants failed to compile. ``rows`` is ``load_hopper_experiment``'s frame."""
    import pandas as pd

    out = []
    for (seq, d, causal), g in rows.groupby(["seq", "head_dim", "causal"], sort=True):
        lib = g.loc[g["variant"] == "flashbook", "tflops"]
        cudnn = g.loc[g["variant"] == "cudnn", "tflops"]
        if lib.empty or not lib.notna().all():
            raise ValueError(f"rows must hold a timed 'flashbook' variant for every shape; "
                             f"none at seq={seq}, head_dim={d}, causal={causal}")
        lib = float(lib.iloc[0])
        row = {"seq": int(seq), "head_dim": int(d), "causal": bool(causal), "flashbook": lib,
               "cudnn": float(cudnn.iloc[0]) if len(cudnn) else float("nan")}
        for key, pick in (("tma", g["tma"] & ~g["ws"]), ("tma_ws", g["tma"] & g["ws"])):
            ran = g[pick & g["tflops"].notna()]
            if ran.empty:
                row[f"best_{key}"], row[f"best_{key}_tflops"], row[f"{key}_vs_flashbook"] = None, float("nan"), float("nan")
            else:
                best = ran.loc[ran["tflops"].idxmax()]
                row[f"best_{key}"] = best["variant"]
                row[f"best_{key}_tflops"] = float(best["tflops"])
                row[f"{key}_vs_flashbook"] = float(best["tflops"]) / lib
        row["failed"] = int((g["tma"] & g["tflops"].isna()).sum())
        row["tried"] = int(g["tma"].sum())
        out.append(row)
    return pd.DataFrame(out)


def _resolve_impl_names(requested) -> list:
    if tuple(requested) != ("all",):
        return list(dict.fromkeys(requested))
    names = [n for n in IMPLEMENTATIONS if n != "flashbook"]
    try:
        names += list(flashbook_variants())
    except Exception:  # noqa: BLE001 - recorded as unavailable by run_sweep
        names.append("flashbook")
    return names


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE)
        return 0
    if runtime.INTERPRET:
        print("TRITON_INTERPRET is set: Triton kernels would run in the CPU interpreter, "
              "and their times would mean nothing. Unset it and run again.")
        return 1

    gpu = gpu_info()
    out_dir = args.out or default_out_dir(gpu["name"])
    progress = not args.no_progress

    if args.ladder:
        print(f"Performance ladder of flashbook's kernels on {gpu['name']}: "
              f"{len(args.shapes)} shapes")
        results = run_ladder(args, progress=progress)
        print(format_ladder_table(results))
        csv_name, fields = "ladder.csv", LADDER_FIELDS
    elif args.sweep_blocks:
        try:
            from . import kernels
        except Exception as exc:  # noqa: BLE001
            print(f"flashbook.kernels cannot be imported ({type(exc).__name__}: {exc}): "
                  f"the block-size sweep was skipped and nothing was measured.")
            return 0
        hook, how = block_sweep_hook(kernels)
        if hook is None:
            print(f"{how}: the block-size sweep needs one of them, so it was skipped "
                  f"and nothing was measured.")
            return 0
        print(f"Block-size sweep of flashbook's forward kernel on {gpu['name']} through "
              f"{how}: {len(block_configs())} configs x {len(args.shapes)} shapes")
        results = run_block_sweep(args, hook, progress=progress)
        print(format_block_table(results))
        csv_name, fields = "blocks.csv", BLOCK_FIELDS
    else:
        impls = _resolve_impl_names(args.impl)
        print(f"Attention on {gpu['name']} ({gpu['capability']}), {args.dtype}: "
              f"{len(args.shapes)} shapes x {len(impls)} implementations")
        results = run_sweep(args, impls, progress=progress)
        print(format_table(results))
        csv_name, fields = "results.csv", RESULT_FIELDS

    write_csv(results, out_dir / csv_name, fields)
    prov = collect_provenance(argv, args)
    prov["files"] = {csv_name: "one row per " + ("rung and shape" if args.ladder
                                                 else "config and shape" if args.sweep_blocks
                                                 else "implementation and shape")}
    write_provenance(prov, out_dir / "provenance.json")
    print(f"\nWrote {out_dir / csv_name} and {out_dir / 'provenance.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
