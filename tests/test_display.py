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
