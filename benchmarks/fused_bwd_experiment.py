"""The backward's dK/dV and dQ programs in one launch, as FlexAttention's backward runs them.

    PYTHONPATH=. python3 benchmarks/fused_bwd_experiment.py --out DIR
        [--shapes documents:8K:128,documents:16K:128,causal:8K:128]
        [--variants library,halves,interleaved] [--stages 3] [--rounds 3]

Chapter 8's backward launches the dK/dV kernel over every key tile of every head, then the dQ
kernel over every query tile of every head: the dQ programs read Q, K, V and dO again after the
dK/dV programs have read them for all heads (at 16K tokens x 16 heads x 128, 64 MB a tensor:
more than the H200's 60 MB of L2). FlexAttention's backward (``flex_attention_backward``)
launches one grid whose first programs of each head are dK/dV programs and whose last are dQ
programs, so both kinds of program of a few heads run side by side and the second reads of a
head's tiles can come from L2. Recorded runs ``masks_profile`` (benchmarks/results/packed_grid_h200/
profile_documents.json) found its one backward kernel 10-20% shorter than our two on packed
documents; the dQ kernel on a second stream (``overlap``) changed nothing, but a second stream
only starts dQ programs once every dK/dV program has started.

Variants (``--variants``; every one the library's kernels line for line, called from one kernel
``_bwd_fused`` by a program-id test):

- ``library``: the library's three launches (delta, dK/dV, dQ);
- ``halves``: one launch of grid (2T, batch x heads): programs 0..T-1 of a head are its dK/dV
  programs (key tile = program), T..2T-1 its dQ programs (FlexAttention's order);
- ``interleaved``: even programs dK/dV, odd ones dQ, tile = program // 2, so a key tile and
  a query tile of the same head start together.

T is the tile count of both kernels: the fused launch needs the dK/dV kernel's key tile as tall
as the dQ kernel's query tile (128 at d = 128 under the causal mask and for documents) and one
head per key head (no GQA); the two share ``num_warps`` (the dK/dV kernel's) and ``--stages``.
Heads are never grouped (``autograd._state["head_group"] = 1``, in every variant). Each
variant's gradients must be bitwise the library's (the same products in the same order); the
script checks that, then times ``flash_backward`` alone (``one_loop_experiment.run_shape``).
DIR/fused_bwd.json: every number and the provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashbook.kernels import autograd  # noqa: E402
from flashbook.kernels.backward import _bwd_dkdv, _bwd_dq  # noqa: E402
from flashbook.kernels.ladder import kernel_with  # noqa: E402


@triton.jit
def halves_is_dkdv():
    return tl.program_id(0) < tl.num_programs(0) // 2


@triton.jit
def halves_query_tile(CAUSAL: tl.constexpr, HEAD_GROUP: tl.constexpr = 1, HEAVY_LAST: tl.constexpr = False):
    """The dQ program's query tile in the second half of axis 0, heaviest first as the library's."""
    tiles = tl.num_programs(0) // 2
    tile = tl.program_id(0) - tiles
    if CAUSAL or HEAVY_LAST:
        tile = tiles - 1 - tile
    return tile


@triton.jit
def interleaved_is_dkdv():
    return tl.program_id(0) % 2 == 0


@triton.jit
def interleaved_position(HEAD_GROUP: tl.constexpr = 1):
    """(key tile, batch x head) of a dK/dV program at an even position of axis 0."""
    return tl.program_id(0) // 2, tl.program_id(1)


@triton.jit
def interleaved_query_tile(CAUSAL: tl.constexpr, HEAD_GROUP: tl.constexpr = 1, HEAVY_LAST: tl.constexpr = False):
    """The dQ program's query tile at an odd position of axis 0, heaviest first."""
    tile = tl.program_id(0) // 2
    if CAUSAL or HEAVY_LAST:
        tile = tl.num_programs(0) // 2 - 1 - tile
    return tile


@triton.jit
def _bwd_fused(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
               stride_qb, stride_qh, stride_qm,
               stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn,
               stride_dob, stride_doh, stride_dom,
               stride_dkb, stride_dkh, stride_dkn,
               stride_dvb, stride_dvh, stride_dvn,
               stride_dqb, stride_dqh, stride_dqm,
               n_heads, n_kv_heads, group, seq_q, seq_k, qk_scale, scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
               first=0, last=0, cap_scale=1.0, CU_SEQLENS_Q=None, CU_SEQLENS_K=None,
               WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, VARLEN: tl.constexpr = False,
               ONE_LOOP: tl.constexpr = False, BLOCK_M2: tl.constexpr = 128, BLOCK_N2: tl.constexpr = 64,
               HEAVY_LAST: tl.constexpr = False):
    """dK/dV programs (``BLOCK_M`` x ``BLOCK_N`` tiles) and dQ programs (``BLOCK_M2`` x
    ``BLOCK_N2``) in one grid; ``is_dkdv``, ``dkdv_program`` and ``dq_program`` are swapped in
    per variant (``ladder.kernel_with``)."""
    if is_dkdv():
        dkdv_program(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                     stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                     stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                     stride_dqb, stride_dqh, stride_dqm,
                     n_heads, n_kv_heads, group, seq_q, seq_k, qk_scale, scale,
                     HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, ATOMIC_DQ, DOT_PRECISION,
                     first, last, cap_scale, CU_SEQLENS_Q, CU_SEQLENS_K,
                     WINDOW=WINDOW, SOFTCAP=SOFTCAP, VARLEN=VARLEN, ONE_LOOP=ONE_LOOP)
    else:
        dq_program(Q, K, V, DO, LSE, DELTA, DQ,
                   stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                   stride_dqb, stride_dqh, stride_dqm,
                   n_heads, group, seq_q, seq_k, qk_scale, scale,
                   HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, DOT_PRECISION,
                   first, last, cap_scale, CU_SEQLENS_Q, CU_SEQLENS_K,
                   WINDOW=WINDOW, SOFTCAP=SOFTCAP, VARLEN=VARLEN, HEAVY_LAST=HEAVY_LAST, ONE_LOOP=ONE_LOOP)


# the names the fused kernel calls, bound per variant
is_dkdv = dkdv_program = dq_program = None

FUSED = {
    "halves": kernel_with({"is_dkdv": halves_is_dkdv, "dkdv_program": _bwd_dkdv,
                           "dq_program": kernel_with({"query_tile_index": halves_query_tile}, base=_bwd_dq)},
                          base=_bwd_fused),
    "interleaved": kernel_with({"is_dkdv": interleaved_is_dkdv,
                                "dkdv_program": kernel_with({"launch_position": interleaved_position}, base=_bwd_dkdv),
                                "dq_program": kernel_with({"query_tile_index": interleaved_query_tile}, base=_bwd_dq)},
                               base=_bwd_fused),
}
VARIANTS = ("library",) + tuple(FUSED)
#: the keywords the fused kernel takes beyond the dK/dV kernel's (its tiles and order)
DQ_ONLY = {"BLOCK_M": "BLOCK_M2", "BLOCK_N": "BLOCK_N2", "HEAVY_LAST": "HEAVY_LAST"}


def fused_launcher(order: str, stages: int | None):
    """An ``autograd._launch`` that keeps the dK/dV launch and, at the dQ launch, makes one
    launch of the fused kernel ``FUSED[order]`` in their place."""
    original = autograd._launch
    kept = {}

    def launch(kernel, grid, args, kwargs, names):
        if "dk" in names:                       # the dK/dV launch: wait for the dQ one
            kept["dkdv"] = (grid, args, kwargs, names)
            return None, tuple(names)
        if "dq" not in names or "dkdv" not in kept:
            return original(kernel, grid, args, kwargs, names)
        grid_kv, args_kv, kw_kv, names_kv = kept.pop("dkdv")
        if grid != grid_kv:
            raise ValueError(f"the fused launch needs one dQ program per dK/dV program: dK/dV grid {grid_kv}, "
                             f"dQ grid {grid} (key tile {kw_kv['BLOCK_N']}, query tile {kwargs['BLOCK_M']}; "
                             "GQA is not fused)")
        if kwargs.get("HEAD_GROUP", 1) != 1 or kw_kv.get("HEAD_GROUP", 1) != 1:
            raise ValueError("the fused launch deals heads out one at a time (HEAD_GROUP = 1)")
        fused = dict(kw_kv, **{DQ_ONLY[name]: value for name, value in kwargs.items() if name in DQ_ONLY})
        if stages is not None:
            fused["num_stages"] = stages
        return original(FUSED[order], (2 * grid[0], grid[1]), args_kv, fused, names_kv)

    return launch


@contextlib.contextmanager
def backward(name: str, stages: int | None = None):
    """flash_backward as variant ``name``; no call plans (a plan replays the launches it kept),
    heads never grouped."""
    if name not in VARIANTS:
        raise ValueError(f"a variant is one of {VARIANTS}, got {name!r}")
    saved = autograd._launch, autograd._plan_key, autograd._state["head_group"]
    autograd._state["head_group"] = 1
    autograd._plan_key = lambda *a, **k: None
    if name != "library":
        autograd._launch = fused_launcher(name, stages)
    autograd.forget_plans()
    try:
        yield
    finally:
        autograd._launch, autograd._plan_key, autograd._state["head_group"] = saved
        autograd.forget_plans()


def main(argv=None) -> int:
    import one_loop_experiment

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="documents:8K:128,documents:16K:128,causal:8K:128")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {VARIANTS}")
    p.add_argument("--stages", type=int, default=None, help="the fused kernel's num_stages (default: the dK/dV kernel's)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from flashbook.bench.records import collect_provenance

    names = args.variants.split(",")
    if set(names) - set(VARIANTS):
        p.error(f"--variants takes names from {VARIANTS}, got {args.variants}")
    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/fused_bwd_experiment.py"),
              "rows": []}
    for text in filter(None, args.shapes.split(",")):
        start = time.perf_counter()
        try:
            row = one_loop_experiment.run_shape(text, names, args.rounds,
                                                variant=lambda name: backward(name, args.stages), base="library")
        except Exception as exc:  # noqa: BLE001 - recorded, the other shapes still run
            row = {"shape": text, "error": f"{type(exc).__name__}: {exc}"[:600]}
        record["rows"].append(row)
        with open(os.path.join(args.out, "fused_bwd.json"), "w") as f:
            json.dump(record, f, indent=1)
        if "error" in row:
            print(f"{text}: {row['error']}", flush=True)
            continue
        print(f"{text}: " + ", ".join(f"{n}: {m:.3f} ms (spread {row['spread'][n]:.1%}, "
                                      f"bitwise {row['bitwise_equal'][n]})" for n, m in row["median_ms"].items())
              + f"  [{time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
