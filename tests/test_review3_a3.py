"""Review round 3, the lab notes (A3): each verdict matches the table beside it, and the names
and signs its tables use are said. The numbers are recomputed from the recorded runs."""
import json
import os

import pytest

from notebook_text import cell_source, markdown, notebook
from test_lesson_ch10 import _ncu_main_kernels, _paths

A3 = "A3_lab_notes.ipynb"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


@pytest.fixture(scope="module")
def ch():
    from flashbook.bench import chapter10
    return chapter10.build()


def test_the_persistent_full_attention_range_names_its_tiles(ch):
    """0.97 to 1.00 holds for the old default's tiles only; with 64-key tiles full attention
    lost beyond noise (0.89 at 4K), so "on full attention it came within noise" was wrong."""
    from flashbook import bench

    pairs = bench.schedule_pairs(bench.GLUON_SHORT_SWEEPS[1], "persistent", "overlap")
    full = pairs[~pairs["causal"]]
    old = full[full["tiles"] == "m64 n128 s2"]["first_over_second"]
    n64 = full[full["tiles"].str.contains(" n64 ")]["first_over_second"]
    v = ch.values
    assert (v["pers_full_lo"], v["pers_full_hi"]) == (f"{old.min():.2f}", f"{old.max():.2f}")
    assert v["pers_full_n64"] == f"{n64.min():.2f}" == "0.89"
    assert 1 - float(v["pers_full_n64"]) > ch.noise_runs                 # beyond noise
    text = cell_source(notebook(A3), "d2b5605d")
    assert "On full attention it came within noise" not in text
    assert "with the old default's tiles (`m64 n128 s2`)" in text and "{glue:text}`pers_full_n64`" in text


def test_the_graph_outlier_is_told_the_right_way_round(ch):
    """The gluon forward's graph at 16K took 1.508 ms against the timed call's 1.283 ms: 18%
    longer. The 15% quoted before was the timed call's shortfall (timer over graph, 0.85)."""
    data = json.load(open(os.path.join(RESULTS, "host_overhead_h200", "host_overhead.json")))
    (row,) = [r for r in data["shapes"] if r["impl"] == "gluon forward" and r["seq"] == 16384]
    v = ch.values
    assert v["host_long_impl"] == "gluon forward"
    assert v["host_long_graph"] == f"{100 * (row['graph_ms'] / row['timer_ms'] - 1):.0f}" == "18"
    assert v["host_long_ratio"] == f"{row['timer_ms'] / row['graph_ms']:.2f}" == "0.85"
    text = cell_source(notebook(A3), "c96171d0")
    assert "{glue:text}`host_long`% slower" not in text
    assert "took {glue:text}`host_long_graph`% longer than its timed call" in text
    assert "({glue:text}`host_long_ratio` in the table)" in text


def test_the_barrier_stalls_name_the_rows_they_come_from(ch):
    """1.82 is `rows_split_red4`'s barrier stalls; the table's row `red4` (the old plan) reads
    1.34. The prose names the rows and uses the caption's unit."""
    (folder,) = _paths("gluon_bwd_rows")
    calls, num = _ncu_main_kernels(folder)
    barrier = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
    main = {name: c.get("_gluon_attn_bwd_rows") or c.get("_gluon_attn_bwd") for name, c in calls.items()}
    v = ch.values
    assert v["gbr_bar"] == f"{num(main['rows_split_red4'], barrier):.2f}" == "1.82"
    assert v["gbr_bar_tma"] == f"{num(main['rows_split_tma'], barrier):.2f}"
    assert f"{num(main['red4'], barrier):.2f}" != v["gbr_bar"]
    text = cell_source(notebook(A3), "a3-gluon-bwd-rows-verdict")
    assert "in `red4`\n{glue:text}`gbr_bar`" not in text and "per issue cycle" not in text
    assert "In `rows_split_tma` an average of" in text and "in `rows_split_red4`\n{glue:text}`gbr_bar`" in text
    assert "per issued instruction" in text
    assert ("markdown", "**Nsight Compute, one call each** (stalls: per issued instruction)") \
        in ch.outputs["gluon_bwd_rows"]


def test_the_noise_floor_names_the_runs_it_comes_from(ch):
    """3.4% is the larger gap of the two runs chapter 10 reads; the older repeats (4.1%, 5.3%)
    set the middle tier, and the lab's own runs are said to come from other sessions."""
    from flashbook.bench.readback import latest_ladder, latest_results

    v = ch.values
    ladder, results = latest_ladder(ch.root).parent.name, latest_results(ch.root).parent.name
    assert v["noise_read"] == f"{ladder} and {results}"
    repeats = ch.tables["repeats"].reset_index().set_index("run")["largest %"]
    assert v["noise"] == f"{max(repeats[ladder], repeats[results]):.1f}" == "3.4"
    assert float(v["noise_runs"]) == repeats.drop(index="gluon_d128, gluon_d128_run2").max()
    text = cell_source(notebook(A3), "a3-title")
    assert "{glue:text}`noise_read`" in text and "from other sessions" in text
    assert "so comparisons across runs are made with care:" not in text
    assert text.rstrip().endswith("The gaps, run by run:")


def test_the_dkdv_preferences_are_read_for_the_reader(ch):
    """The list's entries are explained, what they give at d = 128 is glued from the library,
    and the excerpt ends with the dK/dV list (not on half a line of the dQ list)."""
    from flashbook.kernels import configs

    for mask in ("full", "causal"):
        c = configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=mask == "causal")
        assert ch.values[f"dkdv_{mask}"] == f"{c.block_m} x {c.block_n}, {c.num_warps} warps, {c.num_stages} stages"
    assert ch.values["dkdv_full"] != ch.values["dkdv_causal"]          # "a configuration of its own"
    nb = notebook(A3)
    assert "`Config(B_r, B_c, warps, stages)`" in cell_source(nb, "autotune-md")
    code = cell_source(nb, "dkdv-prefs")
    assert "'\"backward_dq\"'" not in code and "show_between(configs, '\"backward_dkdv\": [', '],')" in code


def test_the_small_grid_is_named(ch):
    """Three shapes share the fewest programs; the verdict names the one its numbers are from."""
    table = ch.tables["launch_order"]
    assert ch.values["lo_small"] == table["programs"].idxmin() == "causal 4K B1"
    assert ch.values["lo_small_programs"] == str(table["programs"].min())
    text = cell_source(notebook(A3), "c10-heads-after")
    assert "At the smallest grid (causal" not in text and "{glue:text}`lo_small`" in text


def test_the_lab_tables_say_their_names_and_signs():
    """The stagger table's sign, the Gluon backward's variants and shapes, the FMA columns and
    units, the lazy threshold, and every entry's script."""
    nb = notebook(A3)
    stagger = cell_source(nb, "a3-atomic-stagger")
    assert 'ms["relaxed+stagger"] / ms["relaxed"] - 1' in stagger            # + is more time
    assert "minus 1 (+: slower)" in cell_source(nb, "a3-atomic-stagger-md")
    assert "Script: `benchmarks/atomic_dq_experiment.py` (both runs)." in cell_source(nb, "a3-atomic-stagger-verdict")
    idea = cell_source(nb, "a3-gluon-bwd-idea")
    assert "`red4_pipe` is `red4` with each step's $dQ$ product" in idea and "(last run only)" in idea
    assert "`triton` is chapter\n8's two kernels" in idea and "(six shapes at each $d$)" in idea
    fma = cell_source(nb, "8fba6e34")
    assert "(`deg3`, `deg4`)" in fma and "(timed at $d$ = 128 too)" in fma
    assert "special-function units (the hardware" in fma and "FMA units (the fused" in fma
    text = markdown(nb)
    assert "$2^8$ in the weights" not in text and "more than 8 (scores are in base 2" in text
    assert "On the {glue:text}`hopper_where` run" not in text and "today's" not in text
