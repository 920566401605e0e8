"""Printed numbers never contradict their verdicts."""
import pytest

from flashbook.display import verdict_text


@pytest.mark.parametrize("value, threshold, met, want", [
    (0.796, 0.8, False, "0.796 \u2717"),     # chapter 9's case: "0.80 ✗" read as a contradiction
    (0.8049, 0.805, False, "0.80 \u2717"),     # already below the threshold as printed
    (1.152, 1.15, True, "1.152 \u2713"),
    (1.147, 1.15, False, "1.147 \u2717"),
    (1.30, 1.15, True, "1.30 \u2713"),       # far from the threshold: two digits are enough
    (0.8, 0.8, True, "0.80 \u2713"),         # exactly the threshold: equal reads as equal
])
def test_digits_agree_with_the_verdict(value, threshold, met, want):
    got = verdict_text(value, threshold, met)
    assert got == want
    shown = float(got.split()[0])
    assert (shown > threshold) == (value > threshold) and (shown == threshold) == (value == threshold)


def test_verdict_needs_a_bool():
    with pytest.raises(TypeError, match="met"):
        verdict_text(0.5, 0.8, "no")


def test_a_kernel_is_shown_without_the_switches_a_later_chapter_adds():
    """Chapters 7 and 8 show the kernels with the window, soft-cap and packed-document
    switches off: no trace of them, still valid Python, and every other line kept."""
    import ast
    import io
    import tokenize

    from flashbook.display import source, without_switches
    from flashbook.kernels import backward, forward

    hidden = set(forward.LATER) | {a for args in forward.LATER.values() for a in args}
    for fn in (forward._attn_fwd, forward.attend, forward._fwd_inner, forward.shifted_scores, forward.visible_keys,
               backward._bwd_dkdv, backward._bwd_dkdv_inner, backward._bwd_dq, backward._bwd_dq_inner):
        lesson = source(fn, without=forward.LATER)
        ast.parse(lesson)
        names = {t.string for t in tokenize.generate_tokens(io.StringIO(lesson).readline) if t.type == tokenize.NAME}
        assert not names & hidden, (fn.__name__, names & hidden)
        assert "``WINDOW``" not in lesson and "soft_cap(" not in lesson, fn.__name__
        assert len(lesson.splitlines()) < len(source(fn).splitlines()), fn.__name__
    text = '''def f(a, b, FLAG: tl.constexpr = False, x=0):
    """One line.

    ``FLAG``: about it."""
    if FLAG:
        a = a + x
    if b and FLAG:
        b = 1
    if FLAG:
        c = g(a, FLAG, x)
    else:
        c = g(a, 0, 0)
    return h(a, b,
             FLAG, x)
'''
    assert without_switches(text, {"FLAG": ("x",)}) == '''def f(a, b):
    """One line."""
    c = g(a, 0, 0)
    return h(a, b)
'''
    # "if not FLAG:" is true with the switch off: its body stays, its else goes
    negated = '''def f(a, FLAG: tl.constexpr = False):
    if FLAG:
        a = 0
    if not FLAG:   # the usual path
        a = a + 1
        if a:
            a = 2
    else:
        a = 3
    if not FLAGS:
        a = 4
    return a
'''
    assert without_switches(negated, {"FLAG": ()}) == '''def f(a):
    a = a + 1
    if a:
        a = 2
    if not FLAGS:
        a = 4
    return a
'''


def test_listed_writes_items_as_prose():
    from flashbook.display import listed

    assert listed(["causal 4K", "window 4K", "documents 4K"]) == "causal 4K, window 4K and documents 4K"
    assert listed(["a", "b"]) == "a and b" and listed(iter(["only"])) == "only"
    assert listed([]) == "none" and listed([880, 2976]) == "880 and 2976"


def test_span_says_a_range_and_collapses_only_when_asked():
    from flashbook.display import span

    assert span([3.14159, 2.5], ".1f") == "2.5 to 3.1"
    assert span([1.04, 0.96], ".0f") == "1 to 1"                  # both ends print the same
    assert span([1.04, 0.96], ".0f", collapse=True) == "1"        # ... said once when asked
    assert span([], ".1f") == "n/a"
    import pandas as pd

    assert span(pd.Series([7.256, 1.2]), ".2f") == "1.20 to 7.26"  # a column works as a list does
