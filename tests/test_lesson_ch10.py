"""Chapter 10 as a lesson: its length, its noise floor, what it says about atomics, its
sections, and the lab notes (appendix A3) that hold the experiments that lost.

The chapter once read like a research log (about 22,600 words on the built page), judged
rungs against one run's noise only, said that atomics are "2.5 to 7.6 times slower in
practice" from one implementation, and showed each lost experiment as a section of its own.
Each test here recomputes what the prose quotes from the recorded files, independently of
``flashbook.bench.chapter10``, so the text cannot drift from the data again.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import re
import sys

import pytest
import yaml

from conftest import ROOT, require
from notebook_text import cells, markdown, run_glued, source_of, sources_by_id

NOTEBOOK = os.path.join(ROOT, "notebooks", "10_making_it_fast.ipynb")
LAB = os.path.join(ROOT, "notebooks", "A3_lab_notes.ipynb")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
RECORDING = os.path.join(RESULTS, "gpu_outputs", "10_making_it_fast.json")


def _index() -> dict:
    return json.load(open(os.path.join(RESULTS, "index.json")))["runs"]


def _paths(name):
    p = _index()[name]["path"]
    return [os.path.join(RESULTS, x) for x in ([p] if isinstance(p, str) else p)]


@pytest.fixture(scope="module")
def ch():
    from flashbook.bench import chapter10

    require(os.path.isfile(os.path.join(RESULTS, "index.json")), "no recorded runs")
    return chapter10.build(RESULTS)


def test_the_chapter_is_a_lesson_not_a_log():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import page_words

    # the notebook's own words are a lower bound; the built page (outputs too) is the measure,
    # checked on the built book by tools/page_words.py
    assert page_words.notebook_words(NOTEBOOK) <= 8_000
    assert page_words.LIMIT == 12_000


def test_the_sections_are_one_idea_each_in_order():
    text = markdown(NOTEBOOK)
    # the rungs are introduced before the noise that judges them, then taken one by one
    headings = ["# 10. Making it fast", "## What you will learn", "## The Triton ladder", "## How we measure",
                "### The noise rule", "## Rung by rung",
                "### Rung 1: `exp2`", "### Rung 2: skip", "### Rung 3: an unmasked main loop",
                "### Rung 4: tuned block sizes", "### Rung 5: the heaviest query tiles first",
                "### The backward: a separate $dQ$ kernel", "## The whole ladder",
                "## What the compiler could not do: a Gluon kernel",
                "## Summary", "## Exercises", "## Further reading"]
    at = [text.find(h) for h in headings]
    assert -1 not in at, [h for h, i in zip(headings, at) if i == -1]
    assert at == sorted(at), "the sections are out of order"
    assert len(re.findall(r"^### Exercise \d", text, re.M)) == 5
    # the experiments that lost are not sections of the lesson any more
    # nor is chapter 9's target table repeated here (one sentence and a link instead)
    for gone in ("### Lazy rescaling", "### Autotuning", "### Sequence lengths known at compile time",
                 "### Three tries", "### Short sequences", "## What did not help",
                 "## Where the kernel stands against cuDNN"):
        assert gone not in text, gone


def _ladder_noise(path):
    """Largest gap, slower over faster minus one, of the two rungs that run the rung before's
    kernel without a mask."""
    rows = list(csv.DictReader(open(os.path.join(path, "ladder.csv"))))
    by = {(r["pass_"], r["seq"], r["head_dim"], r["causal"], int(r["rung"])): float(r["ms"]) for r in rows}
    out = []
    for r in rows:
        if r["pass_"] == "fwd" and r["causal"] == "False" and r["name"] in ("skip masked tiles", "heaviest first"):
            prev = by[(r["pass_"], r["seq"], r["head_dim"], r["causal"], int(r["rung"]) - 1)]
            out.append(max(prev, float(r["ms"])) / min(prev, float(r["ms"])) - 1)
    return max(out)


def _twin_noise(path):
    """Largest gap, slower over faster minus one, between flashbook's and flashbook-atomic's
    forward (one kernel)."""
    rows = [r for r in csv.DictReader(open(os.path.join(path, "results.csv"))) if r["fwd_ms"]]
    key = lambda r: (r["batch"], r["heads"], r["seq"], r["head_dim"], r["causal"])  # noqa: E731
    lib = {key(r): float(r["fwd_ms"]) for r in rows if r["impl"] == "flashbook"}
    twin = {key(r): float(r["fwd_ms"]) for r in rows if r["impl"] == "flashbook-atomic"}
    return max(max(twin[k], lib[k]) / min(twin[k], lib[k]) - 1 for k in lib.keys() & twin.keys())


def test_the_noise_floor_is_the_spread_of_repeated_runs(ch):
    ladders = [_ladder_noise(p) for p in _paths("ladder")]
    sweeps = [_twin_noise(p) for p in _paths("sweep")]
    assert len(ladders) >= 3 and len(sweeps) >= 3
    v = ch.values
    assert (v["noop_lo"], v["noop_hi"]) == (f"{100 * min(ladders):.1f}", f"{100 * max(ladders):.1f}")
    assert (v["twin_lo"], v["twin_hi"]) == (f"{100 * min(sweeps):.1f}", f"{100 * max(sweeps):.1f}")
    # this run's floor: the newest ladder's and the newest full comparison's, the larger
    assert v["noise"] == f"{100 * max(ladders[-1], sweeps[-1]):.1f}"
    assert v["noise_runs"] == f"{100 * max(ladders + sweeps):.1f}"
    assert ch.noise_runs > ch.noise                      # an earlier run was noisier than the newest
    # the Gluon sweep timed twice: how far one configuration moved
    a, b = (json.load(open(os.path.join(RESULTS, _index()[n]["path"])))["rows"] for n in ("gluon_d128", "gluon_d128_run2"))
    key = lambda r: (r["dtype"], r["seq"], r["causal"], r["variant"])  # noqa: E731
    first = {key(r): r["tflops"] for r in a}
    moved = [max(r["tflops"], first[key(r)]) / min(r["tflops"], first[key(r)]) - 1 for r in b if key(r) in first]
    assert v["rerun_max"] == f"{100 * max(moved):.0f}"
    # the prose states the floor and the verdict words the tables use
    text = markdown(NOTEBOOK)
    for name in ("noise", "noise_runs", "rerun_max"):
        assert "{glue:text}`" + name + "`" in text, name
    # each run's own spread is shown in the chapter's noise table, beside this run's floor
    assert ("table", "noise_samples") in ch.outputs["noise"] and ("table", "repeats") not in ch.outputs["noise"]
    spread = ch.tables["noise_samples"]["in each recorded run (%)"]
    assert spread.iloc[0] == f"{v['noop_lo']} to {v['noop_hi']} ({v['n_ladders']} runs)"
    assert spread.iloc[1] == f"{v['twin_lo']} to {v['twin_hi']} ({v['n_sweeps']} runs)"
    here = ch.tables["noise_samples"]["largest gap here (%)"]
    assert max(float(here.iloc[0]), float(here.iloc[1])) == float(v["noise"])    # the floor: within one run
    # the last rung and (round 12) the separate backward in two runs; the Gluon sweep in two runs is
    # quoted in the rule's dropdown
    assert len(here) == 4
    assert "{glue:text}`rerun_max`%" in text
    hint = f"hint ({v['noise']}-{v['noise_runs']}%)"        # the middle tier's label, with its range
    for word in ("within noise", "**hint**", "beyond noise"):
        assert word in text, word
    verdicts = set(ch.tables["exp2_gains"]["verdict"]) | set(ch.tables["tuning_gains"]["verdict"]) \
        | set(ch.tables["heavy"]["verdict"])
    assert verdicts <= {"within noise", hint, "beyond noise"}
    assert "within noise" in set(ch.tables["heavy"]["verdict"])    # heaviest-first without a mask


def test_the_atomics_statement_says_what_was_measured(ch):
    text = markdown(NOTEBOOK)
    assert "2.5 to 7.6" not in text and "in practice: a separate" not in text
    for words in ("`acq_rel`", "relaxed adds", "FlashAttention-2 accumulates $dQ$ with fp32 atomic adds",
                  "TMA reduce-add"):
        assert words.lower() in text.lower(), words
    ratios = []
    for name in ("atomic_dq", "atomic_dq_repeat"):
        rows = json.load(open(os.path.join(RESULTS, _index()[name]["path"])))["rows"]
        ratios += [1 / r["vs_separate"] for r in rows if r["variant"] == "relaxed"]   # the plain relaxed adds
    assert (ch.values["at10_relaxed_lo"], ch.values["at10_relaxed_hi"]) == (f"{min(ratios):.2f}", f"{max(ratios):.2f}")
    assert min(ratios) > 1                                     # the separate kernel still wins everywhere
    for name in ("at10_relaxed_lo", "at10_relaxed_hi", "at10_fence_lo"):
        assert "{glue:text}`" + name + "`" in text, name
    assert "{glue:text}`at10_stagger_lo`" in markdown(os.path.join(ROOT, "notebooks", "A3_lab_notes.ipynb"))   # the stagger: lab notes


def test_speeds_name_the_sdpa_backend():
    text = markdown(NOTEBOOK)
    assert "SDPA's flash backend" in text and "FlashAttention-2" in text and "`mma.sync`" in text
    assert "SDPA's cuDNN backend" in text
    assert not re.search(r"\bSDPA\b(?!'s\s+(cuDNN|flash)\s+backend|\s+cuDNN|'s\s+backends)", text), \
        re.findall(r".{30}\bSDPA\b.{30}", text)
    # Triton already emits wgmma; Gluon adds the order of issue and the producer warp
    assert "`wgmma`" in text and "warpgroup_mma_wait(1)" in text and "producer" in text
    assert 'backend="auto"' in text and "which_kernel.md" in text


def test_the_gpu_cells_keep_their_recorded_sources():
    sys.path.insert(0, os.path.join(ROOT, "book", "_ext"))
    import gpu_outputs

    require(os.path.isfile(RECORDING), "no recorded chapter 10 outputs")
    recorded = {c["id"]: c["source_sha256"] for c in json.load(open(RECORDING))["cells"]}
    gpu = {c["id"]: source_of(c) for c in cells(NOTEBOOK) if "gpu" in c["metadata"].get("tags", [])}
    assert set(gpu) == set(recorded)
    # every gpu cell is as recorded (the last recording, tools/run_notebooks.py, ran at 546fe34)
    for cell_id, source in gpu.items():
        assert gpu_outputs.source_sha256(source) == recorded[cell_id], cell_id


def test_the_lab_notes_page_exists_and_is_in_the_table_of_contents():
    assert os.path.isfile(LAB)
    toc = yaml.safe_load(open(os.path.join(ROOT, "_toc.yml")))
    appendix = next(p for p in toc["parts"] if p["caption"] == "Appendix")
    files = [c["file"] for c in appendix["chapters"]]
    assert files.index("notebooks/A3_lab_notes") == files.index("notebooks/A2_floating_point") + 1
    assert "{doc}`A3 <A3_lab_notes>`" in markdown(NOTEBOOK)   # link text that reads as a phrase
    assert markdown(LAB).startswith("# A3. Lab notes: what did not make it faster")


def test_each_lab_entry_names_its_script_and_its_data_exist(ch):
    sections = re.split(r"^## ", markdown(LAB), flags=re.M)[1:]
    assert len(sections) >= 9
    titles = [s.splitlines()[0] for s in sections]
    for want in ("Tensor descriptors", "Lazy rescaling", "Sequence lengths known at compile time", "Autotuning",
                 "Three tries at $d$ = 64", "Short sequences", "A persistent kernel", "Atomic $dQ$",
                 "A Gluon backward", "Timing notes"):
        assert any(t.startswith(want) for t in titles), want
    for title, body in zip(titles, sections):
        scripts = re.findall(r"`(benchmarks/[\w/]+\.py)", body) + re.findall(r"`python -m (flashbook\.bench)", body)
        assert scripts, f"{title}: names no script"
        for s in scripts:
            assert s == "flashbook.bench" or os.path.isfile(os.path.join(ROOT, s)), (title, s)
        assert "verdict" in body.lower() or title.startswith("Timing notes"), title
    # every topic the page shows has its recorded data: a table, and no "not recorded" message
    from flashbook.bench.chapter10_lab import LAB_TOPICS

    for topic in LAB_TOPICS:
        assert topic not in ch.messages, (topic, ch.messages.get(topic))
        assert any(kind == "table" for kind, _ in ch.outputs.get(topic, [])), topic


def test_the_lab_notes_run_without_a_gpu():
    """The page only reads recorded data: no kernel is launched, no GPU is asked for."""
    code = "\n".join(source_of(c) for c in cells(LAB)[1:] if c["cell_type"] == "code")
    for word in ("torch.", "cuda", "run_rung", "flash_attention(", "compile_elsewhere"):
        assert word not in code, word
    assert glob.glob(os.path.join(ROOT, "benchmarks", "results", "gluon_bwd_h200", "ncu", "raw.csv"))


def _ncu_main_kernels(folder):
    """The profiled calls of a gluon_bwd_ncu.py run, read from raw.csv without the library:
    order.json's name -> {kernel name: its row}, the calls split at each delta kernel."""
    rows = list(csv.reader(open(os.path.join(folder, "ncu", "raw.csv"), newline="")))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    head = rows[start]
    calls = []
    for r in rows[start + 2:]:                                   # the row after the header: units
        k = dict(zip(head, r))
        if k["Kernel Name"] == "_bwd_delta" or not calls:
            calls.append({})
        calls[-1].setdefault(k["Kernel Name"], k)
    order = json.load(open(os.path.join(folder, "ncu", "order.json")))["profiled"]
    assert len(order) == len(calls)
    num = lambda k, m: float(k[m].replace(",", ""))            # noqa: E731
    return dict(zip(order, calls)), num


def test_the_second_gluon_backward_is_quoted_from_its_run(ch):
    """FA3's register plan (run 'gluon_bwd_rows'): every number the lab notes quote is
    recomputed from hopper_bwd.json and ncu/raw.csv, and `none` is no longer called a bound."""
    (folder,) = _paths("gluon_bwd_rows")
    data = json.load(open(os.path.join(folder, "hopper_bwd.json")))
    v = ch.values
    speed = data["speed"]
    assert len(speed) == 12 and {r["d"] for r in speed} == {64, 128}

    def span(d, over):
        x = [r["tflops"]["gluon_rows_split_red4"] / r["tflops"][over] for r in speed if r["d"] == d]
        return f"{min(x):.2f}", f"{max(x):.2f}"

    assert (v["gbr_triton_lo"], v["gbr_triton_hi"]) == span(128, "triton") == ("0.86", "1.02")
    assert (v["gbr_cudnn_lo"], v["gbr_cudnn_hi"]) == span(128, "cudnn") == ("0.68", "0.82")
    assert (v["gbr_gain_lo"], v["gbr_gain_hi"]) == span(128, "gluon_red4")
    assert (v["gbr_gain64_lo"], v["gbr_gain64_hi"]) == span(64, "gluon_red4")
    assert float(v["gbr_gain_lo"]) > 1.25                          # the spills cost a quarter and more
    spread = max(max(ms) / min(ms) - 1 for r in speed for ms in r["ms"].values())
    assert v["gbr_spread"] == f"{100 * spread:.1f}"
    vs = [r["tflops"]["gluon_rows_split_red4"] / r["tflops"]["triton"] for r in speed]
    assert v["gbr_n"] == str(len(vs))
    assert v["gbr_slower"] == str(sum(x < 1 - spread for x in vs)) and int(v["gbr_slower"]) > 0
    assert v["gbr_faster"] == str(sum(x > 1 + spread for x in vs)) == "0"     # so it stays in the lab
    assert v["gbr_checks"] == str(len(data["checks"]))
    assert all(c[m] == c["triton"] for c in data["checks"] for m in data["modes"])   # the same errors
    assert v["gbr_err_hi"] == "1.00"
    # Nsight Compute: the wgmma instructions and tensor math each call executes
    calls, num = _ncu_main_kernels(folder)
    gmma, ops = "sm__inst_executed_pipe_tensor_op_gmma.sum", "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum"
    local, busy = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", \
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    main = {name: c.get("_gluon_attn_bwd_rows") or c.get("_gluon_attn_bwd") for name, c in calls.items()}
    for name, key in (("rows_none", "none"), ("rows_split_red4", "written"), ("red4", "old")):
        assert v[f"gbr_wgmma_{key}"] == f"{num(main[name], gmma) / 1e6:.1f}"
    assert (v["gbr_wgmma_none"], v["gbr_wgmma_written"], v["gbr_wgmma_old"]) == ("13.1", "21.0", "16.8")
    assert v["gbr_ops_none"] == f"{num(main['rows_none'], ops) / num(main['rows_split_red4'], ops):.2f}" == "0.80"
    assert num(main["rows_split_red4"], ops) == num(main["red4"], ops)          # same math, wider instructions
    assert v["gbr_local"] == f"{num(main['rows_split_red4'], local) / 1e9:.1f}" == "0.0"
    assert v["gbr_local_old"] == f"{num(main['red4'], local) / 1e9:.1f}"
    time = "gpu__time_duration.sum"
    assert v["gbr_ms"] == f"{num(main['rows_split_red4'], time) / 1e6:.2f}" == "1.69"
    assert v["gbr_old_ms"] == f"{num(main['red4'], time) / 1e6:.2f}"
    assert v["gbr_tri_dkdv_ms"] == f"{num(calls['triton']['_bwd_dkdv'], time) / 1e6:.2f}"
    assert v["gbr_tri_dq_ms"] == f"{num(calls['triton']['_bwd_dq'], time) / 1e6:.2f}"
    assert v["gbr_tc"] == f"{num(main['rows_split_red4'], busy):.0f}"
    assert v["gbr_tc_dq"] == f"{num(calls['triton']['_bwd_dq'], busy):.0f}"
    barrier = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
    assert v["gbr_bar_tma"] == f"{num(main['rows_split_tma'], barrier):.2f}"
    assert float(v["gbr_bar_tma"]) > float(v["gbr_bar"])
    # the prose quotes them, shows the table, and calls `none` no bound
    text = markdown(LAB)
    for name in ("gbr_triton_lo", "gbr_triton_hi", "gbr_cudnn_lo", "gbr_gain_lo", "gbr_gain_hi", "gbr_spread",
                 "gbr_slower", "gbr_faster", "gbr_wgmma_none", "gbr_wgmma_written", "gbr_wgmma_old", "gbr_local",
                 "gbr_ms", "gbr_tri_dkdv_ms", "gbr_tri_dq_ms"):
        assert "{glue:text}`" + name + "`" in text, name
    assert "the bound of the design." not in text and "### A second try: FlashAttention-3's register plan" in text
    assert {kind for kind, _ in ch.outputs["gluon_bwd_rows"]} == {"markdown", "table"}


def test_without_the_second_run_the_lab_notes_say_so(tmp_path):
    """A results root holding every run but 'gluon_bwd_rows': its cell says which run is
    missing, its values read n/a, and nothing else changes."""
    from flashbook.bench import chapter10

    (folder,) = _paths("gluon_bwd_rows")
    for entry in os.listdir(RESULTS):
        if os.path.join(RESULTS, entry) != folder:
            os.symlink(os.path.join(RESULTS, entry), tmp_path / entry)
    partial, full = chapter10.build(str(tmp_path)), chapter10.build(RESULTS)
    assert set(partial.messages) == {"gluon_bwd_rows"}
    said = partial.messages["gluon_bwd_rows"]
    assert "No recorded" in said and "'gluon_bwd_rows'" in said
    changed = {k for k in full.values if partial.values[k] != full.values[k]}
    assert changed and all(k.startswith("gbr_") for k in changed)
    assert all(partial.values[k] == "n/a" for k in full.values if k.startswith("gbr_"))
    assert "gluon_bwd_rows" not in partial.tables and "gluon_bwd_rows_ncu" not in partial.tables


def test_the_prose_under_the_timing_cell_describes_the_recorded_table():
    """Built without a GPU, the page shows the timing cell's recorded H200 table: the prose names
    that run and explains its NaN, instead of saying the cell "only said so"."""
    cells = sources_by_id(NOTEBOOK)
    assert "{glue:text}`live_note`" in cells["26110378"] and "live_phrase" not in cells["26110378"]
    from test_review3_ch10 import live_note_names

    glued, _ = run_glued(cells["c10-live-note"], **live_note_names())
    recorded = json.load(open(RECORDING))
    table = "".join(o.get("text", "") for c in recorded["cells"] if c["id"] == "6041c7eb" for o in c["outputs"])
    header = table.strip().splitlines()[0]
    assert header.startswith(recorded["provenance"]["gpu"]) and f"recorded run ({header}) at the ladder's shape" in glued["live_note"]
    assert "only said so" not in glued["live_note"] and '"x previous"' in glued["live_note"]
