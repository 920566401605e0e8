"""Where the kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined: the ``@triton.jit`` decorator
returns an interpreted or a compiled function (Triton 3.6 and 3.9 alike). So the choice has
to be made before any kernel is defined: ``import flashbook`` imports this module first,
before anything imports triton, and this module decides.

It also holds the facts about real chips that the book's figures and explorers use
(shared memory per SM, HBM bandwidth, peak matrix throughput), with their sources.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # the NumPy chapters need no torch
        return False
    return bool(torch.cuda.is_available())


HAS_CUDA: bool = _cuda_available()

if not HAS_CUDA and os.environ.get("TRITON_INTERPRET") is None:
    if "triton" in sys.modules:
        warnings.warn(
            "triton was imported before flashbook and there is no CUDA GPU: "
            "Triton kernels cannot run. Import flashbook first, or set "
            "TRITON_INTERPRET=1 before importing triton.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        os.environ["TRITON_INTERPRET"] = "1"

#: True when Triton kernels run in the CPU interpreter rather than on a GPU.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: The oldest triton whose interpreter runs every chapter (measured: see how_to_run).
INTERPRETER_TRITON_FLOOR = "3.3.0"


def _version_tuple(v: str) -> tuple:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:3] if x.isdigit())


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernels here, or None if it can.

    Two known causes, each with its fix: a triton older than
    ``INTERPRETER_TRITON_FLOOR`` (its interpreter lacks what the kernels use), and
    the interpreter of triton 3.6 and older with NumPy 2.4 and newer (loops over a
    run-time range fail; triton 3.7.1 fixed it).
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton_version = version("triton")
    except PackageNotFoundError:
        return ("triton is not installed (it exists for Linux only): pip install "
                f"'triton>={INTERPRETER_TRITON_FLOOR}', or run the Triton chapters on Colab")
    import numpy

    if _version_tuple(triton_version) < _version_tuple(INTERPRETER_TRITON_FLOOR):
        return (f"triton {triton_version} is too old for the book's kernels in the interpreter: "
                f"pip install 'triton>={INTERPRETER_TRITON_FLOOR}' (then restart the kernel)")
    if _version_tuple(triton_version) < (3, 7, 1) and _version_tuple(numpy.__version__) >= (2, 4):
        return (f"Triton's interpreter in triton {triton_version} fails with numpy "
                f"{numpy.__version__}: pip install 'triton>=3.7.1' (or 'numpy<2.4')")
    return None


def device() -> str:
    """The torch device the book's kernels use: ``"cuda"`` or ``"cpu"``."""
    return "cuda" if HAS_CUDA and not INTERPRET else "cpu"


def describe() -> str:
    """One line saying where kernels will run, for the top of a chapter."""
    if HAS_CUDA and not INTERPRET:
        import torch

        name = torch.cuda.get_device_name()
        cc = "".join(map(str, torch.cuda.get_device_capability()))
        return f"GPU: {name} (sm_{cc}); Triton kernels are compiled and run on it."
    if INTERPRET:
        return ("No CUDA GPU: Triton kernels run in the interpreter on the CPU "
                "(small sizes, fp16/fp32 only; timings mean nothing here).")
    return "Triton was imported before flashbook without a GPU: kernels cannot run."


# --------------------------------------------------------------------------- chips

@dataclass(frozen=True)
class Chip:
    """Facts about one GPU that decide how FlashAttention's tiles must be sized."""

    name: str
    arch: str                  # the compute capability Triton compiles for
    sms: int                   # streaming multiprocessors
    smem_per_sm_kib: int       # shared memory per SM (the on-chip "SRAM", M)
    smem_per_block_kib: int    # largest shared memory one program may use (opt-in)
    hbm_gib: float             # device memory, the datasheet's "GB" (rounded: neither 1e9 nor 2**30)
    hbm_tb_s: float            # HBM bandwidth, TB/s (vendor datasheet)
    fp16_tflops: float         # dense fp16 tensor-core peak, TFLOP/s
    bf16_tflops: float | None  # dense bf16 tensor-core peak; None: no bf16 tensor cores
    l2_mib: int
    source: str
    boost_clock_mhz: int       # max SM clock; sets the shared-memory bandwidth below
    regs_per_sm_kib: int       # register file per SM (64 K 32-bit registers)
    max_warps_per_sm: int      # warps an SM keeps resident to hide memory latency

    @property
    def smem_per_block_bytes(self) -> int:
        return self.smem_per_block_kib * 1024

    @property
    def smem_tb_s(self) -> float:
        """Peak shared-memory bandwidth of the whole chip, TB/s (an upper bound).

        Every SM's 32 banks each deliver 4 bytes per clock, at the max boost clock.
        """
        return self.sms * SMEM_BYTES_PER_CLOCK_PER_SM * self.boost_clock_mhz * 1e6 / 1e12

    @property
    def hbm_bytes(self) -> int:
        """Device memory in bytes, reading the datasheet's "GB" as GiB: an upper bound. The
        datasheets' "80 GB" and "141 GB" are rounded, neither exactly 1e9 nor 2**30 bytes: the
        H200's driver reports 150.1e9 bytes (139.8 GiB), more than 141e9, less than 141 * 2**30."""
        return int(self.hbm_gib * 2**30)

    @property
    def fp32_tflops(self) -> float:
        """Peak fp32 FMA rate without tensor cores, TFLOP/s (an FMA counts as 2 FLOPs)."""
        return self.sms * FP32_PER_CLOCK_PER_SM[self.arch] * 2 * self.boost_clock_mhz * 1e6 / 1e12

    @property
    def exp_per_s(self) -> float:
        """Peak rate of exponentials (``ex2`` on the special-function units), per second."""
        return self.sms * SFU_PER_CLOCK_PER_SM * self.boost_clock_mhz * 1e6

    @property
    def dot_tflops(self) -> float:
        """The matrix rate the book's Triton kernels can reach on this chip, TFLOP/s.

        From sm_80 on ``tl.dot`` runs on the fp16/bf16 tensor cores (``fp16_tflops``);
        on sm_75 Triton compiles it into fp32 FMAs (``fp32_tflops``), see how_to_run.
        """
        return self.fp16_tflops if int(self.arch.removeprefix("sm_")) >= 80 else self.fp32_tflops

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity above which the book's kernels are compute-bound:
        ``dot_tflops`` over HBM bandwidth."""
        return self.dot_tflops * 1e12 / (self.hbm_tb_s * 1e12)


_GUIDE = ("CUDA C++ Programming Guide, 'Technical Specifications per Compute "
          "Capability' (shared memory, registers and resident warps per SM)")

#: Threads per warp on every NVIDIA GPU so far (CUDA C++ Programming Guide).
WARP_SIZE: int = 32
#: Shared memory has 32 banks, each 32 bits (4 bytes) wide per clock (CUDA guide).
SMEM_BYTES_PER_CLOCK_PER_SM: int = 32 * 4
#: fp32 add/multiply/FMA results per clock per SM, and special-function-unit results
#: (exp2, log2, reciprocal...) per clock per SM: the CUDA guide's table of arithmetic
#: instruction throughput.
FP32_PER_CLOCK_PER_SM: dict = {"sm_75": 64, "sm_80": 64, "sm_90": 128}
SFU_PER_CLOCK_PER_SM: int = 16
#: Dense fp16/bf16 tensor-core FLOPs per clock per SM (architecture whitepapers: Turing 8 tensor
#: cores x 64 FMA, Ampere 4 x 256, Hopper 4 x 512; 2 FLOPs per FMA).
TENSOR_FLOP_PER_CLOCK_PER_SM: dict = {"sm_75": 1024, "sm_80": 2048, "sm_90": 4096}
#: The most 32-bit registers one thread may use, compute capability 7.5 to 9.0 (CUDA guide).
MAX_REGS_PER_THREAD: int = 255

CHIPS: dict[str, Chip] = {
    "T4": Chip("T4", "sm_75", 40, 64, 64, 16, 0.320, 65.0, None, 4,
               f"NVIDIA T4 datasheet (GDDR6 memory, peaks); {_GUIDE}; L2 size and "
               "max SM clock as the CUDA driver reports them (deviceQuery)",
               boost_clock_mhz=1590, regs_per_sm_kib=256, max_warps_per_sm=32),
    "A100": Chip("A100", "sm_80", 108, 164, 163, 80, 2.039, 312.0, 312.0, 40,
                 f"NVIDIA A100 datasheet (SXM4 80GB); {_GUIDE}; "
                 "A100 architecture whitepaper (L2, boost clock)",
                 boost_clock_mhz=1410, regs_per_sm_kib=256, max_warps_per_sm=64),
    "H100": Chip("H100", "sm_90", 132, 228, 227, 80, 3.35, 989.0, 989.0, 50,
                 f"NVIDIA H100 datasheet (SXM5; its tensor-core peaks are with 2:4 sparsity, dense is half); {_GUIDE}; "
                 "H100 architecture whitepaper (L2, max boost clock)",
                 boost_clock_mhz=1980, regs_per_sm_kib=256, max_warps_per_sm=64),
    "H200": Chip("H200", "sm_90", 132, 228, 227, 141, 4.8, 989.0, 989.0, 60,
                 f"NVIDIA H200 datasheet (SXM; its tensor-core peaks are with 2:4 sparsity, dense is half); {_GUIDE}; "
                 "L2 size and max SM clock "
                 "as the CUDA driver reports them (60 MiB of L2, not the H100's 50)",
                 boost_clock_mhz=1980, regs_per_sm_kib=256, max_warps_per_sm=64),
}


def chip(name: str) -> Chip:
    """Look up a chip by name (``"T4"``, ``"A100"``, ``"H100"``, ``"H200"``)."""
    try:
        return CHIPS[name]
    except KeyError:
        raise ValueError(f"chip must be one of {sorted(CHIPS)}, got {name!r}") from None
