"""flashbook.grade on the student edition, on the book with its solutions, and on wrong answers.

Executing a chapter takes 7-60 s on a CPU, so the default run grades two quick
chapters; FLASHBOOK_GRADE_ALL=1 grades all of them (about 10 minutes on two cores).
"""
import csv
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT
from flashbook import grade
from flashbook.exercises import CORRECT, NOT_ATTEMPTED, WRONG
from test_notebooks import CHAPTERS

sys.path.insert(0, os.path.join(ROOT, "tools"))
import student_edition  # noqa: E402  (tools/ is not a package)

FAST = ("02", "03")
# one group: the tests share one grader run (module fixture), made once on one worker
pytestmark = pytest.mark.xdist_group("grade")

SELECTED = [p for p in CHAPTERS
            if os.environ.get("FLASHBOOK_GRADE_ALL") == "1" or os.path.basename(p)[:2] in FAST]

#: One wrong answer per chapter: (exercise, the cell a student might write, what the report must say).
WRONG_ANSWERS = {
    "01": ("ch01.ex1", "your_gib = 64.0", "64.0 is not the answer"),
    "02": ("ch02.ex3", "def causal_online(Q, K, V, scale):\n    return reference.attention(Q, K, V, scale=scale)",
           "values differ"),
    "03": ("ch03.ex1", "def online_lse(row):\n    return float(np.log(np.sum(np.exp(row))))", "got inf"),
    "04": ("ch04.ex1", "def n_visited(n, block):\n    return (n // block) ** 2 // 2", "the schedule has"),
    "05": ("ch05.ex2", "def ratio(d, d_v):\n    return 2.0", "the answer is 2, expected"),
    "06": ("ch06.ex3", "def softmax_time_bound_us(chip, n_rows, n_cols, bytes_per_element):\n"
           "    return n_rows * n_cols * bytes_per_element / (chip.hbm_tb_s * 1e6)", "expected"),
    "07": ("ch07.ex1", "def predict_stages(n, block_m, block_n):\n    return (0, n // block_m, 0)",
           "the kernel does"),
    "08": ("ch08.ex2", "def backward_flops(n, d, mode):\n    return 4 * 2 * n * n * d", "chapter 5 counts"),
    "09": ("ch09.ex1", "def backward_intensity(n, d):\n    return 5 * 2 * n * n * d / (2 * 8 * n * d)",
           "which bytes or products are missing"),
    "10": ("ch10.ex1", "def skip_speedup(n, block_q, block_k):\n    return 2.0", "tiles miscounted"),
    "11": ("ch11.ex3", "def min_shard(flops_per_s, bytes_per_s):\n    return int(flops_per_s / bytes_per_s)",
           "want 2198"),
}


def run_grader(paths, out, *flags):
    proc = subprocess.run([sys.executable, "-m", "flashbook.grade", *paths, "--out", str(out), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "grades.csv")) as f:
        rows = list(csv.DictReader(f))
    return rows, proc.stdout


def with_wrong_answer(nb, exercise, source):
    """The student's notebook with `source` written just before the exercise's check."""
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and f'check("{exercise}"' in c.source)
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    return nb


@pytest.fixture(scope="module")
def student_run(tmp_path_factory):
    """One grader run over the student edition and a copy with one wrong answer per chapter."""
    base = tmp_path_factory.mktemp("grade")
    student = base / "student"
    student_edition.main(str(student))               # the student edition, as `make student` writes it
    paths = []
    for book_nb in SELECTED:
        name = os.path.basename(book_nb)
        paths.append(str(student / name))
        exercise, source, _ = WRONG_ANSWERS[name[:2]]
        nb = with_wrong_answer(nbformat.read(student / name, as_version=4), exercise, source)
        wrong = base / name.replace(".ipynb", "_wrong.ipynb")
        nbformat.write(nb, wrong)
        paths.append(str(wrong))
    rows, stdout = run_grader(paths, base / "out")
    return rows, stdout, base / "out"


def rows_of(rows, notebook):
    return [r for r in rows if r["notebook"] == notebook]


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("book_nb", SELECTED, ids=os.path.basename)
def test_the_student_edition_is_all_not_attempted(student_run, book_nb):
    rows, stdout, _ = student_run
    name = os.path.basename(book_nb)
    mine = rows_of(rows, name)
    expected = grade.exercises_in(nbformat.read(book_nb, as_version=4))
    assert len(expected) >= 3 and [r["exercise"] for r in mine] == expected
    assert all(r["status"] == NOT_ATTEMPTED for r in mine), mine
    for e in expected:                                                  # the table on stdout
        assert re.search(rf"^{re.escape(name)} +{re.escape(e)} +not attempted", stdout, re.M), e


@pytest.mark.slow
@pytest.mark.parametrize("book_nb", SELECTED, ids=os.path.basename)
def test_one_wrong_answer_is_flagged_with_its_message(student_run, book_nb):
    rows, _, _ = student_run
    name = os.path.basename(book_nb)
    exercise, _, says = WRONG_ANSWERS[name[:2]]
    mine = {r["exercise"]: r for r in rows_of(rows, name.replace(".ipynb", "_wrong.ipynb"))}
    assert mine[exercise]["status"] == WRONG and says in mine[exercise]["message"], mine[exercise]
    assert all(r["status"] == NOT_ATTEMPTED for e, r in mine.items() if e != exercise), mine


@pytest.mark.slow
def test_the_report_is_written_for_a_class(student_run):
    rows, _, out = student_run
    with open(out / "grades.json") as f:
        report = json.load(f)
    assert report["rows"] == rows and len(report["notebooks"]) == 2 * len(SELECTED)
    for nb in report["notebooks"]:
        # the student edition has no solution cell left to remove; Run all finished without an error
        assert nb["solutions_removed"] == 0 and not nb["solutions_run"] and nb["errors"] == [], nb
    assert set(rows[0]) == set(grade.FIELDS)


@pytest.mark.slow
def test_the_book_with_its_solutions_is_all_correct(tmp_path):
    rows, _ = run_grader(SELECTED, tmp_path, "--include-solutions")
    assert {r["notebook"] for r in rows} == {os.path.basename(p) for p in SELECTED}
    assert all(r["status"] == CORRECT for r in rows), [r for r in rows if r["status"] != CORRECT]
    with open(tmp_path / "grades.json") as f:
        for nb in json.load(f)["notebooks"]:
            assert nb["solutions_run"] and nb["solutions_removed"] == 0 and nb["errors"] == [], nb


def test_by_default_no_solution_cell_runs(monkeypatch):
    """The grader strips the cells tagged `solution` before the kernel sees the notebook."""
    seen = []

    class FakeClient:
        def __init__(self, nb, **kwargs):
            seen.append((nb, kwargs))

        def execute(self):
            pass

    import nbclient
    monkeypatch.setattr(nbclient, "NotebookClient", FakeClient)
    book_nb = SELECTED[0]
    result = grade.grade_notebook(book_nb, timeout=5)
    (nb, kwargs), = seen
    assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)
    assert result["solutions_removed"] >= 3 and kwargs["timeout"] == 5 and kwargs["allow_errors"]
    assert all(r["status"] == grade.NO_RESULT and r["message"] == "the check did not run"
               for r in result["rows"])
    grade.grade_notebook(book_nb, include_solutions=True)
    assert any("solution" in c.metadata.get("tags", []) for c in seen[-1][0].cells)


def test_bad_arguments_are_refused(tmp_path, capsys):
    for argv, says in ([str(tmp_path / "missing.ipynb")], "no such notebook"), \
                      ([SELECTED[0], "--timeout", "0"], "--timeout must be a positive"):
        with pytest.raises(SystemExit) as exc:
            grade.main(argv)
        assert exc.value.code == 2 and says in capsys.readouterr().err
