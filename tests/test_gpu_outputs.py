"""Cells tagged `gpu` and their recorded outputs (book/_ext/gpu_outputs.py), and the book's
links from quoted repository paths (book/_ext/flashbook_sphinx.py)."""
import glob
import json
import os
import sys

import nbformat
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "book", "_ext"))
import gpu_outputs  # noqa: E402

RECORDINGS = sorted(glob.glob(os.path.join(ROOT, gpu_outputs.RESULTS, "*.json")))
# Chapters whose pages must show GPU results: every one that tags a cell `gpu`.
GPU_CHAPTERS = sorted(p for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))
                      if any(gpu_outputs.is_gpu_cell(c) for c in nbformat.read(p, as_version=4).cells))


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def gpu_cell(source, outputs=(), cell_id="c1"):
    cell = nbformat.v4.new_code_cell(source, id=cell_id, metadata={"tags": ["gpu"]})
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def glued(name, value):
    return {"output_type": "display_data", "data": {"text/plain": repr(value)},
            "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}}}


PROV = {"gpu": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
        "triton": "3.6.0", "date": "2026-11-29T10:03:24+00:00", "commit": "abc1234"}


def record_of(nb):
    return {"provenance": PROV, "cells": gpu_outputs.extract(nb)}


def test_recorded_outputs_replace_the_live_ones_with_a_provenance_label():
    gpu_run = notebook(gpu_cell("t = time_it()", [stream("H200: 1.23 ms\n"), glued("ms", 1.23)]),
                       nbformat.v4.new_code_cell("x = 1", id="c2"))
    record = record_of(gpu_run)
    assert [c["id"] for c in record["cells"]] == ["c1"]          # untagged cells are not recorded
    cpu_build = notebook(gpu_cell("t = time_it()", [stream("needs a GPU\n"), glued("ms", 99.0),
                                                    glued("only_live", 1)]))
    status = gpu_outputs.apply(cpu_build, record)
    assert status == {"c1": "recorded"}
    outs = cpu_build.cells[0].outputs
    box = outs[0]["data"]["text/html"]
    for fact in ("Recorded on NVIDIA H200", "driver 580.1", "CUDA 13.0", "torch 2.11.0",
                 "triton 3.6.0", "2026-11-29", "commit abc1234"):
        assert fact in box
    assert gpu_outputs.CHANGED_NOTE not in box
    assert outs[1]["text"] == "H200: 1.23 ms\n"
    assert "needs a GPU\n" not in [o.get("text") for o in outs]
    # the recorded glued value wins; a value only the live cell glues is kept for the prose
    assert {gpu_outputs._glue_key(o): o["data"]["text/plain"] for o in outs if gpu_outputs._glue_key(o)} == \
        {"ms": "1.23", "only_live": "1"}


def test_a_cell_changed_since_the_recording_says_so():
    record = record_of(notebook(gpu_cell("t = time_it(n=4096)", [stream("1.23 ms\n")])))
    nb = notebook(gpu_cell("t = time_it(n=8192)", [stream("needs a GPU\n")]))
    assert gpu_outputs.apply(nb, record) == {"c1": "changed"}
    assert gpu_outputs.CHANGED_NOTE in nb.cells[0].outputs[0]["data"]["text/html"]
    assert nb.cells[0].outputs[1]["text"] == "1.23 ms\n"


def test_a_cell_never_recorded_keeps_its_output_under_a_warning():
    nb = notebook(gpu_cell("t = time_it()", [stream("needs a GPU\n")], cell_id="new"))
    assert gpu_outputs.apply(nb, {"provenance": PROV, "cells": []}) == {"new": "missing"}
    assert gpu_outputs.apply(notebook(gpu_cell("y", cell_id="n2")), None) == {"n2": "missing"}
    outs = nb.cells[0].outputs
    assert gpu_outputs.MISSING_CLASS in outs[0]["data"]["text/html"]
    assert "Recorded on" not in outs[0]["data"]["text/html"]
    assert outs[1]["text"] == "needs a GPU\n"


def test_the_mode_can_be_forced(monkeypatch):
    monkeypatch.setenv(gpu_outputs.ENV, "live")
    assert not gpu_outputs.use_recordings()
    monkeypatch.setenv(gpu_outputs.ENV, "recorded")
    assert gpu_outputs.use_recordings()


def test_gpu_chapters_6_to_10_tag_cells():
    names = [os.path.basename(p)[:2] for p in GPU_CHAPTERS]
    assert {"06", "07", "08", "09", "10"} <= set(names), names


@pytest.mark.parametrize("path", GPU_CHAPTERS, ids=os.path.basename)
def test_every_gpu_cell_has_a_recording_from_a_gpu(path):
    stem = os.path.basename(path)[:-len(".ipynb")]
    record = gpu_outputs.load_record(stem)
    assert record is not None, f"no {gpu_outputs.RESULTS}/{stem}.json: run tools/run_notebooks.py on a GPU"
    prov = record["provenance"]
    for key in ("gpu", "driver", "torch", "triton", "date", "commit"):
        assert prov.get(key), f"{stem}: the recording does not say its {key}"
    assert "cpu" not in prov["gpu"].lower()
    tagged = {c.id for c in nbformat.read(path, as_version=4).cells if gpu_outputs.is_gpu_cell(c)}
    assert tagged <= {c["id"] for c in record["cells"]}, f"{stem}: gpu cells without a recording"
    for cell in record["cells"]:
        text = json.dumps(cell["outputs"])
        # what was recorded on the GPU never comes from the interpreter or a build machine
        assert "interpreter" not in text and "TRITON_INTERPRET" not in text, (stem, cell["id"])
        assert not any(p in text for p in ("/work/", "/root/", "/home/", "../..")), (stem, cell["id"])


@pytest.mark.parametrize("path", RECORDINGS, ids=os.path.basename)
def test_no_recording_is_left_without_its_cells(path):
    with open(path) as f:
        record = json.load(f)
    nb = nbformat.read(os.path.join(ROOT, "notebooks", os.path.basename(path)[:-5] + ".ipynb"), as_version=4)
    tagged = {c.id for c in nb.cells if gpu_outputs.is_gpu_cell(c)}
    assert {c["id"] for c in record["cells"]} <= tagged, "recorded cells that are no longer tagged gpu"


def test_a_recording_keeps_the_values_its_prose_quotes_without_myst_nb(monkeypatch):
    """The GPU machine has no myst-nb, where ``glue`` stored nothing: the recordings of
    chapters 7, 8, 10 and 11 carried no glued value, and the prose beside their H200 tables
    quoted the CPU build's numbers. While recording (``RECORD_GLUE``), glue stores the value
    as myst-nb does, which myst-nb's own reader finds, and the recorded value wins."""
    import IPython.display
    from myst_nb.ext.glue import extract_glue_data_cell

    from flashbook import display

    shown = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw=False, metadata=None: shown.append((data, metadata)))
    monkeypatch.setitem(sys.modules, "myst_nb", None)     # import myst_nb fails, as on the GPU machine
    monkeypatch.delenv(display.RECORD_GLUE, raising=False)
    display.glue("worst_ratio", "0.18", display=False)
    assert shown == []                                   # a reader's Jupyter: nothing
    monkeypatch.setenv(display.RECORD_GLUE, "1")
    display.glue("worst_ratio", "0.18", display=False)
    (data, metadata), = shown
    output = {"output_type": "display_data", "data": data, "metadata": metadata}
    monkeypatch.delitem(sys.modules, "myst_nb")
    cell = nbformat.v4.new_code_cell("", id="c1", metadata={"tags": ["gpu"]})
    cell.outputs = [nbformat.from_dict(json.loads(json.dumps(output)))]
    (name, found), = extract_glue_data_cell(cell)
    assert name == "worst_ratio" and found["data"] == {"text/plain": "'0.18'"} and cell.outputs == []
    # the recorded value replaces the one the CPU build computed
    recorded = notebook(gpu_cell("x", [stream("table"), output]))
    live = notebook(gpu_cell("x", [glued("worst_ratio", "0.21")]))
    gpu_outputs.apply(live, record_of(recorded))
    values = [o["data"] for o in live.cells[0].outputs if gpu_outputs._glue_key(o) == "worst_ratio"]
    assert values == [{display.HIDDEN_GLUE_PREFIX + "text/plain": "'0.18'"}]


def test_repository_paths_in_the_prose_link_to_the_repository():
    """A web reader has no checkout: a quoted path of the repository becomes a link to it
    at this version's tag; a pattern, a path that names nothing, and code already in a
    link stay as they are."""
    from docutils import nodes

    import flashbook_sphinx

    para = nodes.paragraph()
    for text in ("benchmarks/results/decode_host_h200", "tests/test_decode.py", "benchmarks/results/…",
                 "benchmarks/results/nothing_here.json", "flash_decode", "tools/../README.md"):
        para += nodes.literal(text, text)
    inside = nodes.reference("", "", refuri="https://example.org")
    inside += nodes.literal("tools/gpu_run.sh", "tools/gpu_run.sh")
    para += inside
    title = nodes.title()
    title += nodes.literal("tests/test_decode.py", "tests/test_decode.py")
    doc = nodes.document(None, None)
    doc += [title, para]
    assert flashbook_sphinx.repository_links(doc, "https://github.com/o/r/", "v9.9.9") == 2
    links = [(r["refuri"], r.astext()) for r in doc.findall(nodes.reference)]
    assert links == [("https://github.com/o/r/tree/v9.9.9/benchmarks/results/decode_host_h200",
                      "benchmarks/results/decode_host_h200"),
                     ("https://github.com/o/r/blob/v9.9.9/tests/test_decode.py", "tests/test_decode.py"),
                     ("https://example.org", "tools/gpu_run.sh")]


#: Values a `gpu` cell glues that do not depend on the machine (the same on a CPU build), so the
#: prose may quote them without a recording: (notebook, name) -> why.
MACHINE_FREE = {("06_gpu_and_triton", "softmax_ulps"): "a constant of the check, ULPS = 16"}


def unrecorded_quotes(nb, stem: str, recorded: dict) -> list[str]:
    """Names the prose quotes ({glue:text}`name`) from a `gpu` cell whose value, on a page built
    without a GPU, would be the CPU's: not stored in the cell's recording (``recorded``: cell id ->
    recorded cell), not glued again by a later non-gpu cell (which reads the recording, as
    chapter 7's check does), and not ``MACHINE_FREE``."""
    import re

    glue_call = re.compile(r'\b(?:g|glue|glue_text)\(\s*"([A-Za-z_0-9]+)"')
    quoted = set(re.findall(r"\{glue(?::\w+)?\}`([^`]+)`",
                            "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")))
    problems = []
    for i, cell in enumerate(nb.cells):
        if not gpu_outputs.is_gpu_cell(cell):
            continue
        stored = {o.get("metadata", {}).get("scrapbook", {}).get("name")
                  for o in recorded.get(cell.id, {}).get("outputs", [])}
        for name in sorted(set(glue_call.findall(cell.source)) & quoted):
            again = any(name in glue_call.findall(c.source) for c in nb.cells[i + 1:]
                        if c.cell_type == "code" and not gpu_outputs.is_gpu_cell(c))
            if name not in stored and not again and (stem, name) not in MACHINE_FREE:
                problems.append(f"{stem}: the prose quotes {name!r} from gpu cell {cell.id}, unrecorded")
    return problems


@pytest.mark.parametrize("path", GPU_CHAPTERS, ids=os.path.basename)
def test_prose_quotes_a_gpu_cells_value_only_as_the_gpu_recorded_it(path):
    nb = nbformat.read(path, as_version=4)
    stem = os.path.splitext(os.path.basename(path))[0]
    record = os.path.join(ROOT, gpu_outputs.RESULTS, f"{stem}.json")
    recorded = {c["id"]: c for c in json.load(open(record))["cells"]} if os.path.isfile(record) else {}
    assert unrecorded_quotes(nb, stem, recorded) == []


def test_the_prose_rule_catches_a_quoted_value_its_recording_lacks():
    prose = nbformat.v4.new_markdown_cell("It ran {glue:text}`speed` times as fast.")
    bare = notebook(gpu_cell('g("speed", 1.5)', [stream("1.5\n")]), prose)
    assert unrecorded_quotes(bare, "x", {}) == ["x: the prose quotes 'speed' from gpu cell c1, unrecorded"]
    recorded = {"c1": {"outputs": [glued("speed", "1.5")]}}
    assert unrecorded_quotes(bare, "x", recorded) == []
    reread = notebook(gpu_cell('g("speed", 1.5)'), nbformat.v4.new_code_cell('g("speed", from_recording)', id="c2"),
                      prose)
    assert unrecorded_quotes(reread, "x", {}) == []


def test_the_box_is_short_and_keeps_the_run_one_click_away():
    """The box says in one line what it is; the run's provenance sits in a <details> below it,
    with a 40-character commit cut to 7 and a dirty tree said in words."""
    prov = dict(PROV, commit="475bbb66fdbdf0631b775dc740df7e1977bd3a24+changes")
    box = gpu_outputs.label(prov, changed=False)["data"]["text/html"]
    lead, details = box.split("<details>", 1)
    assert "The book was built without a GPU" in lead and "driver" not in lead
    assert "<summary>The run</summary>" in details
    assert "commit 475bbb6 with local changes" in details and "+changes" not in box
    assert "475bbb66fdbdf" not in box


def test_a_page_explains_the_recording_once_and_names_the_run_in_every_box():
    """The first recorded box of a page says what a recording is; later unchanged ones from the
    same run are their title and the run; a changed cell always says it changed."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"print({i})", id=f"c{i}") for i in range(3)]
    for c in nb.cells:
        c.metadata["tags"] = ["gpu"]
    cells = [{"id": c.id, "source_sha256": gpu_outputs.source_sha256(c.source),
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "x\n"}]} for c in nb.cells]
    cells[2]["source_sha256"] = "0" * 64                                     # the code changed since
    status = gpu_outputs.apply(nb, {"provenance": PROV, "cells": cells})
    assert status == {"c0": "recorded", "c1": "recorded", "c2": "changed"}
    boxes = [c.outputs[0]["data"]["text/html"] for c in nb.cells]
    assert "The book was built without a GPU" in boxes[0]
    assert "The book was built without a GPU" not in boxes[1] and "<summary>The run</summary>" in boxes[1]
    assert gpu_outputs.CHANGED_NOTE in boxes[2]
    assert all(f"Recorded on {PROV['gpu']}" in b for b in boxes)


def test_a_recorded_cells_prints_show_as_one_box_per_stream():
    """A recording keeps each flush as its own stream output; the page shows one box per
    run of one stream, in order, text unchanged, other outputs where they were."""
    outs = [{"output_type": "stream", "name": "stdout", "text": "a\n"},
            {"output_type": "stream", "name": "stdout", "text": ["b\n", "c\n"]},
            {"output_type": "stream", "name": "stderr", "text": "warn\n"},
            {"output_type": "stream", "name": "stdout", "text": "d\n"},
            {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "t"}},
            {"output_type": "stream", "name": "stdout", "text": "e\n"}]
    got = gpu_outputs.merge_streams(outs)
    assert [(o["output_type"], o.get("name"), o.get("text")) for o in got] == [
        ("stream", "stdout", "a\nb\nc\n"), ("stream", "stderr", "warn\n"), ("stream", "stdout", "d\n"),
        ("display_data", None, None), ("stream", "stdout", "e\n")]
    assert outs[0]["text"] == "a\n"                     # the recording itself is not changed
