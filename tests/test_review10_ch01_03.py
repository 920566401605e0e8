"""Review round 10, the front pages and chapters 1 to 3: the newcomer's items. Chapter 1 keeps
the memory kept apart from the memory moved, compares GiB with a datasheet's "GB" either way
and leaves the profiler's detail to chapter 7; chapter 2 says which token its block trace
follows and where `online_softmax` comes from; chapter 3 says why the score spread is
sigma^2, defines the lse where it first appears, says which error of the lse grows, and runs
exercise 3 with a fixed seed and enough rows that its mean sits near H_N, with the printed
plus-minus named as one standard error. The notation page lists the row scores and the
reference points, and defines a program; the introduction says what N is."""
import contextlib
import io
import math
import re

import numpy as np

from flashbook import softmax, tiled
from notebook_text import book_page, cell_source, flat, notebook

CH1, CH2, CH3 = notebook("01_attention_numpy"), notebook("02_four_tokens"), notebook("03_online_softmax")
X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])     # chapter 2's four tokens


# ---------------------------------------------------------------- chapter 1

def test_chapter_1_separates_the_memory_kept_from_the_memory_moved():
    text = cell_source(CH1, "37bf9eaf")
    outside = flat(text.split(":::{dropdown}")[0])
    assert ("Two different things are called memory here. FlashAttention makes the memory it *keeps* "
            "linear in $N$. The bytes it *moves* (the traffic) still grow as $N^2$, because it reads "
            "$K$ and $V$ again for each group of queries it works on (a *tile*, chapter 4).") in outside
    # what the sentence rests on: doubling N doubles what is kept (O and the lse) and nearly
    # quadruples the traffic, whose K and V reads come once per tile of 128 queries
    d, tile = 128, 128
    kept = {n: n * d + n for n in (4096, 8192)}
    moved = {n: tiled.io_flash(n, n, d, tile, tile).hbm_total for n in (4096, 8192)}
    assert kept[8192] == 2 * kept[4096] and 3.8 < moved[8192] / moved[4096] < 4


def test_chapter_1_says_what_the_peaks_multiple_counts():
    text = flat(cell_source(CH1, "3797eb13"))
    assert "the number of $N \\times N$ temporaries" not in text
    assert ("a small, constant multiple of $8N^2$ bytes (one float64 $N \\times N$ array). The multiple "
            "is the number of such arrays alive at once.") in text
    assert 8 * 4096**2 == np.zeros((4096, 4096)).nbytes


# ---------------------------------------------------------------- chapter 2

def test_chapter_2_names_the_token_its_block_trace_follows_and_ties_it_to_the_tile_table():
    text = flat(cell_source(CH2, "7c0a9028"))
    assert "for a single query" not in text
    assert "Keys in blocks of 2 for token 2 give the same thing" in text
    assert ("the final $l$ below, {glue:text}`t2_l:.4f`, is row 2's final `l after` in the tile "
            "table above") in text
    assert "Q[2], K, V, scale=scale, block_k=2" in cell_source(CH2, "03efa2a4")
    scale = 1 / math.sqrt(2)
    trace = softmax.online_attention_trace(X[2], X, X, scale=scale, block_k=2)
    # the tile table's row 2: query tile 2-3 over key tiles 0-1 then 2-3, merged
    state = softmax.empty_state((2,), value_dim=2)
    for j0 in (0, 2):
        state = softmax.merge(state, softmax.block_state(scale * X[2:4] @ X[j0:j0 + 2].T, X[j0:j0 + 2]))
    assert math.isclose(trace[-1].row_sum, float(state.row_sum[0]), rel_tol=1e-14)
    assert f"{trace[-1].row_sum:.4f}" == "2.4792"


def test_chapter_2_introduces_online_softmax_before_its_table_row():
    text = flat(cell_source(CH2, "ba6290ea"))
    assert ("The last uses chapter 3's `softmax.online_softmax`, which computes the weights $P$ block "
            "by block from a whole $S$; it is here only as one more order of the same arithmetic.") in text
    p, _ = softmax.online_softmax(X @ X.T / math.sqrt(2), block_size=2)
    assert np.allclose(p.sum(-1), 1.0)                     # it returns the weights P


def test_chapter_2_explorer_suggestions_name_the_matrix_and_the_entry():
    text = flat(cell_source(CH2, "e7bd03a3"))
    assert "token 1 a negative entry" not in text
    assert ("Try setting row 3 of $K$ to $[1.5, 1.5]$ (key 3 then outscores key 2 for every query), "
            "or the first entry of row 1 of $Q$ to $-1$") in text
    k = X.copy()
    k[3] = [1.5, 1.5]
    s = X @ k.T
    assert np.all(s[:, 3] > s[:, 2])
    q = X.copy()
    q[1, 0] = -1.0
    trace = softmax.online_attention_trace(q[1], X, X, scale=1 / math.sqrt(2))
    assert [j for j in range(1, 4) if trace[j].rescale < 1] == [1]   # the explorer's token 1


# ---------------------------------------------------------------- chapter 3

def test_chapter_3_says_why_the_score_spread_is_sigma_squared():
    text = flat(cell_source(CH3, "dbc1374d"))
    assert ("each product of matching entries has variance $\\sigma^4$, the $d$ products add up to "
            "variance $d\\sigma^4$, and dividing by $\\sqrt d$ leaves variance $\\sigma^4$, the square "
            "of $\\sigma^2$.") in text
    rng = np.random.default_rng(0)
    sigma, d = 2.0, 128
    q, k = sigma * rng.standard_normal((2, 20000, d))
    scores = (q * k).sum(-1) / math.sqrt(d)
    assert abs(scores.std() / sigma**2 - 1) < 0.03


def test_chapter_3_defines_the_lse_where_the_merge_figure_first_shows_it():
    text = flat(cell_source(CH3, "e1e1781b"))
    assert ("The last box is the whole row's maximum and log-sum-exp, $\\mathrm{lse} = m + \\log l$ "
            "(the logarithm of the softmax's denominator; the section \"Log-sum-exp\" below is about it)") in text
    assert "## Log-sum-exp: one number instead of two" in cell_source(CH3, "5d05038c")


def test_chapter_3_says_which_error_of_the_lse_grows_and_why():
    text = flat(cell_source(CH3, "5d05038c"))
    assert "that error grows with the size of the lse" not in text
    assert ("the stored lse carries a rounding error of about $\\varepsilon\\,|\\mathrm{lse}|$, with "
            "$\\varepsilon$ the format's {term}`eps`, and $e^{S - \\mathrm{lse}}$ turns an error in its "
            "exponent into the same relative error in every weight it rebuilds. So the larger "
            "$|\\mathrm{lse}|$, the larger the weights' error") in text
    # an lse rounded to fp32: the weights' relative error follows |lse| * eps, not the weights
    rng = np.random.default_rng(0)
    eps = float(np.finfo(np.float32).eps)
    worst = {}
    for shift in (0.0, 1000.0):
        s = rng.standard_normal((200, 64)) + shift
        lse = np.logaddexp.reduce(s, axis=-1)
        exact = np.exp(s - lse[:, None])
        rebuilt = np.exp(s - lse.astype(np.float32).astype(np.float64)[:, None])
        worst[shift] = np.abs(rebuilt / exact - 1).max()
        assert worst[shift] <= 0.51 * eps * np.abs(lse).max() * 1.01 + 1e-15
    assert worst[1000.0] > 50 * worst[0.0]


def test_chapter_3_exercise_3_runs_enough_fixed_rows_and_names_its_error_bar():
    code = cell_source(CH3, "a8d46091")
    assert "ex3_rng = np.random.default_rng(3)" in code and "trials = 4000" in code
    assert "+-" not in code and "(± one standard error)" in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"np": np, "math": math})
    lines = out.getvalue().splitlines()
    assert lines[0] == "the number of moves, averaged over 4000 rows (± one standard error):"
    for line in lines[1:]:
        m = re.fullmatch(r"N = +(\d+): measured ([\d.]+) ± ([\d.]+), H_N = ([\d.]+), ln N \+ gamma = [\d.]+", line)
        assert m, line
        n, mean, se, h_n = int(m.group(1)), *(float(m.group(i)) for i in (2, 3, 4))
        assert se <= 0.045 and abs(mean - h_n) < 3 * se + 0.01, line
    solution = flat(cell_source(CH3, "5b97eeaf"))
    assert ("The run below agrees: each measured mean is within three standard errors of $H_N$, as the "
            "cell checks (the printed ±, one standard error, is how far the mean of this many rows "
            "typically strays from the expected count).") in solution


# ---------------------------------------------------------------- the front pages

def test_notation_lists_the_row_scores_the_reference_points_and_what_a_program_is():
    page = book_page("notation.md")
    assert ("| $s_j$, $x_j$ | | one row's scores: chapter 2 writes $s_0, s_1, \\dots$ (counted from 0, "
            "as in code); chapter 3 writes $x_1, \\dots, x_N$ (counted from 1, so that index 0 is the "
            "empty state) |") in page
    assert page.count("| $c_j$ | | any reference point used in place of the running maximum $m_j$") == 1
    head = flat(page.split("## Sizes")[0])
    assert ("A *program* is one running instance of a Triton kernel: the GPU runs many of them at once, "
            "each on its own tile (chapter 6; {term}`program` in the glossary).") in head
    assert re.search(r"^program$", book_page("glossary.md"), re.M)
    # what the rows say about the chapters
    assert "counted from 1 so that index 0 is the empty state" in flat(cell_source(CH3, "eb9921e8"))
    assert "reference points $c_j$" in flat(cell_source(CH3, "f8f404b4"))


def test_intro_says_what_n_is():
    intro = flat(book_page("intro.md"))
    assert "an $N \\times N$ matrix of scores, where $N$ is the number of tokens," in intro
