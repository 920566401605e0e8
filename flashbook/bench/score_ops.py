"""Chapter 10's instruction count per score (its "Prediction" for exp2 and lazy rescaling):
elementwise instructions per score in one tile of the forward's inner loop, and the bounds
with the one step every rung shares added (the rescale of O). The chapter shows
the same model as code the reader can change; a test holds the two to the same counts.
``chapter10`` and ``chapter10_beyond`` both read it from here."""
from __future__ import annotations

#: elementwise instructions per score in one tile of the inner loop (the two tl.dot aside)
PER_SCORE = {
    "masked": ["compare key < seq_k", "select -inf", "multiply by the scale", "row max (compare)",
               "subtract the max", "ex2", "row sum (add)", "convert P to 16 bits"],
    "main": ["row max (compare)", "scale and subtract the max (one FMA)", "ex2", "row sum (add)",
             "convert P to 16 bits"],
}
CAUSAL_EXTRA = ["compare key <= row + diagonal", "and the two conditions"]   # masked stage, causal
# natural exp over exp2: what ptxas makes of tl.exp for sm_90 (Triton 3.6.0 and 3.9.0 alike):
# FMUL by log2(e), FSETP (below -126?), @!P0 FMUL by 0.5, MUFU.EX2, @!P0 FMUL (squaring),
# where tl.exp2 is MUFU.EX2 alone. Predicated instructions take issue slots whether or not they run.
NATURAL_EXP = ["multiply by log2(e)", "range test (x < -126?)", "predicated halving before ex2",
               "predicated squaring after ex2"]


def ops_per_score(stage, causal, exp2):
    """Elementwise instructions per score of one stage (``"masked"``, ``"main"``)."""
    ops = list(PER_SCORE[stage])
    if stage == "masked" and causal:
        ops += CAUSAL_EXTRA
    if not exp2:
        ops += NATURAL_EXP
    return len(ops)


def exp2_bound() -> dict:
    """mask ("full", "causal") -> the most ``exp2`` can gain if those instructions set the pace."""
    return {("causal" if c else "full"): ops_per_score("masked", c, False) / ops_per_score("masked", c, True)
            for c in (False, True)}


def rescale_per_score(head_dim: int, block_n: int) -> float:
    """What the count leaves out: each tile, every rung rescales its output, ``acc * alpha[:, None]``
    (``forward.fold_values``), B_r x d multiplies, so d / B_c per score. The same in every rung, it
    dilutes each saving (the lab notes' lazy-rescaling bound counts it too)."""
    return head_dim / block_n


def with_rescale(before: float, after: float, head_dim: int, block_n: int) -> float:
    """A bound from the count, ``before / after`` instructions per score, with the rescale of O
    added to both sides: lower than the count's own bound."""
    extra = rescale_per_score(head_dim, block_n)
    return (before + extra) / (after + extra)


def below_rescaled(gains, bounds) -> str:
    """How measured gains stand against their bounds with the rescale, as chapter 10 says it."""
    pairs = list(zip(gains, bounds))
    above = sum(float(g) >= float(b) for g, b in pairs)
    return ("and below it with the rescale too" if not above
            else f"but at or above it with the rescale at {above} of {len(pairs)} shapes")


def sfu_cycles_per_warp() -> float:
    """Issue cycles a warp's 32 ``ex2`` keep its SM sub-partition's special-function unit busy:
    16 results per clock per SM (``runtime.SFU_PER_CLOCK_PER_SM``, sm_75 to sm_90) shared by the
    SM's 4 sub-partitions, each of which issues one warp instruction per clock: 32 / 4 = 8."""
    from .. import runtime

    return 32 / (runtime.SFU_PER_CLOCK_PER_SM / 4)


def throughput_bound(before: float, after: float) -> float:
    """The count's bound (``before / after`` instructions per score, one ``ex2`` each) with the
    special-function unit's rate as a second limit: a warp's 32 scores take the larger of its
    issue cycles and ``sfu_cycles_per_warp``. Chapter 10's rung 3: 8 -> 5 gives 1.60 by issue,
    1.00 with the SFU (rung 1's 12 -> 8 gives 1.50 both ways)."""
    sfu = sfu_cycles_per_warp()
    return max(before, sfu) / max(after, sfu)
