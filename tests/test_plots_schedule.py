"""flashbook.plots.schedule: chapter 10's picture of the issue order, checked as a schedule."""
from __future__ import annotations

import itertools

import pytest

from flashbook.plots.schedule import issue_order_figure, issue_timeline


def _by(events):
    return {(kind, j): (start, end) for _lane, kind, j, start, end in events}


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("n, qk, pv, softmax", [(1, 1, 1, 1), (3, 1, 1, 1), (5, 0.7, 1.3, 2.0), (4, 1.5, 0.5, 0.4)])
def test_the_timeline_keeps_every_dependency_and_one_product_at_a_time(overlap, n, qk, pv, softmax):
    events = issue_timeline(n, overlap=overlap, qk=qk, pv=pv, softmax=softmax)
    at = _by(events)
    assert len(events) == 3 * n and len(at) == 3 * n
    for j in range(n):
        assert at["softmax", j][0] >= at["S", j][1] - 1e-12          # the softmax needs S_j
        assert at["PV", j][0] >= at["softmax", j][1] - 1e-12         # P_j V_j needs P_j
    for lane in ("tensor cores", "softmax"):                        # one thing at a time per lane
        spans = sorted((s, e) for ln, _k, _j, s, e in events if ln == lane)
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(spans))
    tensor = [(s, e) for ln, k, _j, s, e in events if ln == "tensor cores"]
    soft = [(s, e) for ln, k, _j, s, e in events if ln == "softmax"]
    overlapped = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in tensor for s2, e2 in soft)
    end = max(e for *_, e in events)
    if not overlap:
        assert overlapped == 0 and end == pytest.approx(n * (qk + pv + softmax))
    else:   # each softmax after the first hides under the previous tile's P V, as far as the shorter allows
        assert overlapped == pytest.approx((n - 1) * min(pv, softmax))
        assert end == pytest.approx(n * (qk + pv + softmax) - (n - 1) * min(pv, softmax))


def test_bad_arguments_and_the_figure():
    with pytest.raises(ValueError, match="n_tiles"):
        issue_timeline(0, overlap=True)
    with pytest.raises(ValueError, match="durations"):
        issue_timeline(2, overlap=False, softmax=0)
    fig = issue_order_figure()
    axes = fig.get_axes()
    assert len(axes) == 2 and "wait_group 0" in axes[0].get_title(loc="left") and "wait(1)" in axes[1].get_title(loc="left")
    assert "end at 9 and 7" in axes[1].get_xlabel()
