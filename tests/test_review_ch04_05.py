"""Statements of chapters 4, 5, A2 and the notation page that a review found wrong or
misleading, each pinned to its corrected form, with the numbers behind it."""
import math
import os

import numpy as np
import pytest

from conftest import ROOT
from flashbook import runtime, softmax, tiled
from notebook_text import cell_source

CH4, CH5, A2 = "04_tiled_forward.ipynb", "05_backward_recompute.ipynb", "A2_floating_point.ipynb"


# ---------------------------------------------------------------- chapter 5

def test_recomputation_saves_less_than_half_the_backward_traffic_and_says_how_much():
    naive = tiled.io_naive_backward(4096, 4096, 128).hbm_total
    atomic = tiled.io_flash_backward(4096, 4096, 128, 128, 128, dq_strategy="atomic").hbm_total
    second = tiled.io_flash_backward(4096, 4096, 128, 128, 128, dq_strategy="second_pass").hbm_total
    assert 0.35 < 1 - atomic / naive < 0.5 and 0.35 < 1 - second / naive < 0.5   # not "most"
    summary = cell_source(CH5, "6d7c2771")
    assert "most of the backward" not in summary
    assert "{glue:text}`t_saved`%" in summary and "{glue:text}`t_saved_sep`%" in summary
    glue_cell = cell_source(CH5, "81e0a147")
    assert 'g("t_saved", 100 * (1 - traffic["tiled, atomic dQ"].hbm_total / naive_t)' in glue_cell


def test_a_row_that_sees_no_key_needs_the_guard_when_p_is_recomputed():
    prose = cell_source(CH5, "63c760ec")
    assert "the mask needs no other special treatment" not in prose
    assert "the formula needs no other special treatment" in prose and "-\\infty" in prose
    # without the guard exp(-inf - (-inf)) is NaN; with it, P is 0
    q, k = np.ones((4, 2)), np.ones((2, 2))
    lse = np.full(2, -np.inf)
    rows, cols = slice(0, 2), slice(0, 2)
    with np.errstate(invalid="ignore"):
        p = tiled._recompute_p(q[rows], k[cols], lse, rows, cols, 4, 2, 1.0, True, tiled.IOCounter())
    assert np.all(p == 0)


def test_the_separate_dq_pass_recomputes_p_twice(monkeypatch):
    calls = {}
    real = tiled._recompute_p

    def counting(*args, **kwargs):
        calls[strategy] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(tiled, "_recompute_p", counting)
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((64, 8)) for _ in range(4))
    o, lse = tiled.forward(q, k, v, block_q=16, block_k=16)
    for strategy in tiled.DQ_STRATEGIES:
        calls[strategy] = 0
        tiled.backward(q, k, v, o, lse, do, block_q=16, block_k=16, dq_strategy=strategy)
    assert calls["second_pass"] == 2 * calls["atomic"] == 2 * 16
    prose = cell_source(CH5, "8762dafa")
    assert "one exponential per\nscore entry, as many as" not in prose
    # the cost section counts the loop it shows; the second pass's extra exponentials are
    # stated where that pass is explained
    assert "the last section meets a way of summing $dQ$ that needs more" in " ".join(prose.split())
    after = " ".join(cell_source(CH5, "b46b7da5").split())
    assert "and twice the exponentials, since it rebuilds $P$ in both of its loops" in after


def test_the_original_paper_keeps_m_and_l():
    prose = cell_source(CH5, "416f9ea0")
    assert "keeps one number per row" not in prose and "$m_i$ and $l_i$ in" in prose


# ---------------------------------------------------------------- chapter 4

def test_fa1_keeping_o_normalised_is_a_choice():
    prose = cell_source(CH4, "5142ffd4")
    assert "must be a valid output" not in prose and "a choice, not a" in prose


def test_the_summary_gives_both_fit_counts_and_they_disagree_on_a_t4():
    t4 = runtime.chip("T4")
    assert tiled.onchip_bytes(64, 64, 128) > t4.smem_per_block_bytes      # paper's count
    assert tiled.smem_bytes(64, 64, 128, arch=t4.arch) == t4.smem_per_block_bytes  # fits, 0 spare
    summary = cell_source(CH4, "69c17574")
    for name in ("f_total", "f_t4_fits", "k_t4", "k_t4_fits"):
        assert f"{{glue:text}}`{name}`" in summary
    assert "What must fit is" not in summary


def test_the_t4_has_no_stages_and_the_table_says_which_count():
    t4 = runtime.chip("T4")
    assert (tiled.smem_bytes(64, 64, 128, num_stages=2, arch=t4.arch)
            == tiled.smem_bytes(64, 64, 128, num_stages=3, arch=t4.arch))
    assert "kernel's count, two stages;" not in cell_source(CH4, "002fe647")
    assert "by a kernel's shared memory" in " ".join(cell_source(CH4, "5d3f8a21").split())   # the dropdown's table


def test_heat_map_crosses_use_the_everything_on_chip_count():
    a100 = runtime.chip("A100")
    assert tiled.onchip_bytes(128, 128, 128) > a100.smem_per_block_bytes   # crossed in the map
    assert tiled.largest_tile(a100, 128, num_stages=2) == 128             # yet a kernel's shared memory holds it
    text = " ".join(cell_source(CH4, "5d3f8a21").split())
    assert "So an A100 runs" not in text and "So by shared memory an A100 can hold" in text
    assert "paper's count" in cell_source(CH4, "9257cb86")
    assert "the ones the chip\ncannot hold" not in cell_source(CH4, "fe451e51")


def test_fa1_with_the_papers_blocks_moves_more_than_naive_on_a_t4():
    n, d = 4096, 128
    m_t4 = runtime.chip("T4").smem_per_block_bytes // 2
    fa1 = tiled.io_flash(n, n, d, *tiled.paper_blocks(m_t4, d), order="fa1").hbm_total
    assert fa1 / tiled.io_naive(n, n, d).hbm_total == pytest.approx(1.49, abs=0.01)
    assert "{glue:text}`t4_fa1_x`" in cell_source(CH4, "800ac299")


def test_d_v_and_program_are_defined_where_first_used():
    assert "$d_v$ is the width of the value" in cell_source(CH4, "541185ed")
    assert "{term}`program`" in cell_source(CH4, "c04-loop-md")      # the library loop's introduction
    assert "program" not in cell_source(CH4, "cb9f9cf5")       # not used before it is defined


def test_explorer_counts_steps_from_zero_in_every_label():
    from flashbook.explorers import Settings, explorer_state, render
    state = explorer_state(Settings(n=512, d=128, block_q=128, block_k=128, chip="T4",
                                    causal=True, order="fa1", step=6))
    fig = render(state)
    assert f"step {state.step} (steps 0 to {len(state.schedule) - 1})" in fig._suptitle.get_text()
    with open(os.path.join(ROOT, "flashbook", "explorers", "flashbook_explorers.js"),
              encoding="utf-8") as f:
        assert "st.step + 1" not in f.read()


# ---------------------------------------------------------------- A2 and notation

def test_merge_is_not_called_associative_without_qualification():
    table = cell_source(A2, "a6496b8d")
    assert "associative and commutative" not in table and "associative only up to rounding" in table
    rng = np.random.default_rng(1)
    differs = 0
    for _ in range(50):
        a, b, c = (softmax.block_state(rng.normal(scale=4, size=5), rng.standard_normal((5, 3)))
                   for _ in range(3))
        left, right = softmax.merge(softmax.merge(a, b), c), softmax.merge(a, softmax.merge(b, c))
        differs += not np.array_equal(left.acc, right.acc)
    assert differs > 0


def test_exp_underflows_to_zero_half_the_smallest_positive_below():
    torch = pytest.importorskip("torch")
    for dt, edge in ((torch.float16, -17.33), (torch.float32, -103.97)):
        smallest = torch.tensor(1, dtype={16: torch.int16, 32: torch.int32}[torch.finfo(dt).bits]).view(dt)
        assert math.log(smallest.item()) - math.log(2) == pytest.approx(edge, abs=0.005)
        assert torch.exp(torch.tensor(edge - 0.02, dtype=dt)) == 0
        assert torch.exp(torch.tensor(edge + 0.02, dtype=dt)) > 0
    assert "far enough below" not in cell_source(A2, "381c58dd")


def test_notation_defines_d_v_and_the_block_b():
    with open(os.path.join(ROOT, "book", "notation.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert any(line.startswith("| $d_v$ |") for line in lines)
    assert any(line.startswith("| $B$ (chapter 4") and "B_r = B_c = B" in line for line in lines)
