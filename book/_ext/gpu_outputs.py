"""Cells that need a GPU show, in a book built without one, their output recorded on a GPU.

How it works (one mechanism for every chapter):

- A code cell whose output is a GPU result (a timing, a check at GPU sizes, what the
  device reports) carries the cell tag ``gpu``. In Jupyter the cell runs as written: on a
  CPU it says that it needs a GPU and shows nothing measured.
- ``tools/run_notebooks.py OUT_DIR`` on a GPU machine executes the chapters and writes
  ``OUT_DIR/gpu_outputs/<chapter>.json``: the provenance of the run (GPU, driver, CUDA,
  torch, triton, date, commit) and, for every ``gpu`` cell, its id, the SHA-256 of its
  source and its outputs. Those files are committed to ``benchmarks/results/gpu_outputs/``.
- At book-build time without a GPU, this Sphinx extension replaces the outputs of every
  ``gpu`` cell with the recorded ones (matched by the nbformat cell id) and puts a
  labelled box above them: "Recorded on NVIDIA H200 (driver ..., ...)". Numbers the cell
  glues into the prose come from the recording too, so text and output agree.
- A cell whose source changed since the recording still shows the recording, and its
  box says "recorded with an earlier version of this cell". A ``gpu`` cell with no
  recording keeps its CPU output under a box that says so. Neither stops the build.
- On a machine with a CUDA GPU the cells run live and nothing is replaced.
  ``FLASHBOOK_GPU_OUTPUTS=recorded`` or ``=live`` forces either behaviour.

Also usable from the command line, to turn executed notebooks into recordings:

    python book/_ext/gpu_outputs.py import EXECUTED.tar.gz RUN.json OUT_DIR
"""
from __future__ import annotations

import copy
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

TAG = "gpu"
ENV = "FLASHBOOK_GPU_OUTPUTS"            # "recorded", "live", or unset (decide by the GPU)
RESULTS = Path("benchmarks") / "results" / "gpu_outputs"
ROOT = Path(__file__).resolve().parents[2]
LABEL_CLASS = "gpu-recorded"
MISSING_CLASS = "gpu-not-recorded"
CHANGED_NOTE = "recorded with an earlier version of this cell"


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def is_gpu_cell(cell) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def _outputs_without_counts(outputs) -> list:
    """The outputs as plain JSON, without execution counts (they differ run to run)."""
    kept = []
    for out in outputs:
        out = json.loads(json.dumps(out))
        out.pop("execution_count", None)
        kept.append(out)
    return kept


def extract(executed, tagged_ids=None) -> list[dict]:
    """The recorded part of one executed notebook: id, source hash and outputs of its
    ``gpu`` cells (or of the cells whose ids are in ``tagged_ids``)."""
    cells = []
    for cell in executed.cells:
        wanted = cell.get("id") in tagged_ids if tagged_ids is not None else is_gpu_cell(cell)
        if cell.cell_type == "code" and wanted:
            cells.append({"id": cell.id, "source_sha256": source_sha256(cell.source),
                          "outputs": _outputs_without_counts(cell.get("outputs", []))})
    return cells


def write_record(path, provenance: dict, cells: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"provenance": provenance, "cells": cells}, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def load_record(stem: str, root=None) -> dict | None:
    path = Path(root or ROOT) / RESULTS / f"{stem}.json"
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def describe(prov: dict) -> str:
    """'NVIDIA H200 (driver 580.159.04, CUDA 13.0, torch 2.11.0, triton 3.6.0, 2026-11-29, commit abc1234)'."""
    parts = [f"{name} {prov[name.lower()]}" for name in ("driver", "CUDA", "torch", "triton")
             if prov.get(name.lower())]
    if prov.get("date"):
        parts.append(str(prov["date"])[:10])
    if prov.get("commit"):
        commit, _, extra = str(prov["commit"]).partition("+")
        parts.append(f"commit {commit[:7]}" + (" with local changes" if extra else ""))
    return f"{prov.get('gpu', 'a GPU')} ({', '.join(parts)})"


def label(prov: dict | None, changed: bool, repeat: bool = False) -> dict:
    """The boxed note shown above recorded outputs (an nbformat display_data output). With
    ``repeat`` (a later cell of the page, from the run the first box explained, unchanged
    since) the box is its title and the run, one click away, without the explanation again."""
    if prov is None:
        title = "Not recorded on a GPU yet"
        text = ("This cell needs a GPU. No run on a GPU has been recorded for it, so what "
                "follows is its output on the machine that built the book, which has none.")
        css = f"admonition warning {MISSING_CLASS}"
    else:
        title = f"Recorded on {prov.get('gpu', 'a GPU')}"
        lead = "" if repeat and not changed else "The book was built without a GPU: this is the cell's output from a run on one."
        if changed:
            lead += f" It was {CHANGED_NOTE}: the code above has changed since."
        css = f"admonition note {LABEL_CLASS}"
        text = f"{lead} The run: {describe(prov)}.".lstrip()
        body = (f'<div class="{css}"><p class="admonition-title">{html.escape(title)}</p>'
                + (f"<p>{html.escape(lead)}</p>" if lead else "") + "<details><summary>The run</summary>"
                f"<p>{html.escape(describe(prov))}</p></details></div>")
        return {"output_type": "display_data", "metadata": {},
                "data": {"text/html": body, "text/plain": f"[{title}] {text}"}}
    body = (f'<div class="{css}"><p class="admonition-title">{html.escape(title)}</p>'
            f"<p>{html.escape(text)}</p></div>")
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/html": body, "text/plain": f"[{title}] {text}"}}


def merge_streams(outputs: list) -> list:
    """Copies of ``outputs`` with each run of consecutive stream outputs of one stream
    (stdout or stderr) joined into one: a recording keeps a cell's prints as the kernel
    flushed them, which the page would show as one box per flush."""
    merged = []
    for o in outputs:
        o = copy.deepcopy(o)
        if o.get("output_type") == "stream" and not isinstance(o.get("text", ""), str):
            o["text"] = "".join(o["text"])
        last = merged[-1] if merged else None
        if (last is not None and o.get("output_type") == "stream" and last.get("output_type") == "stream"
                and last.get("name") == o.get("name")):
            last["text"] += o.get("text", "")
        else:
            merged.append(o)
    return merged


def _glue_key(output):
    return output.get("metadata", {}).get("scrapbook", {}).get("name")


def apply(nb, record: dict | None) -> dict:
    """Replace, in place, the outputs of nb's ``gpu`` cells with the recorded ones and label
    them. Returns {cell id: "recorded" | "changed" | "missing"}."""
    import nbformat

    recorded = {c["id"]: c for c in (record or {}).get("cells", [])}
    prov = (record or {}).get("provenance")
    status = {}
    explained = False          # the first unchanged recorded cell's box says what it is; later ones, the run
    for cell in nb.cells:
        if not is_gpu_cell(cell):
            continue
        rec = recorded.get(cell.get("id"))
        if rec is None:
            status[cell.id] = "missing"
            cell.outputs = [nbformat.from_dict(label(None, False))] + list(cell.get("outputs", []))
            continue
        changed = rec["source_sha256"] != source_sha256(cell.source)
        status[cell.id] = "changed" if changed else "recorded"
        outputs = [nbformat.from_dict(o) for o in merge_streams(rec["outputs"])]
        have = {_glue_key(o) for o in outputs} - {None}
        # numbers the live cell glues but the recording lacks stay, so the prose never loses
        # a value (a newer cell; or a recording made before tools/run_notebooks.py kept glued
        # values, flashbook.display.RECORD_GLUE: those quote the build machine's numbers
        # until the chapter is recorded again); the recorded ones win where both exist
        outputs += [o for o in cell.get("outputs", []) if _glue_key(o) and _glue_key(o) not in have]
        cell.outputs = [nbformat.from_dict(label(prov, changed, repeat=explained))] + outputs
        explained = explained or not changed
    return status


_GPU = None


def use_recordings() -> bool:
    """True where the book is built without a GPU (or FLASHBOOK_GPU_OUTPUTS=recorded)."""
    global _GPU
    mode = os.environ.get(ENV, "").strip().lower()
    if mode in ("recorded", "live"):
        return mode == "recorded"
    if _GPU is None:
        try:
            import torch

            _GPU = bool(torch.cuda.is_available())
        except Exception:
            _GPU = False
    return not _GPU


# ---------------------------------------------------------------- Sphinx


def _patch_myst_nb(root: Path, log) -> None:
    """Wrap each myst-nb notebook client's start_client: once the notebook has its outputs
    (executed, or taken from the cache), the gpu cells get the recorded ones. This runs
    before myst-nb collects glued values and renders the cells."""
    from myst_nb.core import execute

    classes = {cls for cls in vars(execute).values()
               if isinstance(cls, type) and issubclass(cls, execute.NotebookClientBase)}
    for cls in classes:
        original = cls.__dict__.get("start_client")
        if original is None or getattr(original, "_gpu_outputs", False):
            continue

        def start_client(self, _original=original):
            _original(self)
            if self.path is None or not use_recordings():
                return
            status = apply(self.notebook, load_record(Path(self.path).stem, root))
            if status:
                counts = {s: list(status.values()).count(s) for s in sorted(set(status.values()))}
                log.info(f"{Path(self.path).name}: gpu cells {counts}")

        start_client._gpu_outputs = True
        cls.start_client = start_client


def setup(app):
    from sphinx.util import logging

    _patch_myst_nb(Path(app.srcdir), logging.getLogger(__name__))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---------------------------------------------------------------- recordings from old runs


def commit_of(notebook_name: str, executed) -> str | None:
    """The newest commit whose copy of the notebook has exactly the executed code cells."""
    import nbformat

    want = [c.source for c in executed.cells if c.cell_type == "code"]
    path = f"notebooks/{notebook_name}"
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%h", "--", path],
                         capture_output=True, text=True).stdout.split()
    for sha in log:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{sha}:{path}"],
                              capture_output=True, text=True).stdout
        try:
            nb = nbformat.reads(text, as_version=4)
        except Exception:
            continue
        if [c.source for c in nb.cells if c.cell_type == "code"] == want:
            return sha
    return None


def provenance(machine: dict, commit: str | None) -> dict:
    keys = ("gpu", "driver", "cuda", "torch", "triton", "python", "date", "command")
    prov = {key: machine.get(key) for key in keys if machine.get(key) is not None}
    if "command" in prov:   # the output folder was a path on the GPU machine: not for the page
        prov["command"] = re.sub(r"(run_notebooks\.py) \S+", r"\1 OUT_DIR", prov["command"])
    prov["commit"] = commit or "unknown"
    return prov


def import_tarball(tarball, run_json, out_dir) -> list[Path]:
    """Recordings (OUT_DIR/<chapter>.json) from an executed-notebooks tarball and the
    notebooks.json of the same run; the gpu cells are those tagged in today's chapters."""
    import nbformat

    with open(run_json) as f:
        machine = json.load(f)["machine"]
    written = []
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            executed = nbformat.reads(tar.extractfile(member).read().decode(), as_version=4)
            current = nbformat.read(ROOT / "notebooks" / member.name, as_version=4)
            tagged = {c.id for c in current.cells if is_gpu_cell(c)}
            if not tagged:
                continue
            prov = provenance(machine, commit_of(member.name, executed))
            written.append(write_record(Path(out_dir) / f"{Path(member.name).stem}.json",
                                        prov, extract(executed, tagged)))
    return written


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "import":
        sys.exit(__doc__)
    for p in import_tarball(*sys.argv[2:]):
        print(p)
