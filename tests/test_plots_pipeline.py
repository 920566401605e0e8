"""flashbook.plots.pipeline: chapter 6's picture of num_stages, checked as a schedule against the
compiled loop's order and the shared-memory model it draws."""
from __future__ import annotations

import itertools
import os
import re

import pytest

from conftest import ROOT
from flashbook import smem
from flashbook.plots.pipeline import (
    ARCHS,
    buffers_used,
    in_flight,
    model_buffers,
    occupancy,
    pipeline_figure,
    pipeline_schedule,
    tiles_held,
)
from notebook_text import cell_source

CH6 = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")
STAGES = (1, 2, 3, 4)


def _by_tile(events, state):
    return {tile: (start, end) for _b, tile, st, start, end in events if st == state}


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("arch", tuple(ARCHS))
def test_the_buffers_are_the_models(stages, arch):
    """The buffers drawn are smem_buffers' K entry in tiles, and the model gives V as many."""
    for block, d in [(64, 64), (128, 32), (32, 128)]:
        buffers = smem.smem_buffers(block, block, d, num_stages=stages, arch=arch)
        assert buffers["K"] == buffers["V"] == model_buffers(stages, arch) * 2 * block * d
    assert model_buffers(stages, arch) == stages
    assert buffers_used(stages, arch) <= model_buffers(stages, arch)


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("arch", tuple(ARCHS))
@pytest.mark.parametrize("n_tiles", [1, 2, 4, 7])
def test_the_schedule_follows_the_compiled_loop(stages, arch, n_tiles):
    events = pipeline_schedule(stages, arch, n_tiles)
    copy, use, tail = (_by_tile(events, s) for s in ("copy", "use", "tail"))
    assert sorted(copy) == sorted(use) == list(range(n_tiles))
    ahead = max(stages - 1, 1)
    for t in range(n_tiles):
        assert copy[t][1] <= use[t][0]                               # used once it has arrived
        if t >= 1:
            assert use[t - 1][1] <= use[t][0]                        # one tile's products at a time
        if t < ahead:
            assert copy[t][0] == 0                                   # the prologue's copies
        else:                                                        # issued after tile t - s + 1's products
            assert copy[t][0] == use[t - ahead][1]
    for t in range(n_tiles):                                         # while a tile computes: s - 2 copies
        mid = (use[t][0] + use[t][1]) / 2
        assert len(in_flight(events, mid)) <= max(stages - 2, 0)
    if stages <= 2:                                                  # no copy overlaps a program's products
        for t, (a, b) in use.items():
            assert not any(s < b and a < e for s, e in copy.values())
    if stages == 2 and arch == "sm_90" and n_tiles > 1:              # only the tail of P_j V_j (chapter 6 says so)
        assert copy[1][0] == tail[0][0] < tail[0][1] and copy[1][0] < tail[0][1] <= copy[1][1]
    buffers = {b for b, *_ in events}
    assert buffers <= set(range(buffers_used(stages, arch)))
    for b in buffers:                                                # a buffer holds one tile at a time
        spans = sorted((s, e, tile) for bb, tile, _st, s, e in events if bb == b)
        for (s1, e1, t1), (s2, e2, t2) in itertools.pairwise(spans):
            assert t1 == t2 or e1 <= s2, (b, spans)
    # sm_90: P_j V_j's wgmma still reads tile j's buffer when the refill is issued
    if arch == "sm_90" and stages > 1:
        for t in range(n_tiles - ahead):
            assert tail[t][0] == copy[t + ahead][0] and tail[t][1] > tail[t][0]
    else:
        assert not tail


@pytest.mark.parametrize("stages", (2, 3, 4))
def test_sm90_needs_every_buffer_and_sm80_one_fewer(stages):
    """The refill of tile j + s - 1 goes where it can: into tile j's buffer on sm_80 (s - 1 in all),
    into another on sm_90, whose tile j is still read (s in all). With one buffer fewer, sm_90's
    refill would land on a tile still being read."""
    for arch, want in (("sm_90", stages), ("sm_80", stages - 1)):
        events = pipeline_schedule(stages, arch, n_tiles=stages + 4)
        assert len({b for b, *_ in events}) == buffers_used(stages, arch) == want
        times = sorted({s for *_, s, _e in events})
        assert max(len(occupancy(events, t)) for t in times) == want
    events = pipeline_schedule(stages, "sm_90", n_tiles=stages + 4)
    copy, tail = _by_tile(events, "copy"), _by_tile(events, "tail")
    for j in tail:                  # with s - 1 buffers tile j + s - 1 would take tile j's buffer
        assert (j + stages - 1) % (stages - 1) == j % (stages - 1) and copy[j + stages - 1][0] < tail[j][1]


def test_the_figure_agrees_with_the_chapters_compiled_table():
    """Chapter 6's table counts the compiled kernel's K and V tiles together: two per buffer the
    schedule fills (one K, one V) from 2 stages on; at one stage one buffer, K and V in turns.
    The figure's panels count the same tiles (``tiles_held``), against the model's."""
    prose = cell_source(CH6, "49527e1d")
    table = {name.strip("`"): [int(x) for x in cells.split("|")]
             for name, cells in re.findall(r"^\| (`sm_\d+`|the model) \|(.*)\|$", prose, re.M)}
    for arch in ARCHS:
        for stages in (2, 3):
            assert 2 * buffers_used(stages, arch) == table[arch][stages - 1], (arch, stages)
        assert table[arch][0] == 1 < 2 * model_buffers(1, arch)
        assert [tiles_held(s, arch) for s in (1, 2, 3)] == table[arch]
    assert table["the model"] == [2 * model_buffers(s) for s in (1, 2, 3)]


def test_bad_arguments_and_the_figure():
    with pytest.raises(ValueError, match="arch"):
        pipeline_schedule(2, "sm_75")
    with pytest.raises(ValueError, match="num_stages"):
        pipeline_schedule(0, "sm_80")
    with pytest.raises(ValueError, match="n_tiles"):
        pipeline_schedule(2, "sm_90", n_tiles=0)
    fig = pipeline_figure()
    axes = fig.get_axes()
    assert len(axes) == 6
    titles = [ax.get_title(loc="left") for ax in axes]
    assert titles[0].startswith("sm_80") and titles[1].startswith("sm_90")
    for ax, title, (stages, arch) in zip(axes, titles, itertools.product((1, 2, 3), ARCHS)):
        # tiles, as the chapter's table counts them: never "1 of 1 buffers" where the table says 1 of 2
        held = tiles_held(stages, arch)
        assert f"num_stages = {stages}: holds {held} tile" in title, title
        assert title.endswith(f"; the model counts {2 * model_buffers(stages, arch)}"), title
        assert ("(K and V in turns)" in title) == (stages == 1), title
        lanes = [t.get_text() for t in ax.get_yticklabels()][::-1]      # top to bottom
        assert lanes == [f"buffer {b + 1}" for b in range(model_buffers(stages, arch))]
    # "lane" is the page's word for a block position (tl.load): the figure's rows are buffers
    title = " ".join(fig._suptitle.get_text().split())
    # the title agrees with the 1-stage panels ("K and V in turns"), and names no instruction
    assert "each buffer holds one K and one V tile; at 1 stage they take turns in one tile's space." in title
    assert "The number on a bar: which key tile." in title
    assert "lane" not in title and "wgmma" not in title
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "sm_90: the asynchronous P V still reading" in legend and not any("wgmma" in t for t in legend)
    spare = [t.get_text() for ax in axes for t in ax.texts if "never needed" in t.get_text()]
    assert len(spare) == 2                                    # sm_80 at 2 and 3 stages
