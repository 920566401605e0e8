"""Chapter 11 after the eleventh reading: the checked path's cost split as the host table splits it
(the checks a small part), the L2 flush that hides the host in the cuDNN comparison (body and
summary), the 16K ring step accounted for (compute, unhidden transfers, what ring_attention adds),
the profiles' 16% set apart from the graph timings' 8-12%, why 2 programs per SM are planned when 3
fit, a GPU's paged tile, what the gather costs, and the terms and sketches a newcomer tripped on."""
import inspect
import json

import pandas as pd

from conftest import require
from flashbook import bench, runtime
from flashbook.bench import chapter11, decoding
from flashbook.kernels import decode, forward
from notebook_text import cell_source, flat, markdown, run_glued

CH11 = "11_decoding_and_many_gpus"


def test_the_checked_paths_cost_is_mostly_not_the_checks():
    decoded = chapter11.decode_shares(show=False)
    require(decoded is not None and chapter11.host_paths() is not None, "no recorded decoding or host run")
    glued, ns = run_glued([cell_source(CH11, c) for c in ("c11-h2", "c11-h3")], quiet=True, chapter11=chapter11,
                          pd=pd, ours=decoded[2])
    at = json.loads((bench.run_paths("decode_host")[-1] / "host.json").read_text())["2048"]
    us = {k: v["median_us"] for k, v in at.items() if isinstance(v, dict) and "median_us" in v}
    jit = us["launch_jit:split"] + us["launch_jit:combine"]
    rest = us["checked_path"] - jit - us["checks"]
    assert glued["short_checks"] == f"{us['checks']:.1f}" == "4.6"
    assert glued["short_jit"] == f"{jit:.0f}" and glued["short_plan"] == f"{rest:.0f}" == "67"
    assert us["checks"] < 0.05 * us["checked_path"] and rest > jit      # the checks are not the cost
    # the host table's rows are the same numbers
    table = ns["host_table"]["2K cache"]
    assert table["checked path: the argument checks"] == round(us["checks"], 1)
    assert table["checked path: Triton's two launches"] == round(jit, 1)
    text = flat(cell_source(CH11, "c11-h4"))
    assert ("only {glue:text}`short_checks` µs of it on the argument checks: {glue:text}`short_jit` µs in Triton's "
            "two launches") in text
    assert "about {glue:text}`short_plan` µs in the book's own Python, which plans the call" in text
    assert "(checks, buffers, tiles, splits)" not in text
    intro = flat(cell_source(CH11, "c11-h1"))
    assert "which checks every argument" not in intro and "skips the checks" not in intro
    assert "takes the *short path*: no checks, no planning, and launches" in flat(cell_source(CH11, "1029602f"))


def test_the_cudnn_comparison_says_the_flush_hides_the_host_in_body_and_summary():
    """The flush is queued before the start event and the call after it (flashbook.timing.CudaTimer):
    a host cost under the flush's time never reaches the timed interval."""
    from flashbook import timing

    timed = inspect.getsource(timing.CudaTimer.__call__).split("for i in range(n_rep):")[1]
    assert timed.index("self.flush.zero_()") < timed.index("starts[i].record()") < timed.index("fn()")
    against = flat(cell_source(CH11, "c11-h10").split("### Against cuDNN")[1])
    assert "so a host cost under {glue:text}`flush_us` µs never shows" in against
    summary = flat(cell_source(CH11, "c11-45").split("## Summary")[1])
    assert ("On the H200, timed from Python after an L2 flush that hides the host's share, `flash_decode` ran at "
            "{glue:text}`rep_fd_lo`") in summary
    assert "On the H200, called from Python" not in summary
    box = flat(cell_source(CH11, "c11-m7"))
    assert "most likely host jitter long enough to outlast the {glue:text}`flush_us` µs flush" in box


def test_the_16k_ring_step_is_compute_unhidden_transfers_and_the_autograd_call():
    ring = chapter11.ring_runs(show=False)
    require(ring is not None, "no recorded ring run")
    ring_df = ring[0]
    first = ring_df.sort_values("n").iloc[0]
    glued, _ = run_glued(cell_source(CH11, "c11-44"), quiet=True, ring_df=ring_df, chapter11=chapter11)
    assert (glued["ring_first_ring"], glued["ring_first_compute"], glued["ring_first_overlapped"]) == (
        "5.88", "3.95", "4.97")
    assert (glued["ring_first_unhidden"], glued["ring_first_autograd"]) == ("1.0", "0.9")
    assert glued["ring_first_overlapped"] == f"{first['overlapped_ms']:.2f}"
    assert glued["ring_first_unhidden"] == f"{first['overlapped_ms'] - first['compute_ms']:.1f}"
    # part of the transfers, not more than all of them
    assert 0 < first["overlapped_ms"] - first["compute_ms"] < first["comm_ms"]
    link = chapter11.ring_link(ring_df, 450e9)
    assert link.index[0] == first["n"] and link.iloc[0]["comm_ms"] == round(first["comm_ms"], 2)
    # the three parts add up to the step, by construction of the two differences
    parts = first["compute_ms"] + (first["overlapped_ms"] - first["compute_ms"]) + (first["ring_ms"] - first["overlapped_ms"])
    assert abs(parts - first["ring_ms"]) < 1e-9 and first["ring_ms"] - first["overlapped_ms"] > 0.5
    # what ring_attention adds around the direct calls: autograd and the all-gather shape check
    from flashbook import distributed
    wrapper = inspect.getsource(distributed.ring_attention)
    assert "_check_same_everywhere(" in wrapper and "RingAttention.apply(" in wrapper
    assert "dist.all_gather(" in inspect.getsource(distributed._check_same_everywhere)
    prose = flat(cell_source(CH11, "c11-45"))
    assert ("The two GPUs' {glue:text}`ring_first_ring` ms step is about {glue:text}`ring_first_compute` ms of "
            "compute, about {glue:text}`ring_first_unhidden` ms of the transfers'") in prose
    assert ("and {glue:text}`ring_first_autograd` ms more through `ring_attention` (autograd and an all-gather "
            "shape check, not timed apart)") in prose
    # the box no longer repeats the 16K hidden share; its 128K caveat stays
    assert "hiding" not in glued["ring_status"] and "At 128K the hidden fraction" in glued["ring_status"]


def test_the_profiles_16_percent_is_set_apart_from_the_graph_timings():
    ncu = bench.run_paths("decode_ncu")
    require(len(ncu) >= 2, "no recorded Nsight Compute profiles")
    glued, _ = run_glued([cell_source(CH11, "c11-m2"), cell_source(CH11, "c11-m3")], quiet=True,
                         bench=bench, chapter11=chapter11, pd=pd, H200=runtime.chip("H200"))
    assert glued["ncu_gain"] == "16" and glued["ncu_cudnn_moved"] == "4"
    assert glued["split_gain_dense"] == "8 to 12"
    # the graph timings: both split counts in one run, 11% at this very shape
    sweep = pd.read_csv(bench.run_paths("decode_splits")[0] / "decode_splits.csv")
    at = sweep[(sweep["batch"] == 64) & (sweep["seq"] == 32768) & (sweep["cache"] == "dense")].set_index("num_splits")
    assert round(100 * (1 - at.loc[4, "graph_ms"] / at.loc[1, "graph_ms"])) == 11
    assert ncu[-2] != ncu[-1]                                  # the two profiles: two runs
    text = flat(cell_source(CH11, "c11-m4"))
    assert ("The table's {glue:text}`ncu_gain`% comes from two profiling runs, between which even cuDNN's time "
            "moved {glue:text}`ncu_cudnn_moved`%; the graph timings took both split counts in one run.") in text


def test_the_planned_2_programs_per_sm_are_a_full_tiles_and_the_runs_take_the_smallest():
    doc = " ".join(decode.choose_num_splits.__doc__.split())
    assert "fits 3 with 16 query rows (one new token of a group of 4" in doc and "2 with 64 rows" in doc
    assert decode.MAX_ROWS == 64 and decode.decode_tiles(128, 2, 4, interpreter=False)[0] == 16
    glued, _ = run_glued(cell_source(CH11, "c11-19"), decode=decode, H200=runtime.chip("H200"), block_n=64)
    assert (glued["plan_per_sm"], glued["max_rows"], glued["min_tile"]) == ("2", "64", "16")
    # compiled for sm_90 (no GPU needed): the shared memory of one program, 16-row and 64-row tiles
    from flashbook.kernels import targets
    jobs = [dict(kernel="decode", cc=90, head_dim=128, dtype="bf16", assemble=False,
                 config=list(decode.decode_tiles(128, 2, rows, interpreter=False))) for rows in (4, 64)]
    small, full = targets.compile_elsewhere(jobs)
    assert small["error"] is None and full["error"] is None, (small["error"], full["error"])
    per_sm = runtime.chip("H200").smem_per_sm_kib * 1024      # 1 KiB more is reserved per program
    assert per_sm == 228 * 1024
    assert (per_sm // (small["shared"] + 1024), per_sm // (full["shared"] + 1024)) == (3, 2)


def test_the_gather_sentence_and_the_loop_sentence_match_the_kernels():
    from flashbook.display import source

    paged = source(decode._paged_stage)
    assert "tl.load(table + cols // PAGE_SIZE" in paged and "tl.load(table + start_n // PAGE_SIZE)" in paged
    text = flat(cell_source(CH11, "c11-h10"))
    assert ("a gathered tile loads `BLOCK_N` page indices (`table + cols // PAGE_SIZE`) and computes an address "
            "for each row, against one index and one base") in text
    assert source(forward.attend).count("_fwd_inner(") == 2
    assert ("3. **The loop.** It is chapter 7's `attend`, which calls `_fwd_inner` twice: the main stage over "
            "`[lo, mid)`, then the masked stage over `[mid, hi)`.") in flat(cell_source(CH11, "c11-15"))
    assert "then the call to the loop, which is chapter 7's:" in flat(cell_source(CH11, "c11-13"))
    assert "two lessons from measuring the kernel" in flat(cell_source(CH11, "c11-01"))


def test_terms_checks_and_sketches_a_newcomer_can_follow():
    text = flat(markdown(CH11))
    assert "GEMMs, general matrix multiplications" in text
    assert "speculative decoding, where a small model drafts tokens that the large model checks in one step" in text
    # the hidden check's thresholds are the ones its cell asserts
    assert "1e-4 if dtype == torch.float32 else 3e-2" in cell_source(CH11, "3c44d5f3")
    assert "A hidden check in the notebook asserts an error below 3e-2 (1e-4 in float32)." in text
    assert "the check allows 3e-2" not in text
    sketch = cell_source(CH11, "c11-ring-call").split("```python\n")[1]
    assert sketch.startswith("# a sketch of your training script (not run here): model, tokens_full, N are yours\n")
    assert "both would wait forever: a *deadlock*" in text and "mismatched sends deadlock" not in text
