"""What attention costs on paper: FLOPs, bytes moved through HBM, bytes held (chapter 9).

Pure functions: no GPU, no torch. Conventions (those of the FlashAttention papers,
so numbers compare across them):

- forward FLOPs = 4 * batch * heads * N_q * N_k * d (two matrix products of
  2 * N_q * N_k * d each), halved when causal;
- backward FLOPs = 2.5 * forward (five matrix products: S recomputed, dV, dP, dQ,
  dK); a backward that keeps P instead of recomputing it needs only 2 * forward;
  ``attention_flops(..., pass_="bwd")`` is that count, the one every TFLOP/s of
  the book divides by;
- TFLOP/s = those FLOPs / the measured time, whatever an implementation really does
  (a naive causal implementation computes the masked half and throws it away);
- GB are 10**9 bytes; times are medians in milliseconds.
"""
from __future__ import annotations

from .. import runtime
from ..validation import check_count

GB = 1e9

PASSES = ("fwd", "bwd", "fwd+bwd")


def _check_dims(**dims):
    for name, value in dims.items():
        check_count(value, name)


def _check_pass(pass_):
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")


def _check_bytes_args(batch, heads, n_q, n_k, d, impl, pass_, dtype_bytes, heads_kv) -> int:
    """Check the arguments the byte counts share; return ``heads_kv`` (default ``heads``)."""
    heads_kv = heads if heads_kv is None else heads_kv
    _check_dims(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d, dtype_bytes=dtype_bytes, heads_kv=heads_kv)
    _check_pass(pass_)
    if impl not in ("flash", "naive"):
        raise ValueError(f"impl must be 'flash' or 'naive', got {impl!r}")
    return heads_kv


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
    heads_kv = _check_bytes_args(batch, heads, n_q, n_k, d, impl, pass_, dtype_bytes, heads_kv)
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
    heads_kv = _check_bytes_args(batch, heads, n_q, n_k, d, impl, pass_, dtype_bytes, heads_kv)
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
