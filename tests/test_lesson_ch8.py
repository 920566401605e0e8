"""Chapter 8 as a lesson: the statements it corrected stay correct, with the numbers behind
them. The atomic-dQ comparison says what was measured (the fence, relaxed adds, a staggered
start, a second run) and no more; the FLOPs each dQ mode executes are set against what
benchmarks credit, with the tensor pipe's own count; the Triton tutorial's backward is
described as it is; prose beside a GPU cell quotes only numbers that the cell's recording
carries; and the page shows the kernel lines that teach, not whole listings."""
import os
import re
import sys

import nbformat
import pandas as pd
import pytest

from conftest import ROOT
from flashbook import bench
from notebook_text import cell_source, markdown, run_glued

sys.path.insert(0, os.path.join(ROOT, "book", "_ext"))
import gpu_outputs  # noqa: E402

NB = os.path.join(ROOT, "notebooks", "08_triton_backward.ipynb")
GLUED_BY = re.compile(r"""\b(?:g|glue|glue_text)\(\s*["'](\w+)["']""")   # g("name", ...) in a cell


@pytest.fixture(scope="module")
def nb():
    return nbformat.read(NB, as_version=4)


def _quoted(text):
    return set(re.findall(r"\{glue:text\}`(\w+)`", text))


def _glued_by_cells(nb, *cell_ids):
    """Run the chapter's cells ``cell_ids`` in one namespace, as the chapter does, with ``g``
    recording what it glues; returns {name: the text the prose shows}."""
    from flashbook import tiled
    from flashbook.kernels import configs

    return run_glued([cell_source(nb, cell_id) for cell_id in cell_ids], pd=pd, bench=bench,
                     tiled=tiled, configs=configs)[0]


def test_prose_quotes_a_gpu_cells_numbers_only_from_its_recording(nb):
    """A number a gpu cell glues is quoted in the prose only when the cell's H200 recording
    carries it: otherwise the book would print the CPU build's number beside the H200 table
    (once "at most 1.50 times the yardstick's" under a table whose largest ratio was 1.0)."""
    record = gpu_outputs.load_record("08_triton_backward")
    recorded = {c["id"]: {gpu_outputs._glue_key(o) for o in c["outputs"]} - {None} for c in record["cells"]}
    quoted = _quoted(markdown(nb))
    gpu_cells = [c for c in nb.cells if gpu_outputs.is_gpu_cell(c)]
    assert {c.id for c in gpu_cells} == {"ed1bb987", "43428188"}
    for cell in gpu_cells:
        for name in set(GLUED_BY.findall(cell.source)) & quoted:
            assert name in recorded.get(cell.id, set()), (
                f"the prose quotes {name!r}, glued by gpu cell {cell.id}, whose recording lacks it")
    # what the prose does say about the gradient check holds in the recording: every
    # ratio to the yardstick within the rule's factor of 2
    table = next(c for c in record["cells"] if c["id"] == "ed1bb987")["outputs"][0]["text"].splitlines()
    assert "dV / yardstick" in table[0]
    ratios = [float(x) for row in table[2:] if row.strip() for x in row.split()[-8:][1::2]]
    assert len(ratios) == 4 * 5 and max(ratios) <= 2
    assert "Every gradient passes" in cell_source(nb, "aacbec1b")


def test_atomic_dq_is_stated_as_measured_and_not_generalised(nb):
    from flashbook.bench import experiments

    glued = _glued_by_cells(nb, "atomic-relaxed")
    # the two recorded runs, as the chapter glues them
    assert (glued["at_fence_lo"], glued["at_fence_hi"]) == ("2.40", "6.93")            # acq_rel adds
    assert (glued["at_relaxed_lo"], glued["at_relaxed_hi"]) == ("1.08", "1.90")        # relaxed adds
    assert glued["at_spread"] == "3.2%"
    # the fence's cost shape by shape (acq_rel over relaxed), the staggered start, and how far each
    # variant moved between the runs: appendix A3 (and tests/test_review_ch07_08.py)
    _, a3 = run_glued(cell_source(os.path.join(ROOT, "notebooks", "A3_lab_notes.ipynb"), "a3-atomic-fence"),
                      quiet=True)
    assert (f"{a3['fence'].min().min():.2f}", f"{a3['fence'].max().max():.2f}") == ("1.95", "3.69")
    # chapter 10 quotes the same two ranges from the same two runs (they once disagreed)
    from flashbook.bench import chapter10

    ch10 = chapter10.build().values
    assert (ch10["at10_fence_lo"], ch10["at10_fence_hi"]) == (glued["at_fence_lo"], glued["at_fence_hi"])
    assert (ch10["at10_relaxed_lo"], ch10["at10_relaxed_hi"]) == (glued["at_relaxed_lo"], glued["at_relaxed_hi"])
    # "the separate dQ kernel was the faster at every shape measured", in both runs
    spans = experiments.atomic_dq_ranges(experiments.atomic_dq_table())
    assert all(lo > 1 for name, (lo, hi) in spans.items() if name != "separate")
    again = bench.load_recorded_json("atomic_dq_repeat")["rows"]
    assert min(1 / r["vs_separate"] for r in again if r["variant"] != "separate") > 1
    text = cell_source(nb, "4571a510")
    before = cell_source(nb, "c08-atomic-timed-md")        # the table's spread and shapes: above it
    assert {"at_spread", "at_tokens", "at_calls", "at_heads"} <= _quoted(before)
    assert set(glued) - {"at_spread", "at_tokens", "at_calls", "at_heads"} <= _quoted(text)
    assert "{doc}`A3 <A3_lab_notes>`" in text
    assert "{glue:text}`at_spread`" in cell_source(nb, "c08-atomic-timed-md")
    assert "not atomics in general" in text and "with these kernels" in text
    assert "FlashAttention-2" in text and "fp32 atomics" in text and "TMA reduce-add" in text
    md = markdown(nb)
    assert "2.5 to 7.6" not in md and "a separate dQ kernel wins" not in md
    # the hedge is said once, beside the measurement; the summary still scopes the timing to these
    # kernels on one GPU
    assert md.count("not atomics in general") == 1 and "not a verdict on atomics" not in md
    summary = " ".join(cell_source(nb, "28d0e613").split())
    assert "On an H200, with these kernels," in summary
    # the live timing cell recorded before the adds were relaxed is gone, with its record
    assert "0044c164" not in {c.id for c in nb.cells}
    assert "0044c164" not in {c["id"] for c in gpu_outputs.load_record("08_triton_backward")["cells"]}


def test_the_separate_mode_executes_seven_products_where_five_are_credited(nb):
    glued = _glued_by_cells(nb, "4e765c85", "df624218")
    assert glued["credit_factor"] == "2.5" and glued["tr_credit_products"] == "5"
    assert glued["tr_atomic_over_credit"] == "1.00" and glued["tr_separate_over_credit"] == "1.40"
    assert glued["tr_flops"] == "1.40"
    # Nsight Compute's count of the tensor pipe's math on the H200 says the same: 7 products
    # to the forward's 2 (3.5), cuDNN's 5 (2.5)
    assert (glued["ncu_ops_ours"], glued["ncu_ops_cudnn"]) == ("3.50", "2.50")
    text = cell_source(nb, "1f80d233")
    assert "five matrix products" in text and "executes seven" in text and "$2N^2d$" in text
    assert {"credit_factor", "tr_credit_products", "tr_atomic_over_credit", "tr_separate_over_credit",
            "ncu_ops_ours", "ncu_ops_cudnn"} <= _quoted(text)
    assert "{glue:text}`tr_separate_over_credit`" in cell_source(nb, "28d0e613")
    # exercise 2 counts the same products, and its solution sets them against the credit
    solution = cell_source(nb, "6e20b8ca")
    assert '"atomic": 5' in solution and '"separate": 7' in solution and "credit" in solution
    assert "{glue:text}`credit_factor`" in cell_source(nb, "0f88c53c")


def test_the_triton_tutorial_computes_dk_dv_and_dq_in_one_program(nb):
    md = markdown(nb)
    assert "tutorial uses a separate pass" not in md
    text = cell_source(nb, "4571a510")
    assert "each program of its `_attn_bwd` computes" in text and "in one launch" in text


def test_the_page_shows_the_lines_that_teach(nb, monkeypatch):
    """Every listing on the page is a few lines of the library, and the whole file is named
    (the book links a quoted repository path to it). The exception is the minimal backward
    (``flashbook.kernels.minimal``), shown whole as chapter 7 shows its minimal forward: two
    kernels of about 40 lines each."""
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, *a, **k: shown.append(obj.data))
    namespace = {}
    exec(cell_source(nb, "a3996ecb"), namespace)          # the chapter's imports
    calls = [line for c in nb.cells if c.cell_type == "code" and not gpu_outputs.is_gpu_cell(c)
             for line in c.source.splitlines()
             if line.startswith(("show_between(", "flashbook.show_source(", "show_source("))]
    assert len(calls) >= 8
    whole = []
    for call in calls:
        shown.clear()
        exec(call, namespace)
        (listing,) = shown
        code = listing.split("```python\n", 1)[1].rsplit("```", 1)[0]
        if call.startswith("show_source(minimal."):      # the minimal kernels, whole
            whole.append(call)
            assert len(code.splitlines()) <= 45, f"{call}: {len(code.splitlines())} lines"
        else:
            assert len(code.splitlines()) <= 15, f"{call}: {len(code.splitlines())} lines"
    assert whole == ["show_source(minimal.minimal_bwd_dkdv)", "show_source(minimal.minimal_bwd_dq)"]
    assert "`flashbook/kernels/backward.py`" in cell_source(nb, "9d2b629e")


def test_the_query_bounds_figure_describes_what_the_kernels_helper_computes():
    """The figure's description quotes the five bounds; recomputed here by the same probe kernel."""
    import json
    import re

    import torch
    import triton

    from flashbook.kernels import probes

    cell = next(c for c in json.load(open(os.path.join(ROOT, "notebooks", "08_triton_backward.ipynb")))["cells"]
                if c.get("id") == "c08-bounds-fig")
    alt = cell["metadata"]["mystnb"]["image"]["alt"]
    source = "".join(cell["source"])
    n, bm, bn, col = (int(x) for x in re.search(r"QB_N, QB_BM, QB_BN, QB_COL = (\d+), (\d+), (\d+), (\d+)", source).groups())
    out = torch.zeros(triton.cdiv(n, bn), 5, dtype=torch.int32)
    probes._query_bounds_probe[(out.shape[0],)](out, n, n, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True)
    lo, band_end, full_end, main_end, hi = out[col].tolist()
    assert f"N = {n} with {bm} by {bn} tiles" in alt
    assert f"lo = {lo}" in alt and f"band_end = {band_end}" in alt and f"hi = {hi}" in alt
    assert full_end == main_end and f"full_end = main_end = {full_end}" in alt
