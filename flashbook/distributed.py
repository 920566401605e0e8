"""Ring attention: one sequence spread over several processes (chapter 11).

Each of W processes (ranks) holds 1/W of the sequence: its shard of the queries,
keys and values. Attention needs every query to meet every key, so the K/V shards
travel around a ring: at step t rank r holds the K/V shard of rank (r - t) mod W,
computes its queries against it, and meanwhile already sends that shard on to rank
r + 1 and receives the next one from rank r - 1. After W steps every query has seen
every key. Each step gives a partial (o, lse) over a disjoint block of keys; the
chapter-3 merge (``flashbook.softmax.merge``) folds them into the exact output.

    o_part, lse_part = attention of my queries against the K/V block I hold now
    (o, lse)         = merge((o, lse), (o_part, lse_part))

The backward is the same ring once more: each rank recomputes its block's weights
from the saved lse, keeps dQ at home, and sends the block's dK/dV partial sums along
with K and V, so that they arrive, complete, at the rank that owns that K/V shard.

Causal attention gives ranks unequal work when the sequence is cut into W
contiguous pieces (the last rank's queries see every key, the first rank's only its
own). The ``"zigzag"`` layout cuts the sequence into 2W chunks and gives rank r
chunks r and 2W - 1 - r: one early and one late chunk, the same causal work on every
rank.

Works with the ``gloo`` backend on CPUs (plain torch per block, exact in float64)
and with ``nccl`` on GPUs (the book's Triton kernels per block).
"""
from __future__ import annotations

import math
import os
import pickle
import socket

import torch
import torch.distributed as dist

from .ring import (DIAGONAL, FULL, LAYOUTS, SKIP, Block, causal_work, check_layout,  # noqa: F401
                   chunk_ids, num_chunks, pair_kind, step_blocks)

# The schedule (layouts, which blocks each ring step computes) is plain arithmetic in
# flashbook.ring, named here too.


# ----------------------------------------------------------------- shards

def _check_rank(rank, world_size):
    for name, value in (("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


def shard(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "contiguous") -> torch.Tensor:
    """Rank ``rank``'s part of ``x`` along the sequence axis (-2), as ``layout`` lays it out."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have a sequence axis (-2), got shape {tuple(x.shape)}")
    _check_rank(rank, world_size)
    chunks = num_chunks(world_size, check_layout(layout))
    n = x.shape[-2]
    if n % chunks:
        raise ValueError(f"the sequence length {n} must divide into {chunks} equal chunks "
                         f"({layout} layout over world_size {world_size})")
    c = n // chunks
    return torch.cat([x[..., i * c:(i + 1) * c, :] for i in chunk_ids(rank, world_size, layout)], dim=-2)


def unshard(shards, *, layout: str = "contiguous") -> torch.Tensor:
    """The full sequence back from every rank's shard (``shards[r]`` from rank r)."""
    check_layout(layout)
    shards = list(shards)
    if not shards or not all(isinstance(s, torch.Tensor) for s in shards):
        raise TypeError("shards must be a non-empty sequence of torch.Tensor, one per rank")
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"every shard must have the same shape, got {[tuple(s.shape) for s in shards]}")
    w = len(shards)
    per_rank = len(chunk_ids(0, w, layout))
    n = shards[0].shape[-2]
    if n % per_rank:
        raise ValueError(f"a {layout} shard holds {per_rank} equal chunks, but its length {n} "
                         f"does not divide by {per_rank}")
    c = n // per_rank
    pieces = [None] * num_chunks(w, layout)
    for r, s in enumerate(shards):
        for j, i in enumerate(chunk_ids(r, w, layout)):
            pieces[i] = s[..., j * c:(j + 1) * c, :]
    return torch.cat(pieces, dim=-2)


# ----------------------------------------------------------------- per block: attention and merge

def _finite_or_zero(m):
    """m, or 0 where m = -inf: the reference point to subtract (``softmax._finite_or_zero``)."""
    return torch.where(m == -math.inf, torch.zeros_like(m), m)


def merge_partials(o, lse, o_part, lse_part):
    """The chapter-3 merge of two normalised partial results (o, lse), in torch.

    With lse = m + log l and o = acc / l, ``softmax.merge``'s
        m = max(m1, m2),  l = e^(m1-m) l1 + e^(m2-m) l2,  acc = e^(m1-m) acc1 + e^(m2-m) acc2
    becomes, per row,
        m = max(lse1, lse2),  w_i = exp(lse_i - m),  lse = m + log(w1 + w2),
        o = (w1 o1 + w2 o2) / (w1 + w2).
    A side that has seen nothing (lse = -inf) has weight 0; two such sides give
    o = 0 and lse = -inf, never NaN. o is float32 or wider (lse: the same shape minus d).
    """
    m_ref = _finite_or_zero(torch.maximum(lse, lse_part))
    w1, w2 = torch.exp(lse - m_ref), torch.exp(lse_part - m_ref)
    total = w1 + w2
    safe = torch.where(total > 0, total, torch.ones_like(total))
    o = (w1[..., None] * o + w2[..., None] * o_part.to(o.dtype)) / safe[..., None]
    return o, m_ref + torch.log(total)


def _scores(q, k, scale, causal):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:   # square diagonal block: key j visible to query i when j <= i
        n_q, n_k = s.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q)
        s = s.masked_fill(~keep, -math.inf)
    return s


def block_forward(q, k, v, *, causal: bool, scale: float):
    """(o, lse) of one block: the book's Triton kernel on a GPU, plain torch on a CPU.

    The CPU path computes in the inputs' dtype (exact in float64), the kernel in
    float32 with float32 lse.
    """
    if q.is_cuda:
        from .kernels import flash_forward
        return flash_forward(q, k, v, causal=causal, scale=scale)
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _finite_or_zero(lse)[..., None])     # a row that sees no key: p = 0
    return p @ v, lse


def block_backward(q, k, v, o, lse, do, *, causal: bool, scale: float):
    """(dq, dk, dv) of one block, its weights recomputed from the saved global lse.

    P = exp(S - lse) with the lse of the *whole* row (all blocks), so P is this block's
    slice of the true softmax; delta = rowsum(dO * O) with the true output O.
    """
    if q.is_cuda:
        from .kernels import flash_backward
        return flash_backward(q, k, v, o, lse, do, causal=causal, scale=scale)
    s = _scores(q, k, scale, causal)
    p = torch.exp(s - _finite_or_zero(lse)[..., None])
    delta = (do * o).sum(-1, keepdim=True)
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - delta) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do


# ----------------------------------------------------------------- the ring

def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention needs an initialised process group: call "
                           "torch.distributed.init_process_group first (or use "
                           "flashbook.distributed.spawn)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed process group or None, got {type(group).__name__}")
    group = group if group is not None else dist.group.WORLD
    try:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"group must be a process group this rank belongs to: {exc}") from exc
    if rank < 0:
        raise ValueError("group must be a process group this rank belongs to")
    return group, rank, world


class _Ring:
    """Point-to-point exchange with the ring neighbours: send to rank+1, receive from rank-1."""

    def __init__(self, group, rank, world):
        self.group = group
        self.next = dist.get_global_rank(group, (rank + 1) % world)
        self.prev = dist.get_global_rank(group, (rank - 1) % world)

    def start(self, send: list, recv: list):
        """Start sending ``send`` and receiving into ``recv`` (same order on every rank)."""
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recv]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works):
        for w in works:
            w.wait()


def _check_same_everywhere(q, k, causal, layout, group, world):
    """Every rank must call with the same shapes, dtype, mask and layout.

    One small all_gather (in forward, before any ring traffic): every rank sees the
    same table, so a mismatch raises the same error on every rank, not a hang.
    """
    codes = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
    mine = torch.tensor([*q.shape, *k.shape, codes[q.dtype], int(causal), LAYOUTS.index(layout)],
                        dtype=torch.int64, device=q.device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    every = [tuple(t.tolist()) for t in every]
    if any(e != every[0] for e in every):
        raise ValueError("every rank must call ring_attention with the same q/k shapes, dtype, "
                         f"causal and layout; got (q shape, k shape, dtype, causal, layout) "
                         f"per rank: {every}")


def _check_inputs(q, k, v, causal, scale, layout):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, heads, seq, head_dim), "
                             f"got shape {tuple(x.shape)}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v shards must have the same shape (batch, heads, seq, head_dim), "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    check_layout(layout)
    per_rank = 1 if layout == "contiguous" else 2
    if q.shape[2] % per_rank:
        raise ValueError(f"a zigzag shard holds two equal chunks: its length must be even, "
                         f"got {q.shape[2]} (shard the sequence with shard(..., layout='zigzag'))")
    from .reference import resolve_scale
    return resolve_scale(scale, q.shape[-1])


def _ring_forward(q, k, v, *, causal, scale, layout, ring, rank, world, compute=True, communicate=True):
    """Forward over the ring: returns (o, lse), o float32 (or float64), lse of the full rows.

    ``compute=False`` or ``communicate=False`` leave out the attention or the sends
    (same blocks, same messages): the benchmark times each part alone.
    """
    chunk = q.shape[2] // len(chunk_ids(rank, world, layout))
    communicate = communicate and world > 1          # a ring of one sends nothing
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    lse = torch.full(q.shape[:3], -math.inf, dtype=acc_dtype, device=q.device)
    kv = torch.stack([k, v]).contiguous()
    for t in range(world):
        works = []
        if t < world - 1 and communicate:  # send this block on while computing on it
            nxt = torch.empty_like(kv)
            works = ring.start([kv], [nxt])
        plan = step_blocks(rank, (rank - t) % world, world, layout=layout, causal=causal, chunk=chunk)
        for b in plan if compute else []:
            o_b, lse_b = block_forward(q[:, :, b.q_rows], kv[0][:, :, b.k_rows], kv[1][:, :, b.k_rows],
                                       causal=b.causal, scale=scale)
            o[:, :, b.q_rows], lse[:, :, b.q_rows] = merge_partials(
                o[:, :, b.q_rows], lse[:, :, b.q_rows], o_b, lse_b.to(acc_dtype))
        if works:
            ring.wait(works)
            kv = nxt
    return o, lse


def _ring_backward(q, k, v, o, lse, do, *, causal, scale, layout, ring, rank, world,
                   compute=True, communicate=True):
    """Backward over the ring: dQ stays home; dK/dV partial sums follow K/V around the ring.

    At step t rank r holds the K/V of rank s = r - t. It computes its queries' share
    of that block's dK/dV, then adds the share that ranks s, ..., r - 1 have summed
    so far (which arrived while it computed) and passes the sum on. After the last
    step one more hop brings the complete dK/dV to the rank that owns the block.
    """
    chunk = q.shape[2] // len(chunk_ids(rank, world, layout))
    communicate = communicate and world > 1          # a ring of one sends nothing
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    kv = torch.stack([k, v]).contiguous()
    incoming = None                        # (works, buffer, ...): dK/dV sums on their way to us
    for t in range(world):
        works = []
        if t < world - 1 and communicate:  # the next K/V block travels while we compute
            nxt = torch.empty_like(kv)
            works = ring.start([kv], [nxt])
        dkv = torch.zeros(kv.shape, dtype=acc_dtype, device=q.device)
        plan = step_blocks(rank, (rank - t) % world, world, layout=layout, causal=causal, chunk=chunk)
        for b in plan if compute else []:
            qr, kr = b.q_rows, b.k_rows
            dq_b, dk_b, dv_b = block_backward(q[:, :, qr], kv[0][:, :, kr], kv[1][:, :, kr],
                                              o[:, :, qr], lse[:, :, qr], do[:, :, qr],
                                              causal=b.causal, scale=scale)
            dq[:, :, qr] += dq_b
            dkv[0][:, :, kr] += dk_b
            dkv[1][:, :, kr] += dv_b
        if incoming is not None:           # what the earlier ranks summed for this block
            ring.wait(incoming[0])
            dkv += incoming[1]
        if communicate:                    # dkv is kept referenced until its send completes
            buffer = torch.empty_like(dkv)
            incoming = (ring.start([dkv], [buffer]), buffer, dkv)
        else:
            incoming = ([], dkv)
        ring.wait(works)
        if works:
            kv = nxt
    ring.wait(incoming[0])                 # the last hop: our own block's complete sums
    dkv = incoming[1]
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class RingAttention(torch.autograd.Function):
    """One autograd node for the whole ring, forward and backward.

    Its backward is a single function that issues every send and receive in a fixed
    order, so autograd cannot interleave the ring traffic of this call with another
    branch's differently on different ranks.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, group, rank, world):
        ring = _Ring(group, rank, world)
        o, lse = _ring_forward(q, k, v, causal=causal, scale=scale, layout=layout,
                               ring=ring, rank=rank, world=world)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = dict(causal=causal, scale=scale, layout=layout, ring=ring, rank=rank, world=world)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, o, lse, do.contiguous().to(q.dtype), **ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(q, k, v, *, causal: bool = False, scale=None, layout: str = "contiguous", group=None):
    """softmax(scale q k^T) v for a sequence spread over the ranks of ``group``; differentiable.

    Args:
        q, k, v: this rank's shards, (batch, heads, seq / W, head_dim), laid out by
            ``shard(x, rank, W, layout=layout)``; the same shape on every rank.
        causal: query i sees key j only when j <= i (global positions).
        scale: None means 1/sqrt(head_dim).
        layout: ``"contiguous"`` or ``"zigzag"`` (balanced causal work).
        group: the process group of the ring (None: the default group).

    Returns:
        this rank's shard of the output, with q's shape and dtype.

    Every rank must call it with the same arguments, in the same order relative to
    its other collectives; a mismatch of shapes or options raises a ValueError on
    every rank.
    """
    scale = _check_inputs(q, k, v, causal, scale, layout)
    group, rank, world = _group_info(group)
    _check_same_everywhere(q, k, causal, layout, group, world)
    return RingAttention.apply(q, k, v, causal, scale, layout, group, rank, world)


# ----------------------------------------------------------------- running W processes

def free_port() -> int:
    """A TCP port nobody listens on now (for the processes' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, backend, timeout_s, fn, args, out_dir):
    import datetime
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # keep NVLink multicast off
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, *args)
        with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def spawn(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 60.0):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return their results.

    ``fn`` must be importable (defined in a module, not in a notebook cell): spawned
    processes start a new interpreter and find it by name. Each process joins a
    process group before ``fn`` runs and leaves it after; ``timeout_s`` bounds every
    collective, so a schedule that deadlocks fails instead of hanging.
    """
    import tempfile

    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, free_port(), backend, timeout_s, fn, args, out_dir),
                 nprocs=world_size, join=True)
        results = []
        for r in range(world_size):
            with open(os.path.join(out_dir, f"{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results


def demo(rank: int, world: int, n: int = 64, heads: int = 2, d: int = 16, causal: bool = True,
         layout: str = "zigzag", seed: int = 0):
    """Chapter 11's live demo: ring attention on this rank's shard against one process's answer.

    Every rank draws the same full q, k, v (same seed), keeps its shard, runs the
    ring forward and backward, and returns its largest errors against autograd on
    the whole sequence in float64.
    """
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, heads, n, d, generator=g, dtype=torch.float64) for _ in range(4))
    parts = [shard(x, rank, world, layout=layout).requires_grad_(x is not do) for x in (q, k, v, do)]
    o = ring_attention(*parts[:3], causal=causal, layout=layout)
    o.backward(parts[3])
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*full, is_causal=causal)
    want.backward(do)
    errs = {"o": (o - shard(want, rank, world, layout=layout)).abs().max().item()}
    for name, mine, ref in zip(("dq", "dk", "dv"), parts[:3], full):
        errs[name] = (mine.grad - shard(ref.grad, rank, world, layout=layout)).abs().max().item()
    return errs
