"""The numbers behind statements a careful reader found wrong, and that the book now
states correctly (issue "read like a book", item 7)."""
import math

import pytest

from flashbook import bench, runtime


def test_seed_table_flash_memory_agrees_with_chapter_5():
    # B = 8, H = 32, N = 4096, d = 128, fp16: Q, K, V, O are 4 * 8 * 32 * 4096 * 128 * 2 bytes
    qkvo = 4 * 8 * 32 * 4096 * 128 * 2
    assert round(qkvo / 1e9, 2) == 1.07
    o_lse = qkvo / 4 + 8 * 32 * 4096 * 4
    claim = bench.check_seed_table().claims["flash_memory"]
    assert claim.computed == pytest.approx(o_lse / 1e9)
    assert f"{qkvo / 1e9:.2f} GB" in claim.why and "impossible" in claim.why
    assert "beyond" in claim.text and claim.verdict == "consistent"


def test_ridge_uses_the_fma_rate_on_the_t4():
    t4 = runtime.chip("T4")
    assert t4.ridge_flop_per_byte == pytest.approx(t4.fp32_tflops / t4.hbm_tb_s)
    assert t4.ridge_flop_per_byte < 30 < runtime.chip("A100").ridge_flop_per_byte


def test_exp_costs_more_than_an_fma_on_every_chip():
    for c in runtime.CHIPS.values():
        fma_per_s = c.fp32_tflops * 1e12 / 2
        assert fma_per_s / c.exp_per_s == pytest.approx(runtime.FP32_PER_CLOCK_PER_SM[c.arch] / 16)


def test_h200_memory_is_one_number_in_one_unit():
    h200 = runtime.chip("H200")
    assert h200.hbm_bytes == 141 * 2**30
    assert math.isclose(h200.hbm_bytes / 1e9, 151.4, rel_tol=1e-3)
