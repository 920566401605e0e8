"""The index of recorded runs (``benchmarks/results/index.json``, ``flashbook.bench.runs``):
every entry is on disk, every run on disk is an entry, and the library names runs only
through it."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from flashbook import bench

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
INDEX = json.loads((RESULTS / bench.INDEX).read_text())["runs"]


def _paths(entry):
    return [entry["path"]] if isinstance(entry["path"], str) else entry["path"]


def test_every_entry_is_on_disk_and_says_what_it_is():
    for name, entry in INDEX.items():
        # a name is never mistaken for a path (``recorded_file`` takes either)
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert set(entry) <= {"path", "about", "csv"}, (name, entry)
        assert isinstance(entry["about"], str) and entry["about"].strip(), name
        paths = _paths(entry)
        assert paths and all(isinstance(p, str) for p in paths), name
        for p in paths:
            assert not Path(p).is_absolute() and ".." not in Path(p).parts, (name, p)
            assert (RESULTS / p).exists(), f"{name}: benchmarks/results/{p} is not there"
        assert len(set(paths)) == len(paths), name


def test_every_run_on_disk_is_an_entry():
    listed = {Path(p).parts[0] for entry in INDEX.values() for p in _paths(entry)}
    on_disk = {p.name for p in RESULTS.iterdir()} - {bench.INDEX}
    assert on_disk <= listed, f"not in benchmarks/results/{bench.INDEX}: {sorted(on_disk - listed)}"


def test_a_kind_lists_its_runs_oldest_first_and_the_newest_is_read():
    kinds = {name: entry["csv"] for name, entry in INDEX.items() if "csv" in entry}
    assert set(kinds.values()) >= {"results.csv", "blocks.csv", "ladder.csv", "decode.csv", "ring.csv"}
    assert len(set(kinds.values())) == len(kinds), kinds      # one entry per CSV
    for name, csv in kinds.items():
        runs = [p / csv for p in bench.run_paths(name)]
        assert all(p.is_file() for p in runs), name
        dates = [bench.run_date(p) for p in runs]
        assert dates == sorted(dates), (name, dates)
        assert bench.find_runs(csv_name=csv) == runs[::-1]
        assert bench.latest_results(csv_name=csv) == bench.run_path(name) / csv


def _code_strings(path):
    """The string literals of a module's code: not its docstrings, never its comments
    (which may cite a recorded run as evidence)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_library_module_names_a_recorded_run():
    """Runs are found by name in the index: no string of the library's code holds the
    name of a folder or file under benchmarks/results/."""
    names = {part for entry in INDEX.values() for p in _paths(entry) for part in Path(p).parts}
    names |= {p.name for p in RESULTS.iterdir()} - {bench.INDEX}
    found = []
    for module in sorted((REPO / "flashbook").rglob("*.py")):
        for text in _code_strings(module):
            found += [f"{module.relative_to(REPO)}: {text!r}" for name in names if name in text]
    assert not found, "\n".join(found)


def test_an_unknown_name_says_which_names_there_are():
    with pytest.raises(ValueError, match=r"got 'hoper_fwd'; it has .*hopper_fwd"):
        bench.run_path("hoper_fwd")
    with pytest.raises(ValueError, match="got 'nope'"):
        bench.load_recorded_json("nope")
    runs = bench.list_runs()
    assert list(runs) == list(INDEX) and all(runs.values())


def test_a_root_without_an_index_records_nothing_by_name(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "run.json").write_text(json.dumps({"rows": []}))
    assert bench.run_path("hopper_fwd", tmp_path) is None and bench.run_paths("hopper_fwd", tmp_path) == []
    assert bench.load_recorded_json("hopper_fwd", tmp_path) is None
    assert bench.load_recorded_json("x/run.json", tmp_path) == {"rows": []}      # a path under the root
    assert bench.run_path("hopper_fwd", tmp_path / "missing") is None
    assert bench.load_recorded_json("x/run.json", tmp_path / "missing") is None


def test_with_an_index_only_the_runs_it_lists_are_read(tmp_path):
    for folder, date in (("old", "2026-01-01T00:00:00+00:00"), ("new", "2026-02-01T00:00:00+00:00"),
                         ("stray", "2026-03-01T00:00:00+00:00")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ring.csv").write_text("seq\n1\n")
        (tmp_path / folder / "provenance.json").write_text(json.dumps({"date_utc": date}))
    index = {"runs": {"ring": {"path": ["old", "new"], "csv": "ring.csv", "about": "two runs"}}}
    (tmp_path / bench.INDEX).write_text(json.dumps(index))
    assert bench.latest_results(tmp_path, "ring.csv") == tmp_path / "new" / "ring.csv"   # not the stray one
    assert bench.find_runs(tmp_path, "ring.csv") == [tmp_path / "new" / "ring.csv", tmp_path / "old" / "ring.csv"]
    assert bench.find_runs(tmp_path, "decode.csv") == []
    assert bench.run_path("ring", tmp_path) == tmp_path / "new"
    index["runs"]["ring_again"] = {"path": "stray", "csv": "ring.csv", "about": "a second entry"}
    (tmp_path / bench.INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="one entry, not of ring, ring_again"):
        bench.latest_results(tmp_path, "ring.csv")
