"""Chapter 12 and which_kernel after the tenth reading: whose speed the FlexAttention headline is
about, the ALiBi slope's own letter, the stress runs counted over the runs (not in each), error
bounds rounded up (display.bound_up), the names the shown cells take from hidden ones, and
which_kernel's figures pointing to a place that shows them (chapter 10's range, chapter 12's
count of checks, this page's own counts labelled so), the window's reach, the wrapper's time."""
import ast
import builtins
import functools
import json
import os
import re

import pytest

from conftest import ROOT, require
from flashbook import bench
from flashbook.bench import chapter12
from flashbook.display import bound_up
from notebook_text import book_page, cell_source, cells, flat, markdown, notebook, page_glued, run_glued

CH10, CH12 = "10_making_it_fast", "12_masks"


@functools.lru_cache(maxsize=None)
def _which_kernel():
    return page_glued("which_kernel.md")


def _row(start):
    return next(line for line in book_page("which_kernel.md").splitlines() if line.startswith(start))


# --- chapter 12 ---------------------------------------------------------------------------------

def test_bound_up_rounds_an_error_up_to_one_digit():
    """A bound the prose quotes must not sit below an error printed beside it: 5.4e-07 is
    "6e-07", not "5e-07" (round-to-nearest)."""
    for value, want in ((5.4e-07, "6e-07"), (5.7e-07, "6e-07"), (5e-07, "5e-07"), (2.3e-07, "3e-07"),
                        (9.5e-07, "1e-06"), (1e-06, "1e-06"), (0.0, "0")):
        assert bound_up(value) == want, value
    for value in (5.4e-07, 5.7e-07, 1.23e-03, 9.99e-05):
        assert float(bound_up(value)) >= value


def test_ch12_error_bounds_are_rounded_up_past_every_printed_error():
    """ALiBi's dv 5.4e-07 and the packed documents' dq 5.7e-07 (the printed errors): both
    sentences say "to 6e-07"."""
    printed = {"alibi": {"o": 2.3e-07, "dq": 2.8e-07, "dk": 3.0e-07, "dv": 5.4e-07},
               "varlen": {"o": 2.6e-07, "dq": 5.7e-07, "dk": 4.1e-07, "dv": 3.7e-07}}
    code = cell_source(CH12, "1bb6d6c1").split("from flashbook.bench import chapter12")[0]
    glued, _ = run_glued(code, quiet=True, varlen_err=printed["varlen"], dtype="torch.float32")
    assert glued["varlen_err"] == "6e-07"
    glued, _ = run_glued(cell_source(CH12, "58d21353"), quiet=True, alibi_err=printed["alibi"])
    assert glued["alibi_err"] == "6e-07"
    text = flat(markdown(CH12))
    assert "agree with float64 to {glue:text}`alibi_err`" in text
    assert "agrees with float64 to {glue:text}`varlen_err`" in text


def test_ch12_headline_says_whose_speed_and_names_the_backward_exception():
    """"It was never slower" read as FlexAttention (which was slower); flashbook's forward and
    forward plus backward lost nowhere beyond the noise, its backward alone did for packed
    documents at two lengths, as the backward paragraph says."""
    path = bench.run_path("masks")
    require(path is not None, "run masks is not recorded")
    rec = json.load(open(path / "masks.json"))
    verdicts = chapter12.flex_verdicts(rec["rows"])
    assert verdicts["fwd"]["loss"] == verdicts["fwd_bwd"]["loss"] == 0
    clear = [a for a in chapter12.backward_alone(rec["rows"]) if 1 - a["ratio"] > a["spread"]]
    assert {a["mask"] for a in clear} == {"documents"} and [a["seq"] for a in clear] == [8192, 16384]
    head = flat(cell_source(CH12, "448189c1")).split(":::")[0]
    assert "It was never slower" not in head
    assert ("flashbook was never slower beyond the noise, forward or with the backward; its backward alone "
            "was, for packed documents at {glue:text}`mb_bwd_clear` (below).") in head
    assert "beyond the repeats' spread for packed documents at {glue:text}`mb_bwd_clear`" in flat(
        cell_source(CH12, "a5000337"))


def test_ch12_alibi_slope_is_not_the_running_maximum():
    """m is the running maximum from chapter 2 on; the slope is a_h in the text and the summary."""
    text = flat(markdown(CH12))
    assert not re.search(r"(?<![A-Za-z_])m_h", text)
    assert "subtracts $a_h \\cdot |i + N_k - N_q - j|$" in text and "($a_h = 2^{-8(h+1)/H}$ in the paper)" in text
    assert "subtracts $a_h |i + N_k - N_q - j|$ in the score step" in text


def test_ch12_stress_runs_cover_every_class_over_the_runs_not_in_each():
    reruns = chapter12.stress_reruns()
    require(reruns is not None, "no recorded stress runs")
    assert reruns["not_rerun"] == 0 and 1 <= reruns["complete"] < reruns["files"]   # one run took them all
    glued, _ = run_glued(cell_source(CH12, "1bb6d6c1"), quiet=True, varlen_err={"o": 0.0}, dtype="float32")
    assert glued["st_not_rerun_phrase"] == (f"each of the {reruns['classes']} mask classes ran at least once, "
                                            "the one that had failed included.")
    assert "over {glue:text}`st_files` GPU runs, {glue:text}`st_not_rerun_phrase`" in flat(markdown(CH12))


def test_ch12_shown_cells_say_which_names_come_from_hidden_cells():
    """A reader who copies a shown cell learns where a name it uses is defined."""
    hidden, seen = set(), set()
    for cell in cells(notebook(CH12)):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
        made = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                made.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                made.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                made |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if "remove-cell" in cell["metadata"].get("tags", []):
            hidden |= made
            continue
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        from_hidden = (used & hidden) - made - seen - set(dir(builtins))
        comments = " ".join(line for line in src.splitlines() if "#" in line)
        for name in from_hidden:
            assert name in comments and "hidden cell" in comments, (cell["id"], name)
        seen |= made
    assert "# tile_shape: defined in a hidden cell" in cell_source(CH12, "c12-tile-table")


def test_ch12_documents_row_sentence_and_heavy_last_row_read_plainly():
    text = flat(markdown(CH12))
    assert "The table's documents row counts the tiles of the packed sequence as one grid" in text
    assert "The table's documents count tiles" not in text
    box = flat(cell_source(CH12, "b98bd1a6"))
    assert "`HEAVY_LAST` names the natural order it undoes" not in box
    assert "The flag `HEAVY_LAST` turns this on where the heavy tiles would otherwise come last." in box


# --- which_kernel -------------------------------------------------------------------------------

def test_which_kernel_head_dim_128_range_is_the_one_chapter_10_quotes():
    """The row says "a tie from 4K (... ; chapter 10)": the range is the front-door run's from 4K
    on, which chapter 10 quotes as fd128_lo to fd128_hi; the 1K rows (0.88) are this page's own."""
    from flashbook.bench import chapter10_beyond

    rows = bench.load_recorded_json("front_door")["rows"]
    got = {}

    class Ch:
        frames = {"gluon128": bench.gluon_schedule_table(128)}

        def put(self, name, value, fmt=""):
            got[name] = format(value, fmt)

        def nothing(self, *names):
            raise AssertionError("chapter 10 has no front-door range")

    chapter10_beyond.front_door_vs_sweep(Ch(), rows)
    glued = _which_kernel()
    assert (glued["fd_fwd128_4k_lo"], glued["fd_fwd128_4k_hi"]) == (got["fd128_lo"], got["fd128_hi"])
    assert float(glued["fd_fwd128_lo"]) < float(got["fd128_lo"])          # the 1K loss: not chapter 10's range
    assert "`flash_attention`) at {glue:text}`fd128_lo` to {glue:text}`fd128_hi`" in flat(markdown(CH10))
    row = _row("| inference with plain full or causal attention")
    assert ("a tie from 4K ({glue:text}`fd_fwd128_4k_lo` to {glue:text}`fd_fwd128_4k_hi` times cuDNN's speed "
            "there; {doc}`chapter 10") in row


def test_which_kernel_packed_row_counts_chapter_12s_checks():
    """"44 kinds of packed batch (chapter 12)" could not be found there: the row now gives chapter
    12's count of checks (550 of 550), and the footnote the packed classes among them, labelled as
    this page's count."""
    reruns = chapter12.stress_reruns()
    require(reruns is not None, "no recorded stress runs")
    glued = _which_kernel()
    assert glued["stress_tests"] == str(reruns["tests"])
    assert glued["stress_passed"] == str(reruns["tests"] - reruns["failures"])
    ch12, _ = run_glued(cell_source(CH12, "1bb6d6c1"), quiet=True, varlen_err={"o": 0.0}, dtype="float32")
    assert (glued["stress_passed"], glued["stress_tests"]) == (ch12["st_passed"], ch12["st_tests"])
    assert "the stress test passed {glue:text}`st_passed` of {glue:text}`st_tests` checks" in flat(markdown(CH12))
    assert 0 < reruns["packed"] < reruns["classes"] and reruns["packed_tests"] < reruns["tests"]
    assert glued["vl_classes"] == str(reruns["packed"]) and glued["vl_failed"] == "0"
    row = flat(_row("| documents packed in one sequence"))
    assert "kinds of packed batch" not in row
    assert "{glue:text}`stress_passed` of {glue:text}`stress_tests` checks passed in the GPU stress test" in row
    note = flat(_row("[^varlen]:"))
    assert "{glue:text}`vl_failed` failures (this page's count, from chapter 12's runs)" in note
    assert "one mask class (a mask, a dtype and a shape) called 60 times" in note


def test_which_kernel_ring_ratio_is_labelled_as_this_pages_count():
    row = flat(_row("| one sequence spread over several GPUs"))
    assert "up to {glue:text}`ring_grad_ratio` times one GPU's: this page's count, from chapter 11's run)" in row
    assert float(_which_kernel()["ring_grad_ratio"]) > 1


def test_which_kernel_window_reach_is_left_not_the_key_count():
    """window=(W - 1, 0) holds W keys in chapter 12; the Flex table's reach is named `left`."""
    row = flat(_row("| sliding window"))
    assert row.startswith("| sliding window (`q_idx - kv_idx <= left`, with causal: left + 1 keys) | "
                          "`causal=True, window=(left, 0)` |")
    assert "window=(W - 1, 0)" in flat(markdown(CH12))


def test_which_kernel_says_what_the_read_only_call_is_and_what_the_gap_is():
    """131 µs is flash_attn_with_kvcache with no k, v or rotary (kvcache_host.py's "reading
    only"), 65 µs flash_decode: the 66 µs between is the wrapper's own work."""
    glued = _which_kernel()
    read, fd = int(glued["kv_read_host"]), int(glued["kv_fd_host"])
    assert int(glued["kv_wrap_host"]) == read - fd > 0
    script = open(os.path.join(ROOT, "benchmarks", "kvcache_host.py"), encoding="utf-8").read()
    assert '"kvcache, reading only": lambda: fa(q, k_cache, v_cache, cache_seqlens=lengths + 1, causal=True)' in script
    text = flat(book_page("which_kernel.md"))
    assert "µs without writes" not in text
    assert ("{glue:text}`kv_read_host` µs given no `k`, `v` or rotary (a read-only call)") in text
    assert ("The {glue:text}`kv_wrap_host` µs between the read-only call and `flash_decode` is the wrapper's "
            "own Python work around the same kernel.") in text


if __name__ == "__main__":
    pytest.main([__file__])
