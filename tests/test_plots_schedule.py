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


@pytest.mark.parametrize("n, stages, load, step", [(1, 2, 1, 1), (7, 3, 1, 1), (9, 2, 1, 1), (8, 4, 0.6, 1.4),
                                                   (6, 3, 2.5, 1.0)])
def test_the_slot_ring_follows_the_kernels_barriers(n, stages, load, step):
    from flashbook.plots.schedule import slot_ring

    ring = slot_ring(n, stages, load=load, step=step)
    loads = {t: (slot, phase, s, e) for t, slot, phase, s, e in ring["loads"]}
    steps = {j: (s, e) for j, s, e in ring["steps"]}
    held = {t: (slot, phase, s, e) for t, slot, phase, s, e in ring["held"]}
    assert sorted(loads) == sorted(held) == list(range(n)) and sorted(steps) == list(range(n + 1))
    for t, (slot, phase, start, end) in loads.items():
        assert slot == t % stages and phase == (t // stages) & 1      # hopper.attend_tiles' wait
        assert end <= steps[t][0] + 1e-12                               # step t reads K_t: it is in
        if t >= 1:
            assert loads[t - 1][3] <= steps[t][0] + 1e-12               # and V_{t-1}
    for t, (slot, _phase, start, release) in held.items():
        assert release == pytest.approx(steps[t + 1][1])                # released when P_t V_t is done
        if t >= stages:                                                 # the producer's kv_empty wait
            assert start >= held[t - stages][3] - 1e-12
    for slot in range(stages):                                          # a slot holds one tile at a time
        spans = sorted((s, e) for sl, _p, s, e in held.values() if sl == slot)
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(spans))
    times = sorted({s for *_, s, _e in held.values()} | {e for *_, e in held.values()})
    for t0 in times:                                                    # never more than the ring holds
        assert sum(s <= t0 < e for *_, s, e in held.values()) <= stages
    consumer = sorted(steps.values())
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(consumer))


def test_two_slots_stall_the_consumers_and_three_do_not():
    """A step holds two tiles (K_j and V_{j-1}), so with two slots every copy waits for a step to
    end; with three, one copy runs ahead (the default at d = 128: hopper_choices.DEFAULTS)."""
    from flashbook.kernels.hopper_choices import DEFAULTS
    from flashbook.plots.schedule import slot_ring, slot_ring_figure

    def idle(ring):
        s = sorted((a, b) for _j, a, b in ring["steps"])
        return sum(b[0] - a[1] for a, b in itertools.pairwise(s))

    assert idle(slot_ring(8, 2)) > 0 and idle(slot_ring(8, 3)) == 0
    assert DEFAULTS[128][2] == 3
    with pytest.raises(ValueError, match="stages"):
        slot_ring(4, 1)
    with pytest.raises(ValueError, match="durations"):
        slot_ring(4, 3, load=0)
    ax = slot_ring_figure().get_axes()[0]
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["producer warp: TMA copies", "consumer warpgroups"]
