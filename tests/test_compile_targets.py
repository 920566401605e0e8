"""Every kernel configuration the library launches compiles for sm_75, sm_80 and sm_90.

No GPU is needed: Triton compiles for a named target with the ``ptxas`` it ships.
For each chip the test checks that the shared memory one program really allocates
(``compiled.metadata.shared``) fits that chip's limit (``flashbook.runtime.CHIPS``),
and that every head_dim the library accepts has a configuration that compiles.

Compilation runs in a subprocess with TRITON_INTERPRET=0 (this process may have
imported triton in interpreter mode): ``flashbook.kernels.targets.compile_elsewhere``.
Triton's on-disk cache outlives the checkout (``conftest.compile_cache``), so a second run takes
seconds; a cold run is about 100 CPU-seconds for the three chips (Triton 3.9, ptxas
included; measured job after job on the CI machine: 23 s sm_75, 48 s sm_80 with its IEEE
float32 jobs, 29 s sm_90). The sm_90 jobs stop at PTX (``assemble=False``): ``ptxas``
is about 30-40% of a compile, and the GPU tests assemble and run those kernels on an H200;
the T4's and the A100's kernels are assembled here, the only place they are, each kind of
kernel once (``assembled``).
"""
from __future__ import annotations

import os

import pytest

from conftest import compile_cache
from flashbook import runtime
from flashbook.kernels import configs, targets

CHIP_OF = {75: "T4", 80: "A100", 90: "H100"}


def _config(kernel, cc, bd, elem, causal=False, window=False):
    if not configs.supported(kernel, cc=cc, block_d=bd, elem_bytes=elem):
        return None
    return configs.default(kernel, cc=cc, block_d=bd, elem_bytes=elem, causal=causal, window=window)


def _job(kernel, cc, head_dim, dtype, config, causal=True, atomic_dq=False):
    return dict(kernel=kernel, cc=cc, head_dim=head_dim, dtype=dtype, causal=causal, atomic_dq=atomic_dq,
                config=[config.block_m, config.block_n, config.num_warps, config.num_stages])


def jobs_for(cc: int) -> list[dict]:
    """The compilations that cover every configuration the library launches on one chip.

    Shared memory only grows with the head_dim tile and the element size, so each
    (kernel, configuration) is compiled once, at the largest tile and element size
    that selects it for either mask: if it fits there, it fits wherever else it is used. On top of
    that, the smallest tile (16) for each kernel, causal (the branch with the most
    code) throughout, the forward in bfloat16 and the backward in float16, a head_dim
    that is not a power of two (80, masked loads) for the 128 tile, and the atomic-dQ
    backward once.
    """
    widest = {}  # (kernel, config) -> (block_d, elem_bytes) with the most bytes per tile row
    for kernel in configs.KERNELS:
        for bd in configs.BLOCK_DS:
            for elem in (2, 4):
                for causal in (False, True):  # a few defaults differ between the masks
                    config = _config(kernel, cc, bd, elem, causal)
                    if config is not None:
                        widest[kernel, config] = max(widest.get((kernel, config), (0, 0)), (bd, elem),
                                                     key=lambda be: (be[0] * be[1], be[1]))
    jobs = []
    for (kernel, config), (bd, elem) in widest.items():
        dtype = "fp32" if elem == 4 else "bf16" if kernel == "forward" else "fp16"
        jobs.append(_job(kernel, cc, 80 if bd == 128 else bd, dtype, config))
    for kernel in configs.KERNELS:
        smallest = _config(kernel, cc, 16, 2)
        if widest[kernel, smallest] != (16, 2):
            jobs.append(_job(kernel, cc, 16, "fp16", smallest))
    jobs.append(_job("backward_dkdv", cc, 128, "fp16", _config("backward_dkdv", cc, 128, 2), atomic_dq=True))
    # float32 as PyTorch's default switch ("highest") runs it: IEEE products, no tensor cores.
    # Compiled on sm_80 only. Measured with Triton 3.9 at head_dim 128 (forward, dK/dV, dQ):
    # on sm_80 IEEE needs more shared memory than TF32 for the forward (115,200 B against
    # 98,304 B), so it must be checked there; on sm_90 it needs less than TF32 for each
    # kernel (164,352 / 147,968 / 106,496 B against 196,608 / 197,120 / 131,072 B, which
    # the TF32 jobs above check) and took 194 CPU-s to compile, 153 of them the dK/dV kernel;
    # on sm_75 TF32 is already compiled to the same FMA code (identical shared memory).
    # packed documents with a sliding window and a soft cap (chapter "One kernel, many
    # masks"): the window's three stages, the cap's tanh and the per-document lengths, at the
    # widest tile the half-precision kernels take, each kernel at its window configuration
    if cc != 75:
        for kernel in configs.KERNELS:
            jobs.append(dict(_job(kernel, cc, 128, "bf16", _config(kernel, cc, 128, 2, window=True), causal=False),
                             window=True, softcap=True, varlen=True))
            if cc == 90:   # a prefix-LM (causal, the prefix's wider bounds) with ALiBi (every tile biased):
                # one compile for both switches, each a few CPU-minutes less of CI than a job of its own
                jobs.append(dict(_job(kernel, cc, 128, "bf16", _config(kernel, cc, 128, 2, True)), prefix=True,
                                 alibi=True))
    if cc == 80:
        for kernel in configs.KERNELS:
            config = _config(kernel, cc, 128, 4)
            if config is not None:
                jobs.append(dict(_job(kernel, cc, 128, "fp32", config), dot_precision="ieee"))
    return jobs


def assembled(jobs: list[dict]) -> list[bool]:
    """For each job, whether ``ptxas`` runs on it. sm_90's kernels are assembled and run by the
    GPU tests on the H200: here they stop at PTX. On sm_75 and sm_80 every kind of kernel (a
    kernel, an element type, a product precision, the mask switches) is assembled once, at its
    widest head_dim; its other tile sizes give ptxas the same instructions and stop at PTX,
    where shared memory and the tensor-core instructions are read. The A100's IEEE float32
    jobs stop at PTX too: what they check is shared memory, from Triton's metadata, and their
    FMA-only kernels are ptxas's slowest (assembling them took 12 of sm_80's 97 CPU-seconds,
    measured here job by job from a cold cache)."""
    def kind(job):
        return (job["kernel"], job["dtype"], job.get("dot_precision"), job.get("atomic_dq"), job.get("window"),
                job.get("prefix"))
    widest = {}
    for i, job in enumerate(jobs):
        if kind(job) not in widest or job["head_dim"] > jobs[widest[kind(job)]]["head_dim"]:
            widest[kind(job)] = i
    return [job["cc"] != 90 and job.get("dot_precision") != "ieee" and widest[kind(job)] == i
            for i, job in enumerate(jobs)]


@pytest.mark.slow(seconds=35)
@pytest.mark.parametrize("cc", sorted(CHIP_OF))
def test_defaults_compile_and_fit(cc):
    cache_dir = compile_cache()
    workers = max(1, min(2, os.cpu_count() or 1))
    jobs = jobs_for(cc)
    jobs = [dict(job, assemble=a) for job, a in zip(jobs, assembled(jobs))]
    results = targets.compile_elsewhere(jobs, workers=workers, cache_dir=cache_dir, timeout=900)
    limit = runtime.chip(CHIP_OF[cc]).smem_per_block_bytes
    failures = [r for r in results if r["error"] or r["shared"] > limit]
    report = "\n".join(
        f"  {r['kernel']} head_dim={r['head_dim']} {r['dtype']} config={r['config']}: "
        + (r["error"][:400] if r["error"] else f"shared {r['shared']} B > limit {limit} B")
        for r in failures)
    assert not failures, f"sm_{cc}: {len(failures)} of {len(results)} configurations fail:\n{report}"
    # What the book says about tensor cores: every kernel's tl.dot uses them on sm_80
    # and sm_90; on sm_75 (the T4) Triton compiles it to plain FMAs.
    for r in results:
        if r.get("dot_precision") == "ieee":
            continue  # the claim is about tensor-core products; IEEE float32 ones are left out
        if cc == 75:
            assert r["tensor_core_ops"] == 0, f"sm_75 {r['kernel']}: Triton now emits mma; update the book"
        else:
            assert r["tensor_core_ops"] > 0, f"sm_{cc} {r['kernel']} {r['dtype']}: no tensor-core instruction"
        # chapter 10: on sm_90 the forward's products are asynchronous wgmma, each waited for
        # with none left running (wait_group 0); leaving one running is what Gluon adds
        if cc == 90 and r["kernel"] == "forward":
            assert r["wgmma_waits"] == [0], f"sm_90 forward: waits {r['wgmma_waits']}; update chapter 10"
    # The estimate that ``keep`` filters with, against the compiled kernel's own number.
    # Measured over these jobs (Triton 3.9): forward and dQ 0.63-1.00 of the estimate (exact
    # on sm_90 for most), never above it; dK/dV 0.52-1.34: the estimate understates some
    # dK/dV configurations (64 x 64 at head_dim 128 on sm_90: 132 KB compiled, 98 KB
    # estimated), which is why a launch that does not fit moves on to the next candidate.
    if cc != 75:  # no tensor cores: Triton lays out shared memory otherwise there
        elem_bytes = {"fp16": 2, "bf16": 2, "fp32": 4}
        for r in results:
            config = configs.Config(*r["config"])
            estimate = configs.smem_estimate(r["kernel"], config, configs.block_d(r["head_dim"]),
                                             elem_bytes[r["dtype"]], cc)
            high = 1.5 if r["kernel"] == "backward_dkdv" else 1.0
            assert 0.4 * estimate <= r["shared"] <= high * estimate, \
                f"sm_{cc} {r['kernel']} {config} d={r['head_dim']}: compiled {r['shared']} B, estimate {estimate} B"
    # every head_dim tile the library accepts has its configuration compiled, per kernel
    compiled = {(r["kernel"], configs.Config(*r["config"])) for r in results if not r["error"]}
    for kernel in configs.KERNELS:
        for bd in configs.BLOCK_DS:
            for elem in (2, 4):
                config = _config(kernel, cc, bd, elem)
                assert config is None or (kernel, config) in compiled, \
                    f"sm_{cc}: {kernel} for head_dim tile {bd} ({8 * elem}-bit) has no compiled configuration"
            assert _config(kernel, cc, bd, 2) is not None, f"sm_{cc}: {kernel} does not support head_dim {bd}"


def test_unsupported_combinations_are_only_fp32_at_large_head_dim():
    """Only float32 with a 256-wide head_dim tile on the T4 finds no configuration; the
    library then refuses it with a clear error instead of failing to launch."""
    unsupported = [(kernel, cc, bd, elem)
                   for kernel in configs.KERNELS for cc in CHIP_OF for bd in configs.BLOCK_DS
                   for elem in (2, 4)
                   if not configs.supported(kernel, cc=cc, block_d=bd, elem_bytes=elem)]
    assert all(cc == 75 and bd == 256 and elem == 4 for _, cc, bd, elem in unsupported), unsupported
    with pytest.raises(ValueError, match="shared memory"):
        configs.default("backward_dkdv", cc=75, block_d=256, elem_bytes=4)


def test_keep_rejects_what_cannot_fit():
    big = configs.Config(128, 128, 8, 4)
    assert not configs.keep("forward", big, cc=75, block_d=256, elem_bytes=2)
    assert configs.keep("forward", configs.Config(64, 64, 4, 2), cc=90, block_d=64, elem_bytes=2)
    for cc in CHIP_OF:
        for kernel in configs.KERNELS:
            for bd in configs.BLOCK_DS:
                for elem in (2, 4):
                    kept = configs.kept_candidates(kernel, cc=cc, block_d=bd, elem_bytes=elem)
                    limit = configs.smem_limit(cc)
                    assert all(configs.smem_estimate(kernel, c, bd, elem, cc) <= limit for c in kept)


def test_mask_specific_defaults():
    """At head_dim 128 on sm_90 the dK/dV kernel has one default per mask (measured on
    an H200: benchmarks/results/backward_pairs_h200.json); everything else is shared."""
    def pick(kernel, causal, cc=90, bd=128):
        return configs.default(kernel, cc=cc, block_d=bd, elem_bytes=2, causal=causal)

    assert pick("backward_dkdv", False) == configs.Config(64, 64, 4, 2)
    assert pick("backward_dkdv", True) == configs.Config(64, 128, 8, 3)
    assert pick("backward_dq", False) == pick("backward_dq", True) == configs.Config(128, 64, 8, 4)
    for kernel in configs.KERNELS:
        for cc in CHIP_OF:
            for bd in configs.BLOCK_DS:
                if (kernel, cc, bd) != ("backward_dkdv", 90, 128):
                    assert pick(kernel, False, cc, bd) == pick(kernel, True, cc, bd), (kernel, cc, bd)
    # a sliding window's dQ on sm_90 at head_dim 128 (masks_h200/masks_profile.json) and its forward
    # at head_dim <= 128 (masks_h200-5: the forward tile sweeps); the rest as without it
    window = {(kernel, cc, bd): configs.default(kernel, cc=cc, block_d=bd, elem_bytes=2, window=True)
              for kernel in configs.KERNELS for cc in CHIP_OF for bd in configs.BLOCK_DS}
    assert window.pop(("backward_dq", 90, 128)) == configs.Config(64, 64, 4, 2)
    for bd in configs.BLOCK_DS:
        if bd <= 128:
            assert window.pop(("forward", 90, bd)) == configs.Config(64, 64, 4, 3), bd
    assert all(cfg == pick(kernel, False, cc, bd) for (kernel, cc, bd), cfg in window.items())
    # a long sliding window is tiled as the causal mask, a short one as above (configs.tiles_for)
    assert configs.tiles_for(False, configs.LONG_WINDOW) == (True, False)
    assert configs.tiles_for(False, configs.LONG_WINDOW - 1) == (False, True)
    assert configs.tiles_for(True, None) == (True, False) and configs.tiles_for(False, None) == (False, False)
    with pytest.raises(TypeError, match="causal"):
        configs.default("forward", cc=90, block_d=64, elem_bytes=2, causal="yes")
    with pytest.raises(TypeError, match="window"):
        configs.default("forward", cc=90, block_d=64, elem_bytes=2, window=1)


def decode_jobs(cc: int) -> list[dict]:
    """flash_decode's kernels as the library launches them on a GPU at head_dim 128: bf16
    with one new token in a group of 4 (16-row tile, float32 partials for the combine),
    fp16 with 16 new tokens (64 rows, the most shared memory; output written directly),
    the paged kernel on 16-token pages and on 64-token pages (a tile in one page), and the
    combine kernel holding the most splits; the
    16-token and the paged kernels also with a sliding window (``WINDOW``: three stages)."""
    from flashbook.kernels.decode import MAX_SPLITS, decode_tiles

    jobs = []
    for dtype, n_new, splits, window in (("bf16", 1, True, False), ("fp16", 16, False, False),
                                         ("fp16", 16, False, True)):
        config = configs.Config(*decode_tiles(128, 2, 4 * n_new, interpreter=False))
        jobs.append(dict(_job("decode", cc, 128, dtype, config, causal=not window), n_new=n_new, splits=splits,
                         window=window))
    # a paged cache of 16-token pages (vLLM's default): key tiles gathered across pages
    config = configs.Config(*decode_tiles(128, 2, 4, page_size=16, interpreter=False))
    for window in (False, True):
        jobs.append(dict(_job("decode", cc, 128, "bf16", config, causal=not window), n_new=1, splits=True,
                         page_size=16, window=window))
    # 64-token pages hold a whole key tile: one page index per tile (decode.TILE_IN_PAGE)
    config = configs.Config(*decode_tiles(128, 2, 4, page_size=64, interpreter=False))
    jobs.append(dict(_job("decode", cc, 128, "bf16", config), n_new=1, splits=True, page_size=64,
                     tile_in_page=True))
    jobs.append(_job("decode_combine", cc, 128, "bf16", configs.Config(1, MAX_SPLITS, 4, 1)))
    return jobs


@pytest.mark.slow(seconds=15)
def test_decode_kernels_compile_and_fit():
    """sm_80 and sm_90 in one compilation process (about a minute cold on two cores)."""
    cache_dir = compile_cache()
    workers = max(1, min(2, os.cpu_count() or 1))
    results = targets.compile_elsewhere(decode_jobs(80) + decode_jobs(90), workers=workers,
                                        cache_dir=cache_dir, timeout=900)
    for r in results:
        limit = runtime.chip(CHIP_OF[r["cc"]]).smem_per_block_bytes
        what = f"sm_{r['cc']} {r['kernel']} head_dim={r['head_dim']} {r['dtype']} config={r['config']}"
        assert r["error"] is None, f"{what}: {r['error'][:400]}"
        assert r["shared"] <= limit, f"{what}: shared {r['shared']} B > limit {limit} B"
        if r["kernel"] == "decode":
            assert r["tensor_core_ops"] > 0, f"{what}: no tensor-core instruction"
