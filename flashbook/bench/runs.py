"""The recorded runs by name: one index beside them, ``index.json`` in the results root.

The index maps a stable name ("sweep", "hopper_fwd", "peer_tutorial") to where that
run lies under the results root and one line saying what it is::

    {"runs": {"hopper_fwd": {"path": "<a file or folder>", "about": "..."},
              "sweep": {"path": ["<oldest>", "...", "<newest>"], "csv": "results.csv",
                        "about": "..."}}}

``path`` is one folder or file, or a list of them, oldest first, for repeated runs
of one kind: readers take the last. ``csv``, on the entry of such a kind, is the CSV
every run of it holds; ``find_runs(csv_name=...)`` reads the runs of the one entry
that names that file. The library asks for runs by these names, never by folder: a
new run is its folder under the results root and an entry in the index.
"""
from __future__ import annotations

import json

from .records import results_root

#: The index's file name, in the results root.
INDEX = "index.json"


def _index(root):
    """(the results root, its index's entries); (None, {}) when there is no root."""
    base = results_root(root)
    path = base / INDEX if base is not None else None
    if path is None or not path.is_file():
        return base, {}
    with open(path) as f:
        return base, json.load(f)["runs"]


def load_index(root=None) -> dict:
    """The index's entries (name -> entry) of the results root, in the index's order;
    ``{}`` when there is no results root or it holds no index."""
    return _index(root)[1]


def list_runs(root=None) -> dict:
    """Every run of the index: name -> the line saying what it is."""
    return {name: entry["about"] for name, entry in load_index(root).items()}


def run_paths(name: str, root=None) -> list:
    """Every run recorded under ``name``, oldest first, as paths under the results root;
    ``[]`` when there is no results root or it holds no index (nothing recorded there by
    name). Raises ValueError for a name the index does not hold, naming those it does."""
    base, runs = _index(root)
    if not runs:
        return []
    if name not in runs:
        raise ValueError(f"name must be a run of {base / INDEX}, got {name!r}; "
                         f"it has {', '.join(runs)}")
    paths = runs[name]["path"]
    return [base / p for p in ([paths] if isinstance(paths, str) else paths)]


def run_path(name: str, root=None):
    """Where the run ``name`` is recorded (the newest, for a kind of several runs), or
    None when the results root holds no index. ValueError as ``run_paths``."""
    paths = run_paths(name, root)
    return paths[-1] if paths else None


def csv_runs(csv_name: str, root=None):
    """The runs of the one entry whose ``csv`` is ``csv_name``, oldest first (``[]`` if
    none names it), or None when the results root holds no index."""
    base, runs = _index(root)
    if not runs:
        return None
    names = [name for name, entry in runs.items() if entry.get("csv") == csv_name]
    if len(names) > 1:
        raise ValueError(f"{base / INDEX} must name {csv_name!r} as the csv of one entry, "
                         f"not of {', '.join(names)}")
    return run_paths(names[0], base) if names else []


def recorded_file(name: str, root=None):
    """The path of a recorded file: ``name`` is a run of the index, or a path under the
    results root (a file inside an indexed folder, e.g. ``<folder>/<file>.json``). None
    when there is no results root, or when ``name`` is a run and the root holds no index."""
    base, runs = _index(root)
    if base is None:
        return None
    if name in runs or not ("/" in name or "." in name):
        return run_path(name, base)
    return base / name


def load_recorded_json(name: str, root=None):
    """One recorded JSON file (``recorded_file``'s ``name``) as a dict, or None when it
    is not recorded."""
    path = recorded_file(name, root)
    if path is None or not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)


def gpu_record(notebook: str, root=None) -> dict | None:
    """The recorded GPU run of ``notebook``'s ``gpu`` cells (its stem, e.g. "09_benchmarks";
    ``<notebook>.json`` in the recorded run ``gpu_cells``): {"provenance": ..., "cells": [...]},
    or None when nothing is recorded."""
    folder = run_path("gpu_cells", root)
    path = None if folder is None else folder / f"{notebook}.json"
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def recorded_output(notebook: str, cell_id: str, root=None, *, displays: bool = False) -> str | None:
    """What the ``gpu`` cell ``cell_id`` of ``notebook`` printed in its recorded GPU run
    (``gpu_record``), or None; with ``displays``, also the plain text of what it displayed
    (a table), in order. A page built without a GPU shows that output, so its prose reads
    numbers from here."""
    def text(o):
        if "text" in o:
            return "".join(o["text"])
        plain = o.get("data", {}).get("text/plain", "") if displays else ""
        return "".join(plain) + ("\n" if plain else "")

    record = gpu_record(notebook, root)
    cell = None if record is None else next((c for c in record["cells"] if c["id"] == cell_id), None)
    return None if cell is None else "".join(text(o) for o in cell["outputs"])
