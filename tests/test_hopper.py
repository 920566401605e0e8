"""The Gluon kernel's input checks (``flashbook.kernels.hopper``), on any machine, and
its lab's (``benchmarks/gluon_lab.py``: the variants chapter 10 measured slower).

Each wrong input gets an error that names the argument and what was expected,
before anything is launched; both compile for sm_90 here, and the kernels themselves
run in ``test_hopper_gpu.py``.
"""
from __future__ import annotations

import os

import pytest
import torch

from conftest import ROOT, benchmark_script, compile_cache
from flashbook.kernels import hopper

lab = benchmark_script("gluon_lab")
LAB = os.path.join(ROOT, "benchmarks", "gluon_lab.py")


def qkv(b=1, h=2, h_kv=2, n_q=256, n_k=256, d=128, dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(b, h, n_q, d, generator=gen).to(dtype),
            torch.randn(b, h_kv, n_k, d, generator=gen).to(dtype),
            torch.randn(b, h_kv, n_k, d, generator=gen).to(dtype))


@pytest.mark.parametrize("change,kwargs,error,words", [
    (dict(dtype=torch.float32), {}, TypeError, "float16 or bfloat16"),
    ({}, dict(causal=1), TypeError, "causal must be True or False"),
    (dict(d=80), {}, ValueError, "head_dim must be one of (64, 128)"),
    (dict(n_q=63), {}, ValueError, "seq_q >= block_m=64"),
    (dict(n_k=63), {}, ValueError, "seq_k >= block_n=64"),
    (dict(n_k=100), dict(block_n=128), ValueError, "seq_k >= block_n=128 (one tile each), got seq_q=256, seq_k=100"),
    (dict(n_q=512, n_k=256), dict(causal=True), ValueError, "seq_q <= seq_k"),
    (dict(h=3, h_kv=2), {}, ValueError, "k's number of heads (2) must divide q's (3)"),
    ({}, dict(block_n=32), ValueError, "block_n must be one of (64, 128), got 32"),
    ({}, dict(stages=5), ValueError, "stages must be one of (2, 3, 4), got 5"),
    ({}, dict(block_m=32), ValueError, "block_m must be one of (64, 128, 192), got 32"),
    (dict(n_q=128), dict(block_m=192, schedule="producer"), ValueError, "seq_q >= block_m=192"),
    (dict(n_q=320), dict(block_m=192, schedule="overlap"), ValueError, "schedule='overlap' takes block_m 64 or 128"),
    ({}, dict(block_m=64, schedule="producer"), ValueError, "schedule='producer' takes block_m 128 or 192"),
    ({}, dict(schedule="fast"), ValueError, "schedule must be one of"),
    ({}, dict(schedule="pingpong"), ValueError, "schedule must be one of ('overlap', 'producer'), got 'pingpong'"),
])
def test_bad_input_is_named(change, kwargs, error, words):
    q, k, v = qkv(**change)
    with pytest.raises(error) as info:
        hopper.gluon_forward(q, k, v, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("change,kwargs,error,words", [
    ({}, dict(schedule="fast"), ValueError,
     "schedule must be one of ('overlap', 'producer', 'pingpong', 'persistent')"),
    ({}, dict(schedule="pingpong", block_m=64), ValueError, "block_m must be 128"),
    ({}, dict(fma_share=3), ValueError, "fma_share must be one of (0, 2, 4), got 3"),
    ({}, dict(fma_share=False), TypeError, "fma_share must be one of (0, 2, 4), got False"),
    ({}, dict(fma_share=2, degree=5), ValueError, "degree must be one of (3, 4), got 5"),
    (dict(n_q=320), dict(block_m=192, schedule="persistent"), ValueError, "schedule='persistent' takes block_m 64 or 128"),
    ({}, dict(programs=4), ValueError, "schedule='producer' launches one per query tile"),
    ({}, dict(schedule="persistent", block_m=64, programs=0), ValueError, "programs must be a positive int"),
    ({}, dict(schedule="persistent", block_m=64, programs=2.0), ValueError, "programs must be a positive int"),
    # then the library's checks, with the limits of the schedule each variant builds on
    ({}, dict(schedule="pingpong", block_m=128, block_n=32), ValueError, "block_n must be one of (64, 128), got 32"),
    (dict(n_q=128), dict(schedule="persistent", block_m=128, block_n=64, stages=5), ValueError,
     "stages must be one of"),
    (dict(n_q=200), dict(fma_share=2), ValueError, "seq_q a multiple of 64"),
    (dict(n_k=200), dict(schedule="persistent", block_m=64), ValueError, "seq_k a multiple of block_n=128"),
    (dict(d=80), dict(schedule="persistent", block_m=64), ValueError, "head_dim must be one of (64, 128)"),
])
def test_lab_bad_input_is_named(change, kwargs, error, words):
    q, k, v = qkv(**change)
    with pytest.raises(error) as info:
        lab.gluon_forward(q, k, v, **kwargs)
    assert words in str(info.value)


def test_mismatched_k_and_v():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v must have the same sequence length"):
        hopper.gluon_forward(q, k, v[:, :, :128])
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        hopper.gluon_forward(q[0], k, v)
    with pytest.raises(TypeError, match="q, k and v must have the same dtype"):
        hopper.gluon_forward(q, k, v.to(torch.bfloat16))


def test_good_input_off_hopper_says_where_it_runs():
    """Valid shapes on a machine without a Hopper GPU: the error says so, and what runs instead."""
    q, k, v = qkv()
    if hopper.available():
        pytest.skip("this machine has a Hopper GPU: the kernel runs here (test_hopper_gpu.py)")
    with pytest.raises((ValueError, RuntimeError), match="flash_attention"):
        hopper.gluon_forward(q, k, v)
    with pytest.raises((ValueError, RuntimeError), match="flash_attention"):
        hopper.gluon_attention(q, k, v, causal=True)
    for kwargs in (dict(schedule="persistent", block_m=64), dict(schedule="pingpong", block_m=128),
                   dict(fma_share=2), {}):
        with pytest.raises((ValueError, RuntimeError), match="flash_attention"):
            lab.gluon_forward(q, k, v, **kwargs)
    assert hopper.available() is False


def test_without_gluon_the_module_imports_and_says_so(monkeypatch):
    """An older Triton (no ``triton.experimental.gluon``): the chapter can still show the
    kernel's source and the lab's, and a call says what is missing and what to use instead."""
    import importlib
    import inspect
    import sys

    before = hopper.HAS_GLUON
    for name in [m for m in sys.modules if m.startswith("triton.experimental.gluon")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)   # import fails
    try:
        plain = importlib.reload(hopper)
        assert plain.HAS_GLUON is False and plain.available() is False
        assert callable(plain.attend_tiles) and "warpgroup_mma" in inspect.getsource(plain.attend_tiles)
        q, k, v = qkv()
        with pytest.raises(RuntimeError, match="needs Triton's Gluon.*flash_attention"):
            plain.gluon_forward(q, k, v)
        plain_lab = importlib.reload(lab)
        assert "take_turn" in inspect.getsource(plain_lab.attend_tiles)
        assert "ROUNDER" in inspect.getsource(plain_lab.exp2_fma) and callable(plain_lab.refill)
        with pytest.raises(RuntimeError, match="needs Triton's Gluon.*flash_attention"):
            plain_lab.gluon_forward(q, k, v, schedule="persistent", block_m=64)
    finally:
        monkeypatch.undo()
        importlib.reload(hopper)
        importlib.reload(lab)
    assert hopper.HAS_GLUON is before and lab.HAS_GLUON is before


@pytest.mark.slow(seconds=20)
def test_defaults_and_schedules_compile_for_sm90_and_fit():
    """Every configuration the library launches by default, and each schedule, compiled for
    sm_90 here (no GPU needed): it fits an H100/H200's shared memory and uses what the
    chapter says it uses: warpgroup products, TMA copies, and for the warp-specialised
    schedule the register reallocation (setmaxnreg)."""
    from flashbook import runtime
    from flashbook.kernels import targets

    jobs = []
    for head_dim, (block_m, block_n, stages, schedule) in hopper.DEFAULTS.items():
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                jobs.append(dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=head_dim, dtype=dtype, causal=causal,
                                 schedule=schedule, config=[block_m, block_n, 4, stages]))
    for block_m, block_n, stages, schedule in ((128, 128, 3, "overlap"), (64, 64, 3, "overlap"),
                                               (128, 64, 4, "producer"), hopper.SHORT_DEFAULT):
        jobs.append(dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=128, dtype="fp16", causal=True,
                         schedule=schedule, config=[block_m, block_n, 4, stages]))
    # lengths that are not whole key tiles (the last key tile overlaps the one before), both schedules
    for head_dim, (block_m, block_n, stages, schedule) in ((128, hopper.DEFAULTS[128]), (64, hopper.SHORT_DEFAULT)):
        for causal in (False, True):
            jobs.append(dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=head_dim, dtype="bf16", causal=causal,
                             schedule=schedule, config=[block_m, block_n, 4, stages], options={"ragged": True}))
    cache_dir = compile_cache()
    results = targets.compile_elsewhere(jobs, workers=2, cache_dir=cache_dir, timeout=900)
    limit = runtime.chip("H200").smem_per_block_bytes
    for r in results:
        what = f"{r['schedule']} d={r['head_dim']} {r['dtype']} causal={r['causal']} config={r['config']}"
        assert r["error"] is None, f"{what}: {r['error'][:600]}"
        assert 0 < r["shared"] <= limit, f"{what}: shared {r['shared']} B, limit {limit} B"
        assert r["tensor_core_ops"] > 0 and r["tma_copies"] > 0, what
        assert (r["register_moves"] > 0) == (r["schedule"] == "producer"), what
        assert max(r["wgmma_waits"]) >= 1, f"{what}: no wait leaves a product running (chapter 10)"


def test_lab_schedules_compile_for_sm90_and_fit():
    """The lab's schedules compiled for sm_90 (``benchmarks/gluon_lab.py`` compiles them as
    ``targets`` does the library's): ping-pong moves registers as the producer schedule
    does, and the persistent schedule's 64-row programs are capped so that three share an SM."""
    from flashbook import runtime
    from flashbook.kernels import targets

    jobs = [dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=128, dtype="fp16", causal=True, schedule="pingpong",
                 config=[128, 128, 4, 3]),
            dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=64, dtype="fp16", causal=True, schedule="persistent",
                 config=[64, 128, 4, 2]),
            dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=128, dtype="bf16", causal=False, schedule="persistent",
                 config=[128, 64, 4, 2])]
    cache_dir = compile_cache()
    results = targets.compile_elsewhere(jobs, workers=2, cache_dir=cache_dir, timeout=900, script=LAB)
    h200 = runtime.chip("H200")
    for r in results:
        what = f"{r['schedule']} d={r['head_dim']} {r['dtype']} causal={r['causal']} config={r['config']}"
        assert r["error"] is None, f"{what}: {r['error'][:600]}"
        assert 0 < r["shared"] <= h200.smem_per_block_bytes, what
        assert r["tensor_core_ops"] > 0 and r["tma_copies"] > 0, what
        assert (r["register_moves"] > 0) == (r["schedule"] == "pingpong"), what
    persistent = results[1]   # capped so that three 4-warp programs share an SM's registers...
    assert persistent["register_cap"] == lab.PERSISTENT_REGS, persistent
    assert 3 * 128 * persistent["register_cap"] * 4 <= h200.regs_per_sm_kib * 1024   # 4-byte registers
    assert 3 * (persistent["shared"] + 1024) <= h200.smem_per_sm_kib * 1024   # ...and its shared memory
    assert results[2]["register_cap"] is None   # two warpgroups: one program per SM anyway


def test_fma_shares_move_exponentials_and_no_data():
    """The lab's ``fma_share`` compiled for sm_90: the special-function unit's exp2 instructions fall
    by the share (a half, a quarter), and the split of each score tile moves no data
    through shared memory (the columns it hands over are the same thread's registers)."""
    from flashbook.kernels import targets

    jobs = [dict(kernel="gluon_forward", cc=90, assemble=False, head_dim=64, dtype="fp16", causal=False, schedule="overlap",
                 config=[64, 128, 4, 2], options=dict(fma_share=share, degree=degree))
            for share, degree in ((0, 4), (2, 4), (4, 4), (4, 3))]
    cache_dir = compile_cache()
    results = targets.compile_elsewhere(jobs, workers=2, cache_dir=cache_dir, timeout=900, script=LAB)
    for r in results:
        assert r["error"] is None, r["error"][:600]
    plain = results[0]   # share 0: the library's own kernel
    assert plain["exponentials"] > 0
    for r in results[1:]:
        assert r["shared_accesses"] == plain["shared_accesses"], r
        # the tile's exponentials (all but the per-row rescale factors) shrink by the share
        moved = plain["exponentials"] - r["exponentials"]
        assert 0 < moved < plain["exponentials"], r
    half, quarter = results[1]["exponentials"], results[2]["exponentials"]
    assert plain["exponentials"] - half == 2 * (plain["exponentials"] - quarter)
    assert results[3]["exponentials"] == quarter   # the degree changes the polynomial, not the split


def test_exp2_polynomial_is_exact_at_zero_and_within_its_stated_error():
    """The polynomial behind the lab's ``exp2_fma``: 2**0 = 1 exactly (the row's largest score keeps
    weight 1), and its relative error on [-1/2, 1/2], measured independently on random points
    in float64, stays within ``exp2_fma_error`` and below float16's half-ulp."""
    import numpy as np

    rng = np.random.default_rng()
    f = rng.uniform(-0.5, 0.5, 200_000)
    for degree in lab.EXP2_DEGREES:
        coeffs = lab.exp2_polynomial(degree)
        assert len(coeffs) == degree
        value = 1.0 + sum(c * f ** (i + 1) for i, c in enumerate(coeffs))
        err = np.abs(value / 2.0 ** f - 1.0).max()
        assert err <= lab.exp2_fma_error(degree) * (1 + 1e-6)   # the grid may miss the peak by 1e-10
        assert lab.exp2_fma_error(degree) < float(torch.finfo(torch.float16).eps) / 2
    # each degree more buys at least an order of magnitude
    assert lab.exp2_fma_error(4) < lab.exp2_fma_error(3) / 10


def test_default_configuration_follows_head_dim_length_and_mask():
    """d=64 takes three consumer warpgroups (192 query rows) for long sequences (from 2K
    full, 6K causal: where they measured faster), one-warpgroup programs below, with 64-key
    tiles when causal and shorter than 2K; d=128 two warpgroups."""
    assert hopper.DEFAULTS[64][0] == 192
    assert hopper.default_config(64, 2048) == hopper.default_config(64, 4096) == hopper.DEFAULTS[64]
    assert hopper.default_config(64, 1984) == hopper.SHORT_DEFAULT
    assert hopper.default_config(64, 4096, causal=True) == hopper.SHORT_DEFAULT
    assert hopper.default_config(64, 16384, causal=True) == hopper.DEFAULTS[64]
    assert hopper.default_config(64, 1024) == hopper.SHORT_DEFAULT
    assert hopper.default_config(64, 1024, causal=True) == hopper.SHORT_CAUSAL
    assert hopper.default_config(64, 2048, causal=True) == hopper.SHORT_DEFAULT
    assert hopper.default_config(128, 1024, causal=True) == hopper.DEFAULTS[128]
    assert hopper.default_config(128, 64) == hopper.SHORT_DEFAULT
    for head_dim in hopper.HEAD_DIMS:
        for seq in (64, 128, 192, 320, 1024, 3072, 6144, 16384):
            for causal in (False, True):
                block_m, block_n, stages, schedule = hopper.default_config(head_dim, seq, causal)
                assert block_m <= seq and schedule in hopper.SCHEDULES and stages in hopper.STAGES


def test_any_length_from_one_tile_up_and_auto_prefers_triton_where_gluon_measured_slower():
    """The kernel takes lengths that are not whole tiles (the last query or key tile overlaps
    the one before); below one tile it names the limit. ``slower_than_triton``, which sends
    ``backend="auto"`` to the Triton kernel, agrees with every ragged row of the recorded run
    (benchmarks/gluon_lengths.py on the H200, five rounds): Gluon slower there, faster elsewhere."""
    import json

    from flashbook import bench

    for n_q, n_k in ((200, 333), (1000, 1000), (64, 64), (4097, 4097)):
        block_m, block_n, _, _ = hopper.default_config(128, n_q, False, n_k)
        assert n_q >= block_m and n_k >= block_n, (n_q, n_k)
    assert hopper.default_config(64, 100, False, 100)[1] == 64      # fewer keys than a 128-key tile
    run = bench.run_path("gluon_lengths")
    rows = json.load(open(run))["rows"]
    ragged = [r for r in rows if r["ragged"]]
    assert len(ragged) == 8 and all(r["triton_max_diff"] == 0 and r["gluon_max_diff"] < 0.05 for r in rows)
    for r in ragged:
        slower = hopper.slower_than_triton(r["head_dim"], r["seq"], r["seq"], r["causal"])
        assert slower == (r["gluon_over_triton"] < 1), r
    # the cost of RAGGED=True alone, at whole lengths: the one-warpgroup, 128-key-tile programs pay it
    cost = {(r["head_dim"], r["causal"], tuple(r["config"])): r["ragged_cost"] for r in rows if "ragged_cost" in r}
    assert all(c > 0.1 for (d, causal, cfg), c in cost.items() if cfg == (64, 128, 2, "overlap"))
    assert all(abs(c) < 0.05 for (d, _, cfg), c in cost.items() if d == 128)
