"""The recorded decoding runs as chapter 11 and the which-kernel page read them
(``flashbook.bench.decoding``): the issue's table with its repeats, and Nsight Compute's steps."""
from __future__ import annotations

import shutil

import pytest

from flashbook import bench
from flashbook.bench import decoding


def test_the_repeated_table_meets_the_decode_targets():
    """Three repeats of B = 1, 8, 64 x 2K-128K: called from Python, the median over the repeats
    of flash_decode's time is at most 1.1x cuDNN's at every shape, and the paged cache's at
    most 1.05x the dense one's; every output passed the float64 check."""
    runs = bench.run_paths("decode_repeats")
    assert len(runs) == 3
    df = decoding.repeat_ratios(runs)
    assert len(df) == 21 and (df["repeats"] == 3).all()
    assert sorted(set(df.index.get_level_values("batch"))) == [1, 8, 64]
    assert sorted(set(df.index.get_level_values("seq"))) == [2048 * 2**i for i in range(7)]
    assert df["fd_cudnn_ms"].max() <= 1.1 and df["paged_dense_ms"].max() <= 1.05
    # the spread is real: the min and max bracket the median, and short calls scatter
    assert (df["fd_cudnn_ms_min"] <= df["fd_cudnn_ms"]).all() and (df["fd_cudnn_ms"] <= df["fd_cudnn_ms_max"]).all()
    assert df["paged_dense_ms_max"].max() > 1.05     # one repeat at 2K is host noise, above the median
    import pandas as pd
    for run in runs:
        checks = pd.read_csv(run / "decode.csv")
        ours = checks[checks["impl"].str.startswith("flash_decode")]
        assert (ours["status"] == "ok").all() and (ours["check"] == "pass").all()


def test_nsight_shows_why_batch_64_wanted_more_splits():
    """Before: one split at batch 64, 512 programs at 3 per SM, 1.29 waves, the SMs busy three
    quarters of the kernel; at 60fd172: 4 splits, over 5 waves, the SMs busy 97% and the
    kernel no slower than cuDNN's. Each step read the cache's bytes once."""
    before, after = (decoding.ncu_steps(p) for p in bench.run_paths("decode_ncu"))
    assert len(before) == len(after) == 15
    pick = lambda steps, impl, b, n: next(s for s in steps if (s["impl"], s["batch"], s["seq"]) == (impl, b, n))  # noqa: E731
    old, new, cudnn = pick(before, "dense", 64, 32768), pick(after, "dense", 64, 32768), pick(after, "sdpa-cudnn", 64, 32768)
    assert old["per_sm"] == 3 and old["waves"] == pytest.approx(512 / (3 * 132), abs=0.01)
    assert old["sm_busy"] < 0.8 < 0.95 < new["sm_busy"] and old["merge_us"] == 0 < new["merge_us"]
    assert new["kernel_us"] + new["merge_us"] < cudnn["kernel_us"] + cudnn["merge_us"] < old["kernel_us"]
    kv_bytes = 2 * 64 * 8 * 32768 * 128 * 2
    for s in before + after:
        b, n = s["batch"], s["seq"]
        assert s["dram_bytes"] == pytest.approx(2 * b * 8 * n * 128 * 2, rel=0.01)
    assert new["dram_bytes"] == pytest.approx(kv_bytes, rel=1e-3)


def test_a_log_that_does_not_match_its_profile_is_refused(tmp_path):
    src = bench.run_paths("decode_ncu")[-1]
    shutil.copy(src / "raw.csv", tmp_path / "raw.csv")
    (tmp_path / "steps.json").write_text('{"steps": [{"impl": "dense", "batch": 1, "seq": 32768}]}')
    with pytest.raises(ValueError, match="15 profiled steps in raw.csv, 1 in steps.json"):
        decoding.ncu_steps(tmp_path)
    with pytest.raises(ValueError, match="at least one run folder"):
        decoding.repeat_ratios([])
