"""Chapter 9's deep dive into the causal forward: where its time beyond half the unmasked
pass goes (the recorded run ``causal_cost``, benchmarks/causal_cost.py's analysis.json), and a
program's fixed cost in key tiles (chapter 10's lab notes read it too)."""
from __future__ import annotations

from ..display import listed
from ..display import span as _span
from ..plots import benchmarks as plots


#: The names of the causal forward's measured costs (``causal_cost``).
CAUSAL_COST_KEYS = ("cc_excess", "cc_tiles", "cc_fixed", "cc_masked", "cc_mask_ratio", "cc_fixed_tiles",
                    "cc_idle_full", "cc_idle_causal", "cc_b8", "cc_b32", "cc_shape", "cc_seq_ks", "cc_key_tiles")
#: What ``causal_cost`` splits, by the names of the recorded analysis
CAUSAL_COST_MEASURES = ("inst", "cycles", "ncu_us", "ms")
#: How the figure names each measure.
CAUSAL_COST_LABELS = {"inst": "instructions (Nsight)", "cycles": "SM cycles (Nsight)",
                      "ncu_us": "GPU time (Nsight)", "ms": "GPU time (CUDA events)"}


def _causal_cost_analysis(root) -> tuple:
    """The recorded run ``causal_cost``: (its folder, its analysis at d = 128, benchmarks/
    causal_cost.py's analysis.json), or (None, None) where it is not recorded."""
    import json

    from .runs import run_path

    run = run_path("causal_cost", root) if root is not None else None
    if run is None or not (run / "analysis.json").exists():
        return None, None
    return run, json.loads((run / "analysis.json").read_text())["128"]


def _fixed_tiles_of(at: dict) -> list[float]:
    return [at[m]["fit"]["f"] / at[m]["fit"]["a"] for m in CAUSAL_COST_MEASURES]


def fixed_tiles(root) -> list[float]:
    """A causal program's fixed cost (loading Q, the loops' starts and ends, writing O) in key
    tiles, one per measure of the recorded run ``causal_cost`` at d = 128 (empty without it)."""
    _, at = _causal_cost_analysis(root)
    return [] if at is None else _fixed_tiles_of(at)


def causal_cost(ch) -> None:
    """Where the causal forward's time beyond half the unmasked one's goes, at d = 128 (the
    recorded run ``causal_cost``: benchmarks/causal_cost.py's analysis.json). Each part is
    given as a range over its four measures (instructions, SM cycles, ncu's and the CUDA
    events' GPU time), in points of half the unmasked pass."""
    import json

    run, at = _causal_cost_analysis(ch.root)
    if at is None:
        ch.nothing(*CAUSAL_COST_KEYS)
        ch.say("fig-causal-cost", "No recorded results of the causal-cost run (Nsight Compute's counts): "
                                  "no figure to draw.", missing=True)
        return
    by = [at[m] for m in CAUSAL_COST_MEASURES]

    ch.put("cc_excess", _span([100 * (m["ratio_to_half"] - 1) for m in by], ".1f"))
    for name, part in (("cc_tiles", "more_tiles"), ("cc_fixed", "program_costs"), ("cc_masked", "masked_extra")):
        ch.put(name, _span([100 * m["shares"][part] for m in by], ".1f"))
    ch.put("cc_mask_ratio", _span([m["fit"]["b_over_a"] for m in by], ".2f"))
    ch.put("cc_fixed_tiles", _span(_fixed_tiles_of(at), ".1f"))
    # the analysis records elapsed / active - 1; the share of cycles idle is 1 - active / elapsed
    idle = {p["causal"]: 100 * (1 - 1 / (1 + p["idle"])) for p in at["passes"] if p["seq_k"] == p["seq_q"]}
    ch.put("cc_idle_full", idle[False], ".1f"); ch.put("cc_idle_causal", idle[True], ".1f")
    ch.put("cc_b8", at["ms"]["ratio_to_half"], ".2f"); ch.put("cc_b32", at["batch32_ratio_to_half"], ".2f")
    full = next(p for p in at["passes"] if p["seq_k"] == p["seq_q"] and not p["causal"])
    # the profiled shape, and the unmasked passes' key lengths: the same programs, fewer key tiles
    ch.put("cc_shape", f"batch {full['batch']}, {full['heads']} heads, N = {full['seq_q']} queries, d = {full['dim']}")
    unmasked = sorted((p for p in at["passes"] if not p["causal"]), key=lambda p: -p["seq_k"])

    ch.put("cc_seq_ks", listed(p["seq_k"] for p in unmasked))
    ch.put("cc_key_tiles", listed(p["seq_k"] // p["block_n"] for p in unmasked))
    times = run / "times.json"
    gpu = (json.loads(times.read_text())["provenance"].get("gpu") or {}).get("name", "") if times.exists() else ""
    measures = [(CAUSAL_COST_LABELS[m], at[m]["shares"]) for m in CAUSAL_COST_MEASURES]
    ch.figure("fig-causal-cost", "causal_cost", lambda: plots.causal_cost_figure(measures, title=(
        f"Where the causal forward's time beyond half goes\n"
        f"(d = {full['dim']}, N = {full['seq_q']}, batch {full['batch']}, {full['heads']} heads"
        + (f", {gpu})" if gpu else ")"))))
