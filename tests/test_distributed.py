"""Ring attention (flashbook.distributed) on 2 and 4 gloo processes, against float64 NumPy.

Starting processes is the cost (each imports torch), so each spawn runs every case:
both layouts, with and without the causal mask, forward and backward, and the
schedule checks. The process group's timeout is short: a ring whose ranks issue
their sends in different orders deadlocks, and the timeout turns that into a
failure within seconds instead of a hang.
"""
import numpy as np
import pytest
import torch

from flashbook import distributed as D
from flashbook import reference

TIMEOUT_S = 20   # every collective; a deadlocked schedule fails after this
CASES = [(layout, causal) for layout in D.LAYOUTS for causal in (False, True)]
# float64 everywhere: the ring reorders the sums (blocks merged in ring order) so
# errors are a few ulps of the O(1) outputs and gradients, far below 1e-12.
ATOL = 1e-12


def _draw(seed, n, heads=2, d=8, batch=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64) for _ in range(4)]


def _numpy_reference(q, k, v, do, causal):
    o = reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal)
    grads = reference.attention_backward(q.numpy(), k.numpy(), v.numpy(), do.numpy(), causal=causal)
    return [torch.from_numpy(np.ascontiguousarray(x)) for x in (o, *grads)]


def _ring(parts, causal, layout):
    q, k, v = (x.clone().requires_grad_() for x in parts[:3])
    o = D.ring_attention(q, k, v, causal=causal, layout=layout)
    o.backward(parts[3])
    return [o.detach(), q.grad, k.grad, v.grad]


def _every_case(rank, world, seed):
    """Worker: each (layout, causal) case; returns max |ring - reference| per tensor."""
    n = 4 * world * 3                     # 3 rows per zigzag chunk, 6 per contiguous shard
    out = {}
    for layout, causal in CASES:
        full = _draw(seed, n)
        want = _numpy_reference(*full, causal)
        got = _ring([D.shard(x, rank, world, layout=layout) for x in full], causal, layout)
        out[(layout, causal)] = {name: (g - D.shard(w, rank, world, layout=layout)).abs().max().item()
                                 for name, g, w in zip(("o", "dq", "dk", "dv"), got, want)}
    return out


def _schedule_checks(rank, world, seed):
    """Worker: backward orders that autograd may choose differently per rank.

    Two ring calls A and B on different data, used in a different order on each
    rank, plus a branch that has nothing to do with either and is heavier on one
    rank. If the ring's traffic were split over several autograd nodes, the ranks
    could run them in different orders: gloo would then pair A's messages on one
    rank with B's on the other (wrong gradients) or wait forever (timeout).
    """
    n, layout = 8 * world, "zigzag"
    a, b = _draw(seed, n), _draw(seed + 1, n)
    mine = [[D.shard(x, rank, world, layout=layout).clone().requires_grad_(i < 3) for i, x in enumerate(t)]
            for t in (a, b)]
    extra = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    o_a = D.ring_attention(*mine[0][:3], causal=True, layout=layout)
    o_b = D.ring_attention(*mine[1][:3], causal=True, layout=layout)
    side = extra
    for _ in range(20 if rank == 0 else 1):   # an unrelated branch, longer on rank 0
        side = torch.tanh(side @ extra)
    terms = [(o_a * mine[0][3]).sum(), (o_b * mine[1][3]).sum(), side.sum() * 0]
    if rank % 2:
        terms.reverse()
    sum(terms).backward()
    errs = {}
    for name, t, full in (("A", mine[0], a), ("B", mine[1], b)):
        want = _numpy_reference(*full, True)[1:]
        for g, x, w in zip(("dq", "dk", "dv"), t[:3], want):
            errs[name + g] = (x.grad - D.shard(w, rank, world, layout=layout)).abs().max().item()
    # A rank that calls with a different shape: every rank gets the same ValueError
    q = torch.randn(1, 1, 4 if rank else 6, 4, dtype=torch.float64)
    try:
        D.ring_attention(q, q, q)
        errs["mismatch"] = None
    except ValueError as exc:
        errs["mismatch"] = str(exc)
    return errs


def _assert_small(results, what):
    for rank, res in enumerate(results):
        for case, errs in res.items():
            worst = max(errs.values()) if isinstance(errs, dict) else errs
            assert worst < ATOL, f"{what}: rank {rank}, {case}: {errs}"


@pytest.mark.slow
def test_ring_matches_reference_on_four_processes(rng):
    results = D.spawn(_every_case, 4, int(rng.integers(2**31)), timeout_s=TIMEOUT_S)
    _assert_small(results, "4 processes")


def test_ring_on_two_processes_and_schedule(rng):
    results = D.spawn(_two_jobs, 2, int(rng.integers(2**31)), timeout_s=TIMEOUT_S)
    _assert_small([r[0] for r in results], "2 processes")
    for rank, (_, errs) in enumerate(results):
        msg = errs.pop("mismatch")
        assert msg is not None and "same q/k shapes" in msg, f"rank {rank}: no error for a shape mismatch"
        assert max(errs.values()) < ATOL, f"rank {rank}, schedule check: {errs}"


def _two_jobs(rank, world, seed):
    return _every_case(rank, world, seed), _schedule_checks(rank, world, seed)


# ----------------------------------------------------------------- in one process

@pytest.mark.parametrize("layout", D.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_round_trip(rng, layout, world):
    n = 2 * world * int(rng.integers(1, 4))
    x = torch.from_numpy(rng.standard_normal((2, 3, n, 5)))
    shards = [D.shard(x, r, world, layout=layout) for r in range(world)]
    assert all(s.shape[-2] == n // world for s in shards)
    assert torch.equal(D.unshard(shards, layout=layout), x)


def test_zigzag_holds_chunks_r_and_mirror():
    x = torch.arange(8.0).reshape(8, 1)          # 8 rows, 2 ranks: 4 chunks of 2 rows
    assert D.shard(x, 0, 2, layout="zigzag").flatten().tolist() == [0, 1, 6, 7]
    assert D.shard(x, 1, 2, layout="zigzag").flatten().tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_causal_work(world):
    work = np.array(D.causal_work(world, "zigzag"))
    total = world ** 2 / 2                       # half of the W x W blocks of scores
    assert work.sum() == total
    assert np.all(work == total / world ** 2), work   # the same work on every rank at every step
    contiguous = np.array(D.causal_work(world, "contiguous")).sum(axis=1)
    assert contiguous[0] == 0.5 and contiguous[-1] == world - 0.5


@pytest.mark.parametrize("layout", D.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_step_blocks_cover_the_causal_mask_once(layout, world):
    """The blocks of every step, mapped to global positions, tile the causal mask exactly."""
    chunk = 2
    n = chunk * len(D.chunk_ids(0, world, layout)) * world
    index = torch.arange(n, dtype=torch.float64).reshape(n, 1)
    seen = np.zeros((n, n), dtype=int)
    for r in range(world):
        rows = D.shard(index, r, world, layout=layout).flatten().long()
        for t in range(world):
            s = (r - t) % world
            cols = D.shard(index, s, world, layout=layout).flatten().long()
            for b in D.step_blocks(r, s, world, layout=layout, causal=True, chunk=chunk):
                qi, kj = rows[b.q_rows], cols[b.k_rows]
                mask = np.tril(np.ones((len(qi), len(kj)), dtype=int)) if b.causal else 1
                seen[np.ix_(qi.numpy(), kj.numpy())] += mask
    assert np.array_equal(seen, np.tril(np.ones((n, n), dtype=int)))


def test_merge_partials_matches_softmax_merge(rng):
    from flashbook import softmax
    s1, s2 = rng.standard_normal((2, 3, 5, 4))
    v1, v2 = rng.standard_normal((2, 4, 6))
    s2[0] = -np.inf                               # a row that sees nothing in one block
    want = softmax.merge(softmax.block_state(s1, v1), softmax.block_state(s2, v2))
    parts = [softmax.block_state(s, v) for s, v in ((s1, v1), (s2, v2))]
    o, lse = D.merge_partials(*(torch.from_numpy(x) for p in parts for x in (p.output(), p.lse)))
    np.testing.assert_allclose(o.numpy(), want.output(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(lse.numpy(), want.lse, rtol=1e-13)
    empty = torch.full((2,), -np.inf, dtype=torch.float64)
    o, lse = D.merge_partials(torch.zeros(2, 3, dtype=torch.float64), empty,
                              torch.zeros(2, 3, dtype=torch.float64), empty)
    assert torch.equal(o, torch.zeros(2, 3, dtype=torch.float64)) and torch.all(lse == -np.inf)


def test_ring_of_one_in_this_process(rng):
    """A group of one rank: the ring is plain attention (no sends), forward and backward."""
    q, k, v, do = (torch.from_numpy(rng.standard_normal((2, 3, 10, 4))) for _ in range(4))
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{D.free_port()}",
                                         rank=0, world_size=1)
    try:
        for layout, causal in CASES:
            got = _ring([q, k, v, do], causal, layout)
            want = _numpy_reference(q, k, v, do, causal)
            for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
                err = (a - b).abs().max().item()
                assert err < ATOL, f"{layout}, causal={causal}: {name} max error {err:.2e}"
        with pytest.raises(TypeError, match="group must be"):
            D.ring_attention(q, k, v, group="world")
    finally:
        torch.distributed.destroy_process_group()


def test_errors():
    x = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="divide into 4 equal chunks"):
        D.shard(x, 0, 2, layout="zigzag")
    with pytest.raises(ValueError, match="rank must be in"):
        D.shard(x, 2, 2)
    with pytest.raises(ValueError, match="layout"):
        D.shard(x, 0, 2, layout="striped")
    with pytest.raises(TypeError, match="world_size"):
        D.shard(x, 0, 2.0)
    with pytest.raises(ValueError, match="same shape"):
        D.unshard([x, x[..., :3, :]])
    with pytest.raises(ValueError, match="same shape"):
        D.ring_attention(x, x, x[..., :3, :])
    with pytest.raises(TypeError, match="same dtype"):
        D.ring_attention(x, x, x.double())
    with pytest.raises(ValueError, match="length must be even"):
        D.ring_attention(x[..., :3, :], x[..., :3, :], x[..., :3, :], layout="zigzag")
    with pytest.raises(TypeError, match="causal"):
        D.ring_attention(x, x, x, causal=1)
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        D.ring_attention(x, x, x)


# ----------------------------------------------------------------- two GPUs, NCCL

def _gpu_cases(rank, world, seed):
    """Worker: bf16 ring on the GPUs (the Triton kernels per block) against float64, each case."""
    from flashbook.kernels import checks
    device = torch.device("cuda", rank)
    problems = []
    for layout, causal in CASES:
        g = torch.Generator(device=device).manual_seed(seed)
        full = [torch.randn(1, 2, 512, 64, generator=g, device=device, dtype=torch.bfloat16) for _ in range(4)]
        got = _ring([D.shard(x, rank, world, layout=layout) for x in full], causal, layout)
        gathered = []
        for x in got:
            parts = [torch.empty_like(x) for _ in range(world)]
            torch.distributed.all_gather(parts, x.contiguous())
            gathered.append(D.unshard(parts, layout=layout))
        if rank == 0:
            truth = checks.reference_grads(*full, causal=causal)
            yardstick = checks.torch_grads(*full, causal=causal, dtype=torch.bfloat16)
            for name, a, want, yard in zip(("o", "dq", "dk", "dv"), gathered, truth, yardstick):
                problem = checks.within_twice_yardstick(name, a.cpu(), want, yard.cpu(), head_dim=64)
                if problem:
                    problems.append(f"{layout}, causal={causal}: {problem}")
    return problems


@pytest.mark.gpu
def test_ring_on_two_gpus_with_nccl(rng):
    """bf16 ring attention on 2 GPUs, forward and backward, within twice PyTorch's bf16 error."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs (ring attention over NCCL)")
    results = D.spawn(_gpu_cases, 2, int(rng.integers(2**31)), backend="nccl", timeout_s=120)
    assert not results[0], "\n".join(results[0])
