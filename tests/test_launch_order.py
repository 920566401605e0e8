"""The launch order of the programs (``forward.launch_position``'s ``HEAD_GROUP``, and
``query_tile_index``'s ``HEAVY_LAST`` for sliding windows).

Dealing the programs out a few heads at a time changes when each program starts, never what
it computes: every output and gradient must be bitwise the same as with the default order,
for each kernel the order reaches (forward, dK/dV, dQ), with a causal mask, a window, GQA,
packed documents and a last group narrower than the others. The interpreter runs the same
kernels the GPU does; ``benchmarks/launch_order_experiment.py`` times the orders on a GPU.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import flashbook
from flashbook import runtime
from flashbook.kernels import autograd, varlen
from flashbook.kernels.forward import launch_position, query_tile_index

import triton  # noqa: E402  (after flashbook: it decides GPU or interpreter first)
import triton.language as tl  # noqa: E402

DEVICE = runtime.device()


@contextlib.contextmanager
def forced(name: str, value):
    """``autograd._state[name]`` set to ``value`` (the call plans forgotten before and after)."""
    before = autograd._state[name]
    autograd._state[name] = value
    for plans in autograd._PLANS.values():
        plans.clear()
    try:
        yield
    finally:
        autograd._state[name] = before
        for plans in autograd._PLANS.values():
            plans.clear()


def head_group(n: int):
    return forced("head_group", n)


def _grads(fn, *xs):
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    out = fn(*xs)
    torch.manual_seed(3)
    out.backward(torch.randn_like(out))
    return [out.detach()] + [x.grad for x in xs]


def _assert_same(base, other, label: str) -> None:
    """Every output and gradient nonzero, finite and bitwise equal between two launch orders."""
    for what, a, b in zip(("o", "dq", "dk", "dv"), base, other):
        assert torch.isfinite(a).all() and a.abs().max() > 0, what
        assert torch.equal(a, b), f"{what} differs with {label}: {(a - b).abs().max().item()}"


CASES = {   # name: (batch, heads, kv_heads, seq, kwargs)
    "causal": (2, 3, 3, 70, dict(causal=True)),
    "full-gqa": (1, 4, 2, 45, dict(causal=False)),
    "window": (2, 3, 1, 70, dict(causal=True, window=(20, 0))),
}


# 5: wider than the 2 x 3 (batch x heads) of "causal", so its one group is the narrower last one
@pytest.mark.parametrize("name,group", [("causal", 5), ("window", 2), ("full-gqa", 3)])
def test_grouped_launch_order_changes_nothing(name, group):
    batch, heads, kv_heads, seq, kwargs = CASES[name]
    gen = torch.Generator().manual_seed(11 + group)
    q = torch.randn(batch, heads, seq, 32, generator=gen).to(DEVICE, torch.float16)
    k, v = (torch.randn(batch, kv_heads, seq, 32, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    fn = lambda q, k, v: flashbook.flash_attention(q, k, v, backend="triton", **kwargs)  # noqa: E731
    base = _grads(fn, q, k, v)
    with head_group(group):
        grouped = _grads(fn, q, k, v)
    _assert_same(base, grouped, f"HEAD_GROUP={group}")


def test_grouped_launch_order_with_packed_documents():
    gen = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 30, 37, 90], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(90, 2, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(3))
    fn = lambda q, k, v: varlen.flash_attention_varlen(q, k, v, cu, cu, 53, 53, causal=True)  # noqa: E731
    base = _grads(fn, q, k, v)
    with head_group(4):
        grouped = _grads(fn, q, k, v)
    _assert_same(base, grouped, "HEAD_GROUP=4")


@triton.jit
def _where(OUT, HEAD_GROUP: tl.constexpr):
    tile, bh = launch_position(HEAD_GROUP)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    tl.store(OUT + 2 * pid, tile)
    tl.store(OUT + 2 * pid + 1, bh)


def test_launch_position_deals_the_heads_out_in_groups():
    """Program p (the p-th the GPU starts) owns (tile, bh) as the docstring says: a permutation
    of every (tile, bh), G heads at a time, tile by tile, the last group narrower."""
    tiles, bhs = 4, 7
    for group in (1, 3, 7, 9):
        out = torch.full((tiles * bhs, 2), -1, dtype=torch.int32, device=DEVICE)
        _where[(tiles, bhs)](out, HEAD_GROUP=group)
        got = [tuple(r) for r in out.cpu().tolist()]
        want = []
        for start in range(0, bhs, group):
            width = min(group, bhs - start)
            want += [(t, start + h) for t in range(tiles) for h in range(width)]
        assert got == want, (group, got)


def test_the_rule_groups_heads_only_for_small_grids_on_the_chip_it_was_measured_on():
    from flashbook.kernels import configs
    sms = 132
    assert configs.head_group(512, sms=sms, cc=90) == configs.SMALL_GRID_HEAD_GROUP > 1   # causal 4K, batch 1
    assert configs.head_group(configs.SMALL_GRID_PROGRAMS_PER_SM * sms, sms=sms, cc=90) > 1
    assert configs.head_group(configs.SMALL_GRID_PROGRAMS_PER_SM * sms + 1, sms=sms, cc=90) == 1
    assert configs.head_group(512, sms=108, cc=80) == 1    # not measured on an A100: the plain order
    if DEVICE == "cpu":   # the interpreter runs one program at a time: no order to choose
        assert autograd.head_group(torch.device("cpu"), 512) == 1
    with head_group(3):
        assert autograd.head_group(torch.device(DEVICE), 10 ** 6) == 3


def _rule(causal, window, seq_q=70, seq_k=70, diagonal=None):
    extra = autograd.kernel_mask(causal, window, None, seq_q, seq_k, 1.0, diagonal=diagonal)[2]
    return autograd.heavy_last(extra, seq_k)


def test_heavy_last_rule_reverses_windows_with_a_right_limit():
    """A window cut on the right (causal or not) takes its query tiles last first; one cut on
    the left only keeps the plain order (its first tiles are the heavy ones), as does a right
    limit past every key, and the causal mask says it through CAUSAL itself."""
    on = {"HEAVY_LAST": True}
    assert _rule(True, (20, 0)) == on
    assert _rule(False, (-1, 9)) == on
    assert _rule(False, (15, 6)) == on
    assert _rule(True, (20, 0), seq_q=30, seq_k=70) == on        # bottom-right aligned
    assert _rule(True, (20, 0), diagonal=0) == on                 # packed documents: per document
    assert _rule(False, (9, -1)) == {}
    assert _rule(False, (5, 200)) == {}
    assert _rule(True, None) == {} and _rule(False, None) == {}
    with forced("heavy_last", False):
        assert _rule(True, (20, 0)) == {}
    with forced("heavy_last", True):
        assert _rule(False, (9, -1)) == on
        assert _rule(True, None) == {}                            # no window: nothing to force


@pytest.mark.parametrize("window,causal,kv_heads", [((20, 0), True, 1), ((-1, 9), False, 3), ((15, 6), False, 3)])
def test_heavy_last_order_changes_nothing(window, causal, kv_heads):
    """The window's query tiles taken last first (the rule) against the plain order (forced
    off): every output and gradient bitwise the same."""
    gen = torch.Generator().manual_seed(23)
    q = torch.randn(2, 3, 70, 32, generator=gen).to(DEVICE, torch.float16)
    k, v = (torch.randn(2, kv_heads, 70, 32, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    assert _rule(causal, window) == {"HEAVY_LAST": True}
    fn = lambda q, k, v: flashbook.flash_attention(q, k, v, backend="triton", causal=causal, window=window)  # noqa: E731
    with forced("heavy_last", False):
        plain = _grads(fn, q, k, v)
    reversed_ = _grads(fn, q, k, v)
    _assert_same(plain, reversed_, "HEAVY_LAST")


def test_heavy_last_order_with_packed_documents():
    gen = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, 30, 37, 90], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(90, 2, 16, generator=gen).to(DEVICE, torch.float16) for _ in range(3))
    fn = lambda q, k, v: varlen.flash_attention_varlen(q, k, v, cu, cu, 53, 53, causal=True, window=(9, 0))  # noqa: E731
    with forced("heavy_last", False):
        plain = _grads(fn, q, k, v)
    reversed_ = _grads(fn, q, k, v)
    _assert_same(plain, reversed_, "HEAVY_LAST")


@triton.jit
def _tile_of(OUT, CAUSAL: tl.constexpr, HEAVY_LAST: tl.constexpr):
    tl.store(OUT + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0),
             query_tile_index(CAUSAL, 1, HEAVY_LAST))


@pytest.mark.parametrize("causal,heavy,reversed_", [(False, False, False), (False, True, True), (True, False, True),
                                                    (True, True, True)])
def test_query_tile_index_takes_the_last_tiles_first_when_told(causal, heavy, reversed_):
    tiles, heads = 5, 2
    out = torch.full((heads, tiles), -1, dtype=torch.int32, device=DEVICE)
    _tile_of[(tiles, heads)](out, CAUSAL=causal, HEAVY_LAST=heavy)
    order = list(range(tiles))[::-1] if reversed_ else list(range(tiles))
    assert out.cpu().tolist() == [order] * heads
