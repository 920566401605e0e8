"""Nsight Compute's readings of the attention kernels (``flashbook.bench.profiles``): the
parser on a small file made here, then the recorded H200 profile as chapter 9 reads it."""
from __future__ import annotations

import json

import pytest

from flashbook import bench
from flashbook.bench import profiles

HEAD = ["ID", "Kernel Name", profiles.TIME, profiles.DRAM_READ, profiles.L2_HIT, profiles.TENSOR_BUSY,
        *profiles.TENSOR_OPS, profiles.REGS, profiles.SPILL_ST]


def _write(folder, kernels, steps):
    lines = ['"==PROF== a line before the table"', ",".join(f'"{h}"' for h in HEAD),
             ",".join('"unit"' for _ in HEAD)]
    for i, (name, us, ops) in enumerate(kernels):
        row = [str(i), name, f"{us * 1e3:,.0f}", "402,718,720", "89.5", "54.1", f"{ops:.6g}", "0", "255", "0"]
        lines.append(",".join(f'"{x}"' for x in row))
    (folder / "raw.csv").write_text("\n".join(lines) + "\n")
    (folder / "steps.json").write_text(json.dumps({"steps": steps}))


def test_each_kernel_gets_its_pass_and_each_pass_its_sums(tmp_path):
    shape = {"batch": 2, "heads": 3, "seq": 64, "dim": 16, "causal": False}
    fwd = bench.attention_flops(2, 3, 64, 64, 16)      # what pass_table credits the forward
    assert fwd == 4 * 2 * 3 * 64 * 64 * 16
    _write(tmp_path, [("_attn_fwd", 10.0, fwd), ("_bwd_delta", 1.5, 0), ("_bwd_dkdv", 20.0, 2 * fwd),
                      ("_bwd_dq", 12.0, 1.5 * fwd)],
           [dict(shape, impl="triton", pass_="forward", kernels=1),
            dict(shape, impl="triton", pass_="backward", kernels=3)])
    t = profiles.pass_table(tmp_path)
    assert list(t["pass_"]) == ["forward", "backward"] and list(t["kernels"]) == [1, 3]
    assert t["us"].tolist() == pytest.approx([10.0, 33.5])
    assert t["ops_ratio"].tolist() == pytest.approx([1.0, 3.5], rel=1e-4)   # the CSV keeps 6 digits
    assert list(t["kernel"]) == ["_attn_fwd", "_bwd_dkdv"]          # the longest kernel is the main one
    assert t["dram_mb"].iloc[0] == pytest.approx(402.71872) and t["regs"].iloc[1] == 255
    # under the causal mask the convention credits half
    assert bench.attention_flops(2, 3, 64, 64, 16, causal=True) == fwd / 2


def test_a_file_that_does_not_match_its_steps_is_refused(tmp_path):
    shape = {"batch": 1, "heads": 1, "seq": 64, "dim": 16, "causal": False}
    _write(tmp_path, [("_attn_fwd", 10.0, 1.0)], [dict(shape, impl="triton", pass_="backward", kernels=3)])
    with pytest.raises(ValueError, match="1 kernels in raw.csv, 3 in steps.json"):
        profiles.kernel_rows(tmp_path)
    (tmp_path / "raw.csv").write_text("not,ncu\n1,2\n")
    with pytest.raises(ValueError, match="not ncu's raw CSV"):
        profiles.ncu_csv(tmp_path / "raw.csv")


@pytest.fixture(scope="module")
def recorded():
    return profiles.pass_table(bench.run_path("kernel_ncu"))


def test_the_backward_executes_seven_products_where_cudnn_executes_five(recorded):
    """The tensor pipe's own count: chapter 8's backward 3.5 times the forward's ops (7 products
    to 2), cuDNN's and SDPA-flash's 2.5 (5); the forwards 1 (plus the causal diagonal's few %)."""
    t = recorded[recorded["impl"] != "triton-dkdv"]
    assert len(t) == 28 and set(t["dim"]) == {64, 128}
    full = t[~t["causal"]].set_index(["impl", "dim", "pass_"])["ops_ratio"]
    for d in (64, 128):
        assert full[("triton", d, "backward")] == pytest.approx(3.5, abs=0.01)
        assert full[("sdpa-cudnn", d, "backward")] == pytest.approx(2.5, abs=0.01)
        assert full[("sdpa-flash", d, "backward")] == pytest.approx(2.5, abs=0.01)
        assert full[("triton", d, "forward")] == pytest.approx(1.0, abs=0.01)
    causal = t[t["causal"]].set_index(["impl", "dim", "pass_"])["ops_ratio"]
    for d in (64, 128):
        assert causal[("triton", d, "backward")] / causal[("sdpa-cudnn", d, "backward")] == pytest.approx(1.4, abs=0.02)
        assert 1.0 < causal[("gluon", d, "forward")] < 1.05          # the diagonal tiles' excess


def test_the_forwards_read_q_k_v_once_and_the_dkdv_kernel_spills_at_d128(recorded):
    t = recorded[(recorded["pass_"] == "forward") & recorded["impl"].isin(["triton", "gluon", "sdpa-cudnn"])]
    qkv = 3 * t["batch"] * t["heads"] * t["seq"] * t["dim"] * 2 / 1e6
    assert ((t["dram_mb"] / qkv - 1).abs() < 0.001).all()
    assert (t["l2_hit"] > 80).all()
    dkdv = recorded[(recorded["impl"] == "triton-dkdv")].set_index(["mask", "config_dkdv"])
    assert dkdv.loc[("causal", (64, 128, 8, 3)), "spill_mb"] > 100        # the causal default
    assert dkdv.loc[("causal", (32, 128, 8, 2)), "spill_mb"] == 0
    assert dkdv.loc[("causal", (32, 128, 8, 2)), "us"] > dkdv.loc[("causal", (64, 128, 8, 3)), "us"]
    ours = recorded[(recorded["impl"] == "triton") & (recorded["pass_"] == "backward")].set_index(["dim", "causal"])
    assert ours.loc[(128, True), "spill_mb"] > ours.loc[(128, False), "spill_mb"] > 0
    assert ours.loc[(64, False), "spill_mb"] == 0


# ------------------------------------------------------------------ atomic dQ (chapter 8)

def test_atomic_dq_experiment_reads_back_and_relaxed_adds_beat_the_fence():
    """The recorded run (benchmarks/results/atomic_dq_h200): every variant correct, the
    relaxed adds 2-3.7x faster than acq_rel, and the separate dQ kernel still the fastest."""
    from flashbook.bench import experiments

    df = experiments.atomic_dq_table()
    assert df is not None and len(df) == 4 * 2 * 7
    assert df.attrs["environment"]["gpu"]["name"] == "NVIDIA H200"
    assert (df["dq_err"] < 8e-3).all()                      # bf16: a few 2^-8, as the separate kernel's
    spans = experiments.atomic_dq_ranges(df)
    assert spans["separate"] == (1.0, 1.0)
    assert round(spans["atomic"][0], 2) == 2.40 and round(spans["atomic"][1], 2) == 6.84
    assert round(spans["relaxed"][0], 2) == 1.08 and round(spans["relaxed 64x128"][1], 2) == 1.24
    assert all(lo > 1.0 for name, (lo, hi) in spans.items() if name != "separate")
    key = ["n", "d", "causal"]
    fence = df[df["variant"] == "atomic"].set_index(key)["ms"]
    relaxed = df[df["variant"] == "relaxed"].set_index(key)["ms"]
    assert 1.9 < (fence / relaxed).min() and (fence / relaxed).max() < 3.7


def test_atomic_dq_reader_says_none_when_nothing_is_recorded(tmp_path):
    from flashbook.bench import experiments

    (tmp_path / "index.json").write_text(json.dumps({"runs": {}}))
    assert experiments.atomic_dq_table(tmp_path) is None


def test_one_gives_the_row_where_the_index_repeats_other_keys():
    """pandas 2 (Colab's 2.2) returns a one-row frame for ``table.loc[key]`` when the index
    repeats another key, which chapter 8 and 9's glue then could not format (an H200 run with
    pandas 2 failed there); ``profiles.one`` gives the row in every pandas and refuses a key
    that names no row or several."""
    import pandas as pd

    table = pd.DataFrame({"impl": ["triton", "triton", "triton", "cudnn"],
                          "causal": [False, True, True, False], "us": [10.0, 20.0, 21.0, 7.5]})
    at = table.set_index(["impl", "causal"])
    assert not at.index.is_unique
    row = profiles.one(at, ("triton", False))
    assert isinstance(row, pd.Series) and row["us"] == 10.0
    assert profiles.one(at, ("cudnn", False), "us") == 7.5
    assert f"{profiles.one(at, ('triton', False), 'us'):.1f}" == "10.0"
    with pytest.raises(KeyError, match="2 rows"):
        profiles.one(at, ("triton", True))
    with pytest.raises(KeyError):
        profiles.one(at, ("gluon", False))
