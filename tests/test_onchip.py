"""One on-chip memory model for the whole book: tiled.smem_bytes / tiled.largest_tile."""
import pytest

from flashbook import runtime, tiled


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


def test_sm80_model_is_q_plus_stages_of_k_and_v():
    a100 = runtime.chip("A100")
    assert tiled.smem_bytes(128, 64, 128, num_stages=3) == 2 * (128 * 128 + 3 * 2 * 64 * 128)
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
