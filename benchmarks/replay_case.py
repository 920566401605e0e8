"""Replay one run of the stress suite: a class by its name, a seed, on this machine.

    PYTHONPATH=. python3 benchmarks/replay_case.py CLASS_NAME SEED [--times 3]
    PYTHONPATH=. python3 benchmarks/replay_case.py CLASS_NAME SEED --seeds 80
    PYTHONPATH=. python3 benchmarks/replay_case.py CLASS_NAME SEED --times 1 --dump run.pt

``--seeds N``: instead, N runs of the class from SEED on (fresh inputs each), printing for each
its worst output's error as a fraction of the rule's bound (``checks.error_bound``): how close
to the bound the class's runs come on this machine, against which one failing run can be read.

``tests/test_stress_gpu.py`` reports a failure as the class's name and the run's seed
(class ``i`` of ``stress.all_classes`` runs seeds 10000 * i, 10000 * i + 1, ...); this runs
that case again ``--times`` times in a fresh process (the first call takes the checked path,
the later ones the call's plan, ``kernels.launch``) and prints what each found.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
from flashbook import runtime  # noqa: E402
from flashbook.kernels import stress  # noqa: E402


def spread(cases, first: int, count: int, index: int) -> int:
    """``count`` runs from seed ``first``: each run's worst error over its bound; 0 if all pass."""
    from flashbook.kernels import checks

    ratios, rule = [], checks.within_twice_yardstick

    def recording(name, got, want, yardstick, *, head_dim, factor=2.0, terms=1, allow=0.0):
        err, _ = checks.max_error(got, want)
        base, floor = checks.error_bound(got, want, yardstick, head_dim=head_dim, terms=terms)
        ratios.append((err / (factor * base + floor + allow), name))
        return rule(name, got, want, yardstick, head_dim=head_dim, factor=factor, terms=terms, allow=allow)

    checks.within_twice_yardstick = recording
    worst = []
    try:
        for seed in range(first, first + count):
            ratios.clear()
            stress.run_case(cases[(seed - 10_000 * index) % len(cases)], seed, runtime.device())
            worst.append(max(ratios) + (seed,))
            print(f"seed {seed}: worst {worst[-1][1]} at {worst[-1][0]:.3f} of the bound", flush=True)
    finally:
        checks.within_twice_yardstick = rule
    worst.sort(reverse=True)
    print("largest:", ", ".join(f"{r:.3f} ({n}, seed {s})" for r, n, s in worst[:5]))
    return 1 if worst and worst[0][0] > 1 else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("seed", type=int)
    p.add_argument("--times", type=int, default=3)
    p.add_argument("--runs", type=int, default=60, help="runs per class, as the suite's RUNS")
    p.add_argument("--seeds", type=int, default=0, help="runs from SEED on: each one's worst error / bound")
    p.add_argument("--dump", help="also save the run's inputs, lengths and outputs (torch.save) to this file")
    args = p.parse_args(argv)
    classes = dict(stress.all_classes(list(stress.KERNELS), args.runs))
    if args.name not in classes:
        p.error(f"no class {args.name!r}; classes are named as the suite's test ids")
    index = [name for name, _ in stress.all_classes(list(stress.KERNELS), args.runs)].index(args.name)
    cases = classes[args.name]
    if args.seeds:
        return spread(cases, args.seed, args.seeds, index)
    if not 0 <= args.seed - 10_000 * index < len(cases):
        p.error(f"class {args.name} (index {index}) runs seeds {10_000 * index} to {10_000 * index + len(cases) - 1}")
    case = cases[args.seed - 10_000 * index]
    print(case.label(), "seed", args.seed, flush=True)
    if args.dump:   # the inputs the GPU's generator drew, for a reading on any machine
        import torch

        inputs, lengths, outputs = stress._launch(case, args.seed, runtime.device())
        torch.save({"case": case.label(), "seed": args.seed, "inputs": [x.cpu() for x in inputs],
                    "lengths": lengths, "outputs": [x.cpu() for x in outputs]}, args.dump)
    failed = 0
    for i in range(args.times):
        problems = stress.run_case(case, args.seed, runtime.device())
        failed += bool(problems)
        print(f"call {i}: " + ("; ".join(problems) if problems else "right"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
