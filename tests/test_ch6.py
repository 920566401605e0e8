"""Chapter 6 (the GPU and Triton): the chip facts it draws, and the notebook's references.

The numbers in flashbook.runtime.CHIPS come from datasheets, the CUDA programming
guide and the architecture whitepapers. These tests check them against each other
and against independent published figures, so a mistyped fact fails here.
"""
import os
import re

import pytest

from conftest import ROOT
from flashbook import runtime
from notebook_text import markdown, notebook, source_text

CHIPS = runtime.CHIPS
NOTEBOOK = os.path.join(ROOT, "notebooks", "06_gpu_and_triton.ipynb")


def test_shared_memory_per_program_fits_in_one_sm():
    for c in CHIPS.values():
        assert 0 < c.smem_per_block_kib <= c.smem_per_sm_kib, c.name
        assert c.smem_per_block_bytes == c.smem_per_block_kib * 1024


def test_per_sm_limits_match_the_compute_capability():
    # CUDA guide: 64 K 32-bit registers per SM on 7.5, 8.0 and 9.0; resident threads
    # per SM 1024 on 7.5 and 2048 on 8.0 / 9.0; shared memory per SM 64 / 164 / 228 KiB.
    threads = {"sm_75": 1024, "sm_80": 2048, "sm_90": 2048}
    smem = {"sm_75": 64, "sm_80": 164, "sm_90": 228}
    for c in CHIPS.values():
        assert c.regs_per_sm_kib * 1024 == 64 * 1024 * 4, c.name
        assert c.max_warps_per_sm * runtime.WARP_SIZE == threads[c.arch], c.name
        assert c.smem_per_sm_kib == smem[c.arch], c.name
    assert runtime.SMEM_BYTES_PER_CLOCK_PER_SM == 32 * 4      # 32 banks of 32 bits


def test_only_turing_lacks_bf16_tensor_cores():
    for c in CHIPS.values():
        assert (c.bf16_tflops is None) == (c.arch == "sm_75"), c.name
        if c.bf16_tflops is not None:
            assert c.bf16_tflops == c.fp16_tflops, c.name  # same dense rate from sm_80 on


@pytest.mark.parametrize("name, peak_tflops, tb_s", [
    # the rate tl.dot gets and memory bandwidth, as printed on each datasheet: the dense
    # fp16 tensor peak from sm_80 on; on the T4 (sm_75) Triton's tl.dot is fp32 FMAs,
    # 40 SMs x 64 FMA x 2 FLOPs x 1590 MHz (the datasheet rounds it to 8.1 TFLOP/s)
    ("T4", 40 * 64 * 2 * 1590e6 / 1e12, 0.320), ("A100", 312, 2.039), ("H100", 989, 3.35),
    ("H200", 989, 4.8),
])
def test_ridge_points(name, peak_tflops, tb_s):
    assert runtime.chip(name).ridge_flop_per_byte == pytest.approx(peak_tflops / tb_s, rel=1e-9)


def test_ridge_points_order():
    ridge = {n: c.ridge_flop_per_byte for n, c in CHIPS.items()}
    assert ridge["T4"] < ridge["A100"] < ridge["H200"] < ridge["H100"]
    assert round(ridge["H100"]) == 295 and round(ridge["A100"]) == 153


def test_datasheet_peak_is_reachable_at_the_clock():
    # Dense fp16 tensor FLOPs per clock per SM (architecture whitepapers)
    from flashbook.runtime import TENSOR_FLOP_PER_CLOCK_PER_SM as per_clock_per_sm
    for c in CHIPS.values():
        at_clock = c.sms * per_clock_per_sm[c.arch] * c.boost_clock_mhz * 1e6
        # the quoted peak is at most the max-clock rate; H100's is quoted at a lower clock
        assert 0.9 < c.fp16_tflops * 1e12 / at_clock <= 1.01, c.name


def test_shared_memory_bandwidth():
    a100 = runtime.chip("A100")
    # The FlashAttention paper (Figure 1) gives the A100's SRAM bandwidth as 19 TB/s.
    assert 19.0 <= a100.smem_tb_s < 20.0
    assert a100.smem_tb_s == pytest.approx(108 * 128 * 1.41e9 / 1e12)
    for c in CHIPS.values():
        assert c.smem_tb_s > 5 * c.hbm_tb_s, c.name      # on chip is the fast level


def test_notebook_cites_only_known_keys():
    with open(os.path.join(ROOT, "book", "references.bib")) as f:
        keys = set(re.findall(r"^@\w+\{([^,\s]+),", f.read(), flags=re.M))
    cited = set()
    for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", markdown(NOTEBOOK)):
        cited.update(k.strip() for k in group.split(","))
    assert cited, "chapter 6 cites nothing"
    assert cited <= keys, f"unknown citation keys: {sorted(cited - keys)}"


def test_every_number_in_the_prose_is_glued():
    nb = notebook(NOTEBOOK)
    used = set(re.findall(r"\{glue(?::\w+)?\}`([\w]+)", markdown(nb)))
    glued = set(re.findall(r"""glue(?:_text)?\(\s*f?["']([\w{}.()\[\]"']+)["']""", source_text(nb, "code")))
    # f-string names such as f"ridge_{name.lower()}" are expanded over the chips
    expanded = set()
    for name in glued:
        if "{name.lower()}" in name:
            expanded |= {name.replace("{name.lower()}", n.lower()) for n in CHIPS}
        elif "{warps}" in name:
            expanded |= {name.replace("{warps}", str(w)) for w in (4, 8)}
        elif "{" in name:        # another f-string name (f"spill_{name}_values"): a pattern of names
            pattern = re.compile(re.sub(r"\\\{[^}]*\\\}", r"\\w+", re.escape(name)) + "$")
            expanded |= {u for u in used if pattern.match(u)}
        else:
            expanded.add(name)
    assert used, "chapter 6 glues nothing"
    assert used <= expanded, f"prose uses numbers no cell computes: {sorted(used - expanded)}"


def test_h200_l2_is_the_driver_reported_size():
    # An H200's CUDA driver reports 60 MiB of L2 (torch: L2_cache_size); the H100 SXM
    # whitepaper gives 50 MB for the H100. Same SM count, different L2.
    assert runtime.chip("H200").l2_mib == 60 and runtime.chip("H100").l2_mib == 50
    assert runtime.chip("H200").sms == runtime.chip("H100").sms


@pytest.mark.gpu
def test_this_gpu_matches_the_table():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    name = torch.cuda.get_device_name()
    matches = [c for key, c in CHIPS.items() if key in name]
    if not matches:
        pytest.skip(f"{name} is not in CHIPS")
    c = matches[0]
    props = torch.cuda.get_device_properties(0)
    arch = "sm_" + "".join(map(str, torch.cuda.get_device_capability()))
    assert arch == c.arch
    assert props.multi_processor_count == c.sms
    assert props.L2_cache_size == c.l2_mib * 1024**2
    import triton

    drv = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
    assert drv["max_shared_mem"] == c.smem_per_block_bytes
    assert drv["sm_clock_rate"] == c.boost_clock_mhz * 1000
