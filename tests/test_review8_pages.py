"""Which function should I use? after the eighth reading: one table at the top with what each
call gives, the plain-inference row honest about a tie, the flash-attn layout hazard in a
warning box, host times (not flush-hidden called times) for flash_attn_with_kvcache, and the
ring's rounding and GQA cost."""
import pandas as pd

from conftest import require
from flashbook import bench
from notebook_text import book_page, flat, markdown, page_glued


def _rows():
    run = bench.run_path("front_door")
    require(run is not None, "no recorded front_door run")
    return bench.load_recorded_json("front_door")["rows"]


def test_one_decision_table_with_a_measured_column_and_chapter_links():
    page = book_page("which_kernel.md")
    assert page.count("| you want |") == 1
    assert "| you want | call | what it gives (the numbers: measured on an H200) |" in page
    for chapter in ("07_triton_forward", "08_triton_backward", "09_benchmarks", "10_making_it_fast",
                    "11_decoding_and_many_gpus", "12_masks"):
        assert f"<../notebooks/{chapter}>`" in page, chapter


def test_plain_inference_is_called_a_tie_at_head_dim_128():
    rows = _rows()
    glued = page_glued("which_kernel.md")
    for d in (64, 128):
        at = [r["auto_over_cudnn_fwd"] for r in rows if r["head_dim"] == d]
        assert len(at) == 6
        assert glued[f"fd_fwd{d}_lo"] == f"{min(at):.2f}" and glued[f"fd_fwd{d}_hi"] == f"{max(at):.2f}"
    at128 = [r["auto_over_cudnn_fwd"] for r in rows if r["head_dim"] == 128]
    assert min(at128) < 1 < max(at128) < 1.05          # slower at some shapes, within a few % at others
    assert max(r["auto_over_cudnn_fwd"] for r in rows if r["head_dim"] == 128 and r["seq"] == 1024) < 0.95
    assert all(0.95 < r["auto_over_cudnn_fwd"] < 1.05 for r in rows if r["head_dim"] == 128 and r["seq"] >= 4096)
    # "a loss at 1K tokens and a tie from 4K", as the row says
    row = next(line for line in book_page("which_kernel.md").splitlines()
               if line.startswith("| inference with plain full or causal attention"))
    assert "either: SDPA (cuDNN) or `flashbook.flash_attention`" in row and "at head_dim 128 a loss at 1K tokens and a tie from 4K" in row
    assert "H100" not in row


def test_the_layout_hazard_is_a_warning_under_one_call():
    page = book_page("which_kernel.md")
    one_call, rest = page.split("## One call", 1)[1].split("## Coming from flash-attn", 1)
    warning = one_call.split(":::{warning}", 1)[1].split(":::", 1)[0]
    assert "(batch, heads, seq, head_dim)" in warning and "(batch, seq, heads, head_dim)" in warning
    assert "usually without an error" in warning and "`flashbook.flash_attn_func`" in warning
    assert "usually without an error" not in rest


def test_kvcache_python_times_are_host_times():
    """flash_attn_with_kvcache's Python-call cost is the host's time per call; the decoding footnote
    says the flush hides it and gives chapter 11's eager host times (one run)."""
    from flashbook.bench import chapter11

    _, run, _ = chapter11.host_paths()
    glued = page_glued("which_kernel.md")
    assert glued["dec_host_fd"] == f"{run['2048']['call']['median_us']:.0f}"
    assert glued["dec_host_cudnn"] == f"{run['2048']['sdpa_cudnn']['median_us']:.0f}"
    assert int(glued["dec_host_fd"]) > int(glued["dec_host_cudnn"])
    note = next(line for line in book_page("which_kernel.md").splitlines() if line.startswith("[^decode]:"))
    assert "so that work hides behind it" in note and "{glue:text}`dec_host_fd`" in note
    text = flat(book_page("which_kernel.md"))
    assert "The CPU's work per call, on the same H100 machine" in text   # host times, one machine
    assert "Called from Python it took" not in text


def test_the_ring_is_exact_up_to_rounding_with_its_measured_ratio():
    runs = bench.find_runs(csv_name="ring.csv")
    require(runs, "no recorded ring run")
    ring = pd.read_csv(runs[0])
    ratio = max((ring[f"err_{x}"] / ring[f"single_err_{x}"]).max() for x in ("dq", "dk", "dv"))
    assert ratio > 1.2                                  # bf16 partial sums: not one GPU's rounding
    assert page_glued("which_kernel.md")["ring_grad_ratio"] == f"{ratio:.1f}"
    row = next(line for line in book_page("which_kernel.md").splitlines()
               if line.startswith("| one sequence spread over several GPUs"))
    assert "the same result up to rounding" in row and "exact" not in row


def test_before_you_ship_lists_the_advice_the_footnotes_held():
    page = book_page("which_kernel.md")
    ship = page.split("Before you ship:", 1)[1].split("[^decode]:", 1)[0]
    for advice in ("{term}`CUDA graph`", "`ring_attention` needs K and V repeated", "`check_values=False`"):
        assert advice in ship, advice
    code = page.split("## One call", 1)[1].split("```", 2)[1]
    assert "o.sum().backward()   # it trains too; for training speed, the table above points to SDPA" in code


def test_ranges_that_differ_from_the_linked_chapters_name_their_runs():
    """The training and inference rows give this page's run and, beside the chapter link, that
    chapter's own run (chapter 9's full comparison, chapter 10's Gluon sweep), each checked
    against its recorded data; the two host times per decoding call name their machines."""
    full, _ = bench.load_results(bench.latest_results(bench.results_root()))
    goal = next(t for t in bench.PERFORMANCE_TARGETS if t.kind == "goal" and t.metric == "bwd")
    ch9 = bench.target_table(full, targets=[goal])["ratio"].dropna()
    sweep = bench.gluon_schedule_table(128)
    require(sweep is not None, "no recorded Gluon sweep")
    sweep = sweep[sweep["dtype"] == "bf16"]
    ch10 = sweep["producer"] / sweep["cudnn"]
    glued = page_glued("which_kernel.md")
    assert (glued["ch9_bwd_goal_lo"], glued["ch9_bwd_goal_hi"]) == (f"{ch9.min():.2f}", f"{ch9.max():.2f}")
    assert (glued["ch10_fwd128_lo"], glued["ch10_fwd128_hi"]) == (f"{ch10.min():.2f}", f"{ch10.max():.2f}")
    lines = book_page("which_kernel.md").splitlines()
    # the short answer gives one range per cell, the one the chapter it links gives (the training row:
    # chapter 9's full run); the detail section names the runs
    training = next(line for line in lines if line.startswith("| training |"))
    inference = next(line for line in lines if line.startswith("| inference with plain full or causal attention"))
    assert "{glue:text}`ch9_bwd_goal_lo` to {glue:text}`ch9_bwd_goal_hi` times cuDNN's speed" in training
    assert "fd_bwd_goal" not in training and "fd_bwd_lo" not in training
    # chapter 9's Key results give the same range (its t_bwd_cudnn_span, from the same bench.target_table)
    assert (glued["ch9_bwd_goal_lo"], glued["ch9_bwd_goal_hi"]) == ("0.77", "0.81")
    assert "{glue:text}`t_bwd_cudnn_span` backward" in flat(markdown("09_benchmarks"))
    for row in (training, inference):
        assert "ch10_fwd128" not in row and "fd_fwd64" not in row
    assert "{doc}`chapter 9 <../notebooks/09_benchmarks>`" in training
    assert "{doc}`chapter 10 <../notebooks/10_making_it_fast>`" in inference
    detail = flat(book_page("which_kernel.md").split("## What it gives on an H200", 1)[1])
    assert ("(this page's run; chapter 9's full run, at other batches, gave {glue:text}`ch9_bwd_goal_lo` to "
            "{glue:text}`ch9_bwd_goal_hi`)") in detail
    assert ("chapter 10's sweep gave {glue:text}`ch10_fwd128_lo` to {glue:text}`ch10_fwd128_hi`, as cuDNN's "
            "own time moves between runs") in detail
    assert "the wins are at head_dim 64 ({glue:text}`fd_fwd64_lo` to {glue:text}`fd_fwd64_hi`)" in detail
    note = next(line for line in lines if line.startswith("[^decode]:"))
    assert "on the H200 machine's CPU (host times depend on the CPU, not the GPU)" in note
    text = flat(book_page("which_kernel.md"))
    assert ("The CPU's work per call, on the same H100 machine: {glue:text}`kv_rot_host` µs") in text
    assert ("{glue:text}`kv_fd_host` µs for `flash_decode` (on the H200 machine's CPU: "
            "{glue:text}`dec_host_fd` µs)") in text


def test_the_decoding_row_gives_the_range_its_footnote_gives():
    """The decoding row's range is over every timed shape (medians of three runs), as its footnote's
    per-batch ranges are; it does not claim a subset of shapes."""
    from flashbook.bench import decoding

    dec = decoding.repeat_ratios(bench.run_paths("decode_repeats"))
    speed = 1 / dec["fd_cudnn_ms"]
    glued = page_glued("which_kernel.md")
    assert (glued["dec_lo"], glued["dec_hi"]) == (f"{speed.min():.2f}", f"{speed.max():.2f}")
    assert glued["dec_lo"] == min(glued["dec_small_lo"], glued["dec_big_lo"])
    assert glued["dec_hi"] == max(glued["dec_small_hi"], glued["dec_big_hi"])
    row = next(line for line in book_page("which_kernel.md").splitlines() if line.startswith("| decoding with"))
    assert "{glue:text}`dec_lo` to {glue:text}`dec_hi` times cuDNN's speed (medians of three runs)[^decode]" in row
    assert "agreed within 3%" not in row
    # the footnote points at chapter 11's section, which gives the same runs as speeds too
    note = next(line for line in book_page("which_kernel.md").splitlines() if line.startswith("[^decode]:"))
    assert '(chapter 11, "Against cuDNN", the same runs)' in note and "as times, ours over cuDNN's" not in note
    ch11 = markdown("11_decoding_and_many_gpus")
    assert "### Against cuDNN" in ch11 and "times cuDNN's speed" in flat(ch11)
