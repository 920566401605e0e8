"""Where flash_attn_with_kvcache's host time goes, on a GPU: the time per call from Python of
each piece of a decoding step at batch 1 (a 2K cache, 32 query heads on 8 KV heads, d = 128,
bf16, one new token), where the GPU's work is far shorter than the host's, and a profile of
the whole rotary call.

    PYTHONPATH=. python3 benchmarks/kvcache_host.py --out DIR

Each row: median over 5 rounds of (wall time of 1,000 calls / 1,000), the GPU synchronised
before and after each round only. Writes DIR/kvcache_host.json (rows, provenance) and
DIR/profile.txt (cProfile of 1,000 rotary calls, by own time).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import flashbook  # noqa: E402
from flashbook import bench  # noqa: E402
from flashbook.kernels import append, decode, flash_decode  # noqa: E402
from flashbook.kernels.decode_choices import _lengths_from_int  # noqa: E402

B, H, H_KV, D, N = 1, 32, 8, 128, 2048
CALLS, ROUNDS = 1000, 5


def per_call_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(B, 1, H, D, device=dev, dtype=dt)
    k_cache, v_cache = (torch.randn(B, N, H_KV, D, device=dev, dtype=dt) for _ in range(2))
    k, v = k_cache[:, -1:].clone(), v_cache[:, -1:].clone()
    cos, sin = torch.ones(N, D // 2, device=dev, dtype=dt), torch.zeros(N, D // 2, device=dev, dtype=dt)
    lengths = torch.full((B,), N - 1, device=dev, dtype=torch.int32)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k_cache, v_cache))
    out = torch.empty_like(q)
    fa = flashbook.flash_attn_with_kvcache
    pieces = {
        "flash_decode (the attention alone)": lambda: flash_decode(qt, kt, vt, cache_seqlens=lengths + 1),
        "kvcache, reading only": lambda: fa(q, k_cache, v_cache, cache_seqlens=lengths + 1, causal=True),
        "kvcache, append (int length)": lambda: fa(q, k_cache, v_cache, k, v, cache_seqlens=N - 1, causal=True),
        "kvcache, append (tensor lengths)": lambda: fa(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=True),
        "kvcache, rotary + append": lambda: fa(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                               cache_seqlens=lengths, causal=True),
        "append.append_kv (the k/v write)": lambda: append.append_kv(k, v, k_cache, v_cache, lengths),
        "append.append_kv with rotary": lambda: append.append_kv(k, v, k_cache, v_cache, lengths, None, cos, sin),
        "append.rotate_into (q)": lambda: append.rotate_into(q, out, cos, sin, lengths, 1),
        "decode.plan_of (cached)": lambda: decode.plan_of(qt, kt, vt, lengths, None, None, True, None, False, None,
                                                          None, True, warn=False),
        "lengths + 1 (one small op)": lambda: (lengths + 1).to(torch.int32),
        "_lengths_from_int": lambda: _lengths_from_int(N - 1, q, N - 1, "the cache"),
        "torch.empty like q": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
    }
    rows = [{"piece": name, "us_per_call": round(per_call_us(fn), 2)} for name, fn in pieces.items()]
    for r in rows:
        print(f"{r['us_per_call']:8.1f} us  {r['piece']}", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        pieces["kvcache, rotary + append"]()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    with open(os.path.join(args.out, "profile.txt"), "w") as f:
        f.write(text.getvalue())
    prov = bench.collect_provenance(argv, program="python3 benchmarks/kvcache_host.py")
    prov["settings"] = {"batch": B, "heads": H, "kv_heads": H_KV, "head_dim": D, "cache": N, "dtype": "bf16",
                        "calls": CALLS, "rounds": ROUNDS}
    with open(os.path.join(args.out, "kvcache_host.json"), "w") as f:
        json.dump({"rows": rows, "provenance": prov}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
