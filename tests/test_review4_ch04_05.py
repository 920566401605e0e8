"""Review round 4, chapters 4 and 5 and appendix A2: the statements corrected after the review
stay corrected, and where a number or a behaviour is involved the test recomputes it."""
import math
import os

import numpy as np
import pytest

from flashbook import reference, runtime, smem, tiled
from notebook_text import (ROOT, cell_ids, cell_source, find_cell, flat,
                           markdown, notebook, run_glued, source_of, glue_role as _glue)

CH4, CH5, A2 = notebook("04_tiled_forward"), notebook("05_backward_recompute"), notebook("A2_floating_point")



def _blind_rows_in_visited_tiles(n, block_q, block_k):
    """Rows that see none of the keys of a tile the causal loop visits (after skipping)."""
    visible = tiled.visible_key_tiles(n, n, block_q, block_k, causal=True)
    keys = tiled.tile_slices(n, block_k)
    count = 0
    for i, rows in enumerate(tiled.tile_slices(n, block_q)):
        for cols in keys[:visible[i]]:
            count += int((~tiled.tile_mask(rows, cols, n, n).any(axis=1)).sum())
    return count


def _articles_loop(q, k, v, block_q, block_k, scale, allowed, *, guard_tile_max, guard_merge,
                   divide_seen_only, skip=False):
    """chapter 4's seed_forward with the fixes switched on one by one, as a student would write
    them from the text: guard the tile's own max in P, guard the new running max in the two
    rescaling factors, divide only rows whose l is not 0 (a NaN l stays NaN); optionally skip
    wholly masked tiles."""
    n_q, n_k = q.shape[0], k.shape[0]
    safe = lambda m: np.where(np.isneginf(m), 0.0, m)          # noqa: E731
    o = np.zeros((n_q, v.shape[1]))
    for r0 in range(0, n_q, block_q):
        rows = slice(r0, min(r0 + block_q, n_q))
        h = rows.stop - r0
        m_i, l_i, o_i = np.full(h, -np.inf), np.zeros(h), np.zeros((h, v.shape[1]))
        for c0 in range(0, n_k, block_k):
            cols = slice(c0, min(c0 + block_k, n_k))
            if skip and not allowed[rows, cols].any():
                continue
            s_ij = np.where(allowed[rows, cols], scale * q[rows] @ k[cols].T, -np.inf)
            m_ij = s_ij.max(axis=1)
            p_ij = np.exp(s_ij - (safe(m_ij) if guard_tile_max else m_ij)[:, None])
            l_ij = p_ij.sum(axis=1)
            m_new = np.maximum(m_i, m_ij)
            sub = safe(m_new) if guard_merge else m_new
            a, b = np.exp(m_i - sub), np.exp(m_ij - sub)
            o_i = o_i * a[:, None] + (p_ij @ v[cols]) * b[:, None]
            l_i = l_i * a + l_ij * b
            m_i = m_new
        if divide_seen_only:
            o[rows] = np.divide(o_i, l_i[:, None], out=np.zeros_like(o_i), where=l_i[:, None] != 0)
        else:
            o[rows] = o_i / l_i[:, None]
    return o


# ---------------------------------------------------------------- chapter 4

def test_the_guard_is_described_as_what_repairs_the_articles_loop_and_exercise_4_follows():
    """Finding 1: the NaN comes from the tile's own maximum m_ij; a guard on the running maximum
    alone fixes nothing, and a student who follows the three fixes of the text passes Exercise 4."""
    fix1, fixes23 = flat(cell_source(CH4, "cb9f9cf5")), flat(cell_source(CH4, "7b2d9e45"))
    text = fix1 + " " + fixes23
    assert "Where the running maximum is still $-\\infty$, subtract 0 instead" not in text
    assert "when $B_r \\ne B_c$" not in text
    # the section opens by naming the two cases in which a subtracted maximum can be -inf,
    # and the examples and fixes that follow are tagged with them
    opening = flat(cell_source(CH4, "c04-pitfall"))
    assert "Under a causal mask a subtracted maximum can be $-\\infty$ in two cases:" in opening
    assert ("**Case A: a row sees none of *this tile's* keys**, so the tile's own maximum $m_{ij}$ "
            "is $-\\infty$") in opening
    assert "**Case B: a row has seen *no key yet***, so the running maximum is $-\\infty$. Every loop can meet it." in opening
    assert "The culprit is case A" in fix1 and "none of its keys (case A)" in fix1
    assert "$-\\infty$ (case A)." in fixes23 and "3. **Guard the merge too.** This is case B" in fixes23
    # the section says up front which case concerns the library's loop
    assert "The library's FA2 loop subtracts only the running maximum (the equations), so there only case B can occur." in opening
    assert "only case B" not in fixes23
    assert flat(cell_source(CH4, "84de0ee0")).startswith("Case B needs $N_q > N_k$")
    # fix 1 ends right above the N = 8 demo; fixes 2 and 3 follow it, with no NumPy shorthand
    assert "1. **Skip wholly masked tiles.**" in fix1 and fix1.rstrip().endswith("Here is one, in a small causal problem:")
    assert "2. **Guard the exponent.**" in fixes23 and "3. **Guard the merge too.**" in fixes23
    assert "where=" not in text and "(printed below)" not in text
    for words in ("Wherever a maximum that is subtracted may be $-\\infty$, subtract 0 instead",
                  "the tile's own $m_{ij}$ in $P_{ij} = \\exp(S_{ij} - m_{ij})$",
                  "Guarding only the running maximum (fix 3 without fix 2) fixes nothing for rows 4 and 5",
                  "when $B_c$ is not a multiple of $B_r$, a tile the diagonal cuts can still hold rows",
                  "**Guard the merge too.**", "$\\exp(m_i - m^{\\text{new}})$",
                  "divide only the rows whose $l_i$ is not 0. Rows with $l_i = 0$ get 0; a NaN $l_i$ is left as NaN"):
        assert words in text, words
    # the running-maximum-only remark comes after fix 3, not inside fix 2
    assert fixes23.index("Guarding only the running maximum") > fixes23.index("3. **Guard the merge too.**")
    # the B_c-not-a-multiple-of-B_r case is printed right after the list: a visited tile whose
    # first rows see none of its keys; then the library's form of the loop
    ids = cell_ids(CH4)
    assert ids.index("cb9f9cf5") + 1 == ids.index("1e4c7a90") and ids.index("1e4c7a90") + 1 == ids.index("7b2d9e45")
    printed = []
    run_glued(cell_source(CH4, "1e4c7a90"), tiled=tiled, print=lambda *a: printed.append(a))
    (visited, _), (sees,) = printed
    assert visited == 4 and 2 % 4 != 0                  # tile 3, keys 6 and 7, is visited
    assert tiled.tile_slices(8, 2)[visited - 1] == slice(6, 8) and tiled.tile_slices(8, 4)[1] == slice(4, 8)
    assert sees.tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]     # rows 4 and 5 see none of its keys
    assert "query tile 1 (rows 4 to 7) visits key tiles 0 to 3" in flat(cell_source(CH4, "1e4c7a90"))
    library = flat(cell_source(CH4, "7b2d9e45"))
    # the correct loop runs (and is checked) before the tutorial loop and its NaN are shown
    assert ids.index("b263ee77") < ids.index("7c6cf013") < ids.index("cb9f9cf5")
    assert ids.index("84de0ee0") + 1 == ids.index("434e2c11")             # the N_q > N_k demo follows
    assert "The library's FA2 loop subtracts only the running maximum" in flat(cell_source(CH4, "c04-pitfall"))
    assert "The tile is visited, yet its first two rows see none of its keys" in library
    exercise = flat(cell_source(CH4, "853aa331"))
    assert "guard the tile's own maximum, guard the merge, divide only rows whose $l_i$ is not 0" in exercise

    # the condition: after skipping, blind rows in visited tiles exist exactly when B_c is not
    # a multiple of B_r (the review's table at N = 256)
    for (bq, bk), want in {(16, 32): 0, (16, 48): 0, (64, 128): 0, (32, 16): 128, (16, 24): 40,
                           (128, 64): 128}.items():
        assert _blind_rows_in_visited_tiles(256, bq, bk) == want, (bq, bk)
        assert (want == 0) == (bk % bq == 0)

    rng = np.random.default_rng(4)
    n = 50
    q, k, v = (rng.standard_normal((n, 16)) for _ in range(3))
    allowed, want = reference.causal_mask(n, n), reference.attention(q, k, v, causal=True, scale=0.25)
    with np.errstate(invalid="ignore", divide="ignore"):
        # skipping plus a guard on the running maximum only: still NaN (B_c not a multiple of B_r)
        running_only = _articles_loop(q, k, v, 32, 16, 0.25, allowed, guard_tile_max=False,
                                      guard_merge=True, divide_seen_only=False, skip=True)
        assert np.isnan(running_only).any(axis=1).sum() == 32
        # without skipping (Exercise 4's setting), without the tile-max guard: NaN rows, shown
        # by the l != 0 division rather than turned into wrong zeros
        wrong = _articles_loop(q, k, v, 16, 16, 0.25, allowed, guard_tile_max=False,
                               guard_merge=True, divide_seen_only=True)
        assert np.isnan(wrong).any(axis=1).sum() > 0
    fixed = _articles_loop(q, k, v, 32, 16, 0.25, allowed, guard_tile_max=True, guard_merge=True,
                           divide_seen_only=True, skip=True)
    assert np.abs(fixed - want).max() < 1e-12

    # the notebook's own check of Exercise 4, run on the solution the text describes
    _, ns = run_glued(cell_source(CH4, "6102ec88"), np=np, reference=reference, rng=rng)
    student = lambda *a: _articles_loop(*a, guard_tile_max=True, guard_merge=True,  # noqa: E731
                                        divide_seen_only=True)
    ns["test_ex4"](student)
    # leaving out any one of the three fixes fails it (with "l > 0" a missing merge guard was
    # hidden: NaN > 0 is False; with "l != 0" the NaN row shows)
    for missing in ("guard_tile_max", "guard_merge", "divide_seen_only"):
        fixes = {"guard_tile_max": True, "guard_merge": True, "divide_seen_only": True, missing: False}
        with np.errstate(invalid="ignore", divide="ignore"), pytest.raises(AssertionError):
            ns["test_ex4"](lambda *a: _articles_loop(*a, **fixes))     # noqa: B023
    # and the hidden solution agrees
    _, sol = run_glued(cell_source(CH4, "19465888"), np=np)
    ns["test_ex4"](sol["seed_forward_fixed"])


def test_the_fa1_maps_cheapest_column_still_fits_with_16_row_query_tiles():
    """Finding 2: not every cheapest cell is crossed; in the FA1 map B_r = 16, B_c = 256 fits."""
    a100 = runtime.chip("A100")
    assert tiled.onchip_bytes(16, 256, 128) <= a100.smem_per_block_bytes < tiled.onchip_bytes(32, 256, 128)
    assert tiled.onchip_bytes(16, 256, 128) / 1024 == pytest.approx(156.1, abs=0.05)
    text = flat(cell_source(CH4, "fe451e51"))
    assert "the best cells of each map are the ones that would not fit" not in text
    assert "most of the cheapest cells would not fit" in text
    for name in ("hm_best", "hm_fa1_fit", "hm_fa1_fit_kib", "hm_limit"):
        assert _glue(name) in text
    hidden = cell_ids(CH4)[cell_ids(CH4).index("9257cb86") + 1]
    blocks, n, d = [16, 32, 64, 128, 256], 4096, 128
    naive = tiled.io_naive(n, n, d).hbm_bytes()
    fracs = {o: np.array([[tiled.io_flash(n, n, d, bq, bk, order=o).hbm_bytes() / naive for bk in blocks]
                          for bq in blocks]) for o in ("fa1", "fa2")}
    glued, _ = run_glued(cell_source(CH4, hidden), np=np, tiled=tiled, fracs=fracs, blocks=blocks,
                         d_hm=d, limit=a100.smem_per_block_bytes, KiB=1024)
    assert glued == {"hm_best": "256", "hm_fa1_fit": "16", "hm_fa1_fit_kib": "156.1", "hm_limit": "163"}


def test_the_self_check_length_leaves_every_block_but_1_ragged():
    """Finding 3: N = 77 was divided by the 7-wide key tiles; now 6, and the text says 'but 1'."""
    text = flat(cell_source(CH4, "b5f081f4"))
    assert "of a length no block divides" not in text
    assert f"$N$ = {_glue('check_n')}, that every block size but 1 leaves ragged" in text
    code = cell_source(CH4, "b263ee77")
    assert "(32, 6)" in code and "(32, 7)" not in code and "n_c, d_c = (2, 3), 77, 24" in code
    sizes = {1, 16, 10, 32, 6, 100, 200}
    assert all(77 % b for b in sizes if b > 1) and 77 % 7 == 0
    assert 'g("check_n", n_c)' in cell_source(CH4, "ec53721c")


def test_the_guard_demo_visits_a_tile_with_rows_that_see_no_key(monkeypatch):
    """Finding 6: with 4-wide tiles, query tile 1 (rows 4 to 7) is visited and rows 4 and 5 see no
    key. Without the guard they turn NaN, and the library's division no longer hides it."""
    prose = flat(cell_source(CH4, "84de0ee0"))
    assert "and the guard keeps NaN out:" not in prose
    assert f"the query tile of rows {_glue('gd_rows')} is visited" in prose
    after = flat(cell_source(CH4, cell_ids(CH4)[cell_ids(CH4).index("434e2c11") + 2]))
    assert "The library's division lets a NaN through rather than turning it into 0" in after

    rng = np.random.default_rng(6)
    glued, ns = run_glued([cell_source(CH4, "434e2c11"),
                           cell_source(CH4, cell_ids(CH4)[cell_ids(CH4).index("434e2c11") + 1])],
                          quiet=True, np=np, math=math, rng=rng, tiled=tiled, reference=reference)
    assert glued == {"gd_nq": "10", "gd_nk": "4", "gd_b": "4", "gd_rows": "4 to 7", "gd_blind": "4 and 5"}
    assert tiled.visible_key_tiles(10, 4, 4, 4, causal=True) == [0, 1, 1]
    assert tiled.visible_key_tiles(10, 4, 3, 3, causal=True) == [0, 0, 1, 2]   # the old demo: no such tile

    q, k, v = ns["q_b"], ns["k_b"], ns["v_b"]
    for order in tiled.ORDERS:
        o, lse = tiled.forward(q, k, v, block_q=4, block_k=4, causal=True, order=order)
        assert np.all(o[:6] == 0) and np.all(np.isneginf(lse[:6])) and not np.isnan(o).any()
    monkeypatch.setattr(tiled, "_no_inf", lambda m: m)       # the guard removed
    with np.errstate(invalid="ignore"):
        for order in tiled.ORDERS:
            o, lse = tiled.forward(q, k, v, block_q=4, block_k=4, causal=True, order=order)
            assert np.flatnonzero(np.isnan(o).any(axis=1)).tolist() == [4, 5], order
            assert np.flatnonzero(np.isnan(lse)).tolist() == [4, 5], order


def test_a_nan_row_stays_nan_and_a_row_that_sees_no_key_gives_zero_and_minus_inf():
    """Finding 6: _normalise and _lse test l != 0, so NaN propagates; l = 0 still gives 0, -inf."""
    acc = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    with np.errstate(invalid="ignore"):
        out = tiled._normalise(acc, np.array([2.0, 0.0, np.nan]))
        lse = tiled._lse(np.array([1.0, -np.inf, 1.0]), np.array([2.0, 0.0, np.nan]))
    assert np.array_equal(out[0], [0.5, 1.0]) and np.array_equal(out[1], [0.0, 0.0]) and np.isnan(out[2]).all()
    assert lse[0] == pytest.approx(1 + math.log(2)) and lse[1] == -np.inf and np.isnan(lse[2])


def test_shared_memory_and_registers_are_defined_where_first_used():
    """Finding 7: the first prose use of shared memory defines it, with registers, and links both
    (now the data-flow picture, which follows the loop)."""
    ids = cell_ids(CH4)
    first = next(c["id"] for c in CH4["cells"]
                 if c["cell_type"] == "markdown" and "shared memory" in "".join(c["source"]).lower())
    assert first == "a7082dfc"
    text = flat(cell_source(CH4, "a7082dfc"))
    assert "{term}`Shared memory <shared memory>` (the paper's \"SRAM\")" in text
    assert "{term}`Registers <register>` are private to each thread" in text
    for name in ("f_h100", "f_regs"):
        assert _glue(name) in text
    assert "T4" not in text and "A100" not in text          # one chip for both numbers
    assert "on an H100, up to {glue:text}`f_h100` KiB for one" in text
    assert "an H100 has {glue:text}`f_regs` KiB of them on each {term}`SM`" in text
    assert 'g("f_regs", runtime.chip("H100").regs_per_sm_kib)' in cell_source(CH4, "19a1b768")
    assert ids.index("a7082dfc") < ids.index("fe451e51")      # before "registers" is leaned on
    assert ids.index("beb1162b") < ids.index("a7082dfc") < ids.index("541185ed")  # after the loop, before the counts
    assert (runtime.chip("T4").smem_per_block_kib, runtime.chip("H100").smem_per_block_kib,
            runtime.chip("H100").regs_per_sm_kib) == (64, 227, 256)


def test_the_kernel_bullet_says_the_idea_first_and_leaves_triton_to_a_note():
    """Finding 8: the flow teaches the everything-on-chip count; the kernel's count is a titled
    subsection that says what stays in shared memory in plain words (the summary and Exercise 3
    rely on it), then a dropdown with Triton, stages and the T4's fp32 operands. The numbers are
    unchanged."""
    flow = flat(cell_source(CH4, "002fe647"))
    assert "Triton" not in flow and "smem_bytes" not in flow and _glue("f_total") in flow
    text = cell_source(CH4, "5d3f8a21")
    assert text.startswith("(real-kernel-count)=\n### How a real kernel counts\n\n")
    assert text.rstrip().endswith(":::")
    idea, rest = (flat(part) for part in text.split("\n\n", 1)[1].split("\n\n:::{dropdown}", 1))
    assert "dropdown" not in idea and "chapter 6 finds" not in rest
    assert "Triton" not in idea and "num_stages" not in idea and "pipeline" not in idea
    assert "plus spare copies of $K_j$ and $V_j$, so that the next ones can load while it computes" in idea
    for name in ("k_a100", "k_t4", "k_t4_fits", "k_t4_left"):
        assert _glue(name) in idea, name
    assert "*pipeline stages*" in rest and "`num_stages`" in rest and "no tensor-core path" in rest
    ids = cell_ids(CH4)
    assert ids.index("c67740ca") < ids.index("5d3f8a21") < ids.index("36467ddd")
    # its table: the largest square tile by the kernel's count, one glued value per chip and d
    glued, _ = run_glued(cell_source(CH4, "19a1b768"), quiet=True, np=np, rng=np.random.default_rng(0),
                         tiled=tiled, runtime=runtime, bq_f=64, bk_f=64, d_f=128, total=tiled.onchip_bytes(64, 64, 128, 2),
                         seed_rule=64 * 64 * 128 * 2, KiB=2**10, MiB=2**20)
    for c in runtime.CHIPS.values():
        for d in (64, 128, 256):
            assert glued[f"kt_{c.name}_{d}"] == str(tiled.largest_tile(c, d, num_stages=2))
            assert _glue(f"kt_{c.name}_{d}") in text
    assert glued["kt_T4_128"] == "64" and glued["kt_A100_128"] == glued["a100_tile_128"] == "128"
    assert tiled.smem_bytes(64, 64, 128, num_stages=2, arch="sm_80") == 80 * 1024
    assert tiled.smem_bytes(64, 64, 128, arch="sm_75") == 64 * 1024


def test_special_function_units_clock_and_tera_per_second_are_defined():
    """Finding 9: the terms are defined, and the rates are SMs x per-clock rate x clock."""
    text = flat(cell_source(CH4, "b28bb58c"))
    assert "{term}`special-function units <special-function unit>`" in text
    assert "compute exp, log and reciprocals" in text and "(T/s: $10^{12}$ results per second)" in text
    assert "one tick of the chip's clock" in text and _glue("a100_clock") in text and _glue("a100_sms") in text
    assert ("The {glue:text}`a100_fp32` TFLOP/s quoted earlier is twice the first: it counts a fused "
            "multiply-add (FMA, $a\\cdot b + c$ in one instruction) as 2 FLOPs.") in text
    a100 = runtime.chip("A100")
    alu = a100.sms * runtime.FP32_PER_CLOCK_PER_SM[a100.arch] * a100.boost_clock_mhz * 1e6
    assert alu / 1e12 == pytest.approx(9.75, abs=0.01) == a100.fp32_tflops / 2
    assert a100.exp_per_s / 1e12 == pytest.approx(2.44, abs=0.01)
    assert 'g("a100_clock", a100.boost_clock_mhz / 1000, ".2f")' in cell_source(CH4, "c04a1f10")


def test_the_step_annotation_says_running_maximum():
    """Finding 12."""
    text = cell_source(CH4, "988002d9")
    assert "each row against its own maximum" not in text
    assert "each row against its new maximum" in text and "m^{\\text{new}}" in text


def test_the_explorer_says_its_kernel_bar_is_chapter_7s_and_pads_d():
    """Findings 13 and 14: the kernel bar is the query-tiles-outside kernel in either order, and
    d is padded to the kernels' tile width; the page and the widget's note say so."""
    from flashbook.explorers import Settings, explorer_state
    fa1 = explorer_state(Settings(chip="A100", d=128, block_q=64, block_k=128, order="fa1"))
    fa2 = explorer_state(Settings(chip="A100", d=128, block_q=64, block_k=128, order="fa2"))
    assert fa1.kernel_smem == fa2.kernel_smem == {"Q": 16 * 1024, "K": 64 * 1024, "V": 64 * 1024}
    d48 = explorer_state(Settings(chip="A100", n=64, d=48, block_q=32, block_k=32))
    assert smem.tile_d(48) == 64 and d48.kernel_smem["Q"] == 2 * 32 * 64
    assert d48.onchip["Q"] == 2 * 32 * 48                      # the other bar keeps d = 48
    prose = flat(cell_source(CH4, "eb603609"))
    assert "The kernel's bar is always chapter 7's kernel, with query tiles outside" in prose
    assert "rounded up to the next power of two, as the kernels load it" in prose
    with open(os.path.join(ROOT, "flashbook", "explorers", "flashbook_explorers.js"), encoding="utf-8") as f:
        js = f.read()
    assert "The kernel bar is chapter 7's kernel, with query tiles outside, whichever loop order is chosen" in js
    assert "rounded up to ${width}, the tile width the kernels load" in js


def test_exercise_3_solution_does_not_put_p_in_registers_on_the_t4():
    """Finding 15: on sm_75 the model's second term is P (B_r x B_c) and V staged in shared memory."""
    code = cell_source(CH4, "e9a160e1")
    assert "keeps S, P and O in registers" not in code
    assert "fp32 operands of one product at a time there (Q and K, or P and V)" in code
    b, d = 64, 128
    qk, pv = (b + b) * d, b * b + b * d
    assert (qk, pv) == (16384, 12288)
    assert tiled.smem_bytes(b, b, d, arch="sm_75") == 4 * max(qk, pv) == runtime.chip("T4").smem_per_block_bytes
    assert tiled.largest_tile(runtime.chip("T4"), 128) == 64


# ---------------------------------------------------------------- chapter 5

def test_delta_is_the_row_sum_the_jacobian_brings_in_not_its_row_sum():
    """Finding 4: the Jacobian's rows sum to 0; delta is sum_j P_ij dP_ij = rowsum(dO o O)."""
    summary = flat(cell_source(CH5, "6d7c2771"))
    assert "the softmax Jacobian's row sum" not in summary
    assert "(the row sum $\\sum_j P_{ij}\\,dP_{ij}$ that the softmax Jacobian brings in" in summary
    rng = np.random.default_rng(5)
    q, k, v, do = (rng.standard_normal((6, 4)) for _ in range(4))
    p = reference.softmax_rows(reference.scores(q, k, scale=0.5))
    dp, o = do @ v.T, p @ v
    jac = np.diag(p[0]) - np.outer(p[0], p[0])
    assert np.abs(jac.sum(axis=1)).max() < 1e-15
    delta = (p * dp).sum(axis=1)
    assert np.allclose(delta, (do * o).sum(axis=1)) and np.abs(delta).min() > 0
    assert np.allclose(jac @ dp[0], p[0] * (dp[0] - delta[0]))   # the -pp^T part brings delta in


def test_race_and_atomic_add_are_explained_and_linked():
    """Finding 10."""
    text = flat(cell_source(CH5, "960f8ca1"))
    assert "*race*: two programs can read the same old value of $dQ_i$" in text
    assert "the one that writes last overwrites the other's addition" in text
    assert "**{term}`Atomic adds <atomic add>`.**" in text
    assert "read, add and write back as one step, which no other program can interrupt" in text
    assert "{term}`atomic adds <atomic add>`" in cell_source(CH5, "0bda53b5")


def test_the_articles_memory_table_is_one_sentence_with_a_link():
    """Finding 11, then the newcomer's review: the article's memory table is one sentence that
    says why it cannot be right ($P$ alone outgrows its naive figure) and sends the reader to
    chapter 9; no second verdict is left to reconcile. Numbers unchanged."""
    paragraphs = [flat(p) for p in cell_source(CH5, "3beb04ff").split("\n\n")]
    assert len(paragraphs) == 2
    memory = paragraphs[0]
    assert _glue("mem_8k") in memory and "for a whole model" in memory
    assert ("memory table for batch {glue:text}`art_batch`, {glue:text}`art_heads` heads and $N$ = "
            "{glue:text}`art_n` cannot be right, since $P$ alone takes {glue:text}`s_p` GB there against "
            "the {glue:text}`art_naive` GB it gives for naive attention; {doc}`chapter 9 <09_benchmarks>` "
            "checks that table.") in memory
    text = markdown(CH5)
    assert "calls it consistent" not in text and "Neither reading fits both columns" not in text
    hidden = find_cell(CH5, "27932c08")
    assert hidden["metadata"]["tags"] == ["remove-cell"]
    glued, _ = run_glued(source_of(hidden), quiet=True)
    assert (glued["s_p"], glued["art_naive"], glued["art_n"], glued["art_batch"], glued["art_heads"]) == (
        "8.6", "2.1", "4096", "8", "32")
    p_gb = 8 * 32 * 4096 * 4096 * 2 / 1e9
    assert p_gb == pytest.approx(8.59, abs=0.01) and round(p_gb / 2.1) == 4


# ---------------------------------------------------------------- A2

def test_a2_says_which_column_is_scanned_and_which_read_from_bits():
    """Finding 5: only 'largest x with finite e^x' is scanned; 'smallest positive' is 0...01."""
    text = flat(cell_source(A2, "72d4c577"))
    assert "the last two columns come from scanning" not in text
    assert ('the column "largest x with finite e^x" comes from scanning the format one representable '
            'value at a time, and "smallest positive" from its bit pattern 0…01') in text
    code = cell_source(A2, "dadfe528")
    scan = code[code.index("def largest_exp_arg"):code.index("def smallest_positive")]
    bits = code[code.index("def smallest_positive"):code.index("rows = {}")]
    assert "nextafter" in scan and "nextafter" not in bits and ".view(dtype)" in bits
    torch = pytest.importorskip("torch")
    _, ns = run_glued(scan + bits, math=math, torch=torch)
    assert ns["largest_exp_arg"](torch.float16) == 11.0859375
    assert ns["largest_exp_arg"](torch.bfloat16) == 88.5
    assert ns["smallest_positive"](torch.float16) == 2.0 ** -24


def test_chapter_4_calls_dram_hbm_and_says_nsight_calls_it_dram():
    """Re-check N3: a newcomer meets HBM everywhere else in the chapter. The profile itself is
    chapter 1's (named there by its DRAM counter); chapter 4 says what it found, in HBM's name."""
    text = flat(cell_source(CH4, "2db0895f"))
    assert ("A profile of chapter 7's kernel on an H200, reported in {doc}`chapter 1 <01_attention_numpy>`, "
            "found HBM delivering $Q$, $K$ and $V$ once each at {glue:text}`ncu_shape`, with "
            "{glue:text}`ncu_block_q`-row query tiles: 1/{glue:text}`ncu_model_x` of the reads this chapter "
            "counts for that shape ({glue:text}`ncu_reads_nd` $Nd$ counted, $3Nd$ delivered).") in text
    assert "DRAM" not in markdown(CH4) and "real DRAM traffic" not in text
