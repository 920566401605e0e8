"""Execute the chapter notebooks top to bottom and record how it went.

    python tools/run_notebooks.py OUT_DIR [NOTEBOOK ...]

Writes OUT_DIR/notebooks.json (per notebook: ok, seconds, the error if any, and
where it ran: GPU, driver, torch, triton, date, command, commit), OUT_DIR/executed.tar.gz
(the executed notebooks, outputs included) and, for each notebook that ran without
error and has cells tagged `gpu`, OUT_DIR/gpu_outputs/<notebook>.json: those cells'
outputs with the provenance, which the book shows where it is built without a GPU
(book/_ext/gpu_outputs.py). Recording the GPU chapters on a GPU machine:

    python tools/run_notebooks.py OUT notebooks/0[6-9]_*.ipynb notebooks/1[0-9]_*.ipynb
    cp OUT/gpu_outputs/*.json benchmarks/results/gpu_outputs/

`make book` executes the notebooks on the machine that builds the book.
"""
from __future__ import annotations

import datetime
import glob
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time

import nbclient
import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "book", "_ext"))
import gpu_outputs  # noqa: E402  (the book's extension: what it reads, this writes)


def commit() -> str:
    """$FLASHBOOK_COMMIT when set (a copy whose git history is not the one sent); else
    the checkout's commit, with "+changes" if notebooks/ or flashbook/ differ from it."""
    from flashbook.bench import git_commit
    return git_commit(("notebooks", "flashbook")) or "unknown"


def machine() -> dict:
    info = {"python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), sys.argv[0], "OUT_DIR", *sys.argv[2:]]),
            "commit": commit()}   # OUT_DIR: no path of the machine that ran it
    try:
        import torch
        import triton
        info.update(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda)
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True).stdout.strip()
    except Exception as err:  # the record says what could not be read
        info["error"] = repr(err)
    return info


def run(path: str, timeout: int = 900) -> tuple[dict, nbformat.NotebookNode]:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    record = {"notebook": os.path.basename(path), "ok": True, "error": None}
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": os.path.dirname(path)}}).execute()
    except Exception as err:
        record.update(ok=False, error=f"{type(err).__name__}: {str(err)[-2000:]}")
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record, nb


def main(out_dir: str, paths: list[str]) -> int:
    # The notebooks run with their solutions: every exercise check must say "correct".
    from flashbook.exercises import SOLUTIONS_ENV
    os.environ[SOLUTIONS_ENV] = "1"
    # glued values are kept in the outputs even without myst-nb, so a recording carries
    # the numbers its prose quotes (flashbook.display.glue)
    from flashbook.display import RECORD_GLUE
    os.environ[RECORD_GLUE] = "1"
    os.makedirs(out_dir, exist_ok=True)
    paths = paths or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    records = []
    where = machine()
    with tarfile.open(os.path.join(out_dir, "executed.tar.gz"), "w:gz") as tar:
        for path in paths:
            record, nb = run(path)
            records.append(record)
            print(f"{record['notebook']}: {'ok' if record['ok'] else 'FAILED'} in {record['seconds']} s",
                  flush=True)
            data = nbformat.writes(nb).encode()
            info = tarfile.TarInfo(os.path.basename(path))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            cells = gpu_outputs.extract(nb)
            if record["ok"] and cells and where.get("gpu"):   # never a CPU run as a recording
                stem = os.path.splitext(os.path.basename(path))[0]
                gpu_outputs.write_record(os.path.join(out_dir, "gpu_outputs", f"{stem}.json"),
                                         gpu_outputs.provenance(where, where.get("commit")), cells)
    summary = {"machine": where, "notebooks": records,
               "passed": sum(r["ok"] for r in records), "failed": sum(not r["ok"] for r in records)}
    with open(os.path.join(out_dir, "notebooks.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"{summary['passed']} passed, {summary['failed']} failed")
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
