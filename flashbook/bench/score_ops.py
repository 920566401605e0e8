"""Chapter 10's instruction counts per score (its "Prediction" for exp2, the split and lazy
rescaling): the elementwise steps listed per score in one tile of the forward's inner loop (the
chapter shows the same list as code the reader can change; a test holds the two to the same
counts), and what the compiled loops really issue, counted in their sm_90 SASS
(``sass_loops``; recorded by benchmarks/loop_sass.py, read by ``load_loops``).
``chapter10`` and ``chapter10_beyond`` both read them from here."""
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


def sfu_cycles_per_warp() -> float:
    """Issue cycles a warp's 32 ``ex2`` keep its SM sub-partition's special-function unit busy:
    16 results per clock per SM (``runtime.SFU_PER_CLOCK_PER_SM``, sm_75 to sm_90) shared by the
    SM's 4 sub-partitions, each of which issues one warp instruction per clock: 32 / 4 = 8."""
    from .. import runtime

    return 32 / (runtime.SFU_PER_CLOCK_PER_SM / 4)


def throughput_bound(before: float, after: float, ex2_before: float = 1, ex2_after: float = 1) -> float:
    """The most a loop can gain going from ``before`` to ``after`` instructions per score (of
    which ``ex2_*`` are ``MUFU.EX2``), if either rate sets its pace: a warp's 32 scores take the
    larger of their issue cycles and ``sfu_cycles_per_warp`` per ``ex2``. Chapter 10's compiled
    loops issue more instructions than the unit needs cycles, so this is ``before / after``."""
    sfu = sfu_cycles_per_warp()
    return max(before, sfu * ex2_before) / max(after, sfu * ex2_after)


# ------------------------------------------------------------ the compiled loop (SASS)

def sass_loops(sass: str, *, inside: str = "HGMMA") -> list[dict]:
    """The loops of a disassembly (Triton's ``compiled.asm["sass"]``: ``LBB3:`` labels, one
    instruction a line) whose body holds an ``inside`` instruction, in program order. A loop
    runs from its label to the branch back to it, that branch included. Each: ``label``,
    ``instructions`` (every one issued once a trip, predicated or not) and ``ops`` (opcode with
    its first modifier, e.g. ``MUFU.EX2``, ``FMUL``, ``HGMMA.64x64x16`` -> count)."""
    import re
    from collections import Counter

    lines = sass.splitlines()
    found = []
    for i, line in enumerate(lines):
        label = re.fullmatch(r"\s*(\.?L\w+):\s*", line)
        if not label:
            continue
        name = label.group(1)
        ops = []
        for later in lines[i + 1:]:
            m = re.match(r"[^\t]*\t\s*(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)?)", later)
            if not m:
                continue            # another label, or not an instruction
            ops.append(m.group(1))
            if re.search(rf"\bBRA\s+(?:`\()?{re.escape(name)}\b", later):
                break
        else:
            continue                # no branch back to it: not a loop
        counts = Counter(ops)
        if any(op.split(".")[0] == inside for op in counts):
            found.append({"label": name, "instructions": len(ops), "ops": dict(counts)})
    return found


def per_score(loop: dict, scores_per_thread: float, op: str | None = None) -> float:
    """Instructions a thread issues per score of one trip of ``loop`` (``sass_loops``): all of
    them, or only ``op`` (e.g. ``"MUFU.EX2"``). A trip handles B_r x B_c scores over its threads:
    64 x 64 over 4 warps of 32 is 32 a thread."""
    n = loop["instructions"] if op is None else loop["ops"].get(op, 0)
    return n / scores_per_thread


#: the index's name (benchmarks/results/index.json) of benchmarks/loop_sass.py's recording
LOOP_RUN = "loop_sass"


def load_loops(root=None):
    """The recorded compiled loops (benchmarks/loop_sass.py): (a DataFrame indexed by rung,
    head_dim, causal and stage, "main" or "masked", with ``per_score`` and ``mufu_ex2_per_score``,
    the file's provenance without its loops); (None, {}) where none is recorded."""
    import json

    import pandas as pd

    from .runs import run_path

    try:
        path = run_path(LOOP_RUN, root)
    except ValueError:        # a results root whose index does not hold it
        path = None
    if path is None or not path.is_file():
        return None, {}
    with open(path) as f:
        data = json.load(f)
    frame = pd.DataFrame(data.pop("loops")).set_index(["rung", "head_dim", "causal", "stage"]).sort_index()
    return frame, data
