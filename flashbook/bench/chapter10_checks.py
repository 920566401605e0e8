"""The checks of chapter 10's five exercises (``flashbook.exercises.check(..., test=...)``):
each recomputes the answer from the library or the recorded run on its own and says which
case differs. The chapter imports them; the reader's function is the only argument, with the
recorded frame where the exercise reads one."""
from __future__ import annotations

import dataclasses
import math

from .. import tiled
from .experiments import GLUON_EXPERIMENTS, HOST_OVERHEAD_RUN, host_overhead_tables
from .harness import shape_label
from .runs import load_recorded_json


def test_skip_speedup(skip_speedup):
    """Exercise 1: the causal tile ratio against ``tiled.visible_key_tiles`` at several shapes."""
    for n, bq, bk in [(128, 64, 64), (130, 64, 64), (1000, 32, 64), (4096, 128, 64), (300, 64, 16)]:
        want = math.ceil(n / bq) * math.ceil(n / bk) / sum(tiled.visible_key_tiles(n, n, bq, bk, True))
        got = skip_speedup(n, bq, bk)
        assert math.isclose(got, want, rel_tol=1e-12), (
            f"N={n}, B_r={bq}, B_c={bk}: got {got:.4f}, expected {want:.4f} (tiles miscounted?)")


def test_largest_gain(largest_gain, frame):
    """Exercise 2: walks the ladder's forward rows itself, dividing times."""
    want = {}
    records = frame.to_dict("records")
    for r in records:
        prev = [p for p in records if (p["head_dim"], p["seq"], p["causal"], p["rung"])
                == (r["head_dim"], r["seq"], r["causal"], r["rung"] - 1)]
        if prev:
            key = (int(r["head_dim"]), int(r["seq"]), bool(r["causal"]))
            gain = prev[0]["ms"] / r["ms"]
            if key not in want or gain > want[key][1]:
                want[key] = (r["name"], gain)
    got = largest_gain(frame)
    assert set(got) == set(want), f"shapes differ: {sorted(set(got) ^ set(want))}"
    for key, (name, gain) in want.items():
        assert got[key][0] == name and math.isclose(got[key][1], gain, rel_tol=1e-9), (
            f"{shape_label(*key)}: got {got[key]}, expected ({name!r}, {gain:.3f})")
    print("; ".join(f"{shape_label(*key)}: {name} ({gain:.2f}x)" for key, (name, gain) in want.items()))


def test_rung_without(rung_without):
    """Exercise 3: one flag off, the library's tiles, and exact in float32 (a small forward)."""
    from ..kernels.ladder import Features, Rung
    from .rung_check import check_rungs

    flags = [f.name for f in dataclasses.fields(Features)]
    for flag in flags:
        rung = rung_without(flag)
        assert isinstance(rung, Rung), f"rung_without({flag!r}) must return a Rung, got {type(rung).__name__}"
        off = [f for f in flags if getattr(rung.features, f) != getattr(Features(), f)]
        assert off == [flag], f"rung_without({flag!r}) switches off {off}, expected [{flag!r}]"
        assert rung.config is None, f"rung_without({flag!r}) must keep the library's tiles (config=None)"
    errors = check_rungs([rung_without(f) for f in flags], batch=1, heads=1, n=70, d=16, backward=False)
    print(f"{len(flags)} rungs, each with one flag off, all exact: largest error {errors['max |O error|'].max():.1e}")


def test_schedule_gains(schedule_gains, table):
    """Exercise 4: the fastest Gluon configuration of each shape, from the recorded run's rows."""
    rows = load_recorded_json(GLUON_EXPERIMENTS[128])["rows"]
    want = {}
    for shape in {(r["dtype"], r["seq"], r["causal"]) for r in rows}:
        here = [r for r in rows if (r["dtype"], r["seq"], r["causal"]) == shape]
        library = next(r["tflops"] for r in here if r["variant"] == "flashbook")
        best = max((r for r in here if r["variant"].startswith("gluon ")), key=lambda r: r["tflops"])
        want[shape] = (best["variant"].split()[1], best["tflops"] / library)
    got = schedule_gains(table)
    assert set(got) == set(want), f"shapes differ: {sorted(set(got) ^ set(want))}"
    for key, (schedule, gain) in sorted(want.items()):
        assert got[key][0] == schedule and math.isclose(got[key][1], gain, rel_tol=1e-9), (
            f"{key}: got {got[key]}, expected ({schedule!r}, {gain:.3f})")
    for schedule in sorted({s for s, _ in want.values()}):
        gains = [x for s, x in want.values() if s == schedule]
        print(f"{schedule}: fastest at {len(gains)} of {len(want)} shapes, {min(gains):.2f}-{max(gains):.2f}x")


def test_host_bound(host_bound):
    """Exercise 5: the rows whose timer outran their CUDA graph, from the recorded JSON."""
    rows = load_recorded_json(HOST_OVERHEAD_RUN)["shapes"]
    for threshold in (0.05, 0.2):
        want = {(r["impl"], r["head_dim"], r["seq"], r["causal"]): r["timer_ms"] / r["graph_ms"]
                for r in rows if r["timer_ms"] > (1 + threshold) * r["graph_ms"]}
        got = host_bound(host_overhead_tables()[1], threshold=threshold)
        assert set(got) == set(want), f"threshold {threshold}: rows differ: {sorted(set(got) ^ set(want))}"
        for key, ratio in want.items():
            assert math.isclose(got[key], ratio, rel_tol=1e-9), f"{key}: got {got[key]}, expected {ratio:.3f}"
    found = host_bound(host_overhead_tables()[1])
    print(f"{len(found)} rows over 5%; " + "; ".join(f"{k[0]} d={k[1]} N={k[2]}{' causal' if k[3] else ''}: {r:.2f}x"
                                                     for k, r in sorted(found.items(), key=lambda x: -x[1])))
