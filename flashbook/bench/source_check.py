"""The seed article's performance table, checked against arithmetic (chapter 9).

``check_seed_table`` compares each figure of the table with the floors that
``costs`` gives: a time below what the FLOPs or the bytes need at the chip's peak
is impossible, and so is a memory figure below what the matrices it holds take.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import runtime
from .costs import (GB, attention_flops, attention_hbm_bytes, attention_memory_bytes,
                    roofline_ms, tflops)

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
