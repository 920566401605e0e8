"""One on-chip memory model for the whole book: flashbook.smem (tiled.smem_bytes and
tiled.largest_tile for the chapters, kernels.configs.smem_estimate for the kernels)."""
import csv
import re
from pathlib import Path

import pytest

from flashbook import runtime, tiled

#: The H200 block sweep (``python -m flashbook.bench --sweep-blocks``): per forward
#: configuration, the shared memory of the kernel as compiled for sm_90.
BLOCK_SWEEP = (Path(__file__).resolve().parents[1] / "benchmarks" / "results"
               / "2026-11-29-h200-blocks" / "blocks.csv")


def test_the_model_is_the_kernels_config_filter():
    from flashbook.kernels import configs

    for cc in (75, 80, 90):
        for cfg in configs.candidates("forward"):
            for width in (32, 64, 128):
                for elt in (2, 4):
                    assert tiled.smem_bytes(cfg.block_m, cfg.block_n, width, num_stages=cfg.num_stages,
                                            dtype_bytes=elt, arch=f"sm_{cc}") == \
                        configs.smem_estimate("forward", cfg, width, elt, cc), (cfg, width, elt, cc)


def test_the_largest_t4_tile_at_d128_is_one_number():
    t4 = runtime.chip("T4")
    # sm_75: fp32 operand tiles, 4 * max(2 * 64 * 128, 64 * 64 + 64 * 128) = 65536 bytes,
    # exactly the T4's 64 KiB per program; 128 would need twice that
    assert tiled.smem_bytes(64, 64, 128, arch="sm_75") == 64 * 1024 == t4.smem_per_block_bytes
    assert tiled.smem_bytes(128, 128, 128, arch="sm_75") > t4.smem_per_block_bytes
    assert {tiled.largest_tile(t4, 128, num_stages=s) for s in (1, 2, 3)} == {64}


def test_sm80_model_is_what_the_compiler_allocated_on_the_h200():
    """Every forward configuration of the recorded H200 block sweep (sm_90, bfloat16):
    ``shared_bytes`` is ``compiled.metadata.shared`` of the kernel Triton built there, and a
    configuration that did not fit carries the compiler's "Required: N" in its note."""
    rows = list(csv.DictReader(BLOCK_SWEEP.read_text().splitlines()))
    assert len(rows) >= 60 and {r["status"] for r in rows} == {"ok", "out-of-resources"}
    for r in rows:
        if r["status"] == "ok":
            compiled = int(float(r["shared_bytes"]))
        else:
            compiled = int(re.search(r"Required: (\d+)", r["note"]).group(1))
        assert compiled > 0
        model = tiled.smem_bytes(int(r["block_m"]), int(r["block_n"]), int(r["head_dim"]),
                                 num_stages=int(r["num_stages"]), dtype_bytes=2, arch="sm_90")
        assert model == compiled, r


def test_largest_tile_on_the_a100():
    a100 = runtime.chip("A100")
    assert tiled.largest_tile(a100, 128, num_stages=2) == 128      # 2 * 128 * 128 * 5 = 160 KiB
    assert tiled.largest_tile(a100, 128, num_stages=3) == 64       # 128 would need 224 KiB


def test_per_sm_and_per_program_limits():
    for c in runtime.CHIPS.values():
        # one program may use up to the per-SM size less the 1 KiB the SM reserves (from sm_80)
        assert c.smem_per_block_kib in (c.smem_per_sm_kib, c.smem_per_sm_kib - 1)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="arch"):
        tiled.smem_bytes(64, 64, 64, arch="ampere")
    with pytest.raises(ValueError, match="d must be at most"):
        tiled.tile_d(300)


def test_smem_buffers_add_up_to_smem_bytes():
    """The figure's stacked bar (smem_buffers) and the number (smem_bytes) are one model."""
    from flashbook import smem

    for arch in ("sm_75", "sm_80", "sm_90"):
        for kernel in smem.KERNELS:
            for bm, bn, d, stages, elt in ((64, 64, 128, 2, 2), (128, 32, 64, 3, 2), (16, 128, 256, 1, 4)):
                parts = smem.smem_buffers(bm, bn, d, num_stages=stages, dtype_bytes=elt, arch=arch, kernel=kernel)
                assert sum(parts.values()) == smem.smem_bytes(bm, bn, d, num_stages=stages, dtype_bytes=elt,
                                                              arch=arch, kernel=kernel)
                if arch == "sm_75":
                    assert list(parts) == [smem.FP32_OPERANDS]
    assert smem.smem_buffers(128, 64, 128, num_stages=3) == {"Q": 32768, "K": 49152, "V": 49152}
    with pytest.raises(ValueError, match="kernel"):
        smem.smem_buffers(64, 64, 64, kernel="decode")
