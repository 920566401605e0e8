"""Chapter 10's performance ladder: from a first, plain kernel to the library's.

Each rung changes one thing and keeps the result exact. A rung's kernel is the
library's own, ``forward._attn_fwd`` of chapter 7, compiled with some of the helpers
it calls swapped for a plain version (``swaps``): natural exp instead of exp2, every
key tile visited, every tile masked, the query tiles launched in order. So the
library's kernel carries no switches, and each rung differs from it only where its
``Features`` say. Below the tuning rung each rung also uses a small fixed tile
configuration. A reader with a GPU can run any rung with ``run_rung`` and time it.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import triton
import triton.language as tl

from .autograd import forward_with
from .configs import Config
from .forward import LOG2E, _attn_fwd, causal_bounds, fold_values, launch_position, load_tile, visible_keys


@dataclass(frozen=True)
class Features:
    """What the library's forward kernel does beyond the plain algorithm, one switch per rung.

    The library's kernel has all four; a rung with some switched off is still exact,
    only slower.
    """
    exp2: bool = True         # exp2 with log2(e) folded into the scale, instead of exp
    skip_masked: bool = True  # causal: never visit key tiles that no row of the tile sees
    split: bool = True        # mask only the diagonal and ragged tiles; the rest run unmasked
    heavy_first: bool = True  # causal: launch the query tiles with the most keys first


#: The tiles of a first kernel: what a tutorial would pick before measuring anything.
FIRST_CONFIG = Config(block_m=64, block_n=64, num_warps=4, num_stages=2)


@dataclass(frozen=True)
class Rung:
    name: str
    change: str                   # what this rung adds to the one before
    features: Features
    config: Config | None         # None: the library's own (measured) choice for the chip


RUNGS = (
    Rung("first kernel", "the FlashAttention-2 loop of chapter 7 with natural exp, every "
         "key tile visited and masked, 64x64 tiles, 4 warps, 2 stages",
         Features(exp2=False, skip_masked=False, split=False, heavy_first=False), FIRST_CONFIG),
    Rung("exp2", "exp2 with log2(e) folded into the scale: one ex2, without tl.exp's multiply and subnormal guard",
         Features(exp2=True, skip_masked=False, split=False, heavy_first=False), FIRST_CONFIG),
    Rung("skip masked tiles", "causal: key tiles that no row of the query tile may see are "
         "never loaded", Features(exp2=True, skip_masked=True, split=False, heavy_first=False),
         FIRST_CONFIG),
    Rung("unmasked main loop", "only the diagonal (and ragged) tiles pay for the mask",
         Features(exp2=True, skip_masked=True, split=True, heavy_first=False), FIRST_CONFIG),
    Rung("tuned tiles", "block sizes, warps and stages chosen by the measured sweep "
         "(the library's choice for the chip)",
         Features(exp2=True, skip_masked=True, split=True, heavy_first=False), None),
    Rung("heaviest first", "causal: the query tiles with the most keys are launched first, "
         "so no long program is left running alone at the end", Features(), None),
)


# ------------------------------------------------------------------ the plain versions
# Each rung is ``forward._attn_fwd`` with some of the helpers it calls swapped for
# the plain version below (same arguments, same results, slower).

@triton.jit
def in_launch_order(CAUSAL: tl.constexpr, HEAD_GROUP: tl.constexpr = 1, HEAVY_LAST: tl.constexpr = False):
    """Instead of ``query_tile_index``: program i takes query tile i, heavy or not."""
    pid_m, _ = launch_position(HEAD_GROUP)
    return pid_m


@triton.jit
def every_tile_masked(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr):
    """Instead of ``causal_bounds``: visit every key tile, each with the mask."""
    return 0, seq_k


@triton.jit
def visible_tiles_masked(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr):
    """Instead of ``causal_bounds``: skip the tiles no row sees, but mask all the others."""
    full_end, hi = causal_bounds(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    return 0, hi


@triton.jit
def every_tile_split(start_m, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr):
    """Instead of ``causal_bounds``: the unmasked main stage, then every other tile masked."""
    full_end, hi = causal_bounds(start_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    return full_end, seq_k


@triton.jit
def attend_natural(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn, rows, offs_n, offs_d,
                   seq_k, diagonal, lo, full_end, hi, qk_scale, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, WINDOW: tl.constexpr = False, first=0,
                   SOFTCAP: tl.constexpr = False, cap_scale=1.0, PREFIX: tl.constexpr = False,
                   prefix=0, ALIBI: tl.constexpr = False, ALIBI_SLOPES=None, alibi_head=0,
                   alibi_diagonal=0):  # attend's arguments, as a swap needs
    """Instead of ``attend``: natural exp, scores and maxima in natural units (``qk_scale``
    is the plain softmax scale here), and every key tile in [lo, hi) masked, whatever
    ``full_end`` says (the split into two stages came later, with exp2)."""
    tl.static_assert(not WINDOW and not SOFTCAP and not PREFIX and not ALIBI,
                     "the ladder's rungs know no window, cap, prefix or ALiBi")
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base, cols, stride_kn, seq_k, offs_d, HEAD_DIM, True, not EVEN_D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(visible_keys(rows, cols, seq_k, diagonal, CAUSAL), s, float("-inf"))
        # a row that has seen no key yet keeps 0 as its maximum, so -inf - max is never NaN
        new_max = tl.maximum(row_max, tl.max(s, 1))
        new_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        alpha = tl.exp(row_max - new_max)
        acc, row_sum = fold_values(acc, row_sum, tl.exp(s - new_max[:, None]), alpha, v_base, cols,
                                   stride_vn, seq_k, offs_d, HEAD_DIM, True, EVEN_D, DOT_PRECISION)
        row_max = new_max
    return acc, row_max * LOG2E, row_sum  # the maxima in log2 units, as normalised_rows wants them


_BOUNDS = {(False, False): every_tile_masked, (True, False): visible_tiles_masked,
           (False, True): every_tile_split, (True, True): causal_bounds}


def swaps(features: Features) -> dict:
    """The helpers of ``forward._attn_fwd`` that a kernel with ``features`` replaces."""
    out = {}
    if not features.exp2:
        out["attend"] = attend_natural
    if (features.skip_masked, features.split) != (True, True):
        out["causal_bounds"] = _BOUNDS[features.skip_masked, features.split]
    if not features.heavy_first:
        out["query_tile_index"] = in_launch_order
    return out


_kernels: dict = {}


def kernel_with(replaced: dict, constexprs: tuple = (), base=None):
    """``base`` (default ``forward._attn_fwd``; any ``@triton.jit`` kernel of the library,
    e.g. ``backward._bwd_dkdv``) compiled with the helpers named in ``replaced`` (name -> a
    ``@triton.jit`` function with the same arguments) in place of the library's, and
    with the run-time arguments named in ``constexprs`` (e.g. ``("seq_q", "seq_k")``)
    made compile-time constants, one compiled kernel per value (an experiment's knob).

    The same Python function, compiled against other globals: the kernel is the
    library's line for line, except for the helpers it calls. Built once per set.
    """
    base = _attn_fwd if base is None else base
    fn = base.fn
    kernel_name = fn.__name__
    unknown = set(replaced) - set(fn.__code__.co_names)
    if unknown:
        raise ValueError(f"{kernel_name} calls no helper named {sorted(unknown)}; it calls "
                         f"{sorted(n for n in fn.__code__.co_names if n in fn.__globals__)}")
    args = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    if set(constexprs) - set(args):
        raise ValueError(f"constexprs must name arguments of {kernel_name}, got {sorted(set(constexprs) - set(args))}")
    key = (id(base),) + tuple(sorted((name, id(f)) for name, f in replaced.items())) + tuple(sorted(constexprs))
    if not replaced and not constexprs:
        return base
    if key not in _kernels:
        plain = types.FunctionType(fn.__code__, dict(fn.__globals__, **replaced), fn.__name__,
                                   fn.__defaults__, fn.__closure__)
        for attr in ("__module__", "__qualname__", "__doc__", "__kwdefaults__"):
            setattr(plain, attr, getattr(fn, attr))
        # the annotations say which arguments are tl.constexpr: without them a GPU launch
        # would try to pass HEAD_DIM, CAUSAL, ... as run-time values
        plain.__annotations__ = dict(fn.__annotations__, **{name: tl.constexpr for name in constexprs})
        # specialised as the library compiles the base (a length of 1 gets forward.for_lengths'
        # unspecialised twin at launch): a rung compiled otherwise times something else
        free = [name for name in getattr(base, "do_not_specialize", ()) if name not in constexprs]
        _kernels[key] = (triton.jit(plain, do_not_specialize=free), replaced)   # keep the helpers alive with their id
    return _kernels[key][0]


def rung_kernel(features: Features):
    """The kernel of a rung: ``kernel_with(swaps(features))``."""
    if not isinstance(features, Features):
        raise TypeError(f"features must be a flashbook.kernels.ladder.Features, got {features!r}")
    return kernel_with(swaps(features))


def run_rung(rung: Rung, q, k, v, *, causal: bool = False, scale=None):
    """The forward pass (o, lse) as the kernel of ``rung`` computes it."""
    if not isinstance(rung, Rung):
        raise TypeError(f"rung must be one of flashbook.kernels.ladder.RUNGS, got {rung!r}")
    return forward_with(rung_kernel(rung.features), q, k, v, causal=causal, scale=scale,
                        config=rung.config, log2_scores=rung.features.exp2)
