"""Compile the kernels for a GPU that is not here: sm_75 (T4), sm_80 (A100), sm_90 (H100/H200).

Triton can compile a kernel for any NVIDIA target without that GPU present (it
ships its own ``ptxas``). This is how the book checks, on a machine with no GPU,
that every configuration it would launch fits each chip: ``compile_kernel``
returns the compiled kernel, whose ``metadata.shared`` is the shared memory one
program really allocates (chapter 9 compares it with ``configs.smem_estimate``).

Compilation needs ``TRITON_INTERPRET`` unset or 0 when triton is imported, so on
a CPU-only machine (where ``flashbook`` turns the interpreter on) it runs in a
separate process: ``compile_elsewhere(plan())`` does that from Python, and
``TRITON_INTERPRET=0 python -m flashbook.kernels.targets --all`` from a shell.
"""
from __future__ import annotations

import json
import re
import sys

from . import configs
from .configs import Config

ARCHS = (75, 80, 90)
DTYPES = ("fp16", "bf16", "fp32")
_ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def _kernel_fn(kernel: str):
    from .backward import _bwd_dkdv, _bwd_dq
    from .decode import _decode_combine, _decode_fwd
    from .forward import _attn_fwd

    return {"forward": _attn_fwd, "backward_dkdv": _bwd_dkdv, "backward_dq": _bwd_dq,
            "decode": _decode_fwd, "decode_combine": _decode_combine}[kernel]


def compile_kernel(kernel: str, *, cc: int, config: Config, head_dim: int, dtype: str = "fp16",
                   causal: bool = True, atomic_dq: bool = False, n_new: int = 1, splits: bool = True,
                   dot_precision: str = "tf32", page_size: int = 0, window: bool = False, softcap: bool = False,
                   varlen: bool = False, prefix: bool = False, alibi: bool = False, tile_in_page: bool = False):
    """Compile one kernel configuration for compute capability ``cc``; return the compiled kernel.

    The decode kernels (``flash_decode``, chapter 11) take ``n_new`` new tokens; with
    ``splits`` the decode kernel writes float32 partial results for the combine kernel
    (whose ``config.block_n`` is the number of splits it holds, BLOCK_S); ``page_size``
    > 0 compiles the decode kernel for a paged cache of such pages (``tile_in_page``: pages
    of a key tile or more, one page index per tile).
    ``dot_precision`` is the ``input_precision`` of the kernels' ``tl.dot`` (what
    ``autograd.dot_precision`` passes at launch): it only matters for fp32 inputs,
    "tf32" (tensor cores) or "ieee" (PyTorch's default "highest"). ``window``, ``softcap``:
    the attention kernels with a sliding window or a soft cap (``autograd.kernel_mask``;
    ``window`` also for the decode kernel, ``flash_decode(..., window=)``);
    ``varlen``: for packed documents (``varlen.flash_attention_varlen``); ``prefix``: a
    prefix-LM (causal after a prefix every row sees); ``alibi``: ALiBi biases (``alibi_slopes``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = _kernel_fn(kernel)
    constexprs = {
        "HEAD_DIM": head_dim, "BLOCK_D": configs.block_d(head_dim),
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "CAUSAL": causal,
        "DOT_PRECISION": dot_precision,
    }
    fp32 = {"LSE", "DELTA", "ALIBI_SLOPES"} | ({"DQ"} if atomic_dq else set())
    if kernel == "backward_dkdv":
        constexprs["ATOMIC_DQ"] = atomic_dq
    if kernel in ("forward", "backward_dkdv", "backward_dq"):
        constexprs.update(WINDOW=window, SOFTCAP=softcap, VARLEN=varlen, PREFIX=prefix, ALIBI=alibi,
                          HEAD_GROUP=1)   # the launch order (forward.launch_position): the plain one
        if kernel != "backward_dkdv":   # a causal window's query tiles, last first (autograd.heavy_last)
            constexprs["HEAVY_LAST"] = window
        if kernel != "forward":   # a short window's backward: one loop a program (autograd.one_loop)
            constexprs["ONE_LOOP"] = window
        if not varlen:   # the cu_seqlens pointers and DOC_ORDER: None, as a launch without documents leaves them
            constexprs.update(CU_SEQLENS_Q=None, CU_SEQLENS_K=None, DOC_ORDER=None)
        if not alibi:    # the slopes' pointer likewise
            constexprs.update(ALIBI_SLOPES=None)
    if kernel == "decode":
        constexprs.update(N_NEW=n_new, HAS_SEQLENS=True, PAGE_SIZE=page_size, WINDOW=window,
                          TILE_IN_PAGE=tile_in_page)
        fp32 |= {"O"} if splits else set()
    if kernel == "decode_combine":
        constexprs = {"HEAD_DIM": head_dim, "BLOCK_D": configs.block_d(head_dim), "BLOCK_S": config.block_n}
        fp32 |= {"O_PART"}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("SEQLENS", "TABLE", "CU_SEQLENS_Q", "CU_SEQLENS_K", "DOC_ORDER"):
            signature[name] = "*i32"
        elif name in fp32:
            signature[name] = "*fp32"
        elif name.isupper():  # a tensor: Q, K, V, O, DO, DK, DV, DQ
            signature[name] = f"*{dtype}"
        elif name in ("qk_scale", "scale", "cap_scale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        # what Triton assumes at launch for 16-byte aligned tensors and strides that are multiples of 16
        if signature[name].startswith("*") or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)


def resources(compiled, *, load: bool = False) -> dict:
    """Shared memory (bytes) of a kernel ``compile_kernel`` returned, and its registers
    and spills per thread (known once the kernel is loaded on a GPU: ``load=True``
    loads it there, and raises Triton's OutOfResources if it does not fit; None otherwise)."""
    if load:
        compiled._init_handles()  # Triton reads registers and spills when it loads the binary
    return {"shared_bytes": int(compiled.metadata.shared),
            "n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None)}


def plan(kernels=configs.KERNELS, archs=ARCHS, head_dims=configs.BLOCK_DS, dtypes=DTYPES):
    """Every default configuration the library would launch, as compile jobs.

    Each job compiles the causal kernel (the one with the most code); where the
    mask has a default of its own, a second job compiles that one without the mask.
    """
    jobs = []
    for kernel in kernels:
        for cc in archs:
            for hd in head_dims:
                for dtype in dtypes:
                    picks = {causal: configs.default(kernel, cc=cc, block_d=configs.block_d(hd),
                                                     elem_bytes=_ELEM_BYTES[dtype], causal=causal)
                             for causal in (True, False)}
                    for causal, config in picks.items():
                        if causal or config != picks[True]:
                            jobs.append(dict(kernel=kernel, cc=cc, head_dim=hd, dtype=dtype, causal=causal,
                                             config=[config.block_m, config.block_n,
                                                     config.num_warps, config.num_stages]))
    return jobs


def _no_assembly(*args):
    """A Triton stages hook that stops at PTX: its "cubin" stage returns no binary (no
    ``ptxas``). Called with no arguments it names itself for Triton's cache key."""
    if not args:
        return "flashbook-no-assembly", "1"
    args[1]["cubin"] = lambda src, metadata: b""


def run_job(job: dict, compile_gluon=None) -> dict:
    """Compile one job from ``plan``; report shared memory (bytes) and registers if known.

    ``compile_gluon`` compiles the "gluon_forward" jobs (by default ``hopper.compile_for``;
    benchmarks/gluon_lab.py passes its own), with the job's ``options`` as keywords.
    ``job["assemble"] = False`` stops at PTX, without ``ptxas`` (about 40% of a compile):
    everything reported here comes from the PTX and Triton's metadata, and where the
    target's GPU runs the tests anyway (sm_90 here) ``ptxas`` runs there. ``job["sass_ops"]``
    (assembled jobs only): SASS opcodes such as "MUFU.EX2" to count in the disassembly."""
    from triton import knobs

    out = dict(job)
    knobs.runtime.add_stages_inspection_hook = None if job.get("assemble", True) else _no_assembly
    try:
        if job["kernel"] == "gluon_forward":   # chapter 10's Gluon kernel (hopper.py): config = [m, n, warps, stages]
            if compile_gluon is None:
                from .hopper import compile_for as compile_gluon

            block_m, block_n, _, stages = job["config"]   # block_m may be 192: three 64-row warpgroups
            compiled = compile_gluon(job["cc"], head_dim=job["head_dim"], block_m=block_m,
                                     block_n=block_n, stages=stages, schedule=job["schedule"],
                                     causal=job.get("causal", True), dtype=job["dtype"], **job.get("options", {}))
        else:
            compiled = compile_kernel(job["kernel"], cc=job["cc"], config=Config(*job["config"]), head_dim=job["head_dim"],
                                      dtype=job["dtype"], causal=job.get("causal", True),
                                      atomic_dq=job.get("atomic_dq", False), n_new=job.get("n_new", 1),
                                      splits=job.get("splits", True),
                                      dot_precision=job.get("dot_precision", "tf32"),
                                      page_size=job.get("page_size", 0), window=job.get("window", False),
                                      tile_in_page=job.get("tile_in_page", False),
                                      softcap=job.get("softcap", False), varlen=job.get("varlen", False),
                                      prefix=job.get("prefix", False), alibi=job.get("alibi", False))
        out["shared"] = resources(compiled)["shared_bytes"]
        # Tensor-core instructions in the PTX: mma (sm_80) or wgmma (sm_90). On sm_75
        # Triton emits none: tl.dot becomes plain fused multiply-adds there.
        ptx = compiled.asm.get("ptx", "")
        out["tensor_core_ops"] = ptx.count("mma.sync") + ptx.count("wgmma.mma_async")
        # how many asynchronous products each wait leaves running (sm_90): 0 waits for all
        out["wgmma_waits"] = sorted({int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)})
        out["tma_copies"] = ptx.count("cp.async.bulk.tensor")
        out["register_moves"] = ptx.count("setmaxnreg")   # warp specialisation's register reallocation
        cap = re.search(r"\.maxnreg (\d+)", ptx)   # a register cap given at compile time
        out["register_cap"] = int(cap.group(1)) if cap else None
        out["exponentials"] = ptx.count("ex2.approx")   # on the special-function unit
        out["shared_accesses"] = ptx.count("ld.shared") + ptx.count("st.shared")   # not TMA, not wgmma operands
        if job.get("sass_ops"):   # instructions of the assembled code (SASS), e.g. "MUFU.EX2": needs assemble
            sass = compiled.asm["sass"]
            out["sass_ops"] = {op: len(re.findall(re.escape(op) + r"\b", sass)) for op in job["sass_ops"]}
        out["error"] = None
    except Exception as e:  # reported, not raised: the caller decides what a failure means
        out["shared"] = None
        out["tensor_core_ops"] = out["tma_copies"] = out["register_moves"] = out["register_cap"] = None
        out["wgmma_waits"] = None
        out["exponentials"] = out["shared_accesses"] = None
        out["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
    knobs.runtime.add_stages_inspection_hook = None
    return out


def compile_elsewhere(jobs: list[dict], *, workers: int = 1, cache_dir: str | None = None,
                      timeout: float = 1800, script: str | None = None) -> list[dict]:
    """Run ``run_job`` for each job in a fresh Python process with TRITON_INTERPRET=0.

    ``cache_dir`` becomes Triton's cache (TRITON_CACHE_DIR): a second call with the
    same jobs then takes seconds. ``script``: a Python file that reads the jobs as
    ``main`` does (benchmarks/gluon_lab.py, for its kernels) instead of this module.
    Returns ``run_job``'s results, in order.
    """
    import os
    import subprocess
    import tempfile

    env = dict(os.environ, TRITON_INTERPRET="0")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, stated to keep 3.9 quiet
    if cache_dir:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        proc = subprocess.run(
            [sys.executable, *([script] if script else ["-m", "flashbook.kernels.targets"]), "--workers", str(workers),
             "--out", out],
            input=json.dumps(jobs), text=True, capture_output=True, env=env, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"compilation process failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv=None, run=run_job) -> int:
    """``python -m flashbook.kernels.targets [--workers N] [--all] [--out FILE]``.

    Reads compile jobs (a JSON list of dicts like ``plan()``'s) on stdin, or takes
    the whole ``plan()`` with ``--all``, and writes the results as JSON on stdout.
    ``run`` compiles one job (``run_job``, or a script's own: ``compile_elsewhere``).
    """
    import argparse
    import os
    from concurrent.futures import ProcessPoolExecutor

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--workers", type=int, default=1, help="compile in this many processes")
    parser.add_argument("--all", action="store_true", help="compile every default configuration")
    parser.add_argument("--out", help="write the JSON results here instead of stdout")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("set TRITON_INTERPRET=0 to compile for a GPU target", file=sys.stderr)
        return 2
    jobs = plan() if args.all else json.load(sys.stdin)
    if args.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(run, jobs))
    else:
        results = [run(job) for job in jobs]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
    else:
        json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
