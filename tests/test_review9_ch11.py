"""Chapter 11 after the ninth reading: batch 1's bandwidth split between the split kernel and the
rest of the step (decoding.step_split), the table's three runs' agreement (decoding.graph_spread),
the ring recording's release (chapter11.ring_release), decode comparisons as speeds (the other's
time over ours, the book's convention), and the decode half's order: concepts, then measurements."""
import json
import os

import pandas as pd
import pytest

from conftest import require
from flashbook import bench
from flashbook.bench import chapter11, decoding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CH11 = os.path.join(ROOT, "notebooks", "11_decoding_and_many_gpus.ipynb")


def _cells():
    return {c["id"]: "".join(c["source"]) for c in json.load(open(CH11, encoding="utf-8"))["cells"]}


def _flat(text):
    return " ".join(text.split())


def test_step_split_is_the_kernels_bandwidth_and_the_rest_of_the_step():
    step = {"kernel_us": 40.0, "dram_bytes": 120e6}
    out = decoding.step_split(step, 50.0)
    assert out["split_tb_s"] == pytest.approx(3.0) and out["outside_pct"] == pytest.approx(20.0)
    with pytest.raises(ValueError):
        decoding.step_split(step, 30.0)                # a kernel longer than its step


def test_batch_1_bandwidth_is_blamed_on_the_merge_and_the_gap_not_only_on_few_programs():
    ncu = bench.run_paths("decode_ncu")
    decoded = chapter11.decode_shares(show=False)
    require(len(ncu) >= 2 and decoded is not None, "no recorded decoding profile or table")
    step = next(s for s in decoding.ncu_steps(ncu[-1]) if (s["impl"], s["batch"], s["seq"]) == ("dense", 1, 32768))
    ours = decoded[2]
    graph_us = 1000 * ours[(ours["batch"] == 1) & (ours["seq"] == 32768)]["graph_ms"].iloc[0]
    split = decoding.step_split(step, graph_us)
    # the split kernel alone reads far faster than the whole step; a fifth or more lies outside it
    assert split["split_tb_s"] > 1.2 * ours[(ours["batch"] == 1) & (ours["seq"] == 32768)]["kv_tb_s_graph"].iloc[0]
    assert 15 < split["outside_pct"] < 35 and step["dram_pct"] < 85
    cells = _cells()
    for name in ("b1_split_tb_s", "b1_outside_pct", "b1_step_us", "b1_split_dram"):
        assert f'"{name}"' in cells["c11-m3"] and f"{{glue:text}}`{name}`" in cells["c11-m4"]
    text = _flat(cells["c11-m4"])
    assert "too few programs" not in text
    assert ("The merge and the gap between the two launches take the other {glue:text}`b1_outside_pct`% "
            "of the {glue:text}`b1_step_us` µs step") in text


def test_the_tables_three_runs_agree_and_the_chapter_says_so():
    paths = bench.run_paths("decode_repeats")
    require(len(paths) == 3, "no recorded decoding repeats")
    spread = decoding.graph_spread(paths)
    frames = pd.concat(pd.read_csv(p / "decode.csv") for p in paths)
    t = frames[(frames["status"] == "ok") & (frames["impl"] == "flash_decode")].groupby(["batch", "seq"])["graph_ms"]
    assert spread == pytest.approx(float(100 * (t.max() / t.min() - 1).max())) and 0 < spread < 2
    newest = chapter11.decode_shares(show=False)[0]
    assert newest.parent in paths                      # the table is one of the three runs
    cells = _cells()
    assert "decoding.graph_spread(bench.run_paths(\"decode_repeats\"))" in cells["c11-28"]
    assert "agreed within {glue:text}`dec_repeat_spread`% at every shape" in _flat(cells["c11-h1"])


def test_the_ring_recording_names_its_release():
    require(chapter11.ring_runs(show=False) is not None, "no recorded ring run")
    release = chapter11.ring_release()
    prov = json.loads(open(os.path.join(ROOT, "benchmarks", "results", "ring-2xh200", "ring_provenance.json")).read())
    assert release == prov["flashbook"]
    cells = _cells()
    assert 'g("ring_release", chapter11.ring_release())' in cells["c11-44"]
    assert "library release {glue:text}`ring_release`" in _flat(cells["c11-45"])


def test_decode_comparisons_are_speeds():
    cells = _cells()
    prose = _flat("\n".join(s for i, s in cells.items() if not s.lstrip().startswith(("import", "g(", "names", "if ", "REP"))))
    assert "below 1: faster" not in prose and "times cuDNN's time" not in prose
    assert "times the time of the fastest" not in prose
    assert ("the median call ran at {glue:text}`rep_fd_lo` to {glue:text}`rep_fd_hi` times cuDNN's speed, "
            "and the paged cache at {glue:text}`rep_paged_lo` to {glue:text}`rep_paged_hi` times the dense one's") in prose
    assert "times the speed of the fastest of PyTorch's backends" in prose
    assert "their time over ours; above 1, ours is faster" in _flat(cells["c11-h1"])
    # the values: reciprocals of the recorded time ratios, lo and hi swapped
    paths = bench.run_paths("decode_repeats")
    require(len(paths) == 3, "no recorded decoding repeats")
    repeats = decoding.repeat_ratios(paths)
    glued = {}
    exec(cells["c11-m6"], {"repeats": repeats, "REPEATS": paths, "pd": pd,
                           "g": lambda name, value, fmt="": glued.__setitem__(name, format(value, fmt))})
    assert glued["rep_fd_lo"] == f"{1 / repeats['fd_cudnn_ms'].max():.2f}"
    assert glued["rep_fd_hi"] == f"{1 / repeats['fd_cudnn_ms'].min():.2f}"
    assert glued["rep_paged_lo"] == f"{1 / repeats['paged_dense_ms'].max():.2f}"
    assert glued["rep_paged_hi"] == f"{1 / repeats['paged_dense_ms'].min():.2f}"
    assert glued["rep_graph_paged_lo"] == f"{1 / repeats['paged_dense_graph'].max():.2f}"
    assert "faster.min()" in cells["c11-28"] and "1 / faster" not in cells["c11-28"]


def test_the_decode_half_teaches_before_it_measures():
    order = [c["id"] for c in json.load(open(CH11, encoding="utf-8"))["cells"]]
    cells = _cells()
    heading = {i: s for i, s in cells.items() if "### A paged KV cache" in s or "### Calling it from your model" in s
               or "## Why decoding is memory-bound" in s or "## Measured on an H200" in s}
    at = {key: order.index(next(i for i, s in heading.items() if key in s))
          for key in ("### A paged KV cache", "### Calling it from your model", "## Why decoding is memory-bound",
                      "## Measured on an H200")}
    assert at["### A paged KV cache"] < at["### Calling it from your model"] < at["## Why decoding is memory-bound"]
    assert at["## Why decoding is memory-bound"] < at["## Measured on an H200"] < order.index("c11-m1")
    assert order.index("c11-22") < order.index("5a7c24f0") < order.index("c11-h5") < order.index("c11-call")


def test_launch_fit_is_a_fixed_time_plus_a_streaming_rate():
    short = {"kernel_us": 30.0, "dram_bytes": 100e6, "waves": 0.65, "per_sm": 3}
    long = {"kernel_us": 110.0, "dram_bytes": 500e6, "waves": 0.65, "per_sm": 3}
    fit = decoding.launch_fit(short, long)                 # 400 MB in 80 us more: 5 TB/s, 10 us fixed
    assert fit["tb_s"] == pytest.approx(5.0) and fit["fixed_us"] == pytest.approx(10.0)
    with pytest.raises(ValueError):
        decoding.launch_fit(short, dict(long, waves=1.29))   # different grids do not share a fixed cost
    with pytest.raises(ValueError):
        decoding.launch_fit(long, short)


def test_batch_1_loses_fixed_time_not_streaming_rate():
    ncu = bench.run_paths("decode_ncu")
    require(len(ncu) >= 2, "no recorded decoding profile")
    steps = decoding.ncu_steps(ncu[-1])
    at = lambda seq: next(s for s in steps if (s["impl"], s["batch"], s["seq"]) == ("dense", 1, seq))
    fit = decoding.launch_fit(at(32768), at(131072))
    # the same 256 programs stream about as fast as batch 64's, with several microseconds per launch
    assert 4.3 < fit["tb_s"] < 4.8 and 5 < fit["fixed_us"] < 15 and at(131072)["dram_pct"] > at(32768)["dram_pct"] + 10
    cells = _cells()
    assert "decoding.launch_fit(ours_b1, long_b1)" in cells["c11-m3"]
    text = _flat(cells["c11-m4"])
    for name in ("b1_128k_dram", "b1_fixed_us", "b1_stream_tb_s", "b1_stream_pct"):
        assert f'"{name}"' in cells["c11-m3"] and f"{{glue:text}}`{name}`" in text
    assert "batch 1 loses fixed time, not streaming rate" in text and "with its many programs" not in text
    # a wave counted one way: the plan's 2 per SM against the 3 that fit, reconciled where the plan is stated
    assert ("a fixed guess: {glue:text}`plan_per_sm` fit an SM with a full tile of {glue:text}`max_rows` query rows, "
            "{glue:text}`ncu_per_sm` with the {glue:text}`min_tile`-row tile") in _flat(cells["c11-17"])
    assert "of the {glue:text}`ncu_first_wave` that fit at once" in text and "of a wave." not in text


def test_the_16k_ring_overlap_is_read_within_its_spread():
    require(chapter11.ring_runs(show=False) is not None, "no recorded ring run")
    first = chapter11.ring_runs(show=False)[0].sort_values("n").iloc[0]
    unhidden = first["overlapped_ms"] - first["compute_ms"]
    # the difference of two medians is no surer than their repeats' spread
    assert first["overlapped_spread_ms"] + first["compute_spread_ms"] > 0.3 * unhidden
    cells = _cells()
    assert 'g("ring_first_spread", first_spread)' in cells["c11-44"]
    text = _flat(cells["c11-45"])
    assert ("about {glue:text}`ring_first_unhidden` ms of the transfers' {glue:text}`comm_16k_ms` ms not hidden" in text
            and "All are medians, whose repeats spread by {glue:text}`ring_first_spread`." in text)
