"""Shared memory per program: the one model of which tiles fit a chip (chapters 4, 6, 9).

``tiled.onchip_bytes`` is the algorithm's footprint: every buffer one program holds, as
the paper's model puts all of it in on-chip SRAM. A GPU kernel splits it: the input
tiles sit in shared memory, the fp32 accumulators (S/P, O, m, l) in registers (on sm_75,
where Triton stages fp32 copies of one product's operands, P passes through shared memory
too, as the operand of P V).
``smem_bytes`` is that kernel's shared memory: the one model every chapter uses to say
which tiles fit a chip (``tiled`` names it too), and the filter of the kernels'
configurations (``kernels.configs.smem_estimate`` asks it).

It is compared with the chip's limit *per program* (``runtime.Chip.smem_per_block_kib``:
163 KiB on an A100), which is 1 KiB less than the shared memory *per SM* (164 KiB)
because the CUDA guide reserves 1 KB of shared memory per thread block for the system;
several programs share one SM's 164 KiB. Plain arithmetic: importing it imports neither torch nor triton.
"""
from __future__ import annotations

from .validation import check_count

#: The kernels that take a configuration (the delta preprocess is too small to care).
KERNELS = ("forward", "backward_dkdv", "backward_dq")
#: ``smem_buffers``' one entry on sm_75, where Triton stages fp32 copies of the operands.
FP32_OPERANDS = "fp32 operands"
#: The tile widths the kernels use for the head dimension (d is padded up to one: a power
#: of two, >= 16 for the tensor cores).
TILE_DS = (16, 32, 64, 128, 256)


def tile_d(d: int, name: str = "d") -> int:
    """The head dimension rounded up to the tile width the kernels load (loads are masked
    past d); ``name`` is the argument an error names."""
    d = check_count(d, name)
    for width in TILE_DS:
        if d <= width:
            return width
    raise ValueError(f"{name} must be at most {TILE_DS[-1]}, got {d}")


def smem_bytes(block_q: int, block_k: int, d: int, *, num_stages: int = 2,
               dtype_bytes: int = 2, arch: str = "sm_80", kernel: str = "forward") -> int:
    """Shared memory one program of one of the book's kernels needs, in bytes (roughly).

    From sm_80 on (tensor cores, asynchronous copies): the tile that stays resident
    plus, for each of ``num_stages`` pipeline stages, the tiles that stream, in the
    input dtype (``dtype_bytes``): the asynchronous copies of one stage overlap the
    arithmetic on another.

    * ``"forward"`` and ``"backward_dq"``: the query-side tile stays (B_r x d; with dO
      for dQ), the K and V tiles (B_c x d each) stream;
    * ``"backward_dkdv"``: K and V stay, Q and dO stream.

    On sm_75 Triton has no tensor-core path: ``tl.dot`` stages its fp32 operands in
    shared memory with no pipeline, for the forward max((B_r + B_c) d, B_r B_c +
    max(B_r, B_c) d) fp32 values (fp32 inputs keep one more copy of a tile and of P),
    a fit to what Triton 3.9 allocates there. ``d`` is the tile width (``tile_d``).

    The compiler may reuse or add buffers: the compile-target tests compare the model
    with the compiled kernels' real numbers (``compiled.metadata.shared``).
    """
    return sum(smem_buffers(block_q, block_k, d, num_stages=num_stages, dtype_bytes=dtype_bytes,
                            arch=arch, kernel=kernel).values())


def smem_buffers(block_q: int, block_k: int, d: int, *, num_stages: int = 2,
                 dtype_bytes: int = 2, arch: str = "sm_80", kernel: str = "forward") -> dict:
    """``smem_bytes`` buffer by buffer (bytes; they add up to it), for a figure that
    stacks them: from sm_80 on, each input tile with all of its stages (``"K"`` is
    ``num_stages`` copies of the B_c x d key tile); on sm_75 one entry, the fp32
    operand tiles Triton stages there."""
    bm, bn = check_count(block_q, "block_q"), check_count(block_k, "block_k")
    d, stages = check_count(d, "d"), check_count(num_stages, "num_stages")
    elt = check_count(dtype_bytes, "dtype_bytes")
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit()):
        raise ValueError(f"arch must look like 'sm_80', got {arch!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if int(arch[3:]) < 80:
        # fp32 operand tiles (rows x d): Q and K (forward); Q, K and V or dO (backward)
        rows = bm + bn if kernel == "forward" else bm + bn + max(bm, bn)
        fp32 = max(rows * d, bm * bn + max(bm, bn) * d)
        if elt == 4:  # float32 inputs keep one more copy of a tile and of P
            fp32 += bm * bn + max(bm, bn) * d
        return {FP32_OPERANDS: 4 * fp32}
    if kernel == "forward":        # Q stays; K and V stream
        resident, streamed = {"Q": bm}, {"K": bn, "V": bn}
    elif kernel == "backward_dq":  # Q and dO stay; K and V stream
        resident, streamed = {"Q": bm, "dO": bm}, {"K": bn, "V": bn}
    else:                          # K and V stay; Q and dO stream
        resident, streamed = {"K": bn, "V": bn}, {"Q": bm, "dO": bm}
    out = {name: elt * rows * d for name, rows in resident.items()}
    out.update({name: elt * stages * rows * d for name, rows in streamed.items()})
    return out


def largest_tile(chip, d: int, *, num_stages: int = 2, dtype_bytes: int = 2):
    """The largest power of two B (16 to 256) with B_r = B_c = B whose ``smem_bytes``
    fit one program on ``chip`` (a ``runtime.Chip``), or None if not even 16 fits."""
    width = tile_d(d)
    best = None
    for b in TILE_DS:
        if smem_bytes(b, b, width, num_stages=num_stages, dtype_bytes=dtype_bytes,
                      arch=chip.arch) <= chip.smem_per_block_bytes:
            best = b
    return best
