"""Chapter 10's numbers, tables and figures (``flashbook.bench.chapter10.build``), from the
recorded runs and from a results root with nothing in it; read against the chapter's own
Markdown and code (the notebook's JSON: nothing is executed here)."""
import io
import os
import re

import pytest
from matplotlib.figure import Figure

from conftest import ROOT, require
from flashbook import bench
from flashbook.bench import chapter10
from notebook_text import cell_source, cells, markdown, source_of

NOTEBOOK = os.path.join(ROOT, "notebooks", "10_making_it_fast.ipynb")
LAB_NOTES = os.path.join(ROOT, "notebooks", "A3_lab_notes.ipynb")   # the experiments that lost
RECORDED = os.path.join(ROOT, "benchmarks", "results")
HIDDEN = ("hide-input", "remove-cell", "remove-input")


def _quoted(path=NOTEBOOK) -> set:
    """Every name the chapter's (or the lab notes') Markdown quotes: {glue:text}`name` (with
    or without a format) and {glue:}`name`."""
    return set(re.findall(r"\{glue(?::[\w-]*)?\}`([^`:]+)", markdown(path, sep="")))


GLUED_BY_NOTEBOOK = {name for names in chapter10.GLUED_BY_NOTEBOOK.values() for name in names}


@pytest.fixture(scope="module")
def recorded():
    require(bench.latest_ladder(RECORDED) is not None, "no recorded ladder under benchmarks/results/")
    return chapter10.build(RECORDED)


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    return chapter10.build(tmp_path_factory.mktemp("no_results"))


def test_every_quoted_name_has_a_value_from_the_recorded_runs(recorded):
    quoted = _quoted()
    assert len(quoted) > 130          # the regex finds the chapter's names (142 when last counted)
    assert quoted - GLUED_BY_NOTEBOOK <= set(recorded.values), sorted(quoted - GLUED_BY_NOTEBOOK - set(recorded.values))
    lab = _quoted(LAB_NOTES)           # the lab notes glue build()'s values only
    assert len(lab) > 80 and lab <= set(recorded.values), sorted(lab - set(recorded.values))
    # (ptx_gl_wgmma: the PTX table shows it; since round 10 the optional note on the counts quotes it too)
    assert GLUED_BY_NOTEBOOK <= quoted | {"ptx_gl_wgmma"}
    assert not GLUED_BY_NOTEBOOK & set(recorded.values)          # each name is glued once
    missing = {k: v for k, v in recorded.values.items() if v in ("n/a", "(not recorded)") or "not recorded" in v}
    assert missing == {}
    assert recorded.messages == {}                               # everything was found


def _glued_in(code: str) -> set:
    """The names a cell glues by hand: g("name", ...), and g(f"poly{deg}_err", ...) for 3 and 4."""
    names = set(re.findall(r'\bg\(\s*"([^"]+)"', code))
    for pattern in re.findall(r'\bg\(\s*f"([^"]+)"', code):
        names |= {pattern.replace("{deg}", str(deg)) for deg in (3, 4)} if "{deg}" in pattern else set()
    return names


def test_the_names_the_notebook_glues_itself_are_glued_where_the_module_says():
    """The teaching, live and lab cells glue their own names, and no other cell glues a
    name by hand: the rest come from build()'s values, in one loop."""
    for cell_id, names in chapter10.GLUED_BY_NOTEBOOK.items():
        glued = _glued_in(cell_source(NOTEBOOK, cell_id))
        assert set(names) <= glued, (cell_id, set(names) - glued)
    others = set()
    for c in cells(NOTEBOOK):
        if c["cell_type"] == "code" and c.get("id") not in chapter10.GLUED_BY_NOTEBOOK:
            others |= _glued_in(source_of(c))
    assert others == set()
    assert "for name, text in ch.values.items():" in cell_source(NOTEBOOK, "4206a104")


def _shown(path) -> set:
    return {t for c in cells(path) if c["cell_type"] == "code"
            for t in re.findall(r'ch\.show\("(\w+)"\)', source_of(c))}


def test_the_notebook_shows_every_topic_and_only_those():
    from flashbook.bench.chapter10_lab import LAB_TOPICS

    assert _shown(NOTEBOOK) == set(chapter10.TOPICS)
    assert _shown(LAB_NOTES) == set(LAB_TOPICS)
    assert not set(chapter10.TOPICS) & set(LAB_TOPICS)
    assert "ch = chapter10.build()" in cell_source(NOTEBOOK, "4206a104")
    hidden = [c for c in cells(NOTEBOOK) if c["cell_type"] == "code"
              and any(t in c.get("metadata", {}).get("tags", []) for t in HIDDEN)]
    assert sum(len(source_of(c).splitlines()) for c in hidden) < 320


def test_with_nothing_recorded_every_name_has_a_value_and_the_cells_say_why(empty):
    quoted = _quoted()
    assert quoted - GLUED_BY_NOTEBOOK <= set(empty.values)
    assert set(empty.values) == set(chapter10.build(RECORDED).values)
    assert empty.values["noise"] == "n/a" and empty.values["n_rungs"] == str(len(chapter10.RUNGS))
    assert empty.figures == {} and empty.noise is None and empty.frames["steps"] is None
    from flashbook.bench.chapter10_lab import LAB_TOPICS

    assert len(empty.messages) >= 15
    for topic, text in empty.messages.items():
        assert topic in chapter10.TOPICS + LAB_TOPICS
        assert all("No recorded" in line or "none recorded" in line for line in text.splitlines()), (topic, text)
    assert "No recorded ladder was found" in empty.messages["ladder_figure"]


def test_the_results_root_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(bench.RESULTS_ENV, str(tmp_path))
    ch = chapter10.build()
    assert ch.root == tmp_path and ch.values["goal_verdict"] == "n/a" and "recorded" in ch.messages


def test_every_figure_draws_and_every_table_renders(recorded):
    assert set(recorded.figures) == {"ladder", "backward", "schedules"}
    for name, draw in recorded.figures.items():
        fig = draw()
        assert isinstance(fig, Figure) and fig.axes, name
        assert all(ax.has_data() for ax in fig.axes), name
        fig.savefig(io.BytesIO(), format="png")
    assert len(recorded.tables) >= 30
    for name in recorded.tables:
        assert "<table" in recorded.styled(name).to_html(), name


def test_the_noise_floor_is_the_larger_sample(recorded):
    ladder = recorded.frames["fsteps"]
    same = ladder[~ladder["causal"] & ladder["name"].isin(chapter10.NO_OPS_UNMASKED)]
    floor = float((same["vs_prev"] - 1).abs().max())
    assert recorded.noise >= floor
    assert recorded.values["noise"] == f"{100 * recorded.noise:.1f}"
    assert float(recorded.values["noise"]) == max(float(recorded.values["noise_ladder"]),
                                                  float(recorded.values["noise_twin"]))


def test_the_chapters_instruction_count_is_the_library_one(recorded):
    """The chapter writes the listed steps out for the reader to change (cell 1791dcf8) and shows
    them beside the compiled loops' counts; the bounds come from the compiled counts, the same
    ones the measured table uses."""
    import pandas as pd

    ns = {"pd": pd, "g": lambda *a, **k: None, "ch": recorded}
    exec(cell_source(NOTEBOOK, "1791dcf8"), ns)
    assert ns["PER_SCORE"] == chapter10.PER_SCORE
    assert ns["CAUSAL_EXTRA"] == chapter10.CAUSAL_EXTRA and ns["NATURAL_EXP"] == chapter10.NATURAL_EXP
    for stage in ("masked", "main"):
        for causal in (False, True):
            for exp2 in (False, True):
                assert ns["ops_per_score"](stage, causal, exp2) == chapter10.ops_per_score(stage, causal, exp2)
    model = recorded.tables["exp2_model"]
    assert len(model) == 4
    for (d, mask), row in model.iterrows():
        c = mask == "causal"
        assert row["listed, exp"] == ns["ops_per_score"]("masked", c, False)
        exp, exp2 = chapter10._compiled(recorded, 0, d, c), chapter10._compiled(recorded, 1, d, c)
        assert (row["compiled, exp"], row["compiled, exp2"]) == (round(exp, 3), round(exp2, 3))
        assert row["gain if bound by them"] == round(exp / exp2, 3)
    for shape, row in recorded.tables["exp2_gains"].iterrows():      # the measured table's bound: the same
        d, mask = int(shape.split()[0][2:]), shape.split()[-1]
        assert row["bound from the count"] == model.loc[(d, mask), "gain if bound by them"]


def test_show_refuses_a_topic_it_does_not_know(recorded):
    with pytest.raises(ValueError, match="topic must be one of"):
        recorded.show("no such topic")
