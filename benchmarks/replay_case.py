"""Replay one run of the stress suite: a class by its name, a seed, on this machine.

    PYTHONPATH=. python3 benchmarks/replay_case.py CLASS_NAME SEED [--times 3]

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("seed", type=int)
    p.add_argument("--times", type=int, default=3)
    p.add_argument("--runs", type=int, default=60, help="runs per class, as the suite's RUNS")
    args = p.parse_args(argv)
    classes = dict(stress.all_classes(list(stress.KERNELS), args.runs))
    if args.name not in classes:
        p.error(f"no class {args.name!r}; classes are named as the suite's test ids")
    index = [name for name, _ in stress.all_classes(list(stress.KERNELS), args.runs)].index(args.name)
    case = classes[args.name][args.seed - 10_000 * index]
    print(case.label(), "seed", args.seed, flush=True)
    failed = 0
    for i in range(args.times):
        problems = stress.run_case(case, args.seed, runtime.device())
        failed += bool(problems)
        print(f"call {i}: " + ("; ".join(problems) if problems else "right"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
