"""Where the causal forward's time goes: chapter 7's forward with the causal mask against the
same kernel without a mask, counted by Nsight Compute and timed.

The causal forward credits half the FLOPs of full attention, yet takes more than half its
time. Three costs could make up the difference, and this run measures each:

1. **more tiles**: the tiles on the diagonal are computed whole (``masks.tile_counts``);
2. **per-program costs**: loading Q, the loop's prologue and drain, the epilogue; a causal
   program has half the key tiles of a full one on average to spread them over;
3. **the masked tiles**: the compare and select of the diagonal's tiles;

and a fourth, **idle SMs** (a wave's tail), is the gap between ncu's elapsed and active cycles.

Passes (bf16, batch 8, H = 16 at d = 128 and 32 at d = 64, query length 4096): full attention
with 4096, 2048 and 1024 keys (the same programs, with 64, 32 and 16 unmasked key tiles each
at 64 keys a tile) and causal attention at 4096 keys. A quantity X (instructions executed,
SM cycles, GPU time) is fitted as ``programs * f + unmasked_tiles * a`` over the three full
passes; the causal pass's masked tiles then cost ``b`` each, ``(X - programs * f -
unmasked * a) / masked`` (``decompose``).

    python3 benchmarks/causal_cost.py --steps OUT/steps.json --times OUT/times.json   # no ncu
    ncu --profile-from-start off --clock-control none --csv --page raw \\
        --metrics "$(python3 benchmarks/causal_cost.py --metrics)" \\
        python3 benchmarks/causal_cost.py > OUT/raw.csv
    python3 benchmarks/causal_cost.py --analyse OUT      # anywhere: OUT/analysis.json

``--times`` also times causal and full at batch 8 and 32 (four times the waves: a wave's tail
matters less), each ``--repeat`` times, taking turns.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: what ncu reads for each pass
METRICS = ("gpu__time_duration.sum", "smsp__inst_executed.sum", "sm__cycles_active.sum",
           "sm__cycles_active.avg", "sm__cycles_elapsed.avg", "launch__grid_size",
           "launch__waves_per_multiprocessor")
N_Q = 4096
KEYS_FULL = (4096, 2048, 1024)
BATCH = 8


def heads(d: int) -> int:
    return 2048 // d


def passes(dims=(128, 64)) -> list[dict]:
    """The profiled passes, in order: for each head_dim, full attention at each key length, then causal."""
    return [{"dim": d, "batch": BATCH, "heads": heads(d), "seq_q": N_Q, "seq_k": n_k, "causal": causal}
            for d in dims for n_k, causal in [(n, False) for n in KEYS_FULL] + [(N_Q, True)]]


def tiles(step: dict, block_m: int, block_n: int) -> dict:
    """Programs, unmasked and masked key tiles of one pass (all heads), by ``masks.tile_counts``."""
    from flashbook import masks

    c = masks.tile_counts(step["seq_q"], step["seq_k"], block_m, block_n, causal=step["causal"])
    bh = step["batch"] * step["heads"]
    return {"programs": bh * -(-step["seq_q"] // block_m), "unmasked": bh * c["full"], "masked": bh * c["partial"]}


def decompose(rows: list[dict], quantity: str) -> dict:
    """Fit ``quantity`` = programs * f + unmasked * a over the full passes (least squares),
    then the causal pass's masked tiles' cost b. ``rows``: one dict per pass of one head_dim,
    with ``causal``, ``programs``, ``unmasked``, ``masked`` and ``quantity``. Returns f, a, b,
    b / a, the causal pass's parts (``parts``: programs, unmasked tiles, masked tiles at a,
    the masked tiles' extra (b - a)) and the fit's largest relative residual over the full passes."""
    import numpy as np

    full = [r for r in rows if not r["causal"]]
    (causal,) = [r for r in rows if r["causal"]]
    if len(full) < 3:
        raise ValueError(f"need three full passes to fit two constants and see the residual, got {len(full)}")
    a_mat = np.array([[r["programs"], r["unmasked"]] for r in full], dtype=float)
    y = np.array([r[quantity] for r in full], dtype=float)
    (f, a), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
    residual = float(np.max(np.abs(a_mat @ [f, a] - y) / y))
    b = (causal[quantity] - causal["programs"] * f - causal["unmasked"] * a) / causal["masked"]
    parts = {"programs": causal["programs"] * f, "unmasked": causal["unmasked"] * a,
             "masked_at_a": causal["masked"] * a, "masked_extra": causal["masked"] * (b - a)}
    return {"f": float(f), "a": float(a), "b": float(b), "b_over_a": float(b / a), "fit_residual": residual,
            "parts": {k: float(v) for k, v in parts.items()}, "causal_total": float(causal[quantity])}


def loss_shares(rows: list[dict], quantity: str) -> dict:
    """The causal pass's ``quantity`` over half the full pass's (at equal keys): how far it is
    from the convention's half, and each cost's share of that excess (``decompose``'s parts
    against an ideal causal pass: half the unmasked tiles' cost of the full pass and its programs)."""
    full = next(r for r in rows if not r["causal"] and r["seq_k"] == r["seq_q"])
    (causal,) = [r for r in rows if r["causal"]]
    d = decompose(rows, quantity)
    ideal = 0.5 * full[quantity]
    excess = causal[quantity] - ideal
    tile_units = causal["unmasked"] + causal["masked"] - 0.5 * full["unmasked"]   # tiles beyond half
    # what an ideal half pass pays: half the tiles at a, and all the programs at f (half as many tiles each)
    split = {"more_tiles": tile_units * d["a"],
             "program_costs": causal["programs"] * d["f"] - 0.5 * full["programs"] * d["f"],
             "masked_extra": d["parts"]["masked_extra"]}
    split["unexplained"] = excess - sum(split.values())
    return {"ratio_to_half": causal[quantity] / ideal, "excess": excess,
            "shares": {k: v / ideal for k, v in split.items()}, "fit": d}


def _config(d: int):
    from flashbook.kernels import configs

    return configs.default("forward", cc=90, block_d=configs.block_d(d), elem_bytes=2, causal=True)


def _inputs(step, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    shape_q = (step["batch"], step["heads"], step["seq_q"], step["dim"])
    shape_k = (step["batch"], step["heads"], step["seq_k"], step["dim"])
    return (torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, generator=g),
            *(torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)))


def _call(step):
    from flashbook.kernels import flash_forward

    q, k, v = _inputs(step)
    cfg = _config(step["dim"])
    return lambda: flash_forward(q, k, v, causal=step["causal"], config=cfg)


def profile(steps) -> None:
    """Each pass twice (compile, warm), then once between cudaProfilerStart and Stop."""
    from flashbook.timing import profile_once

    for step in steps:
        profile_once(_call(step))


def times(dims, repeat: int) -> list[dict]:
    """Each pass's GPU time (``timing.time_ms``), and causal and full at batch 8 and 32,
    ``repeat`` rounds taking turns."""
    from flashbook import timing

    steps = passes(dims) + [dict(s, batch=32) for s in passes(dims) if s["seq_k"] == N_Q]
    calls = [_call(s) for s in steps]
    for fn in calls:
        fn()
    out = [dict(s, ms=[]) for s in steps]
    for _ in range(repeat):
        for row, fn in zip(out, calls):
            row["ms"].append(timing.time_ms(fn))
    return out


def analyse(folder) -> dict:
    """``decompose`` and ``loss_shares`` of each head_dim's passes, from raw.csv (+ steps.json)
    and times.json: instructions, SM cycles summed over SMs, GPU time (ncu), GPU time (timer)."""
    import statistics

    from flashbook.bench import profiles

    folder = os.fspath(folder)
    steps = json.load(open(os.path.join(folder, "steps.json")))["steps"]
    rows = profiles.ncu_csv(os.path.join(folder, "raw.csv"))
    if len(rows) != len(steps):
        raise ValueError(f"{len(rows)} kernels in raw.csv, {len(steps)} passes in steps.json")
    timed = json.load(open(os.path.join(folder, "times.json")))["rows"]
    out = {}
    for d in sorted({s["dim"] for s in steps}):
        cfg = _config_fields(steps, d)
        mine = []
        for s, r in zip(steps, rows):
            if s["dim"] != d:
                continue
            t = next(x for x in timed if all(x[k] == s[k] for k in ("dim", "batch", "seq_k", "causal")))
            mine.append(dict(s, **tiles(s, *cfg), inst=r["smsp__inst_executed.sum"],
                             cycles=r["sm__cycles_active.sum"], ncu_us=r["gpu__time_duration.sum"] / 1e3,
                             idle=r["sm__cycles_elapsed.avg"] / r["sm__cycles_active.avg"] - 1,
                             ms=statistics.median(t["ms"]), spread=(max(t["ms"]) - min(t["ms"])) / statistics.median(t["ms"])))
        big = {c: next(x for x in timed if x["dim"] == d and x["batch"] == 32 and x["causal"] == c) for c in (False, True)}
        out[str(d)] = {"block": cfg, "passes": mine,
                       **{q: loss_shares(mine, q) for q in ("inst", "cycles", "ncu_us", "ms")},
                       "batch32_ratio_to_half": statistics.median(big[True]["ms"]) / (0.5 * statistics.median(big[False]["ms"]))}
    return out


def _config_fields(steps, d):
    for s in steps:
        if s["dim"] == d:
            return s["block_m"], s["block_n"]
    raise ValueError(f"no pass at head_dim {d}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="128,64")
    p.add_argument("--metrics", action="store_true", help="print METRICS for ncu's --metrics and exit")
    p.add_argument("--steps", help="write the passes (with their tiles) to this JSON file; no profiling")
    p.add_argument("--times", help="time the passes and write them to this JSON file")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--analyse", help="a folder with raw.csv, steps.json and times.json: write analysis.json there")
    args = p.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return 0
    if args.analyse:
        result = analyse(args.analyse)
        with open(os.path.join(args.analyse, "analysis.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({d: {q: {"ratio_to_half": round(r[q]["ratio_to_half"], 4),
                                  "shares": {k: round(v, 4) for k, v in r[q]["shares"].items()},
                                  "b_over_a": round(r[q]["fit"]["b_over_a"], 3),
                                  "fit_residual": round(r[q]["fit"]["fit_residual"], 4)}
                              for q in ("inst", "cycles", "ncu_us", "ms")} for d, r in result.items()}, indent=1))
        return 0
    import flashbook  # noqa: F401  (decides GPU or interpreter before triton is imported)
    from flashbook.bench.records import collect_provenance

    dims = [int(x) for x in args.dims.split(",")]
    steps = passes(dims)
    if args.steps or args.times:
        prov = collect_provenance(sys.argv[1:], program="python3 benchmarks/causal_cost.py")
        if args.steps:
            for s in steps:
                cfg = _config(s["dim"])
                s.update(block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps,
                         num_stages=cfg.num_stages, kernels=1)
            with open(args.steps, "w") as f:
                json.dump({"provenance": prov, "steps": steps}, f, indent=1)
        if args.times:
            with open(args.times, "w") as f:
                json.dump({"provenance": prov, "rows": times(dims, args.repeat)}, f, indent=1)
        return 0
    profile(steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
