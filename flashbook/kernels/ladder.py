"""Chapter 10's performance ladder: from a first, plain kernel to the library's.

Each rung changes one thing and keeps the result exact. Every rung is the same
kernel (``forward._attn_fwd``) with some of its ``configs.Features`` switched off
and, below the tuning rung, a small fixed tile configuration, so a reader with a
GPU can run any rung with ``run_rung`` and time it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .autograd import flash_forward
from .configs import Config, Features

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
    Rung("exp2", "exp2 with log2(e) folded into the scale: one multiply fewer per score",
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


def run_rung(rung: Rung, q, k, v, *, causal: bool = False, scale=None):
    """The forward pass (o, lse) as the kernel of ``rung`` computes it."""
    if not isinstance(rung, Rung):
        raise TypeError(f"rung must be one of flashbook.kernels.ladder.RUNGS, got {rung!r}")
    return flash_forward(q, k, v, causal=causal, scale=scale, config=rung.config,
                         features=rung.features)
