"""Chapter 9's live timing cell, as recorded on the GPU, against the full runs: the ratio
table that cell printed divides by the full run that was newest when it was recorded, which
may be older than the run the page reads, so the page shows it against every full run."""
from __future__ import annotations

import re

import pandas as pd

from .readback import load_results
from .runs import gpu_record, recorded_output, run_paths

#: The cell of chapter 9 that runs the quick set live (its recording: ``runs.gpu_record``).
LIVE_CELL = "live-run"


def _minute(date: str) -> str:
    """An ISO date-time to the minute, as the page prints it: "2026-11-30 13:47"."""
    return date[:16].replace("T", " ")


def parse_table(text: str):
    """``format_table``'s printed blocks as rows: (impl, head_dim, seq, causal) and the
    forward and backward TFLOP/s, from a header line such as "d=128  N=1024  not causal ..."
    and the implementation lines under it."""
    rows, shape = [], None
    for line in text.splitlines():
        head = re.match(r"d=(\d+)\s+N=(\d+)\s+(not causal|causal)\b", line)
        if head:
            shape = (int(head.group(1)), int(head.group(2)), head.group(3) == "causal")
            continue
        cells = line.split()
        if shape and len(cells) >= 5 and cells[0] != "impl":
            try:
                fwd, bwd = float(cells[2]), float(cells[4])
            except ValueError:
                continue
            rows.append({"impl": cells[0], "head_dim": shape[0], "seq": shape[1], "causal": shape[2],
                         "fwd_tflops": fwd, "bwd_tflops": bwd})
    return rows


def live_recorded(ch) -> None:
    """The live cell's recorded run against the full runs: the ratio table the recording
    shows was computed against the full run that was newest when it was recorded, which
    may be older than the run this page reads; here it is against that one, and against
    every full run, so that the drift between runs is in view."""
    cell = "live-recorded"
    record = gpu_record("09_benchmarks", ch.root) if ch.root is not None else None
    rows = parse_table(recorded_output("09_benchmarks", LIVE_CELL, ch.root) or "") if record else []
    if ch.results is None or not rows:
        ch.say(cell, "No live run is recorded beside the full runs: nothing to compare here.")
        ch.nothing("live_cudnn_moved")
        return
    live = pd.DataFrame(rows)
    when = (record.get("provenance") or {}).get("date", "")
    keys = ["impl", "head_dim", "seq", "causal"]
    runs = []
    for run in run_paths("sweep", ch.root) or []:
        csv = run / "results.csv"
        if csv.exists():
            frame, prov = load_results(csv)
            runs.append((prov.get("date_utc", ""), frame))
    runs.sort(key=lambda r: r[0])
    page = ch.provenance.get("date_utc", "")
    before = [r for r in runs if r[0] and when and r[0] < when]
    table = live.set_index(keys)[["fwd_tflops"]].rename(columns={"fwd_tflops": "live"})
    for date, frame in runs:
        label = f"{_minute(date)} UTC" + (" (this page)" if date == page else "")
        table.insert(len(table.columns) - 1, label,
                     frame.set_index(keys)["fwd_tflops"].reindex(table.index))
    table["live / this page's run"] = table["live"] / ch.results.set_index(keys)["fwd_tflops"].reindex(table.index)
    if before:
        table["live / newest run then"] = table["live"] / before[-1][1].set_index(keys)["fwd_tflops"].reindex(table.index)
    ch.tables["live_recorded"] = table
    ch.say(cell, f"The live cell above was recorded on {_minute(when)} UTC"
                 + (f", before the full run this page reads ({_minute(page)} UTC): its ratio "
                    f"table divides by the run that was newest then ({_minute(before[-1][0])} UTC)."
                    if before and page > when else "."))
    ch.say(cell, "Forward TFLOP/s of each full run, of the live run, and the ratios:")
    ch.table(cell, "live_recorded", table.round(2))
    # how far one implementation's forward moved across the runs at one shape
    timed = table.drop(columns=[c for c in table.columns if "/" in c])
    moved = (timed.max(axis=1) / timed.min(axis=1) - 1).groupby(level="impl").max()
    ch.put("live_cudnn_moved", 100 * moved["sdpa-cudnn"] if "sdpa-cudnn" in moved.index else None, ".0f")
    ch.say(cell, "The most each implementation's forward moved across these runs at one shape: "
                 + ", ".join(f"{impl} {100 * m:.0f}%" for impl, m in moved.sort_values(ascending=False).items()))
