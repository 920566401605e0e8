"""Block sizes, warps and pipeline stages for each kernel, per chip and head_dim (chapter 9).

A kernel configuration is four numbers:

* ``block_m`` (B_r), the query rows in a tile, and ``block_n`` (B_c), the key rows;
* ``num_warps``, the warps (32 threads each) that share one program;
* ``num_stages``, how many tiles deep Triton pipelines the loads of the inner loop.

They must fit the chip: each stage of the pipeline holds a K and a V tile (or a Q
and a dO tile) in shared memory, so ``smem_estimate`` adds up the tiles a kernel
keeps there (``flashbook.smem``: the model the chapters use too), and ``keep`` drops
every configuration that cannot fit, or that makes no sense. ``default`` picks, for a
chip and a head_dim, the first configuration of a short preference list that ``keep``
allows; ``candidates`` lists what an autotuner may try instead
(``flashbook.kernels.set_autotune(True)``).

The compile-target tests compile every default for sm_75 (T4), sm_80 (A100) and
sm_90 (H100/H200) and check that the shared memory Triton really allocates
(``compiled.metadata.shared``) stays within each chip's limit.
"""
from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass

from .. import runtime, smem
from ..smem import KERNELS  # noqa: F401  (the kernels that take a configuration)

#: head_dim is padded up to one of these (``smem.TILE_DS``: powers of two, >= 16 for the
#: tensor cores).
BLOCK_DS = smem.TILE_DS
MAX_HEAD_DIM = BLOCK_DS[-1]


@dataclass(frozen=True)
class Config:
    block_m: int     # query rows per tile (B_r)
    block_n: int     # key rows per tile (B_c)
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        # tl.arange takes power-of-two lengths: a bad tile would compute garbage or fail deep in Triton
        # (the Gluon kernel, whose 192-row tiles are three warpgroups, takes its sizes as arguments)
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1 or value & (value - 1):
                raise ValueError(f"Config.{name} must be a power of two >= 1, got {value!r}")
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, numbers.Integral) or self.num_stages < 1:
            raise ValueError(f"Config.num_stages must be an int >= 1, got {self.num_stages!r}")

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-w{self.num_warps}-s{self.num_stages}"


#: The argument that gives each kernel's configuration (``flash_forward``'s, ``flash_backward``'s two).
CONFIG_ARGS = {"forward": "config", "backward_dkdv": "config_dkdv", "backward_dq": "config_dq"}


def check_given(config, kernel: str) -> None:
    """A configuration passed by hand must be a ``Config``: a tuple would fail later, inside a launch."""
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"{CONFIG_ARGS.get(kernel, 'config')} must be a flashbook.kernels.Config(block_m, block_n, "
                        f"num_warps, num_stages), got {config!r}")


def block_d(head_dim: int) -> int:
    """head_dim rounded up to the tile width the kernels use (loads are masked past head_dim)."""
    return smem.tile_d(head_dim, "head_dim")


# ------------------------------------------------------------------ what fits

def smem_estimate(kernel: str, config: Config, block_d: int, elem_bytes: int, cc: int = 80) -> int:
    """Bytes of shared memory a configuration needs, roughly (chapter 9's explorer shows it).

    The book's one model of it, ``flashbook.smem.smem_bytes`` (``tiled.smem_bytes`` in
    chapters 4 and 6): per kernel, the tile that stays resident plus, per pipeline stage,
    the tiles that stream (forward and dQ: the query side stays, K and V stream; dK/dV:
    K and V stay, Q and dO stream); below sm_80, fp32 operand tiles and no pipeline.
    """
    return smem.smem_bytes(config.block_m, config.block_n, block_d, num_stages=config.num_stages,
                           dtype_bytes=elem_bytes, arch=f"sm_{cc}", kernel=kernel)


def keep(kernel: str, config: Config, *, cc: int, block_d: int, elem_bytes: int,
         limit_bytes: int | None = None) -> bool:
    """Whether a configuration makes sense for this kernel, head_dim and chip.

    ``limit_bytes``: shared memory one program may use (default ``smem_limit(cc)``)."""
    bm, bn, warps = config.block_m, config.block_n, config.num_warps
    limit = limit_bytes if limit_bytes is not None else smem_limit(cc)
    if smem_estimate(kernel, config, block_d, elem_bytes, cc) > limit:
        return False
    if config == Config(16, 16, 4, 1):  # the last resort: small, always worth keeping
        return True
    # the fp32 accumulator tiles live in registers: (rows x block_d) per program,
    # spread over the warps; beyond ~128 fp32 values per thread they spill
    acc_rows = bn if kernel == "backward_dkdv" else bm
    acc_tiles = 2 if kernel == "backward_dkdv" else 1
    if acc_tiles * acc_rows * block_d > 128 * 32 * warps:
        return False
    # a tensor-core warp computes 16 rows of a tile: more warps than rows leaves some idle
    if cc >= 80 and warps * 16 > max(bm, bn) * 2:
        return False
    return True


def candidates(kernel: str) -> list[Config]:
    """Every configuration an autotuner may try for ``kernel`` (before ``keep``)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return [Config(bm, bn, w, s)
            for bm, bn, w, s in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (1, 2, 3, 4))]


# ------------------------------------------------------------------ the chips

_CC_SMEM = {int(c.arch.removeprefix("sm_")): c.smem_per_block_bytes for c in runtime.CHIPS.values()}


def smem_limit(cc: int) -> int:
    """Shared memory one program may use on compute capability ``cc`` (75, 80, 90...)."""
    if cc in _CC_SMEM:
        return _CC_SMEM[cc]
    if runtime.HAS_CUDA:  # a chip the book has no facts about: ask the driver
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(
            triton.runtime.driver.active.get_current_device())
        return int(props["max_shared_mem"])
    return min(_CC_SMEM.values())


# Each entry is (largest head_dim tile it is meant for, configuration), or with a
# third element, the masks it is meant for ("full" or "causal"); the first entry
# that admits the head_dim and the mask, and that `keep` allows, is the default.
# sm_90, measured on an H200 in bf16:
# * forward and dQ: 128 x 64 tiles with 8 warps lead at head_dim 64 and 128
#   (benchmarks/results/gpu_tests_h200.json, N = 4096); the dQ kernel takes a fourth
#   pipeline stage at head_dim 128;
# * dK/dV: 64 x 64 with 4 warps at head_dim 64; at 128, 64 x 64 with 4 warps and
#   2 stages without a mask (two programs share a multiprocessor), 64 x 128 with
#   8 warps under the causal mask (benchmarks/results/backward_pairs_h200.json:
#   7-10% and 5-8% faster backward passes than the one configuration for both);
# * dQ under a sliding window at head_dim 128: 64 x 64 with 4 warps and 2 stages, the
#   short key loops of many small programs (benchmarks/results/masks_h200-2/profile_2_plans.json:
#   the backward at N = 16K, W = 1K took 1.136 ms against 1.196 ms with the causal choice;
#   profile_3_dq_window_ab.json: 3-4% at 4K, no difference at 32K with W = 4K).
# * a sliding window of at least LONG_WINDOW keys takes the causal mask's dK/dV and dQ tiles,
#   a shorter one the window's dQ entry and the unmasked dK/dV entry (``tiles_for``):
#   benchmarks/results/window_order_h200/run2_tiles_sweep.json, medians of three repeats, bf16,
#   B 1 x H 16: with W = 4K (N = 4K, 8K, 16K) the short window's tiles took the backward
#   1.8-2.3% (dK/dV) and 2.6-4.0% (dQ) longer than the causal choices, with W = 1K (8K, 32K) the
#   causal choices took 1.1-1.9% (dK/dV) and 1.4-4.5% (dQ) longer (``bench.chapter12``). Each gap
#   is about the repeats' spread, its sign the same at every length.
# * the forward under a short sliding window (``tiles_for``) at head_dim up to 128: 64 x 64 with
#   4 warps and 3 stages, the rows' short key loops in programs half as tall
#   (benchmarks/results/masks_h200-5: with W = 1K the forward took 0.419 against 0.585 ms at
#   d = 64, N = 16K and 0.360 against 0.414 ms at d = 128, N = 16K, best of 24 and 20 tile choices;
#   against FlexAttention the d = 64 forward went from 0.81-0.88x (4K, 16K, 32K; 1.36x at 8K) to
#   1.07-1.15x at 4K-32K, and at
#   d = 128 from 1.05-1.09x to 1.12-1.21x at 8K-32K).
# sm_80 follows the same shapes with the A100's smaller shared memory; sm_75 (T4)
# has 64 KiB and no tensor-core path in Triton.
ANY = BLOCK_DS[-1]
MASKS = ("full", "causal", "window")
_PREFERRED: dict[str, dict[str, list[tuple]]] = {
    "sm_90": {
        "forward": [(128, Config(64, 64, 4, 3), "window"),
                    (ANY, Config(128, 64, 8, 3)), (ANY, Config(128, 64, 8, 2)), (ANY, Config(64, 64, 4, 3)),
                    (ANY, Config(64, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
        "backward_dkdv": [(64, Config(64, 64, 4, 3)), (ANY, Config(64, 64, 4, 2), "full"),
                          (ANY, Config(64, 128, 8, 3)), (ANY, Config(64, 128, 8, 2)),
                          (ANY, Config(32, 64, 4, 3)), (ANY, Config(32, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
        "backward_dq": [(64, Config(128, 64, 8, 3)), (128, Config(64, 64, 4, 2), "window"),
                        (ANY, Config(128, 64, 8, 4)), (ANY, Config(128, 64, 8, 3)),
                        (ANY, Config(128, 64, 8, 2)), (ANY, Config(64, 64, 4, 3)),
                        (ANY, Config(64, 32, 4, 2)), (ANY, Config(32, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
    },
    "sm_80": {
        "forward": [(ANY, Config(128, 64, 4, 3)), (ANY, Config(128, 32, 8, 2)), (ANY, Config(64, 64, 4, 2)),
                    (ANY, Config(64, 32, 4, 2)), (ANY, Config(32, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
        "backward_dkdv": [(64, Config(64, 64, 4, 3)), (ANY, Config(32, 128, 8, 2)), (ANY, Config(32, 64, 4, 2)),
                          (ANY, Config(32, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
        "backward_dq": [(ANY, Config(128, 64, 8, 2)), (ANY, Config(128, 32, 8, 2)), (ANY, Config(64, 32, 4, 2)),
                        (ANY, Config(32, 32, 4, 2)), (ANY, Config(32, 32, 4, 1))],
    },
    "sm_75": {
        # Triton (since 3.2) has no tensor-core path below sm_80: tl.dot becomes FMAs
        # whose operands go through shared memory. Small tiles, 8 warps to share the
        # arithmetic, no pipelining (there are no asynchronous copies either).
        "forward": [(ANY, Config(64, 32, 8, 1)), (ANY, Config(32, 32, 8, 1))],
        "backward_dkdv": [(ANY, Config(32, 32, 8, 1)), (ANY, Config(16, 32, 8, 1))],
        "backward_dq": [(ANY, Config(32, 32, 8, 1)), (ANY, Config(32, 16, 8, 1))],
    },
}

#: What the interpreter runs: small tiles (it is slow), with B_r != B_c so that
#: the causal bounds are exercised for tiles that are not square.
INTERPRETER: dict[str, Config] = {
    "forward": Config(32, 16, 4, 1),
    "backward_dkdv": Config(16, 32, 4, 1),
    "backward_dq": Config(32, 16, 4, 1),
}


#: A window whose rows each see this many keys or more is long: at head_dim tiles above
#: ``WINDOW_TILES_HEAD_DIM`` it is tiled as the causal mask (``tiles_for``), and its backward keeps
#: three loops (``autograd.one_loop``); measured at 1K (short) and 4K (causal-like) keys, not between.
LONG_WINDOW = 2048

#: Up to this head_dim tile a window of any length takes the window's own tiles (``tiles_for``).
#: benchmarks/results/masks_h200-6: with W = 4K at d = 64, N = 16K the forward took 1.248 ms with
#: the window's 64 x 64 x 4 warps x 3 stages against 1.544 ms with the causal mask's 128 x 64 x 8 x 3,
#: and the backward 3.98 ms with the window's dQ tiles (64 x 64 x 4 x 2) against 4.21 ms (one timing
#: each); FlexAttention's time over ours went from 0.85-0.87 (forward) and 0.94-0.96 (forward +
#: backward) to 1.02-1.09 and 1.00-1.01 at N = 8K-32K. The causal mask itself at d = 64, 16K loses
#: 3% with 64 x 64 (masks_h200-5, run 3).
WINDOW_TILES_HEAD_DIM = 64


def long_window(window_keys: int | None) -> bool:
    """Whether a window whose rows each see up to ``window_keys`` keys (None: no window) is long."""
    return window_keys is not None and window_keys >= LONG_WINDOW


def tiles_for(causal: bool, window_keys: int | None, block_d: int | None = None) -> tuple[bool, bool]:
    """``(causal, window)`` to choose a kernel's tiles with (``preferred``), for a kernel launched
    with ``CAUSAL = causal`` and, when ``window_keys`` is not None, a sliding window whose rows each
    see up to that many keys (``WINDOW``). A short window's loops are short, and its forward and dQ
    have tiles of their own. A long one's loops are the causal mask's, and so are its tiles, except
    at head_dim tiles up to ``WINDOW_TILES_HEAD_DIM`` (``block_d``; None: above it), where the
    window's own tiles measured faster at every length."""
    if window_keys is None:
        return causal, False
    if long_window(window_keys) and (block_d is None or block_d > WINDOW_TILES_HEAD_DIM):
        return True, False
    return False, True


def _family(cc: int) -> str:
    return "sm_90" if cc >= 90 else "sm_80" if cc >= 80 else "sm_75"


def preferred(kernel: str, *, cc: int, block_d: int, elem_bytes: int, causal: bool = False,
              window: bool = False) -> list[Config]:
    """The preference list for this chip and mask, filtered by ``keep``: what the library tries, in order.
    ``window``: a sliding window (the kernels' ``WINDOW``): its own entries first, then the
    entries of the mask ``causal`` names."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not isinstance(causal, bool) or not isinstance(window, bool):
        raise TypeError(f"causal and window must be True or False, got {causal!r} and {window!r}")
    limit = smem_limit(cc)
    masks = (("window",) if window else ()) + (MASKS[causal],)
    entries = _PREFERRED[_family(cc)][kernel] + [(ANY, Config(16, 16, 4, 1))]  # the last resort
    return [config for bound, config, *only in entries
            if block_d <= bound and (not only or only[0] in masks)
            and keep(kernel, config, cc=cc, block_d=block_d, elem_bytes=elem_bytes, limit_bytes=limit)]


def default(kernel: str, *, cc: int, block_d: int, elem_bytes: int, causal: bool = False,
            window: bool = False) -> Config:
    """The configuration the library uses for ``kernel`` on compute capability ``cc``
    (for the causal mask when ``causal``, a sliding window when ``window``: a few entries
    differ between the masks)."""
    options = preferred(kernel, cc=cc, block_d=block_d, elem_bytes=elem_bytes, causal=causal, window=window)
    if not options:
        raise ValueError(
            f"head_dim up to {block_d} with {8 * elem_bytes}-bit inputs needs more shared memory "
            f"than sm_{cc} offers per program ({smem_limit(cc) // 1024} KiB) even with the "
            f"smallest tiles; use float16 or bfloat16 inputs, or a smaller head_dim")
    return options[0]


def supported(kernel: str, *, cc: int, block_d: int, elem_bytes: int) -> bool:
    """Whether some configuration of ``kernel`` fits this chip, head_dim tile and element size."""
    try:
        default(kernel, cc=cc, block_d=block_d, elem_bytes=elem_bytes)
    except ValueError:
        return False
    return True


def kept_candidates(kernel: str, *, cc: int, block_d: int, elem_bytes: int) -> list[Config]:
    """``candidates`` filtered by ``keep`` for one chip and head_dim (the autotuner's list)."""
    limit = smem_limit(cc)
    return [c for c in candidates(kernel)
            if keep(kernel, c, cc=cc, block_d=block_d, elem_bytes=elem_bytes, limit_bytes=limit)]


# ------------------------------------------------------------------ launch order

#: A grid of at most this many programs per SM deals its programs out HEAD_GROUP heads at a time
#: (``forward.launch_position``), chosen from ``benchmarks/launch_order_experiment.py`` on an H200
#: (recorded run ``launch_order``): groups of 4 or more heads gained most at 512 programs (batch 1,
#: 16 heads, N = 4K), a little at 1,024, and nothing beyond the run-to-run spread from 2,048 on,
#: where groups of 16 heads lost up to 7%.
SMALL_GRID_PROGRAMS_PER_SM = 8
SMALL_GRID_HEAD_GROUP = 4


def head_group(programs: int, *, sms: int, cc: int) -> int:
    """How many heads a grid of ``programs`` deals out at a time on a chip with ``sms`` SMs:
    ``SMALL_GRID_HEAD_GROUP`` for a small grid on sm_90 (where it was measured), else 1 (the
    kernels' plain order)."""
    if cc == 90 and programs <= SMALL_GRID_PROGRAMS_PER_SM * sms:
        return SMALL_GRID_HEAD_GROUP
    return 1

