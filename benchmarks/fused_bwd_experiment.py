"""The backward's dK/dV and dQ programs in one launch, as FlexAttention's backward runs them.

    PYTHONPATH=. python3 benchmarks/fused_bwd_experiment.py --out DIR
        [--shapes documents:8K:128,documents:16K:128,causal:8K:128]
        [--variants separate,halves,interleaved,tile_major] [--rounds 3]

Chapter 8's backward launches the dK/dV kernel over every key tile of every head, then the dQ
kernel over every query tile of every head: the dQ programs read Q, K, V and dO again after the
dK/dV programs have read them for all heads (at 16K tokens x 16 heads x 128, 64 MB a tensor:
more than the H200's 60 MB of L2). FlexAttention's backward launches one grid whose first
programs of each head are dK/dV programs and whose last are dQ programs, so the second reads of
a head's tiles come soon after the first (whether from L2 is not measured here). Recorded run
``packed_grid`` (profile_documents.json) found its one backward kernel 10-20% shorter than our
two on packed documents; the dQ kernel on a second stream (``masks_profile``'s ``overlap``)
changed nothing, but a second stream only starts dQ programs once every dK/dV program has started.

Variants (``--variants``), each forced with ``autograd._state["fused_backward"]``:

- ``separate``: two launches (after the delta kernel), the dK/dV kernel's then the dQ kernel's;
- ``halves``: the library's ``backward._bwd_fused``, grid (2T, batch x heads): programs 0..T-1 of
  a head are its dK/dV programs, T..2T-1 its dQ programs (FlexAttention's order);
- ``interleaved``: the same kernel with its helpers swapped (``ladder.kernel_with``): even
  programs dK/dV, odd ones dQ, tile = program // 2, so a key tile and a query tile of the same
  head start together;
- ``tile_major``: the same kernel with its helpers swapped: the same positions started slot by
  slot across all heads (and documents), the first dK/dV tile of every row, then the heaviest dQ
  tile of every row, and so on, so that no row's heavy programs start after every other row's
  (packed documents: a long document that comes last);
- ``given_order``: ``halves`` with packed documents' rows in the order given, not heaviest first
  (``varlen.longest_first``, which every other variant keeps).

T is the tile count of both kernels: one launch needs the dK/dV kernel's key tile as tall as the
dQ kernel's query tile (128 at d = 128 under the causal mask and for documents) and one head per
key head (no GQA); the two share the dK/dV kernel's ``num_warps`` and ``num_stages``. Heads are
never grouped (``autograd._state["head_group"] = 1``, in every variant). Each variant's gradients
must be bitwise the two launches' (the same programs); the script checks that, then times
``flash_backward`` alone (``one_loop_experiment.run_shape``). DIR/fused_bwd.json: every number
and the provenance. (Recorded run ``fused_bwd`` was made at ae1036d, before the library had
``_bwd_fused``: its ``library`` variant is ``separate`` here, and its ``halves`` the same kernel
built in this script.)
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashbook.kernels import autograd  # noqa: E402
from flashbook.kernels.backward import _bwd_dkdv, _bwd_dq, _bwd_fused, fused_query_tile  # noqa: E402
from flashbook.kernels.ladder import kernel_with  # noqa: E402


@triton.jit
def interleaved_position():
    """``backward.fused_position`` alternating: even programs of axis 0 dK/dV, odd ones dQ,
    t = program // 2."""
    x = tl.program_id(0)
    return x % 2 == 0, x // 2, tl.program_id(1)


@triton.jit
def tile_major_position():
    """``backward.fused_position`` slot by slot: launch position p goes to row p % rows and slot
    p // rows, even slots dK/dV, odd ones dQ, t = slot // 2."""
    rows = tl.num_programs(1)
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    slot = pid // rows
    return slot % 2 == 0, slot // 2, pid % rows


def with_position(position):
    """The library's one-launch kernel, line for line, with ``position`` in place of
    ``fused_position`` wherever it and the kernels it calls use it (``ladder.kernel_with``)."""
    swap = {"fused_position": position}
    return kernel_with({**swap, "_bwd_dkdv": kernel_with(swap, base=_bwd_dkdv),
                        "_bwd_dq": kernel_with({**swap, "fused_query_tile": kernel_with(swap, base=fused_query_tile)},
                                               base=_bwd_dq)},
                       base=_bwd_fused)


INTERLEAVED, TILE_MAJOR = with_position(interleaved_position), with_position(tile_major_position)
#: variant -> (autograd._state["fused_backward"], the one-launch kernel, packed documents heaviest first)
VARIANTS = {"separate": (False, _bwd_fused, True), "halves": (True, _bwd_fused, True),
            "interleaved": (True, INTERLEAVED, True), "tile_major": (True, TILE_MAJOR, True),
            "given_order": (True, _bwd_fused, False)}


def given_order(launch_shape):
    """``autograd.launch_shape`` without ``DOC_ORDER``: packed documents' rows in the order given."""
    def shape(*args, **kwargs):
        grid, extra = launch_shape(*args, **kwargs)
        return grid, {k: v for k, v in extra.items() if k != "DOC_ORDER"}
    return shape


@contextlib.contextmanager
def backward(name: str):
    """flash_backward as variant ``name``; no call plans (a plan replays the launches it kept),
    heads never grouped."""
    if name not in VARIANTS:
        raise ValueError(f"a variant is one of {tuple(VARIANTS)}, got {name!r}")
    saved = (autograd._bwd_fused, autograd._plan_key, autograd._state["head_group"],
             autograd._state["fused_backward"], autograd.launch_shape)
    autograd._state["fused_backward"], autograd._bwd_fused, heaviest_first = VARIANTS[name]
    if not heaviest_first:
        autograd.launch_shape = given_order(autograd.launch_shape)
    autograd._state["head_group"] = 1
    autograd._plan_key = lambda *a, **k: None
    autograd.forget_plans()
    try:
        yield
    finally:
        (autograd._bwd_fused, autograd._plan_key, autograd._state["head_group"],
         autograd._state["fused_backward"], autograd.launch_shape) = saved
        autograd.forget_plans()


def main(argv=None) -> int:
    import one_loop_experiment

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="documents:8K:128,documents:16K:128,causal:8K:128")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {tuple(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from flashbook.bench.records import collect_provenance

    names = args.variants.split(",")
    if set(names) - set(VARIANTS):
        p.error(f"--variants takes names from {tuple(VARIANTS)}, got {args.variants}")
    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/fused_bwd_experiment.py"),
              "rows": []}
    one_loop_experiment.run_shapes(args.shapes, names, args.rounds, os.path.join(args.out, "fused_bwd.json"),
                                   record, variant=backward, base="separate", keep_going=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
