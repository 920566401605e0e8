"""flashbook.plots.pipeline: chapter 6's picture of num_stages, checked as a schedule against the
shared-memory model it draws."""
from __future__ import annotations

import itertools
import os
import re

import pytest

from conftest import ROOT
from flashbook import smem
from flashbook.plots.pipeline import (
    ARCHS,
    REGISTERS,
    model_buffers,
    occupancy,
    pipeline_figure,
    pipeline_schedule,
)
from notebook_text import cell_source

CH6 = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")
STAGES = (1, 2, 3, 4)


def _times(steps):
    """One instant inside every half iteration, the prologue included."""
    return [t / 2 + 0.25 for t in range(-2, 2 * steps)]


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("arch", tuple(ARCHS))
def test_the_buffers_are_the_models(stages, arch):
    """The lanes are smem_buffers' K entry in tiles, and the model gives V as many."""
    for block, d in [(64, 64), (128, 32), (32, 128)]:
        buffers = smem.smem_buffers(block, block, d, num_stages=stages, arch=arch)
        assert buffers["K"] == buffers["V"] == model_buffers(stages, arch) * 2 * block * d
    assert model_buffers(stages, arch) == stages


@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("arch", tuple(ARCHS))
@pytest.mark.parametrize("n_steps, n_tiles", [(4, None), (6, None), (5, 3), (3, 1)])
def test_every_step_holds_no_more_than_the_model_and_uses_only_loaded_tiles(stages, arch, n_steps, n_tiles):
    events = pipeline_schedule(stages, arch, n_steps, n_tiles)
    n_buffers = model_buffers(stages, arch)
    rows = {row for row, *_ in events}
    assert rows <= set(range(n_buffers)) | {REGISTERS}
    assert (REGISTERS in rows) == (arch == "sm_80")          # only sm_80 moves the tile out
    copies = {tile: (start, end) for _row, tile, state, start, end in events if state == "copy"}
    uses = {tile: (start, end) for _row, tile, state, start, end in events if state == "use"}
    assert len(copies) == sum(1 for *_, state, _s, _e in events if state == "copy")   # one copy per tile
    for tile, (start, _end) in uses.items():
        assert copies[tile][1] <= start                       # used only once it has arrived
    assert sorted(uses) == list(range(min(n_steps, n_tiles or n_steps)))   # tile j in iteration j
    for j, (start, end) in uses.items():
        assert j <= start and end <= j + 1
    if n_tiles is not None:
        assert max(copies) < n_tiles                          # no copy past the last tile
    for row in rows:                                          # a buffer holds one tile at a time
        spans = sorted((s, e) for r, _t, _st, s, e in events if r == row)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), (row, spans)
    for t in _times(n_steps):
        held = occupancy(events, t)
        assert len(held) <= n_buffers
        in_use = [tile for _r, tile, state, s, e in events if state == "use" and s <= t < e]
        assert len(in_use) <= 1                               # one tile under tl.dot at a time
        copying = [tile for tile, state in held.values() if state == "copy"]
        if stages == 1:
            assert not (in_use and copying)                   # one stage: nothing overlaps
        elif in_use and (n_tiles is None):                   # the next s - 1 tiles are on their way
            assert sorted(copying) == list(range(in_use[0] + 1, in_use[0] + stages))


@pytest.mark.parametrize("stages", (2, 3, 4))
def test_sm90_fills_every_buffer_and_sm80_one_fewer(stages):
    """In the loop's steady state: s buffers on sm_90 (wgmma reads the tile in use from its buffer),
    s - 1 on sm_80 (tl.dot works from registers), the model's s on both."""
    for arch, want in (("sm_90", stages), ("sm_80", stages - 1)):
        events = pipeline_schedule(stages, arch, n_steps=stages + 3)
        steady = [len(occupancy(events, t + 0.5)) for t in range(stages, stages + 3)]
        assert steady == [want] * 3, (arch, steady)
        assert want <= model_buffers(stages, arch)


def test_the_figure_agrees_with_the_chapters_compiled_table():
    """Chapter 6's table counts the compiled kernel's K and V tiles together: from 2 stages on,
    two per buffer this schedule fills (one K, one V); at one stage one buffer, K and V in turns."""
    prose = cell_source(CH6, "49527e1d")
    table = {name.strip("`"): [int(x) for x in cells.split("|")]
             for name, cells in re.findall(r"^\| (`sm_\d+`|the model below) \|(.*)\|$", prose, re.M)}
    for arch in ARCHS:
        for stages in (2, 3):
            events = pipeline_schedule(stages, arch, n_steps=6)
            assert 2 * len(occupancy(events, 4.5)) == table[arch][stages - 1], (arch, stages)
        assert table[arch][0] == 1 < 2 * model_buffers(1, arch)
    assert table["the model below"] == [2 * model_buffers(s) for s in (1, 2, 3)]


def test_bad_arguments_and_the_figure():
    with pytest.raises(ValueError, match="arch"):
        pipeline_schedule(2, "sm_75")
    with pytest.raises(ValueError, match="num_stages"):
        pipeline_schedule(0, "sm_80")
    with pytest.raises(ValueError, match="n_steps"):
        pipeline_schedule(2, "sm_90", n_steps=0)
    fig = pipeline_figure()
    axes = fig.get_axes()
    assert len(axes) == 6
    titles = [ax.get_title(loc="left") for ax in axes]
    assert titles[0].startswith("sm_80") and titles[1].startswith("sm_90")
    for ax, title, (stages, arch) in zip(axes, titles, itertools.product((1, 2, 3), ARCHS)):
        used = 1 if stages == 1 else (stages if arch == "sm_90" else stages - 1)
        assert f"num_stages = {stages}: the model counts {model_buffers(stages, arch)}, {used} " in title
        lanes = [t.get_text() for t in ax.get_yticklabels()][::-1]      # top to bottom
        assert lanes[:model_buffers(stages, arch)] == [f"buffer {b + 1}" for b in range(model_buffers(stages, arch))]
        assert (lanes[-1] == REGISTERS) == (arch == "sm_80")
    spare = [t.get_text() for ax in axes for t in ax.texts if "never needed" in t.get_text()]
    assert len(spare) == 2                                    # sm_80 at 2 and 3 stages
