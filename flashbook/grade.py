"""Grade student notebooks: run each one and collect what every exercise check reported.

    python -m flashbook.grade NOTEBOOK... [--timeout S] [--out DIR] [--include-solutions]

Each notebook is read (never written), and executed top to bottom in a fresh
kernel, on the CPU (no GPU is visible to it), in an empty temporary directory,
with at most ``--timeout`` seconds (default 600) for each cell; a cell that fails
or runs out of time is recorded and the next cells still run. Every
``flashbook.exercises.check`` displays a machine-readable copy of its report
(mime type ``application/vnd.flashbook.check+json``); the grader collects them.
An exercise whose check never reported (its cell failed before it, or was
deleted) is listed as "no result", with the error if there was one.

By default the cells tagged ``solution`` are removed before anything runs, so
grading the book's own notebooks grades the student edition: the grader never
runs a solution unless it is asked to. ``--include-solutions`` runs them, for a
teacher checking the answer key (every check should then say "correct").

The report: a table on stdout, and with ``--out DIR`` the same rows in
``DIR/grades.csv`` (one row per notebook and exercise, for a class) and
``DIR/grades.json`` (the rows, plus per notebook the time it took and the cells
that failed).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime
import json
import os
import re
import sys
import tempfile
import time

from .exercises import MIME, SOLUTIONS_ENV

#: The status of an exercise whose check did not report.
NO_RESULT = "no result"
#: A check call in a code cell, with its exercise name as a literal.
_CHECK_CALL = re.compile(r"""\bcheck\(\s*(["'])([^"']+)\1""")
FIELDS = ("notebook", "exercise", "status", "message")


def strip_solutions(nb) -> int:
    """Remove the cells tagged ``solution`` from nb in place; return how many."""
    before = len(nb.cells)
    nb.cells = [c for c in nb.cells if "solution" not in c.get("metadata", {}).get("tags", [])]
    return before - len(nb.cells)


def exercises_in(nb) -> list[str]:
    """The exercise names of the notebook's check calls, in order."""
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            names += [m.group(2) for m in _CHECK_CALL.finditer(cell.source) if m.group(2) not in names]
    return names


@contextlib.contextmanager
def _student_environment():
    """The kernel inherits this: no GPU, and checks that report instead of raising."""
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", SOLUTIONS_ENV)}
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop(SOLUTIONS_ENV, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _error_of(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return f"{out.get('ename')}: {out.get('evalue')}"
    return None


def grade_notebook(path: str, *, timeout: int = 600, include_solutions: bool = False) -> dict:
    """Execute one notebook and return its rows (one per exercise) and how the run went."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb = copy.deepcopy(nb)
    removed = 0 if include_solutions else strip_solutions(nb)
    expected = exercises_in(nb)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flashbook-grade-") as work, _student_environment():
        client = nbclient.NotebookClient(
            nb, timeout=timeout, kernel_name="python3", allow_errors=True,
            interrupt_on_timeout=True, resources={"metadata": {"path": work}})
        run_error = None
        try:
            client.execute()
        except Exception as err:              # a dead kernel: grade what ran
            run_error = f"{type(err).__name__}: {str(err)[-500:]}"
    seconds = round(time.perf_counter() - start, 1)

    reported, errors, failed_before = {}, [], {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        err = _error_of(cell)
        if err:
            errors.append({"cell": i, "error": err})
        for out in cell.get("outputs", []):
            record = out.get("data", {}).get(MIME) if out.get("output_type") == "display_data" else None
            if record:
                reported[record["name"]] = record
        for m in _CHECK_CALL.finditer(cell.source):
            if err and m.group(2) not in reported:
                failed_before[m.group(2)] = err
    name = os.path.basename(path)
    rows = []
    for ex in expected + [e for e in reported if e not in expected]:
        if ex in reported:
            rows.append({"notebook": name, "exercise": ex, "status": reported[ex]["status"],
                         "message": reported[ex].get("message", "")})
        else:
            why = failed_before.get(ex) or run_error or "the check did not run"
            rows.append({"notebook": name, "exercise": ex, "status": NO_RESULT, "message": why})
    return {"notebook": name, "path": os.path.abspath(path), "seconds": seconds,
            "solutions_removed": removed, "solutions_run": include_solutions,
            "errors": errors, "run_error": run_error, "rows": rows}


def table(rows: list[dict], width: int = 70) -> str:
    """The rows as a fixed-width text table."""
    cols = {f: max([len(f)] + [len(str(r[f])) for r in rows]) for f in FIELDS[:3]}
    lines = ["  ".join(f.ljust(cols[f]) for f in FIELDS[:3]) + "  message"]
    for r in rows:
        msg = r["message"] if len(r["message"]) <= width else r["message"][: width - 3] + "..."
        lines.append("  ".join(str(r[f]).ljust(cols[f]) for f in FIELDS[:3]) + "  " + msg)
    return "\n".join(lines)


def write_report(out_dir: str, notebooks: list[dict]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    rows = [r for nb in notebooks for r in nb["rows"]]
    with open(os.path.join(out_dir, "grades.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python -m flashbook.grade"] + sys.argv[1:]),
               "notebooks": [{k: v for k, v in nb.items() if k != "rows"} for nb in notebooks],
               "rows": rows}
    with open(os.path.join(out_dir, "grades.json"), "w") as f:
        json.dump(summary, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashbook.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", metavar="NOTEBOOK")
    parser.add_argument("--timeout", type=int, default=600, metavar="S",
                        help="seconds allowed for each cell (default 600)")
    parser.add_argument("--out", metavar="DIR", help="write DIR/grades.csv and DIR/grades.json")
    parser.add_argument("--include-solutions", action="store_true",
                        help="run the cells tagged `solution` too (default: they are removed)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    missing = [p for p in args.notebooks if not os.path.isfile(p)]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    graded = []
    for path in args.notebooks:
        result = grade_notebook(path, timeout=args.timeout, include_solutions=args.include_solutions)
        graded.append(result)
        counts = {s: sum(r["status"] == s for r in result["rows"]) for s in
                  ("correct", "wrong", "not attempted", NO_RESULT)}
        print(f"{result['notebook']}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
              + f" ({result['seconds']} s)", file=sys.stderr, flush=True)
    print(table([r for nb in graded for r in nb["rows"]]))
    if args.out:
        write_report(args.out, graded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
