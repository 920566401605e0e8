"""Chapter 9's Nsight Compute readings (``chapter9.build`` calls ``ncu`` after the speed
section): what the tensor cores executed, the backward's registers, spills and DRAM bytes,
and SDPA's kernels, from the recorded profile of ``benchmarks/kernel_ncu.py``.
"""
from __future__ import annotations

from .chapter9_measured import _span
from .costs import attention_flops
from .profiles import one

#: The names of Nsight Compute's readings (``ncu``).
NCU_KEYS = ("ncu_shape", "ncu_fb_ops", "ncu_cudnn_ops", "ncu_flash_ops", "ncu_fb_us", "ncu_cudnn_us",
            "ncu_rate", "ncu_regs", "ncu_spill_full", "ncu_spill_causal", "ncu_cudnn_regs",
            "ncu_cudnn_spill", "ncu_nospill_tile", "ncu_nospill_ms", "ncu_spill_ms",
            "ncu_tc_fb_fwd", "ncu_tc_cudnn_fwd", "ncu_flash_wgmma", "ncu_fb_dram_bwd",
            "ncu_fb_read_gb", "ncu_cudnn_read_gb", "ncu_fb_tb_s", "ncu_cudnn_tb_s",
            "ncu_pair_tile", "ncu_pair_spill_mb", "ncu_pair_spill_ms", "ncu_pair_clean_ms",
            "ncu_pair_spill_warps", "ncu_pair_clean_warps", "ncu_flash_copies", "ncu_flash_copy_mb",
            "ncu_cudnn_launch", "ncu_cfg_full", "ncu_cfg_causal", "ncu_pair_spill_ops", "ncu_pair_clean_ops",
            "ncu_tc_flash_fwd", "ncu_flash_fwd_x", "ncu_flash_spill_gb", "ncu_flash_regs", "ncu_cudnn_threads",
            "ncu_nospill_cfg", "ncu_spill_cfg", "ncu_nospill_ops", "ncu_spill_ops", "ncu_nospill_slower",
            "ncu_pair_dkdv_x", "ncu_toolchain", "ncu_cudnn_wgmma", "ncu_run_flash_fwd_x", "ncu_peak",
            "ncu_flash_peak_pct", "ncu_fb_peak_pct", "ncu_cudnn_peak_pct",
            "ncu_flash_per_busy", "ncu_fb_per_busy", "ncu_cudnn_per_busy",
            "ncu_dq_regs", "ncu_dq_spill_full", "ncu_dq_spill_causal", "ncu_run_cudnn_peak_pct",
            "ncu_two_cfg", "ncu_two_spill_mb", "ncu_dkdv_two_ms", "ncu_dkdv_clean_ms", "ncu_dkdv_three_ms",
            "ncu_clean_faster", "ncu_stage_gain")


def ncu(ch) -> None:
    """Nsight Compute's count of what the tensor cores did, one pass per kernel on the H200
    (benchmarks/kernel_ncu.py; ``profiles`` reads ncu's CSV with the passes)."""
    from . import profiles
    from .runs import run_path
    from .. import runtime

    ch.put("hbm_tb_s", runtime.chip("H200").hbm_tb_s, "g")      # the datasheet's, beside the measured rates
    ch.put("max_regs", runtime.MAX_REGS_PER_THREAD)               # the most registers one thread may have
    run = run_path("kernel_ncu", ch.root) if ch.root is not None else None
    if run is None or not run.exists():
        ch.nothing(*NCU_KEYS)
        return
    table = profiles.pass_table(run)
    ch.tables["ncu_passes"] = table
    rows = profiles.kernel_rows(run)      # every profiled kernel, read once
    at = table[table["dim"] == 128].set_index(["impl", "causal", "pass_"])
    fb, cu, fl = (one(at, (impl, False, "backward")) for impl in ("triton", "sdpa-cudnn", "sdpa-flash"))
    ch.put("ncu_shape", f"B = {fb['batch']}, H = {fb['heads']}, N = {fb['seq']}, d = 128, bf16, no mask")
    ch.put("ncu_fb_ops", fb["ops_ratio"], ".2f"); ch.put("ncu_cudnn_ops", cu["ops_ratio"], ".2f")
    ch.put("ncu_flash_ops", fl["ops_ratio"], ".2f")
    ch.put("ncu_fb_us", fb["us"], ",.0f"); ch.put("ncu_cudnn_us", cu["us"], ",.0f")
    # executed ops per microsecond, ours over cuDNN's
    ch.put("ncu_rate", (fb["ops_ratio"] / fb["us"]) / (cu["ops_ratio"] / cu["us"]), ".2f")
    ch.put("ncu_regs", fb["regs"]); ch.put("ncu_spill_full", fb["spill_mb"], ".0f")
    ch.put("ncu_spill_causal", one(at, ("triton", True, "backward"), "spill_mb"), ".0f")
    # the dQ kernel of the same passes: its registers and local-memory stores (it spills too)
    dq = {k["causal"]: k for k in rows if k["impl"] == "triton" and k["pass_"] == "backward"
          and k["dim"] == 128 and k["Kernel Name"] == "_bwd_dq"}
    ch.put("ncu_dq_regs", int(dq[False][profiles.REGS]) if False in dq else None)
    for causal, key in ((False, "full"), (True, "causal")):
        ch.put(f"ncu_dq_spill_{key}", dq[causal][profiles.SPILL_ST] / 1e6 if causal in dq else None, ".0f")
    # which dK/dV tile spilled those: the library's defaults, with the warps each launch had
    from .chapter8 import ncu_dkdv_registers
    from ..kernels import configs

    launched = ncu_dkdv_registers(128, ch.root)
    for causal, key in ((False, "full"), (True, "causal")):
        cfg = configs.default("backward_dkdv", cc=90, block_d=128, elem_bytes=2, causal=causal)
        warps = launched.get(f"warps_{key}")
        ch.put(f"ncu_cfg_{key}", f"{cfg.block_m} × {cfg.block_n}, {warps} warps" if warps else None)
    ch.put("ncu_fb_dram_bwd", fb["dram_mb"], ",.0f")
    ch.put("ncu_cudnn_regs", cu["regs"]); ch.put("ncu_cudnn_spill", cu["spill_mb"], ".0f")
    # the tensor pipe in the forward, ours against cuDNN's (the share of active cycles it was busy)
    ch.put("ncu_tc_fb_fwd", one(at, ("triton", False, "forward"), "tensor_pct"), ".0f")
    ch.put("ncu_tc_cudnn_fwd", one(at, ("sdpa-cudnn", False, "forward"), "tensor_pct"), ".0f")
    # the causal dK/dV tiles profiled one by one: the default spills; the fastest tile that does not
    tiles = profiles.causal_dkdv_tiles(table)
    spilling = tiles[tiles["spill_mb"] == one(at, ("triton", True, "backward"), "spill_mb")]
    # the fastest tile that does not spill and executes the same tensor work as the default:
    # the like-with-like test of what the spill costs
    clean = tiles[tiles["spill_mb"] == 0]
    if len(spilling):
        clean = clean[(clean["ops_ratio"] - spilling["ops_ratio"].iloc[0]).abs() < 1e-6]
    if len(spilling) and len(clean):
        best, default = clean.loc[clean["us"].idxmin()], spilling.iloc[0]
        bm, bn, _, _ = best["config_dkdv"]
        ch.put("ncu_nospill_tile", f"{bm} × {bn}")
        ch.put("ncu_nospill_ms", best["us"] / 1000, ".2f"); ch.put("ncu_spill_ms", default["us"] / 1000, ".2f")
        ch.put("ncu_nospill_cfg", profiles.tile_label(best["config_dkdv"]))
        ch.put("ncu_spill_cfg", profiles.tile_label(default["config_dkdv"]))
        ch.put("ncu_nospill_ops", best["ops_ratio"], ".2f"); ch.put("ncu_spill_ops", default["ops_ratio"], ".2f")
        ch.put("ncu_nospill_slower", 100 * (best["us"] / default["us"] - 1), ".0f")
    else:
        ch.nothing("ncu_nospill_tile", "ncu_nospill_ms", "ncu_spill_ms", "ncu_nospill_cfg", "ncu_spill_cfg",
                   "ncu_nospill_ops", "ncu_spill_ops", "ncu_nospill_slower")
    # like with like: the spill-free tile against the default tile at the same (fewer) stages, and
    # what the default's extra stage buys; the dK/dV kernel alone (the delta and dQ kernels are the same)
    at_clean_stages = tiles.iloc[:0]
    if len(spilling) and len(clean):   # the default's tile and warps at the spill-free tile's stages
        at_clean_stages = tiles[tiles["config_dkdv"].map(lambda c: tuple(c[:3]) == tuple(default["config_dkdv"][:3])
                                                       and c[3] == best["config_dkdv"][3])]
    if len(at_clean_stages):
        two = at_clean_stages.iloc[0]
        kernel_ms = {tuple(k["config_dkdv"]): k[profiles.TIME] / 1e6 for k in rows
                     if k["impl"] == "triton-dkdv" and k.get("mask") == "causal" and k["dim"] == 128
                     and k["Kernel Name"] == "_bwd_dkdv"}
        t_two, t_clean, t_three = (kernel_ms[tuple(r["config_dkdv"])] for r in (two, best, default))
        ch.put("ncu_two_cfg", profiles.tile_label(two["config_dkdv"]))
        ch.put("ncu_two_spill_mb", two["spill_mb"], ".0f")
        ch.put("ncu_dkdv_two_ms", t_two, ".2f"); ch.put("ncu_dkdv_clean_ms", t_clean, ".2f")
        ch.put("ncu_dkdv_three_ms", t_three, ".2f")
        ch.put("ncu_clean_faster", 100 * (1 - t_clean / t_two), ".0f")
        ch.put("ncu_stage_gain", 100 * (t_two / t_three - 1), ".0f")
    else:
        ch.nothing("ncu_two_cfg", "ncu_two_spill_mb", "ncu_dkdv_two_ms", "ncu_dkdv_clean_ms", "ncu_dkdv_three_ms",
                   "ncu_clean_faster", "ncu_stage_gain")
    ch.put("ncu_toolchain", profiles.toolchain(run))     # whether a tile spills depends on it
    # the same causal tile and stages, spilling (fewer warps) against not spilling (more warps)
    pairs = [(a, b) for _, a in tiles[tiles["spill_mb"] > 0].iterrows() for _, b in tiles[tiles["spill_mb"] == 0].iterrows()
             if (a["config_dkdv"][0], a["config_dkdv"][1], a["config_dkdv"][3])
             == (b["config_dkdv"][0], b["config_dkdv"][1], b["config_dkdv"][3])
             and b["config_dkdv"][2] > a["config_dkdv"][2]]
    if pairs:
        a, b = pairs[0]
        ch.put("ncu_pair_tile", f"{a['config_dkdv'][0]} × {a['config_dkdv'][1]}")
        ch.put("ncu_pair_spill_mb", a["spill_mb"], ".0f")
        ch.put("ncu_pair_spill_ms", a["us"] / 1000, ".2f"); ch.put("ncu_pair_clean_ms", b["us"] / 1000, ".2f")
        ch.put("ncu_pair_spill_warps", a["config_dkdv"][2]); ch.put("ncu_pair_clean_warps", b["config_dkdv"][2])
        # what the pair does not hold equal: the tensor ops each executed (more warps may recompute)
        ch.put("ncu_pair_spill_ops", a["ops_ratio"], ".2f"); ch.put("ncu_pair_clean_ops", b["ops_ratio"], ".2f")
    else:
        ch.nothing("ncu_pair_tile", "ncu_pair_spill_mb", "ncu_pair_spill_ms", "ncu_pair_clean_ms",
                   "ncu_pair_spill_warps", "ncu_pair_clean_warps", "ncu_pair_spill_ops", "ncu_pair_clean_ops")
    # what each whole backward (every kernel of the pass) read from and wrote to HBM, d = 128, no mask
    # the pair's dK/dV kernel alone: the tensor ops the more warps executed over the fewer's
    if pairs:
        def dkdv_ops(config):
            return sum(k.get(m, 0.0) for k in rows if k["impl"] == "triton-dkdv" and k.get("mask") == "causal"
                       and k["dim"] == 128 and tuple(k["config_dkdv"]) == tuple(config)
                       and k["Kernel Name"] == "_bwd_dkdv" for m in profiles.TENSOR_OPS)
        ch.put("ncu_pair_dkdv_x", dkdv_ops(b["config_dkdv"]) / dkdv_ops(a["config_dkdv"]), ".2f")
    else:
        ch.nothing("ncu_pair_dkdv_x")

    def pass_kernels(impl, pass_="backward"):
        return [k for k in rows if k["impl"] == impl and k["pass_"] == pass_ and k["dim"] == 128 and not k["causal"]]

    for impl, key in (("triton", "fb"), ("sdpa-cudnn", "cudnn")):
        ks = pass_kernels(impl)
        read = sum(k[profiles.DRAM_READ] for k in ks)
        moved = read + sum(k["dram__bytes_write.sum"] for k in ks)
        ch.put(f"ncu_{key}_read_gb", read / 1e9, ".2f")
        ch.put(f"ncu_{key}_tb_s", moved / (sum(k[profiles.TIME] for k in ks) * 1e-9) / 1e12, ".1f")
    # the shape of cuDNN's forward launch: threads per program (in warpgroups of 128) and programs per SM
    main = max(pass_kernels("sdpa-cudnn", "forward"), key=lambda k: k[profiles.TIME], default=None)
    if main is not None:
        threads, programs = profiles.launch_extent(main, "Block Size"), profiles.launch_extent(main, "Grid Size")
        sms = int(main.get("device__attribute_multiprocessor_count") or 0)
        ch.put("ncu_cudnn_launch", f"{threads // 128} warpgroups ({threads} threads) per program and "
               f"{programs} programs" + (", one per SM" if programs == sms else f" on {sms} SMs"))
    else:
        ch.nothing("ncu_cudnn_launch")
    # the registers ncu reads are a launch figure: per thread, for the whole program's threads
    bwd = max(pass_kernels("sdpa-cudnn"), key=lambda k: k[profiles.TIME], default=None)
    ch.put("ncu_cudnn_threads", profiles.launch_extent(bwd, "Block Size") if bwd is not None else None)
    ch.put("ncu_cudnn_wgmma", profiles.forward_wgmma(rows, "sdpa-cudnn")
           if pass_kernels("sdpa-cudnn", "forward") else None, ",")
    # SDPA-flash's forward against ours: the tensor pipe's busy share, the time, and its spill
    ours, flash = one(at, ("triton", False, "forward")), one(at, ("sdpa-flash", False, "forward"))
    ch.put("ncu_tc_flash_fwd", flash["tensor_pct"], ".0f"); ch.put("ncu_flash_fwd_x", flash["us"] / ours["us"], ".2f")
    # "busy" counts the cycles the tensor pipe was active, not the work done in them: the rate
    # each forward reached, as a share of the chip's peak, over its busy share is the work per busy cycle
    peak = runtime.chip("H200").bf16_tflops
    ch.put("ncu_peak", peak, "g")
    for impl, key in (("sdpa-flash", "flash"), ("triton", "fb"), ("sdpa-cudnn", "cudnn")):
        r = one(at, (impl, False, "forward"))
        flops = attention_flops(int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["seq"]), 128)
        of_peak = flops / (r["us"] * 1e-6) / 1e12 / peak
        ch.put(f"ncu_{key}_peak_pct", 100 * of_peak, ".0f")
        ch.put(f"ncu_{key}_per_busy", of_peak / (r["tensor_pct"] / 100), ".2f")
    # the same ratio in the full comparison run (medians, at the profiled shape)
    res = ch.results
    same = (res[(res["status"] == "ok") & (res["batch"] == int(ours["batch"])) & (res["heads"] == int(ours["heads"]))
                & (res["seq"] == int(ours["seq"])) & (res["head_dim"] == 128) & ~res["causal"]].set_index("impl")
            if res is not None else None)
    ch.put("ncu_run_flash_fwd_x", same.loc["sdpa-flash", "fwd_ms"] / same.loc["flashbook", "fwd_ms"]
           if same is not None and {"sdpa-flash", "flashbook"} <= set(same.index) else None, ".2f")
    # cuDNN's forward at the same shape in the full comparison run, as a share of the peak
    ch.put("ncu_run_cudnn_peak_pct", 100 * same.loc["sdpa-cudnn", "fwd_tflops"] / peak
           if same is not None and "sdpa-cudnn" in same.index else None, ".0f")
    ch.put("ncu_flash_spill_gb", flash["spill_mb"] / 1e3, ".1f"); ch.put("ncu_flash_regs", flash["regs"])
    # SDPA-flash's backward starts with element-wise kernels (copies, by their traffic)
    copies = [k for k in pass_kernels("sdpa-flash") if "elementwise_kernel" in k["Kernel Name"]]
    ch.put("ncu_flash_copies", len(copies))
    sizes = {f"{k[profiles.DRAM_READ] / 1e6:.0f}" for k in copies}
    ch.put("ncu_flash_copy_mb", (sizes.pop() if len(sizes) == 1 else _span([float(x) for x in sizes]))
           if copies else None)
    # which tensor-core instructions SDPA's FlashAttention-2 forward issues (chapter 7 reads the same)
    ch.put("ncu_flash_wgmma", profiles.forward_wgmma(rows) if pass_kernels("sdpa-flash", "forward") else None, ",")
