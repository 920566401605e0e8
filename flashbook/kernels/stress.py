"""Correct every time: each shape class run with many seeds, every buffer poisoned first.

A kernel that is right for one draw of random numbers can still be wrong one run
in thirteen: a read of a row past the end that happens to hold a harmless value,
two programs racing for one element, a buffer read before anything wrote it. One
seed per shape catches none of these. So every *class* of shapes (the small and
ragged lengths where masks and tile edges meet, both orders of seq_q and seq_k,
causal or not, every dtype) runs many times, with

* fresh random inputs each run (the seed is kept, so a failure can be replayed);
* every buffer the kernels write filled with NaN before the launch
  (``autograd.poisoned_outputs``), so an element nobody writes cannot pass;
* every output and gradient compared with float64 by the book's rule: at most
  twice the error of the same attention in plain PyTorch in the input dtype
  (``checks.within_twice_yardstick``), NaN never.

The runs of one class cycle through GQA groups 1/2/4/8 and several head_dims, so
each pair (group, head_dim) meets each length pair several times.

Used by ``tests/test_stress_gpu.py`` (thousands of runs on a GPU),
``tests/test_stress.py`` (the same code in Triton's interpreter, fewer seeds) and
``benchmarks/stress.py`` (records the counts with provenance).
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field, replace

import torch

from .. import masks
from . import autograd, checks
from .autograd import poisoned_outputs

#: (seq_q, seq_k): lengths around the tile sizes (16 ... 128) and around one, both orders
SQUARE_LENGTHS = (1, 2, 3, 17, 63, 64, 65, 127, 129)
LENGTH_PAIRS = tuple((n, n) for n in SQUARE_LENGTHS) + (
    (1, 64), (64, 1), (17, 65), (65, 17), (3, 127), (127, 3), (1, 129), (129, 2))
#: the Gluon forward's lengths: whole tiles, and lengths that are not (a last query or key
#: tile that overlaps the one before), down to one 64-row, 64-key tile
GLUON_LENGTH_PAIRS = ((64, 128), (128, 128), (192, 256), (320, 384), (256, 128), (128, 512),
                      (64, 64), (100, 100), (200, 333), (333, 200), (130, 777), (1000, 1000))
GROUPS = (1, 2, 4, 8)
HEAD_DIMS = (16, 64, 80, 128, 256)
FP32_HEAD_DIMS = (16, 64, 80, 128)   # see all_classes: float32 at 256 compiles for minutes
#: new tokens per decode step (1 is plain decoding; more is speculative decoding)
NEW_TOKENS = (1, 2, 3, 8, 16)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
GRADS = checks.GRADS
KERNELS = ("attention", "decode", "gluon", "varlen")


@dataclass(frozen=True)
class Case:
    """One run: a kernel, a shape, a dtype and (for decode) the cache lengths' seed."""
    kernel: str              # "attention" (Triton fwd + bwd), "gluon" (Gluon fwd + bwd), "decode", "varlen"
    batch: int
    heads: int
    kv_heads: int
    seq_q: int               # decode: new tokens per sequence; varlen: the longest document
    seq_k: int               # decode: the cache's length n_max; varlen: the longest document
    head_dim: int
    causal: bool
    dtype: str
    dq_mode: str = "separate"
    page_size: int = 0       # decode: 0 a dense cache, else a paged one (shuffled pages)
    window: tuple = (-1, -1)  # attention: flash_attention's sliding window (left, right)
    softcap: float = 0.0     # attention, decode: the soft cap c (0: off)
    prefix: int = 0          # attention (causal): a prefix-LM's prefix, keys every row sees
    alibi: bool = False      # attention, varlen: ALiBi biases with ``alibi_slopes(heads)``
    fused: bool = False      # varlen: the backward in one launch (``autograd.fuse_backward``) forced, heads ungrouped

    def label(self) -> str:
        return (f"{self.kernel}-{self.dtype}-b{self.batch}h{self.heads}/{self.kv_heads}-"
                f"{self.seq_q}x{self.seq_k}-d{self.head_dim}-{'causal' if self.causal else 'full'}"
                + ("" if self.dq_mode == "separate" else f"-{self.dq_mode}")
                + (f"-pages{self.page_size}" if self.page_size else "")
                + (f"-window{self.window[0]},{self.window[1]}" if self.window != (-1, -1) else "")
                + (f"-softcap{self.softcap:g}" if self.softcap else "")
                + (f"-prefix{self.prefix}" if self.prefix else "")
                + ("-alibi" if self.alibi else "") + ("-fused" if self.fused else ""))


@dataclass
class ClassResult:
    """What one class's runs gave: how many ran, and each failure with its seed."""
    name: str
    runs: int = 0
    failures: list = field(default_factory=list)   # (case label, seed, problems)

    @property
    def passed(self) -> bool:
        return self.runs > 0 and not self.failures


def alibi_slopes(heads: int, device):
    """The ALiBi paper's slopes for ``heads`` query heads, 2^(-8 (h + 1) / heads): float32,
    (heads,), as ``flash_attention(alibi_slopes=)`` takes them."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def _slopes(case: Case, device):
    return alibi_slopes(case.heads, device) if case.alibi else None


def _draw(shapes, dtype, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(s, generator=gen, device=device, dtype=torch.float32).to(dtype) for s in shapes]


def _launch(case: Case, seed: int, device):
    """Draw the inputs of ``case`` from ``seed`` and run its kernels with poisoned outputs:
    (inputs, lengths, outputs). Attention: inputs (q, k, v, dO), outputs (o, dq, dk, dv),
    lengths None. Decode: inputs (q, k, v) as a dense cache (paged for the call when the
    case says so), one length per sequence (the first at full length, the second empty
    when the batch allows), outputs (o,)."""
    dtype = DTYPES[case.dtype]
    b, h, hk, nq, nk, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim
    if case.kernel == "decode":
        from .decode import flash_decode, paginate

        q, k, v = _draw(((b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)), dtype, seed, device)
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(0, nk + 1, (b,), generator=gen)
        lengths[0] = nk
        if b > 2:
            lengths[1] = 0
        caches, table = (k, v), {}
        if case.page_size:
            *caches, pages = paginate(k, v, case.page_size, generator=gen, spare=3)
            table = {"block_table": pages}
        with poisoned_outputs():
            o = flash_decode(q, *caches, cache_seqlens=lengths.to(device), causal=case.causal,
                             softcap=case.softcap or None, **table)
        return (q, k, v), lengths.tolist(), (o,)
    if case.kernel == "varlen":   # `batch` documents of random lengths, the first one at full length
        from .varlen import flash_attention_varlen

        gen = torch.Generator().manual_seed(seed)
        lengths = [torch.randint(0, n + 1, (b,), generator=gen) for n in (nq, nk)]
        lengths[0][0], lengths[1][0] = nq, nk
        cu_q, cu_k = (torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]) for n in lengths)
        q, k, v, do = _draw(((int(cu_q[-1]), h, d), (int(cu_k[-1]), hk, d), (int(cu_k[-1]), hk, d),
                             (int(cu_q[-1]), h, d)), dtype, seed, device)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        with poisoned_outputs(), one_launch(case.fused):
            o = flash_attention_varlen(*leaves, cu_q.to(device, torch.int32), cu_k.to(device, torch.int32), nq, nk,
                                       causal=case.causal, window=case.window, softcap=case.softcap,
                                       prefix=case.prefix, alibi_slopes=_slopes(case, device))
            o.backward(do)
        return (q, k, v, do), (cu_q.tolist(), cu_k.tolist()), (o.detach(), *(x.grad for x in leaves))
    q, k, v, do = _draw(((b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d), (b, h, nq, d)), dtype, seed, device)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with poisoned_outputs():
        if case.kernel == "gluon":
            from .hopper import gluon_attention

            o = gluon_attention(*leaves, causal=case.causal)
        else:
            o = autograd.flash_attention(*leaves, causal=case.causal, dq_mode=case.dq_mode,
                                         window=case.window, softcap=case.softcap, prefix=case.prefix,
                                         alibi_slopes=_slopes(case, device))
        o.backward(do)
    return (q, k, v, do), None, (o.detach(), *(x.grad for x in leaves))


@contextlib.contextmanager
def one_launch(enabled: bool):
    """Inside: the backward's dK/dV and dQ programs in one launch wherever their grids match
    (``autograd.fuse_backward`` forced, heads never grouped), so that small classes run the path
    the library takes for long packed documents; call plans forgotten before and after."""
    if not enabled:
        yield
        return
    saved = autograd._state["fused_backward"], autograd._state["head_group"]
    autograd._state.update(fused_backward=True, head_group=1)
    autograd.forget_plans()
    try:
        yield
    finally:
        autograd._state["fused_backward"], autograd._state["head_group"] = saved
        autograd.forget_plans()


def run_attention(case: Case, seed: int, device) -> list:
    """Forward and backward of ``case`` on inputs drawn from ``seed``: the problems found
    (empty when every output and gradient is within the rule)."""
    (q, k, v, do), _, got = _launch(case, seed, device)
    mask = dict(causal=case.causal, window=case.window, softcap=case.softcap, prefix=case.prefix,
                alibi_slopes=_slopes(case, q.device))
    truth = checks.torch_grads(q, k, v, do, dtype=torch.float64, **mask)
    yardstick = checks.torch_grads(q, k, v, do, dtype=DTYPES[case.dtype], **mask)
    return checks.backward_problems(got, truth, yardstick, q, k, v, do, head_dim=case.head_dim,
                                    terms=(1, 1, alone_rows(case), 1), **mask)


def alone_rows(case: Case) -> int:
    """How many query rows of a KV head see some key alone (P = 1 there, so dK sums that
    many roundings of an exact 0: ``checks.within_twice_yardstick``'s ``terms``): every
    row with one key and no mask, else at most one row per query head (causal: the
    first row that sees a key sees key 0 alone); with a window, the rows that see
    exactly one key (a window of (0, 0): every row)."""
    group = case.heads // case.kv_heads
    if case.window != (-1, -1) or case.prefix:
        seen = masks.allowed(case.seq_q, case.seq_k, causal=case.causal, window=case.window,
                             prefix=case.prefix).sum(axis=1)
        return group * max(1, int((seen == 1).sum()))
    return group * (case.seq_q if case.seq_k == 1 and not case.causal else 1)


def run_decode(case: Case, seed: int, device) -> list:
    """``flash_decode`` on ragged cache lengths drawn from ``seed``, against float64
    attention over each sequence's own keys."""
    (q, k, v), lengths, (o,) = _launch(case, seed, device)
    problems = []
    for i, n in enumerate(lengths):
        ks, vs = k[i:i + 1, :, :n], v[i:i + 1, :, :n]
        cap = case.softcap or None
        truth = checks.torch_attention(q[i:i + 1].double(), ks.double(), vs.double(), causal=case.causal, softcap=cap)
        yardstick = checks.torch_attention(q[i:i + 1], ks, vs, causal=case.causal, softcap=cap)
        problems += [f"sequence {i} (length {n}): {p}"
                     for p in checks.compare(("o",), (o[i:i + 1],), (truth,), (yardstick,), case.head_dim)]
    return problems


def run_varlen(case: Case, seed: int, device) -> list:
    """``flash_attention_varlen`` on documents of lengths drawn from ``seed``: each document's
    output and gradients against float64 attention over that document alone (rows of a
    document without keys, and keys of one without queries, must be exactly 0)."""
    (q, k, v, do), (cu_q, cu_k), got = _launch(case, seed, device)
    problems = []
    for b in range(case.batch):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        one = lambda x, span: x[span].transpose(0, 1).unsqueeze(0)   # noqa: E731  (1, heads, n, d)
        mine = (one(got[0], rows), one(got[1], rows), one(got[2], keys), one(got[3], keys))
        if rows.start == rows.stop or keys.start == keys.stop:   # nothing to attend to: zeros
            problems += [f"document {b}: {name} not 0" for name, x in zip(GRADS, mine) if bool(x.ne(0).any())]
            continue
        inputs = (one(q, rows), one(k, keys), one(v, keys), one(do, rows))
        mask = dict(causal=case.causal, window=case.window, softcap=case.softcap, prefix=case.prefix,
                    alibi_slopes=_slopes(case, q.device))
        truth = checks.torch_grads(*inputs, dtype=torch.float64, **mask)
        yardstick = checks.torch_grads(*inputs, dtype=DTYPES[case.dtype], **mask)
        alone = alone_rows(replace(case, seq_q=rows.stop - rows.start, seq_k=keys.stop - keys.start))
        problems += [f"document {b} ({rows.stop - rows.start} x {keys.stop - keys.start}): {p}"
                     for p in checks.backward_problems(mine, truth, yardstick, *inputs, head_dim=case.head_dim,
                                                       terms=(1, 1, alone, 1), **mask)]
    return problems


RUNNERS = {"attention": run_attention, "gluon": run_attention, "decode": run_decode, "varlen": run_varlen}


def launch_only(case: Case, seed: int, device) -> list:
    """The kernels of ``case`` alone, on poisoned outputs, with no reference computed (for
    compute-sanitizer, which should see nothing but the library's kernels): a problem only
    if an output holds NaN or inf."""
    _, _, outs = _launch(case, seed, device)
    return [f"{name}: not finite" for name, x in zip(GRADS, outs) if not bool(torch.isfinite(x).all())]


def run_case(case: Case, seed: int, device, *, check: bool = True) -> list:
    """The problems of one run (a crash is a problem too, with its message); ``check=False``
    launches the kernels alone (``launch_only``)."""
    try:
        return RUNNERS[case.kernel](case, seed, device) if check else launch_only(case, seed, device)
    except Exception as exc:  # noqa: BLE001 - a raised error is a failed run, reported with the rest
        return [f"raised {type(exc).__name__}: {exc}"]


def attention_class(seq_q: int, seq_k: int, dtype: str, causal: bool, runs: int, *, batch: int = 2,
                    heads: int = 8, groups=GROUPS, head_dims=HEAD_DIMS, dq_mode: str = "separate",
                    kernel: str = "attention", window=(-1, -1), softcap: float = 0.0, prefix: int = 0,
                    alibi: bool = False) -> list:
    """``runs`` cases of one class (lengths, dtype, mask), cycling through (group, head_dim)."""
    combos = list(itertools.product(groups, head_dims))
    return [Case(kernel, batch, heads, heads // g, seq_q, seq_k, d, causal, dtype, dq_mode,
                 window=tuple(window), softcap=softcap, prefix=prefix, alibi=alibi)
            for g, d in itertools.islice(itertools.cycle(combos), runs)]


#: (window, causal, softcap) of the mask classes: a window of one key, causal bands, a
#: band on both sides, one side unlimited either way, and the soft cap alone and in a band
MASKS = (((0, 0), False, 0.0), ((3, 0), True, 0.0), ((16, 8), False, 0.0), ((-1, 5), False, 0.0),
         ((70, -1), False, 0.0), ((-1, -1), False, 5.0), ((20, 0), True, 5.0))
MASK_LENGTH_PAIRS = ((1, 1), (17, 17), (65, 65), (17, 65), (65, 17), (129, 2))


#: the prefixes of the prefix-LM classes (causal): one key, a ragged tile's worth, past every length
PREFIXES = (1, 17, 200)

#: (window, causal, softcap) of the ALiBi classes: the bias alone (both sides of the
#: diagonal), under causal, and with a band and the soft cap (the cap first, then the bias)
ALIBI_MASKS = (((-1, -1), False, 0.0), ((-1, -1), True, 0.0), ((16, 8), False, 5.0))


def mask_name(window, causal: bool, softcap: float, prefix: int = 0, alibi: bool = False) -> str:
    """A mask class's name: ``window3,0-causal``, ``softcap5-full``, ``prefix17-causal``,
    ``alibi-causal``, ..."""
    parts = ([f"window{window[0]},{window[1]}"] if tuple(window) != (-1, -1) else []) + (
        [f"softcap{softcap:g}"] if softcap else []) + ([f"prefix{prefix}"] if prefix else []) + (
        ["alibi"] if alibi else [])
    return "-".join(parts + ["causal" if causal else "full"])


def decode_class(n_new: int, dtype: str, causal: bool, runs: int, *, batch: int = 3, heads: int = 8,
                 n_max: int = 300, groups=GROUPS, head_dims=HEAD_DIMS, page_size: int = 0, softcap: float = 0.0) -> list:
    """``runs`` decode cases with ``n_new`` new tokens, cycling through (group, head_dim);
    ``page_size``: on a paged cache; ``softcap``: with the soft cap."""
    combos = list(itertools.product(groups, head_dims))
    return [Case("decode", batch, heads, heads // g, n_new, n_max, d, causal, dtype, page_size=page_size,
                 softcap=softcap)
            for g, d in itertools.islice(itertools.cycle(combos), runs)]


def all_classes(kernels=KERNELS, runs: int = 60) -> list:
    """(name, cases) of every class the GPU stress test runs, for the kernels named: the
    Triton kernels in fp16, bf16 and fp32 at every length pair, causal or not (and atomic
    dQ at four ragged pairs), decode with 1 to 16 new tokens on ragged caches, and the
    Gluon forward at the lengths it takes."""
    found = []
    if "attention" in kernels:
        for dtype in ("fp16", "bf16"):
            for n_q, n_k in LENGTH_PAIRS:
                for causal in (False, True):
                    found.append((f"attention-{dtype}-{n_q}x{n_k}-{'causal' if causal else 'full'}",
                                  attention_class(n_q, n_k, dtype, causal, runs)))
        # float32 multiplies in IEEE precision (PyTorch's default), which compiles to long
        # FMA loops: for sm_90 on a 2-core CPU, the forward, dK/dV and dQ kernels took 6, 11
        # and 4 s at head_dim 16, 20, 73 and 25 s at 128, and 111, 249 and 98 s at 256. So
        # each length pair takes one head_dim (the pairs cycle through FP32_HEAD_DIMS), and
        # head_dim 256 in float32 is left to tests/test_kernels_gpu.py's single runs.
        for i, (n_q, n_k) in enumerate(LENGTH_PAIRS):
            d = FP32_HEAD_DIMS[i % len(FP32_HEAD_DIMS)]
            for causal in (False, True):
                found.append((f"attention-fp32-{n_q}x{n_k}-d{d}-{'causal' if causal else 'full'}",
                              attention_class(n_q, n_k, "fp32", causal, runs, head_dims=(d,))))
        for dtype in ("fp16", "bf16"):   # atomic dQ: the ragged lengths
            for n_q, n_k in ((1, 1), (17, 65), (65, 17), (129, 129)):
                found.append((f"attention-atomic-{dtype}-{n_q}x{n_k}-causal",
                              attention_class(n_q, n_k, dtype, True, runs, dq_mode="atomic")))
        for dtype in ("fp16", "bf16"):   # windows and the soft cap (chapter "One kernel, many masks")
            for n_q, n_k in MASK_LENGTH_PAIRS:
                for window, causal, cap in MASKS:
                    found.append((f"attention-{dtype}-{n_q}x{n_k}-{mask_name(window, causal, cap)}",
                                  attention_class(n_q, n_k, dtype, causal, runs, window=window, softcap=cap)))
                for prefix in PREFIXES:
                    found.append((f"attention-{dtype}-{n_q}x{n_k}-{mask_name((-1, -1), True, 0.0, prefix)}",
                                  attention_class(n_q, n_k, dtype, True, runs, prefix=prefix)))
                for window, causal, cap in ALIBI_MASKS:
                    found.append((f"attention-{dtype}-{n_q}x{n_k}-{mask_name(window, causal, cap, alibi=True)}",
                                  attention_class(n_q, n_k, dtype, causal, runs, window=window, softcap=cap,
                                                  alibi=True)))
    if "decode" in kernels:
        for dtype in ("fp16", "bf16", "fp32"):
            for n_new in NEW_TOKENS:
                for causal in (False, True):
                    found.append((f"decode-{dtype}-new{n_new}-{'causal' if causal else 'full'}",
                                  decode_class(n_new, dtype, causal, runs)))
        for dtype in ("fp16", "bf16"):   # a paged cache: vLLM's 16-token pages, and 64
            for page_size in (16, 64):
                for n_new in (1, 4):
                    found.append((f"decode-paged{page_size}-{dtype}-new{n_new}-causal",
                                  decode_class(n_new, dtype, True, runs, page_size=page_size)))
        for dtype in ("fp16", "bf16"):   # the soft cap (Gemma 2), dense and paged
            for page_size in (0, 16):
                for n_new in (1, 4):
                    paged = f"-paged{page_size}" if page_size else ""
                    found.append((f"decode{paged}-{dtype}-new{n_new}-softcap5-causal",
                                  decode_class(n_new, dtype, True, runs, page_size=page_size, softcap=5.0)))
    if "varlen" in kernels:   # packed documents: 4 of random lengths up to the longest
        for dtype in ("fp16", "bf16"):
            for longest in (17, 65, 129):
                for window, causal, cap in (((-1, -1), False, 0.0), ((-1, -1), True, 0.0)) + MASKS[1:3] + MASKS[-1:]:
                    found.append((f"varlen-{dtype}-max{longest}-{mask_name(window, causal, cap)}",
                                  attention_class(longest, longest, dtype, causal, runs, batch=4, kernel="varlen",
                                                  window=window, softcap=cap)))
                found.append((f"varlen-{dtype}-max{longest}-{mask_name((-1, -1), True, 0.0, alibi=True)}",
                              attention_class(longest, longest, dtype, True, runs, batch=4, kernel="varlen",
                                              alibi=True)))
            # the one-launch backward, forced: head_dims whose tile is 128 (the rule's), no GQA
            for longest in (65, 129):
                for window, causal, cap in (((-1, -1), True, 0.0), MASKS[-1]):
                    found.append((f"varlen-{dtype}-max{longest}-{mask_name(window, causal, cap)}-fused",
                                  [replace(c, fused=True) for c in attention_class(
                                      longest, longest, dtype, causal, runs, batch=4, kernel="varlen", groups=(1,),
                                      head_dims=(128, 80), window=window, softcap=cap)]))
    if "gluon" in kernels:
        for dtype in ("fp16", "bf16"):
            for n_q, n_k in GLUON_LENGTH_PAIRS:
                for causal in (False, True):
                    if causal and n_q > n_k:
                        continue
                    found.append((f"gluon-{dtype}-{n_q}x{n_k}-{'causal' if causal else 'full'}",
                                  attention_class(n_q, n_k, dtype, causal, runs, kernel="gluon",
                                                  head_dims=(64, 128))))
    return found


def run_class(name: str, cases, device, *, first_seed: int = 0, check: bool = True) -> ClassResult:
    """Every case of a class, seeds ``first_seed``, ``first_seed + 1``, ...: fresh inputs each."""
    result = ClassResult(name)
    for i, case in enumerate(cases):
        seed = first_seed + i
        problems = run_case(case, seed, device, check=check)
        result.runs += 1
        if problems:
            result.failures.append((case.label(), seed, problems))
    return result


def report(result: ClassResult, most: int = 5) -> str:
    """A failure message: how many runs failed, and the first few with their seeds."""
    lines = [f"{result.name}: {len(result.failures)} of {result.runs} runs failed"]
    for label, seed, problems in result.failures[:most]:
        lines.append(f"  {label} seed {seed}: " + "; ".join(problems))
    return "\n".join(lines)
