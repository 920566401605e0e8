"""``flash_attention``: the Triton kernels wired into PyTorch's autograd (chapters 7 and 8).

    o = flash_attention(q, k, v, causal=True)      # q, k, v: (batch, heads, seq, head_dim)
    o.sum().backward()                              # runs the backward kernels

The forward kernel saves O and the natural-log ``lse`` of each row; the backward
recomputes the attention weights from them, tile by tile. Everything the kernels
assume is checked here, once, with an error that names the argument.

Precision: inputs may be float16, bfloat16 or float32; scores, softmax statistics
and every accumulator are float32. float32 inputs follow PyTorch's own switch for
its float32 matrix products, ``torch.set_float32_matmul_precision``: "highest"
(PyTorch's default) makes the kernels' products IEEE float32
(``input_precision="ieee"``, no tensor cores, much slower), "high" or "medium"
lets them use TF32 tensor cores (``input_precision="tf32"``, a 10-bit mantissa).
Measured on an H200 (unit-normal inputs, N = 1000, d = 64, causal): with TF32,
max errors 2.5e-3 (o) to 5.4e-3 (dv) against float64, 2 to 4 times those of
PyTorch's own math with TF32 matrix products (most likely because the conversion
to TF32 truncates instead of rounding, a bias that adds up along long sums); with
IEEE float32, within 2x the error of PyTorch's float32 SDPA.
``set_fp32_precision("ieee" | "tf32")`` overrides PyTorch's switch for these
kernels alone; ``set_fp32_precision(None)`` follows it again. The Triton
interpreter (no GPU) always computes in float32 and cannot run bfloat16, so
bfloat16 is refused there. float16 and bfloat16 inputs, on an H200, stay within
twice the error of PyTorch's FlashAttention (SDPA flash backend) against float64.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Callable

import torch
import triton

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # older Triton kept it beside the autotuner
    from triton.runtime.autotuner import OutOfResources

from .. import runtime
from . import configs
from .backward import _bwd_delta, _bwd_dkdv, _bwd_dq, _bwd_fused
from .configs import Config
from .forward import _attn_fwd, for_lengths
from .inputs import (DQ_MODES, check_arguments, check_inputs, check_shapes, is_empty, last_dim_contiguous,  # noqa: F401,E501
                     no_double_backward, _interpreter_problem)
from .launch import AttentionPlan, Launch, Plans, call_key
from .mask_args import LOG2E, alibi_args, keys_of, kernel_mask, masked_args, tiles_of, window_keys  # noqa: F401,E501 (re-exported)


_state = {
    "fp32_precision": None,  # None: follow torch.get_float32_matmul_precision()
    "autotune": os.environ.get("FLASHBOOK_AUTOTUNE", "0") not in ("", "0"),
    "poison": False,  # fill every buffer a kernel writes with NaN first (tests: a missed write shows)
    "head_group": None,  # forward.launch_position's HEAD_GROUP: None follows configs.head_group (an int: forced)
    "heavy_last": None,  # forward.query_tile_index's HEAVY_LAST: None follows heavy_last's rule (a bool: forced)
    "one_loop": None,  # the backward's ONE_LOOP: None follows one_loop's rule (a bool: forced)
    "fused_backward": None,  # one launch for dK/dV and dQ: None follows fuse_backward's rule (a bool: forced)
}


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """Inside this block every buffer the kernels write (outputs, lse, delta, gradients,
    split-K partials) starts as NaN instead of whatever ``torch.empty`` left there, so
    an element that no program writes shows as NaN rather than as a plausible stale
    value. The stress tests (``kernels.stress``) run under it. The flag is global, not
    per thread, because autograd runs the backward on a thread of its own."""
    before = _state["poison"]
    _state["poison"] = bool(enabled)
    try:
        yield
    finally:
        _state["poison"] = before


def new_buffer(shape, *, like: torch.Tensor | None = None, device=None, dtype=None) -> torch.Tensor:
    """A buffer a kernel will write: ``torch.empty_like(like)`` (its strides kept) or
    ``torch.empty(shape, device=, dtype=)``; NaN-filled under ``poisoned_outputs``."""
    x = torch.empty_like(like) if like is not None else torch.empty(shape, device=device, dtype=dtype)
    if _state["poison"] and x.is_floating_point():
        x.fill_(float("nan"))
    return x


def set_fp32_precision(precision: str | None) -> None:
    """Override how float32 inputs are multiplied on a GPU: ``"ieee"``, ``"tf32"`` or ``None``.

    ``None`` (the default) follows PyTorch's switch, as its own matmuls do:
    ``torch.set_float32_matmul_precision("highest")`` gives ``"ieee"``, "high" and
    "medium" give ``"tf32"``. ``"ieee"`` or ``"tf32"`` pins the kernels' choice
    whatever PyTorch's switch says. See the module docstring for the errors.
    """
    if precision not in ("tf32", "ieee", None):
        raise ValueError(f"precision must be 'tf32', 'ieee' or None (follow PyTorch), got {precision!r}")
    _state["fp32_precision"] = precision


def dot_precision(dtype: torch.dtype) -> str:
    """The ``input_precision`` the kernels' ``tl.dot`` get for inputs of ``dtype``.

    float16 and bfloat16 are multiplied exactly on tensor cores whatever this says
    ("tf32" is the neutral value there). float32: the override of
    ``set_fp32_precision``, else PyTorch's switch ("highest" -> "ieee").
    """
    if dtype != torch.float32:
        return "tf32"
    if _state["fp32_precision"] is not None:
        return _state["fp32_precision"]
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def set_autotune(enabled: bool) -> None:
    """Benchmark every kept configuration on first use of each shape class (GPU only).

    Off by default: the first call then costs one compilation per kernel rather
    than dozens. Also switched on by the environment variable FLASHBOOK_AUTOTUNE=1.
    On an H200 at head_dim 128 the tuning took 200-250 s per mask, and since each
    candidate is timed for only ~20 ms its forward pick was slower than the default
    (benchmarks/results/autotune_h200.json): the defaults are the better start.
    """
    _state["autotune"] = bool(enabled)
    forget_plans()


def forget_plans() -> None:
    """Forget every remembered call signature (``launch``): the next call of each checks and
    chooses again. Switching autotuning on or off does it."""
    for plans in _PLANS.values():
        plans.clear()


# ------------------------------------------------------------------ configurations

_chosen: dict[tuple, Config] = {}


def _cc(device: torch.device) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def _run(kernel: str, x: torch.Tensor, bd: int, causal: bool, key: tuple, launch: Callable[[Config], None],
         config: Config | None = None, window: bool = False) -> Config:
    """Launch ``kernel`` with a configuration, and return the one used.

    An explicit ``config`` is used as given. The interpreter uses its own small
    tiles. On a GPU: the first entry of the chip's preference list that launches
    (a Triton version may need a little more shared memory than the estimate,
    so a refusal moves on to the next entry), or, with autotuning on, the fastest
    of every kept candidate for this shape class.
    """
    configs.check_given(config, kernel)
    if config is None and (runtime.INTERPRET or x.device.type != "cuda"):
        config = configs.INTERPRETER[kernel]
    if config is not None:
        launch(config)
        return config
    cc, elem = _cc(x.device), x.element_size()
    # float32's dot precision is part of the key: IEEE and TF32 compile to different kernels
    dtype_key = (x.dtype, dot_precision(x.dtype)) if x.dtype == torch.float32 else x.dtype
    full_key = (kernel, cc, dtype_key, bd, causal, window) + (key if _state["autotune"] else ())
    if full_key in _chosen:
        launch(_chosen[full_key])
        return _chosen[full_key]
    if _state["autotune"]:
        from ..timing import time_ms  # the benchmarks' timer, with a short budget per candidate

        timings = {}
        for candidate in configs.kept_candidates(kernel, cc=cc, block_d=bd, elem_bytes=elem):
            try:
                timings[candidate] = time_ms(lambda: launch(candidate), warmup_ms=5, rep_ms=20)
            except OutOfResources:
                continue
        options = sorted(timings, key=timings.get)
    else:
        options = configs.preferred(kernel, cc=cc, block_d=bd, elem_bytes=elem, causal=causal, window=window)
    for candidate in options:
        try:
            launch(candidate)
        except OutOfResources:
            continue
        _chosen[full_key] = candidate
        return candidate
    configs.default(kernel, cc=cc, block_d=bd, elem_bytes=elem, causal=causal, window=window)  # the clear error
    raise RuntimeError(f"no configuration of {kernel} could be launched on sm_{cc} for head_dim tile {bd}")


def _seq_bucket(n: int) -> int:
    return triton.next_power_of_2(n)


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def head_group(device: torch.device, programs: int) -> int:
    """``HEAD_GROUP`` for a grid of ``programs`` on ``device`` (``configs.head_group``; 1 on
    the interpreter, or what ``_state["head_group"]`` forces)."""
    if _state["head_group"] is not None:
        return _state["head_group"]
    if device.type != "cuda":
        return 1
    return configs.head_group(programs, sms=_sms(device), cc=_cc(device))


def launch_shape(packed, side: str, heads: int, batch: int, length: int, block: int, extra: dict,
                 device: torch.device | None = None) -> tuple[tuple, dict]:
    """A kernel's grid and its keyword arguments beyond chapter 7's (``extra``: a window's and
    a soft cap's, ``kernel_mask``; empty without them). Usually (cdiv(length, block), batch *
    heads). Packed documents (``varlen.Packed``): a row per document at its longest length,
    (cdiv(max_seqlen, block), documents * heads), ``cu_seqlens`` and ``DOC_ORDER`` (heaviest
    first). ``side``: "q" or "k", whose length the grid walks. On ``device``, a small
    grid deals its programs out a few heads at a time (``head_group``: ``HEAD_GROUP``)."""
    if packed is None:
        grid = (triton.cdiv(length, block), batch * heads)
    else:
        longest = packed.max_seqlen_q if side == "q" else packed.max_seqlen_k
        grid = (triton.cdiv(longest, block), packed.documents * heads)
        extra = dict(extra, CU_SEQLENS_Q=packed.cu_seqlens_q, CU_SEQLENS_K=packed.cu_seqlens_k, VARLEN=True,
                     **({} if packed.order is None else {"DOC_ORDER": packed.order}))
    group = 1 if device is None else head_group(device, grid[0] * grid[1])
    if group != 1:
        extra = dict(extra, HEAD_GROUP=group)
    return grid, extra


def heavy_last(extra: dict, seq_k: int) -> dict:
    """``HEAVY_LAST`` for the query-side kernels (forward and dQ; ``forward.query_tile_index``),
    as a keyword argument to add to their launch: {} or {"HEAVY_LAST": True}.

    Under a sliding window whose right side is limited, the first query tiles see fewer keys (the
    window is cut at key 0) and all later ones the same number, so the last tiles start first, as
    the causal mask's do: with the plain order the heaviest programs started last and ran on
    alone (recorded run ``window_order``: at batch 1 x 16 heads, N = 4K, the forward of a window as
    long as the sequence took 0.206 ms in the plain order, 0.166 ms last first and 0.160 ms as the
    causal mask). ``extra`` is ``kernel_mask``'s; a window with no
    right limit (``last`` past every key) keeps the plain order, as its first tiles are the
    heavy ones. The dK/dV kernel needs nothing: its first key tiles are the heavy ones under
    every right-limited mask. ``_state["heavy_last"]`` forces True or False (experiments)."""
    if "WINDOW" not in extra:
        return {}
    forced = _state["heavy_last"]
    return {"HEAVY_LAST": True} if (extra["last"] < seq_k if forced is None else forced) else {}


def one_loop(short_window: bool) -> dict:
    """``ONE_LOOP`` for the backward's kernels, as a keyword argument to add to their launch: {}
    or {"ONE_LOOP": True}.

    The dK/dV and dQ kernels walk a program's tiles in three pipelined loops (a masked band, the
    whole tiles, the masked far edge), and each loop starts by waiting for its first loads. A
    short sliding window (``short_window``: not ``configs.long_window``, rows of fewer than
    ``configs.LONG_WINDOW`` keys) leaves each program a few tiles, and one masked loop over all
    of them was faster, with the same sums in the same order (recorded run ``one_loop``: at
    W = 1K the backward took 2.6-6.1% less time at d = 128 from N = 4K to 32K, 12.4% less at
    d = 64, 0.5% with a soft cap; with a 4K window, the causal mask or packed documents, whose
    programs keep more whole tiles, 6.5-12.6% more). ``_state["one_loop"]`` forces True or
    False (experiments; forget the plans after)."""
    forced = _state["one_loop"]
    return {"ONE_LOOP": True} if (short_window if forced is None else forced) else {}


def fuse_backward(packed: bool, device: torch.device, block_d: int) -> bool:
    """Whether the backward launches its dK/dV and dQ programs as one grid (``backward._bwd_fused``)
    where the two kernels' grids match and neither deals heads out in groups (``HEAD_GROUP``).
    On an H200 that took 1.8-9.2% off the backward of packed documents (``packed``) at d = 128
    from 8K to 32K tokens, bitwise the same gradients; under the causal mask at 16K it added 4.4%
    (recorded run ``fused_bwd``). So: packed documents on sm_90 with the head_dim tile measured,
    ``block_d`` 128. ``_state["fused_backward"]`` forces True or False (experiments; forget the
    plans after)."""
    forced = _state["fused_backward"]
    if forced is not None:
        return forced
    return packed and block_d == 128 and device.type == "cuda" and _cc(device) == 90


# ------------------------------------------------------------------ forward / backward

# A call signature seen before launches from its plan (``launch``): no checks, no Triton binding.
_PLANS = {"forward": Plans(), "backward": Plans()}
_EXTRA_TENSORS = (("ALIBI_SLOPES", "alibi"), ("CU_SEQLENS_Q", "cu_q"), ("CU_SEQLENS_K", "cu_k"), ("DOC_ORDER", "order"))


def _plan_key(side: str, kernel, tensors, packed, configs_given, *flags):
    """The signature of a forward or backward call (``launch.call_key``), or None: autotuning on
    (it may choose again), or a call that must take the checked path."""
    if _state["autotune"]:
        return None
    more = () if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k, packed.order)   # order: None or not
    q = tensors[0]
    precision = dot_precision(q.dtype) if isinstance(q, torch.Tensor) else None
    sizes = (None,) if packed is None else (packed.max_seqlen_q, packed.max_seqlen_k)
    key = call_key(tuple(tensors) + more, flags + sizes + (precision,))
    return None if key is None else (side, kernel, configs_given) + key


def _extras(alibi_slopes, packed) -> dict:
    """The tensors a plan takes beyond q, k, v (and o, lse, do): the slopes, the cu_seqlens."""
    out = {} if alibi_slopes is None else {"alibi": alibi_slopes}
    if packed is not None:
        out.update(cu_q=packed.cu_seqlens_q, cu_k=packed.cu_seqlens_k, order=packed.order)
    return out


def _launch(kernel, grid, args, kwargs, names) -> tuple[Launch, tuple]:
    """A launch whose first ``len(names)`` positional arguments are the tensors ``names``, and
    the keyword tensors of ``_EXTRA_TENSORS`` among ``kwargs``; run once, as Triton binds it."""
    extra = [(kw, name) for kw, name in _EXTRA_TENSORS if kw in kwargs]
    tensors = (*args[:len(names)], *(kwargs[kw] for kw, _ in extra))
    run = Launch(kernel, grid, args, kwargs, list(range(len(names))) + [kw for kw, _ in extra])
    run(*tensors)
    return run, tuple(names) + tuple(name for _, name in extra)


def _as_given(pairs, alibi_slopes) -> bool:
    """Whether the kernels read each input as it was passed (no contiguous copy, no cast), so
    that a plan can hand them the next call's tensors directly."""
    return all(a is b for a, b in pairs) and (alibi_slopes is None or alibi_slopes.is_contiguous())


def flash_forward(q, k, v, *, causal: bool = False, scale=None, config: Config | None = None,
                  window=None, softcap=None, packed=None, prefix=0, alibi_slopes=None):
    """Run the forward kernel: returns (o, lse), lse float32 of shape (batch, heads, seq_q).

    ``lse`` is the natural-log logsumexp of each scaled score row (-inf for a row
    that sees no key). No autograd: ``flash_attention`` is the differentiable entry.
    ``config`` overrides the block sizes (see ``configs``). ``window`` and ``softcap``:
    see ``kernel_mask``. ``packed``: q, k, v are (1, heads, total, head_dim) views of
    documents packed along one sequence (``varlen.flash_attention_varlen``). ``alibi_slopes``:
    ``alibi_args``; lse is then that of the biased scores (flash-attn's causal kernels add
    slope * j instead, which moves each row's lse by slope * (i + seq_k - seq_q), not o).
    """
    return forward_with(_attn_fwd, q, k, v, causal=causal, scale=scale, config=config, window=window,
                        softcap=softcap, packed=packed, prefix=prefix, alibi_slopes=alibi_slopes)


def forward_with(kernel, q, k, v, *, causal: bool = False, scale=None, config: Config | None = None,
                 log2_scores: bool = True, window=None, softcap=None, packed=None, prefix=0, alibi_slopes=None):
    """``flash_forward`` with another kernel that takes ``_attn_fwd``'s arguments
    (chapter 10's rungs, ``ladder.rung_kernel``). ``log2_scores``: the kernel wants
    the scale times log2(e) (exp2); False passes the plain scale (natural exp).
    """
    key = _plan_key("forward", kernel, (q, k, v, alibi_slopes), packed, config, causal, scale, log2_scores,
                    window, softcap, prefix)
    plan = _PLANS["forward"].get(key) if key is not None else None
    if plan is not None:
        return plan.run(new_buffer, q=q, k=k, v=v, **_extras(alibi_slopes, packed))
    given = (q, k, v)
    scale = check_inputs(q, k, v, causal, scale)
    if is_empty(q, k):   # nothing to attend to, or nobody attending: zeros and lse -inf, no launch
        return (torch.zeros_like(q), torch.full(q.shape[:3], float("-inf"), device=q.device, dtype=torch.float32))
    q, k, v = (last_dim_contiguous(x) for x in (q, k, v))
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    causal_given, (causal, qk_scale, extra) = causal, kernel_mask(causal, window, softcap, seq_q, seq_k, scale,
                                                                  diagonal=0 if packed is not None else None, prefix=prefix)
    extra.update(alibi_args(alibi_slopes, q, None if packed is None else packed.documents))
    if (extra or packed is not None) and kernel is not _attn_fwd:
        raise ValueError("window, softcap, prefix, alibi_slopes and packed documents need the library's forward "
                         "kernel (forward._attn_fwd)")
    if not log2_scores:
        qk_scale = scale
    bd = configs.block_d(head_dim)
    o = new_buffer(None, like=q)
    lse = new_buffer((batch, heads, seq_q), device=q.device, dtype=torch.float32)
    precision = dot_precision(q.dtype)
    kernel = for_lengths(kernel, (seq_q, seq_k))   # a length of 1: the unspecialised twin (forward.LENGTH_ARGS)

    made = []

    def launch(cfg: Config):
        grid, later = launch_shape(packed, "q", heads, batch, seq_q, cfg.block_m, extra, q.device)   # later: masks, documents
        later = dict(later, **heavy_last(extra, seq_k))   # not in place: later may be extra itself
        made[:] = [_launch(kernel, grid, [
            q, k, v, o, lse,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            o.stride(0), o.stride(1), o.stride(2),
            heads, heads // kv_heads, seq_q, seq_k, qk_scale], dict(
            HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=causal, DOT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **later),
            ("q", "k", "v", "o", "lse"))]

    tiles_causal, tiles_window = tiles_of(causal, causal_given, window, extra, bd)   # a short window's own tiles
    _run("forward", q, bd, tiles_causal, (_seq_bucket(seq_q), _seq_bucket(seq_k)), launch, config, window=tiles_window)
    if key is not None and _as_given(zip(given, (q, k, v)), alibi_slopes):
        _PLANS["forward"].remember(key, AttentionPlan([("o", "q"), ("lse", (batch, heads, seq_q))], made, ("o", "lse")))
    return o, lse


def flash_backward(q, k, v, o, lse, do, *, causal: bool = False, scale=None, dq_mode: str = "separate",
             config_dkdv: Config | None = None, config_dq: Config | None = None, window=None, softcap=None,
             packed=None, prefix=0, alibi_slopes=None):
    """Run the backward kernels: returns (dq, dk, dv) for upstream gradient ``do``.

    ``dq_mode="separate"`` (default) computes dQ in its own kernel: deterministic.
    ``dq_mode="atomic"`` adds dQ into an fp32 buffer with atomics from the dK/dV
    kernel: one kernel fewer, but the summation order, and so the last bits of
    dQ, may change between runs on a GPU. The adds are relaxed (an H200 ran the backward
    2.0-3.7x faster than with Triton's default acq_rel, benchmarks/results/atomic_dq_h200),
    and it is still 1.08-1.86x slower than the separate mode there. It uses the dK/dV tiles
    chosen for the separate mode; on sm_90 at head_dim 128 without a mask those are 64 x 64,
    which doubles the atomic traffic: 12.2 ms against 7.7 ms with 64 x 128 tiles at batch 8,
    N = 4096 (the same run). ``window``, ``softcap``, ``prefix`` and
    ``alibi_slopes`` must be the forward's (``kernel_mask``, ``alibi_args``), and ``packed`` too.
    """
    signature = _plan_key("backward", None, (q, k, v, o, lse, do, alibi_slopes), packed, (config_dkdv, config_dq),
                          causal, scale, dq_mode, window, softcap, prefix)
    plan = _PLANS["backward"].get(signature) if signature is not None else None
    if plan is not None:
        return plan.run(new_buffer, q=q, k=k, v=v, o=o, lse=lse, do=do, **_extras(alibi_slopes, packed))
    given, given_do = (q, k, v, o, lse), do
    scale = check_inputs(q, k, v, causal, scale, dq_mode)
    for name, x, like in (("o", o, q), ("do", do, q)):
        if not isinstance(x, torch.Tensor) or x.shape != like.shape:
            raise ValueError(f"{name} must be a tensor of shape {tuple(like.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    # lse is read with the row index alone: a wrong shape, dtype or layout would read
    # the wrong rows (or past the end) without any error from the kernels.
    lse_shape = q.shape[:3]
    if not isinstance(lse, torch.Tensor) or lse.shape != lse_shape:
        raise ValueError(f"lse must be a tensor of shape {tuple(lse_shape)} (batch, heads, seq_q), "
                         f"got {tuple(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__}")
    if lse.dtype != torch.float32 or lse.device != q.device:
        raise TypeError(f"lse must be float32 on {q.device} (as flash_forward returns it), "
                        f"got {lse.dtype} on {lse.device}")
    if is_empty(q, k):   # no score exists, so every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q, k, v, o, do = (last_dim_contiguous(x) for x in (q, k, v, o, do))
    do = do.to(q.dtype)
    lse = lse.contiguous()
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    bd = configs.block_d(head_dim)
    precision = dot_precision(q.dtype)
    causal_given = causal
    causal, qk_scale, extra = kernel_mask(causal, window, softcap, seq_q, seq_k, scale,
                                          diagonal=0 if packed is not None else None, prefix=prefix)
    extra.update(alibi_args(alibi_slopes, q, None if packed is None else packed.documents))

    # a length of 1 launches each kernel's twin that takes the lengths as run-time values
    # (forward.LENGTH_ARGS says why); new_buffer is torch.empty, NaN-filled in the stress tests
    delta_kernel = for_lengths(_bwd_delta, (seq_q,), ("seq_q",))
    dkdv_kernel, dq_kernel, fused_kernel = (for_lengths(kernel, (seq_q, seq_k)) for kernel in (_bwd_dkdv, _bwd_dq, _bwd_fused))
    delta = new_buffer(None, like=lse)
    block = 64 if runtime.device() == "cuda" else 32
    made = {"delta": _launch(delta_kernel, (triton.cdiv(seq_q, block), batch * heads), [
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        heads, seq_q], dict(HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=block), ("o", "do", "delta"))}

    dk = new_buffer(None, like=k)
    dv = new_buffer(None, like=v)
    atomic = dq_mode == "atomic"
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if atomic else new_buffer(None, like=q)
    key = (group, _seq_bucket(seq_q), _seq_bucket(seq_k))

    # autotuning times each kernel's launches on their own, so it keeps two launches
    fuse, pending = fuse_backward(packed is not None, q.device, bd) and not (atomic or _state["autotune"]), {}
    dkdv_names = ("q", "k", "v", "do", "lse", "delta", "dk", "dv", "dq")

    def launch_dkdv(cfg: Config):
        if atomic:
            dq.zero_()
        grid, later = launch_shape(packed, "k", kv_heads, batch, seq_k, cfg.block_n, extra, q.device)
        pending["dkdv"] = (grid, [
            q, k, v, do, lse, delta, dk, dv, dq,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            heads, kv_heads, group, seq_q, seq_k, qk_scale, scale], dict(
            HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=causal, ATOMIC_DQ=atomic, DOT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **later, **loops))
        if not fuse or "HEAD_GROUP" in later:
            made["dkdv"] = _launch(dkdv_kernel, *pending.pop("dkdv"), dkdv_names)
        # else its programs are launched with the dQ kernel's, in one grid (fuse_backward)

    def launch_dq(cfg: Config):
        grid, later = launch_shape(packed, "q", heads, batch, seq_q, cfg.block_m, extra, q.device)
        order = heavy_last(extra, seq_k)
        later = dict(later, **order, **loops)   # not in place: later may be extra itself
        if "dkdv" in pending:   # kept until it launched: a launch that does not fit tries the next dQ tiles
            fused_grid, fused_args, fused_kw = pending["dkdv"]
            if fused_grid == grid and "HEAD_GROUP" not in later:
                made["dkdv"] = _launch(fused_kernel, (2 * grid[0], grid[1]), fused_args, dict(
                    fused_kw, BLOCK_M2=cfg.block_m, BLOCK_N2=cfg.block_n, **order), dkdv_names)
                del pending["dkdv"]
                made["dq"] = None
                return
            made["dkdv"] = _launch(dkdv_kernel, *pending["dkdv"], dkdv_names)
            del pending["dkdv"]
        made["dq"] = _launch(dq_kernel, grid, [
            q, k, v, do, lse, delta, dq,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            heads, group, seq_q, seq_k, qk_scale, scale], dict(
            HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            CAUSAL=causal, DOT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **later), ("q", "k", "v", "do", "lse", "delta", "dq"))

    keys = keys_of(causal_given, window, extra)   # a short window: one loop a program (read by the launches above)
    tiles_causal, tiles_window = configs.tiles_for(causal, keys, bd)   # a long window: causal's (above d = 64)
    loops = one_loop(keys is not None and not configs.long_window(keys))
    _run("backward_dkdv", q, bd, tiles_causal, key + (atomic,), launch_dkdv, config_dkdv, window=tiles_window)
    if atomic:
        # the atomics added unscaled dS K: scale once here, then cast to the input dtype
        dq = dq.mul_(scale).to(q.dtype)
    else:
        _run("backward_dq", q, bd, tiles_causal, key, launch_dq, config_dq, window=tiles_window)
        # dO may have been copied or cast (o.sum()'s is a stride-0 view): the plan does the same
        if signature is not None and _as_given(zip(given, (q, k, v, o, lse)), alibi_slopes):
            dtype = q.dtype
            _PLANS["backward"].remember(signature, AttentionPlan(
                [("delta", "lse"), ("dk", "k"), ("dv", "v"), ("dq", "q")],
                [made[name] for name in ("delta", "dkdv", "dq") if made[name] is not None], ("dq", "dk", "dv"),
                prepare=None if do is given_do else {"do": lambda x: last_dim_contiguous(x).to(dtype)}))
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Forward saves (q, k, v, o, lse); backward recomputes P from them tile by tile, once: no double backward.

    ``forward`` computes (o, lse): ``flash_forward`` unless another kernel is given (chapter 10's
    Gluon kernel, ``hopper.gluon_forward``); the backward is the same whichever kernel ran forward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, dq_mode, forward=None, window=None, softcap=None, packed=None,
                prefix=0, alibi_slopes=None):
        masked = masked_args(window, softcap, packed, prefix, alibi_slopes)
        o, lse = (forward or flash_forward)(q, k, v, causal=causal, scale=scale, **masked)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.dq_mode, ctx.masked = causal, scale, dq_mode, masked
        return o

    @staticmethod
    def backward(ctx, do):
        no_double_backward()
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, causal=ctx.causal, scale=ctx.scale,
                                    dq_mode=ctx.dq_mode, **ctx.masked)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def flash_attention(q, k, v, *, causal: bool = False, scale=None, dq_mode: str = "separate",
                    window=None, softcap=None, prefix=0, alibi_slopes=None):
    """softmax(scale * q k^T) v with the Triton kernels of chapters 7 and 8; differentiable.

    This is ``flashbook.flash_attention(..., backend="triton")``; the front door
    (``dispatch.flash_attention``) also knows the Hopper forward.

    Args:
        q: (batch, heads, seq_q, head_dim) float16, bfloat16 or float32.
        k, v: (batch, kv_heads, seq_k, head_dim), same dtype and device; kv_heads must
            divide heads (grouped-query / multi-query attention). Any strides: a
            (batch, seq, heads, head_dim) tensor passed as ``x.transpose(1, 2)`` is
            used without a copy.
        causal: query i sees key j only when j <= i + seq_k - seq_q (the diagonal
            aligned to the bottom-right corner). Rows that see no key give zeros.
        scale: multiplies the scores; None means 1/sqrt(head_dim).
        dq_mode: ``"separate"`` (deterministic dQ kernel) or ``"atomic"`` (dQ added
            with atomics inside the dK/dV kernel; chapter 8 compares the two).
        window: ``(left, right)``, flash-attn's sliding window: query i sees key j when
            i + d - left <= j <= i + d + right (d = seq_k - seq_q); -1 is no limit; with
            ``causal=True`` right is 0. Key tiles outside every row's window are skipped.
        softcap: ``c > 0`` replaces each scaled score s by c * tanh(s / c) (Gemma 2's
            logit soft-capping), in the forward and its gradient; None is off.
        prefix: ``p > 0`` with ``causal=True`` (prefix-LM): the first p keys are seen by
            every query as well, a bidirectional prompt before causal generation.
        alibi_slopes: flash-attn's ALiBi, float32 (heads,) or (batch, heads) on q's device:
            the score of query i and key j gets -slope * |i + seq_k - seq_q - j| added (after
            the soft cap, as flash-attn). No gradient flows to the slopes.

    Returns:
        o with q's shape, dtype and memory layout.

    Precision: float32 accumulation for every dtype; float32 inputs follow
    PyTorch's ``torch.get_float32_matmul_precision()``: IEEE float32 products for
    "highest" (its default), TF32 for "high"/"medium"; ``set_fp32_precision``
    overrides it (module docstring: the errors measured with each). head_dim up to 256: sizes that
    are not a power of two are padded on chip and masked. bfloat16 needs a GPU.
    """
    check_inputs(q, k, v, causal, scale, dq_mode)
    kernel_mask(causal, window, softcap, 1, 1, 1.0, prefix=prefix)   # the mask's arguments, checked
    alibi_args(alibi_slopes, q)
    return FlashAttention.apply(q, k, v, causal, scale, dq_mode, None, window, softcap, None, prefix, alibi_slopes)
