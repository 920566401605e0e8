"""Short programs in one loop: the backward's ``ONE_LOOP`` (``autograd.one_loop``) timed.

    PYTHONPATH=. python3 benchmarks/one_loop_experiment.py --out DIR
        [--shapes documents:8K:128,documents:16K:128,window:8K:128:1K,window:16K:128:1K,causal:8K:128]
        [--variants rule,three,one] [--rounds 3]

Chapter 8's backward kernels walk a program's tiles in three loops: the masked band (the causal
diagonal, or a window's edge), the whole tiles, and the masked tiles at the far end (a window's
other edge, or a document's ragged last tile). Triton pipelines each loop on its own, so each
starts by waiting for its first loads. A dK/dV program of a 1K sliding window walks about 18
query tiles; at N = 16K under the causal mask, about 128. With ``ONE_LOOP`` a program walks all
its tiles in the first, masked, loop, and the other two are not compiled.

Variants (``autograd._state["one_loop"]``): ``rule``, the library's choice (one loop for a
short window); ``three`` and ``one``, forced for every mask. The masked loop computes the same
sums in the same order, so every gradient must be bitwise the three loops'; the script checks
that, then times ``flash_backward`` alone (its forward kept), the variants taking turns
``rounds`` times. Shapes are ``masks_profile``'s (``mask:N:d[:window[:batch]]``).
DIR/one_loop.json: every number and the provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import masks_profile  # noqa: E402

#: the variants: the library's rule (``autograd.one_loop``), then three loops or one, forced
VARIANTS = {"rule": None, "three": False, "one": True}


@contextlib.contextmanager
def loops(name: str):
    """The backward launched with ``VARIANTS[name]`` as ``autograd._state["one_loop"]``."""
    from flashbook.kernels import autograd

    before = autograd._state["one_loop"]
    autograd._state["one_loop"] = VARIANTS[name]
    autograd.forget_plans()
    try:
        yield
    finally:
        autograd._state["one_loop"] = before
        autograd.forget_plans()


def run_shape(text: str, names: list[str], rounds: int, variant=loops, base: str = "three") -> dict:
    """The backward at one shape (``masks_profile.parse_shape``) under each variant of ``names``
    (``variant(name)``: a context manager), each compared bitwise with ``base`` and timed
    ``rounds`` times, the variants taking turns."""
    from flashbook import timing
    from flashbook.kernels import autograd

    shape = masks_profile.parse_shape(text)
    q, k, v, do, kw = masks_profile.backward_inputs(shape)
    o, lse = autograd.flash_forward(q, k, v, **kw)
    row = {"shape": text, "times_ms": {n: [] for n in names}, "bitwise_equal": {}}
    with variant(base):
        expected = autograd.flash_backward(q, k, v, o, lse, do, **kw)
    for name in names:
        with variant(name):
            got = autograd.flash_backward(q, k, v, o, lse, do, **kw)
        row["bitwise_equal"][name] = all(torch.equal(a, b) for a, b in zip(expected, got))
    for _ in range(rounds):
        for name in names:
            with variant(name):
                autograd.flash_backward(q, k, v, o, lse, do, **kw)   # compiled and planned before timing
                row["times_ms"][name].append(
                    timing.time_ms(lambda: autograd.flash_backward(q, k, v, o, lse, do, **kw)))
    row["median_ms"] = {n: float(np.median(t)) for n, t in row["times_ms"].items()}
    row["spread"] = {n: float((max(t) - min(t)) / np.median(t)) for n, t in row["times_ms"].items()}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="documents:8K:128,documents:16K:128,window:8K:128:1K,window:16K:128:1K,"
                                        "causal:8K:128")
    p.add_argument("--variants", default="rule,three,one", help=f"from {sorted(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from flashbook.bench.records import collect_provenance

    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/one_loop_experiment.py"),
              "rows": []}
    names = args.variants.split(",")
    if set(names) - set(VARIANTS):
        p.error(f"--variants takes names from {sorted(VARIANTS)}, got {args.variants}")
    run_shapes(args.shapes, names, args.rounds, os.path.join(args.out, "one_loop.json"), record)
    return 0


def run_shapes(shapes: str, names: list[str], rounds: int, path: str, record: dict, *, variant=loops,
               base: str = "three", keep_going: bool = False) -> None:
    """Each shape of the comma-separated ``shapes`` through ``run_shape``: its row appended to
    ``record["rows"]``, ``record`` written to ``path`` after each, one line printed. With
    ``keep_going`` a shape that raises is recorded as {"shape", "error"} and the others still run."""
    for text in filter(None, shapes.split(",")):
        start = time.perf_counter()
        try:
            row = run_shape(text, names, rounds, variant, base)
        except Exception as exc:  # noqa: BLE001 - recorded when keep_going, the other shapes still run
            if not keep_going:
                raise
            row = {"shape": text, "error": f"{type(exc).__name__}: {exc}"[:600]}
        record["rows"].append(row)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        if "error" in row:
            print(f"{text}: {row['error']}", flush=True)
            continue
        print(f"{text}: " + ", ".join(f"{n}: {m:.3f} ms (spread {row['spread'][n]:.1%}, "
                                      f"bitwise {row['bitwise_equal'][n]})" for n, m in row["median_ms"].items())
              + f"  [{time.perf_counter() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    sys.exit(main())
