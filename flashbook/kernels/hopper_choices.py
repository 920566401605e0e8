"""The Gluon forward's host-side choices (``hopper.gluon_forward``, chapter 10): what it
takes and which tiles and schedule it launches by default, each from a recorded run, and
where ``flash_attention``'s ``backend="auto"`` still prefers the Triton kernel. Pure Python:
``flashbook.kernels.hopper`` imports them all (``hopper.DEFAULTS``, ``hopper.default_config``...).
"""
from __future__ import annotations

import torch

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
BLOCK_MS = (64, 128, 192)   # query rows per program: one warpgroup (4 warps) per 64 rows
WG_ROWS = 64           # query rows per consumer warpgroup under warp specialisation
BLOCK_NS = (64, 128)   # keys per tile
STAGES = (2, 3, 4)     # K/V tiles in flight
#: how the work of one program is laid out in time (chapter 10):
#: "overlap"  every warp loads and computes; S_{j} and P_{j-1} V_{j-1} overlap the softmax
#: "producer" a producer warp does every load; two or three consumer warpgroups compute
SCHEDULES = ("overlap", "producer")
#: registers per consumer thread under warp specialisation, by the number of consumer
#: warpgroups (the producer warp keeps 24); what is left of the SM's 64K for one program
CONSUMER_REGS = {2: 240, 3: 160}
#: (block_m, block_n, stages, schedule) used when none is given: the fastest of
#: benchmarks/gluon_experiment.py on the H200 (benchmarks/results/gluon_h200/) at most shapes;
#: at d=64 three consumer warpgroups (FlashAttention-3's 192-row tile) for long sequences
DEFAULTS = {128: (128, 128, 3, "producer"), 64: (192, 128, 4, "producer")}
#: below these query lengths (full, causal) the 192-row tiles measured slower than
#: SHORT_DEFAULT (gluon_d64_wg3.json, gluon_d64_run3.json, the --graph peer runs, and timed
#: from CUDA graphs at 1K to 4K: gluon_d64_short_graph.json, gluon_d64_persistent_graph.json)
WIDE_FROM = {False: 2048, True: 6144}
#: what shorter sequences take (one-warpgroup programs, three to an SM)
SHORT_DEFAULT = (64, 128, 2, "overlap")
#: causal, d=64, below SHORT_CAUSAL_BELOW query rows: 64-key tiles, so that less of the
#: diagonal tile is masked away (the two graph-timed sweeps: +1.6% and +2.2% at 1K, -2% at 2K)
SHORT_CAUSAL = (64, 64, 3, "overlap")
SHORT_CAUSAL_BELOW = 2048


def default_config(head_dim: int, seq_q: int, causal: bool = False, seq_k: int | None = None) -> tuple:
    """(block_m, block_n, stages, schedule) ``gluon_forward`` takes when none is given; with
    fewer keys than one key tile (``seq_k``), 64-key tiles."""
    config = DEFAULTS.get(head_dim, DEFAULTS[128])
    shortest = max(config[0], WIDE_FROM[bool(causal)] if config[0] > 128 else 0)
    if seq_q < shortest:
        config = SHORT_CAUSAL if causal and head_dim == 64 and seq_q < SHORT_CAUSAL_BELOW else SHORT_DEFAULT
    if seq_k is not None and seq_k < config[1]:
        config = (config[0], min(BLOCK_NS), *config[2:])
    return config


def slower_than_triton(head_dim: int, seq_q: int, seq_k: int, causal: bool = False) -> bool:
    """Whether the Gluon forward measured slower than chapter 7's Triton kernel for this call,
    so that ``backend="auto"`` takes Triton (benchmarks/gluon_lengths.py, run ``gluon_lengths``):
    a key length that is not a whole number of key tiles under the one-warpgroup schedule
    with 128-key tiles (``SHORT_DEFAULT``). Its last, overlapping key tile takes the kernel from
    154 to 221 registers a thread at d = 64 (ptxas), so two programs share an SM where three
    did: RAGGED=True alone cost 16-20% at whole lengths, and at N = 1000 and 4097 the kernel
    gave 0.87 and 0.89 of Triton's speed. Everywhere else it measured 1.03-1.27 of Triton's."""
    block_m, block_n, _, schedule = default_config(head_dim, seq_q, causal, seq_k)
    return schedule == "overlap" and block_n == 128 and seq_k % block_n != 0
