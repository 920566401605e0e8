"""flash_decode: the split-K decode kernel (chapter 11), on the interpreter (or a GPU).

Every case compares the output with the float64 truth (``flashbook.reference``,
each sequence cut to its own length, KV heads repeated for their query group),
with the book's criterion (``checks.within_twice_yardstick``, as in
test_kernels.py): at most twice the error of plain PyTorch attention computed in
the input dtype, plus floors of a few float32 ulps and eps/4 for rounding luck.
The kernel keeps scores, softmax statistics, partial outputs and the merge in
float32 and rounds only P before the P V product and o at the end, so it stays
within that yardstick (which rounds S and P to the input dtype).

The interpreter cases are small (tens of keys, head_dim 16-80, key tiles of 16
there) so that each runs in about a second, yet cover: ragged lengths (one shorter
than n_new, one 0), GQA (4 query heads on 2 KV heads) and MQA, causal and not,
1 and 4 new tokens, one split, several, and more splits than key tiles, a
head_dim that is not a power of two, more query rows than one tile, a transposed
cache. GPU cases (``-m gpu``) run bf16 and fp16 at realistic sizes.
"""
from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashbook import masks, reference, runtime
from flashbook.kernels import autograd, checks, decode, flash_decode
from flashbook.kernels.decode import MAX_SPLITS, PAGE_SIZES, choose_num_splits, paginate
from flashbook.kernels.decode_choices import window_offsets

DEVICE = runtime.device()
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def truth_and_yardstick(q, k, v, lengths, causal, scale=None, window=None):
    """float64 truth and the same-dtype PyTorch yardstick, per sequence over its own keys
    (with a ``window``: ``masks.attention``, the new tokens bottom-right aligned on them)."""
    group = q.shape[1] // k.shape[1]
    want, yard = torch.zeros(q.shape, dtype=torch.float64), torch.zeros(q.shape, dtype=q.dtype)
    for b, n in enumerate(lengths):
        if n == 0:
            continue  # no key at all: the output is 0
        qb, kb, vb = q[b:b + 1].cpu(), k[b:b + 1, :, :n].cpu(), v[b:b + 1, :, :n].cpu()
        q64, k64, v64 = (x.double().repeat_interleave(r, 1).numpy() for x, r in ((qb, 1), (kb, group), (vb, group)))
        if window is None:
            want[b] = torch.from_numpy(reference.attention(q64, k64, v64, causal=causal, scale=scale))[0]
            yard[b] = checks.torch_attention(qb, kb, vb, causal=causal, scale=scale)[0]
        else:
            want[b] = torch.from_numpy(masks.attention(q64, k64, v64, causal=causal, window=window, scale=scale))[0]
            allowed = torch.from_numpy(masks.allowed(q.shape[2], n, causal=causal, window=window))
            yard[b] = checks.torch_attention(qb, kb, vb, scale=scale, allowed=allowed)[0]
    return want, yard


def run_case(b, h, h_kv, n_new, n_max, lengths, d, causal, num_splits, dtype, *, layout="bhsd",
             scale=None, seed=None):
    seed = random.randrange(2**31) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[dtype]
    q = torch.randn(b, h, n_new, d, generator=gen).to(dtype).to(DEVICE)
    if layout == "bshd":  # caches stored (batch, seq, kv_heads, d), as many servers keep them
        k, v = (torch.randn(b, n_max, h_kv, d, generator=gen).to(dtype).to(DEVICE).transpose(1, 2)
                for _ in range(2))
    else:
        k, v = (torch.randn(b, h_kv, n_max, d, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    seqlens = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    o = flash_decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits, causal=causal, scale=scale)
    assert o.shape == q.shape and o.dtype == dtype
    lengths = [n_max] * b if lengths is None else lengths
    want, yard = truth_and_yardstick(q, k, v, lengths, causal, scale)
    assert not torch.isnan(o).any(), f"seed {seed}: NaN in the output"
    problem = checks.within_twice_yardstick("o", o.cpu(), want, yard, head_dim=d)
    assert problem is None, f"seed {seed}: {problem}"
    return o


# (batch, heads, kv_heads, n_new, n_max, lengths, head_dim, causal, num_splits, dtype)
CASES = {
    "mha-1-token-causal-1-split": (2, 2, 2, 1, 50, [50, 17], 32, True, 1, "fp16"),
    "mha-1-token-full-3-splits": (2, 2, 2, 1, 50, [50, 17], 32, False, 3, "fp32"),
    "gqa-4-tokens-causal-3-splits": (2, 4, 2, 4, 70, [70, 33], 32, True, 3, "fp16"),
    "gqa-4-tokens-full-1-split": (2, 4, 2, 4, 70, [5, 70], 16, False, 1, "fp32"),
    "mqa-4-tokens-causal-2-splits": (2, 4, 1, 4, 45, [45, 2], 16, True, 2, "fp32"),  # 2 < n_new: rows see nothing
    "mqa-1-token-full": (1, 4, 1, 1, 45, None, 16, False, 2, "fp16"),
    "more-splits-than-tiles": (1, 4, 2, 1, 40, [40], 32, True, 7, "fp16"),   # 3 key tiles, 7 splits
    "empty-sequence": (2, 2, 1, 2, 30, [0, 30], 16, True, 2, "fp32"),
    "d80-default-splits": (1, 2, 2, 2, 37, None, 80, True, None, "fp16"),
    "rows-past-one-tile": (1, 8, 1, 9, 20, [20], 16, True, 2, "fp32"),      # 72 rows: two row tiles
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case):
    run_case(*CASES[case])


@settings(max_examples=8, deadline=None)
@given(n_new=st.integers(1, 5), group=st.sampled_from([1, 2, 4]), n_max=st.integers(1, 60),
       fractions=st.lists(st.floats(0, 1), min_size=2, max_size=2), causal=st.booleans(),
       num_splits=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_any_sizes(n_new, group, n_max, fractions, causal, num_splits, seed):
    """Random small shapes (caches shorter than one key tile too), float32."""
    lengths = [round(f * n_max) for f in fractions]
    run_case(2, 2 * group, 2, n_new, n_max, lengths, 16, causal, num_splits, "fp32", seed=seed)


def test_transposed_cache_and_custom_scale():
    run_case(2, 4, 2, 3, 40, [40, 21], 32, True, 3, "fp16", layout="bshd", scale=0.3)


def test_every_split_count_gives_the_same_output():
    """1, 2, 5 and 9 splits of 3 key tiles: the merge makes them agree to float32 rounding."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q = torch.randn(1, 2, 2, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(1, 1, 41, 16, generator=gen).to(DEVICE) for _ in range(2))
    outs = [flash_decode(q, k, v, num_splits=s) for s in (1, 2, 5, 9)]
    for s, o in zip((2, 5, 9), outs[1:]):
        assert torch.allclose(o, outs[0], rtol=0, atol=1e-5), f"{s} splits differ from 1"  # fp32: ~1e-7


# ------------------------------------------------------------ the split count

def test_split_count_fills_the_gpu():
    """An H200 (132 SMs, 2 programs per SM: 264 slots) at 32K keys in tiles of 64 (512
    tiles): batch 1 with 8 KV heads takes 32 splits of 16 tiles, 256 programs in one
    wave (33 would leave the same 16 tiles per split); batch 8 takes 4 (256 programs);
    batch 64 (512 programs) takes none."""
    assert choose_num_splits(1, 8, 32768, sm_count=132, block_n=64) == 32
    assert choose_num_splits(8, 8, 32768, sm_count=132, block_n=64) == 4
    # batch 64 fills the GPU unsplit, but 4 splits ran faster on the H200 (decode_h200-3)
    assert choose_num_splits(64, 8, 32768, sm_count=132, block_n=64) == 4
    assert choose_num_splits(64, 8, 32768, sm_count=132, block_n=64, min_splits=1) == 1   # the model alone
    assert choose_num_splits(64, 8, 2048, sm_count=132, block_n=64) == 2    # 32 tiles: splits of 16
    assert choose_num_splits(64, 8, 1024, sm_count=132, block_n=64) == 1    # 16 tiles: no floor
    for batch in (1, 2, 3, 8, 16, 32):
        s = choose_num_splits(batch, 8, 131072, sm_count=132, block_n=64)
        waves = batch * 8 * s / 264
        assert 1 <= s <= MAX_SPLITS and waves / np.ceil(waves) >= 0.9, (batch, s)
    # short caches: at least 2 key tiles per split
    assert choose_num_splits(1, 8, 256, sm_count=132, block_n=64) == 2
    assert choose_num_splits(1, 8, 64, sm_count=132, block_n=64) == 1
    assert choose_num_splits(1, 1, 0, sm_count=132, block_n=64) == 1
    assert choose_num_splits(1, 8, 32768, sm_count=1, block_n=16) == 1   # the interpreter


def test_split_count_errors():
    with pytest.raises(ValueError, match="sm_count must be >= 1"):
        choose_num_splits(1, 8, 1024, sm_count=0, block_n=64)
    with pytest.raises(TypeError, match="batch must be an integer"):
        choose_num_splits(1.5, 8, 1024, sm_count=132, block_n=64)


# ------------------------------------------------------------ errors

def _inputs(b=1, h=4, h_kv=2, n_new=1, n_max=20, d=16, dtype=torch.float32):
    q = torch.randn(b, h, n_new, d, dtype=dtype, device=DEVICE)
    k = torch.randn(b, h_kv, n_max, d, dtype=dtype, device=DEVICE)
    return q, k, torch.randn_like(k)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_splits": 0}, ValueError, "num_splits must be >= 1"),
    ({"num_splits": MAX_SPLITS + 1}, ValueError, f"num_splits must be at most {MAX_SPLITS}"),
    ({"num_splits": 2.0}, TypeError, "num_splits must be an integer"),
    ({"causal": 1}, TypeError, "causal must be True or False"),
    ({"scale": -1.0}, ValueError, "scale must be a finite number > 0"),
    ({"cache_seqlens": [20]}, TypeError, "cache_seqlens must be a torch.Tensor"),
    ({"cache_seqlens": torch.tensor([20.0])}, TypeError, "cache_seqlens must be int32 or int64"),
    ({"cache_seqlens": torch.tensor([20, 20])}, ValueError, r"cache_seqlens must have shape \(1,\)"),
    ({"cache_seqlens": torch.tensor([21]), "check_values": True}, ValueError, r"cache_seqlens must be in \[0, 20\]"),
    ({"cache_seqlens": torch.tensor([-1]), "check_values": True}, ValueError, r"cache_seqlens must be in \[0, 20\]"),
    ({"check_values": 1}, TypeError, "check_values must be True or False"),
])
def test_bad_arguments(kwargs, error, match):
    q, k, v = _inputs()
    if isinstance(kwargs.get("cache_seqlens"), torch.Tensor):
        kwargs = {**kwargs, "cache_seqlens": kwargs["cache_seqlens"].to(DEVICE)}
    with pytest.raises(error, match=match):
        flash_decode(q, k, v, **kwargs)


def test_bad_tensors_are_named():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="1 to 16 new tokens"):
        flash_decode(torch.randn(1, 4, 17, 16, device=DEVICE), k, v)
    with pytest.raises(ValueError, match=r"k_cache's number of heads \(3\) must divide q's \(4\)"):
        flash_decode(q, *_inputs(h_kv=3)[1:])
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same sequence length"):
        flash_decode(q, k, v[:, :, :10])
    with pytest.raises(TypeError, match="q, k_cache and v_cache must have the same dtype"):
        flash_decode(q, k.half(), v)
    with pytest.raises(ValueError, match="v_cache must have 4 dimensions"):
        flash_decode(q, k, v[0])
    with pytest.raises(TypeError, match="k_cache must be a torch.Tensor"):
        flash_decode(q, k.cpu().numpy(), v)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's refusal of bfloat16")
def test_bfloat16_is_refused_on_the_interpreter():
    with pytest.raises(TypeError, match="bfloat16"):
        flash_decode(*_inputs(dtype=torch.bfloat16))


# ------------------------------------------------------------ on a GPU

GPU_CASES = {  # (batch, heads, kv_heads, n_new, n_max, lengths, head_dim, causal, num_splits)
    "b1-32k-gqa-default-splits": (1, 32, 8, 1, 32768, None, 128, True, None),
    "b4-ragged-4-tokens": (4, 32, 8, 4, 8192, [8192, 1, 3000, 4097], 128, True, None),
    "b3-ragged-full-many-splits": (3, 16, 2, 2, 5000, [5000, 129, 2500], 64, False, 128),
    "b8-mqa-16-tokens": (8, 16, 1, 16, 2048, [2048, 1000, 17, 2047, 5, 1024, 1500, 64], 128, True, 5),
}


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_realistic_sizes(case, dtype):
    run_case(*GPU_CASES[case], dtype)


def test_a_call_signature_fixes_everything_the_checks_and_the_compiled_kernel_read(monkeypatch):
    """The host's short path: a call whose signature matches an earlier call's skips the
    checks and Triton's lookup. So the signature must differ wherever a check or Triton's
    specialisation could answer differently, and be None (the checked path) where it
    cannot be trusted."""
    monkeypatch.setattr(decode.runtime, "INTERPRET", False)   # the short path is for GPUs; the key is not
    q, k, v = (torch.randn(s) for s in ((2, 8, 1, 16), (2, 2, 40, 16), (2, 2, 40, 16)))
    lengths = torch.tensor([40, 7], dtype=torch.int32)

    def key(q=q, k=k, v=v, lengths=lengths, table=None, splits=None, causal=True, scale=None, check=False,
            window=None):
        return decode._signature(q, k, v, lengths, table, splits, causal, scale, check, window)

    base = key()
    assert base is not None and key() == base and hash(key()) == hash(base)
    assert key(lengths=torch.tensor([3, 3], dtype=torch.int32)) == base        # values are read on the GPU
    buf = torch.randn(2 * 8 * 16 + 1)
    shifted = buf[1:].view(2, 8, 1, 16)                     # 4 bytes off a 16-byte boundary
    different = [key(q=q.half()), key(q=q.transpose(0, 1).contiguous().transpose(0, 1)), key(q=shifted),
                 key(k=k[:, :, :39]), key(v=v.transpose(2, 3).contiguous().transpose(2, 3)),
                 key(lengths=lengths.long()), key(lengths=None), key(splits=3), key(causal=False),
                 key(scale=0.5), key(q=torch.nn.Parameter(q)), key(window=(4, 0)), key(window=(5, 0))]
    assert all(d is not None and d != base for d in different)
    assert len(set(different)) == len(different)
    for trusted_not in (dict(check=True), dict(check=None), dict(causal=1), dict(splits=2.0),
                        dict(scale=torch.tensor(0.5)), dict(scale=True), dict(q=q.numpy()),
                        dict(window=[4, 0]), dict(window=(4.0, 0)), dict(window=(np.int64(4), 0)),
                        dict(window=(4, 0, 0))):
        assert key(**trusted_not) is None, trusted_not
    monkeypatch.setattr(decode.runtime, "INTERPRET", True)
    assert key() is None                                    # the interpreter always takes the checked path


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("window", [None, (1000, 0)])
@pytest.mark.parametrize("paged", [False, True])
def test_the_short_path_gives_the_checked_paths_bits(paged, window):
    """The second call of a signature launches from the compiled kernels' own launchers; it
    must give bit for bit what Triton's launch gives, with fresh inputs and poisoned
    outputs, and must still refuse what the checks refuse (a new signature)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    for seed in range(5):
        q, k, v = (torch.randn(s, generator=gen, device="cuda").to(torch.bfloat16)
                   for s in ((3, 32, 2, 128), (3, 8, 3000, 128), (3, 8, 3000, 128)))
        lengths = torch.tensor([3000, 1, 1777], device="cuda", dtype=torch.int32)
        if seed % 2:   # inputs the kernel cannot read as they are: q (batch, n_new, heads, d) transposed, int64
            q, lengths = q.transpose(1, 2).contiguous().transpose(1, 2), lengths.long()
        kwargs = dict(cache_seqlens=lengths, num_splits=4, window=window)
        if paged:
            k, v, table = decode.paginate(k, v, 64, generator=torch.Generator().manual_seed(seed))
            kwargs["block_table"] = table
        decode._PLANS.clear()
        with autograd.poisoned_outputs():
            checked = flash_decode(q, k, v, **kwargs)      # Triton's launch; the plan is kept
            assert len(decode._PLANS) == 1
            plan = next(iter(decode._PLANS.values()))
            # the first call keeps the compiled kernels; the second takes their launchers
            assert plan.split.launcher is None and plan.split.compiled is not None
            assert plan.as_is[0] == plan.as_is[3] == (seed % 2 == 0)
            short = flash_decode(q, k, v, **kwargs)        # the compiled kernels' launchers
            assert plan.split.launcher is not None and plan.combine.launcher is not None
        assert torch.equal(checked, short) and not short.isnan().any()
    with pytest.raises(ValueError, match="cache_seqlens must have shape"):
        flash_decode(q, k, v, **{**kwargs, "cache_seqlens": lengths[:2]})


# ------------------------------------------------------------ the GPU benchmark's CPU-checkable part

def _decode_bench():
    from conftest import benchmark_script

    return benchmark_script("decode_bench")


def test_decode_bench_plan_and_judge():
    """benchmarks/decode_bench.py: bytes, plan and argument errors; and its correctness
    judgement of flash_decode and SDPA's math backend on a small float32 case here."""
    db = _decode_bench()
    # the bytes of the caches the benchmark reads, counted on the tensors it makes (meta: no
    # memory); a Llama-3-8B-like layer, 8 KV heads x 128 x bf16, holds 4 KiB per token
    for batch, seq in ((1, 32768), (8, 1024)):
        _q, k, v = db.decode_inputs(batch, seq, device="meta")
        assert db.kv_bytes(batch, seq) == k.nbytes + v.nbytes == batch * seq * 4096
    assert [s for *_, s in db.plan((1, 64), (1024, 131072), memory_bytes=40e9)] == [None, None, None, "skipped-memory"]
    assert db.main(["--dry-run", "--batches", "1", "--seqs", "1K"]) == 0
    with pytest.raises(SystemExit):
        db.parse_args(["--impl", "sdpa-nothing", "--out", "x"])
    with pytest.raises(SystemExit):
        db.parse_args(["--sweep-caches", "dense,flat", "--out", "x"])
    assert db.parse_shapes("64x2K, 1x128K") == ((64, 2048), (1, 131072))
    with pytest.raises(Exception, match="BATCHxSEQ"):
        db.parse_shapes("64-2K")
    args = db.parse_args(["--out", "x", "--split-shapes", "8x1K", "--sweep-caches", "paged,paged-rows"])
    assert args.split_shapes == ((8, 1024),) and args.sweep_caches == ("paged", "paged-rows")
    decode._PLANS["stale"] = object()
    with db._reading("paged-rows"):   # the row gather for one sweep, then the default again
        assert decode.TILE_IN_PAGE is False and not decode._PLANS
        decode._PLANS["made under it"] = object()
    assert decode.TILE_IN_PAGE is True and not decode._PLANS
    with db._reading("paged"):
        assert decode.TILE_IN_PAGE is True
    rows = [db.Row(1, 32768, "flash_decode", ms=0.05, graph_ms=0.04, copy_fraction=0.7, copy_fraction_graph=0.85),
            db.Row(1, 32768, "sdpa-flash", ms=0.06, graph_ms=0.03),
            db.Row(8, 65536, "flash_decode", ms=0.4, graph_ms=0.39, copy_fraction=0.9, copy_fraction_graph=0.91),
            db.Row(1, 32768, "sdpa-math", status="oom")]
    verdict = db.goals(rows)
    assert verdict["graph_ms"]["all_at_least_0.8"] and not verdict["ms"]["all_at_least_0.8"]
    assert not verdict["graph_ms"]["batch1_faster_than_every_sdpa"]   # sdpa-flash's 0.03 ms
    assert verdict["ms"]["batch1_faster_than_every_sdpa"]
    if DEVICE != "cpu":
        return
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q = torch.randn(1, db.HEADS, 1, db.HEAD_DIM, generator=gen)
    k, v = (torch.randn(1, db.KV_HEADS, 40, db.HEAD_DIM, generator=gen) for _ in range(2))
    impls = db.implementations()
    for name in ("flash_decode", "sdpa-math", "flash_decode-softcap", "flash_decode-lse", "kvcache",
                 "kvcache-append", "kvcache-rotary", "kvcache-paged-append"):
        want, yardstick, want_lse = db.reference_batch0(q, k, v, softcap=db.SOFTCAP_OF.get(name))
        call, _ = impls[name](q, k, v)
        row = db.Row(1, 40, name)
        o, lse = db._output(name, call())
        db.judge(row, o, want, yardstick, lse, want_lse)
        assert row.check == "pass" and row.rel_error < 1e-5, (name, row)
        assert (lse is None) == (name != "flash_decode-lse") and (lse is None or "max lse error" in row.note)
    # the judge fails what is wrong: another cache's output, an lse shifted by 0.01
    want, yardstick, want_lse = db.reference_batch0(q, k, v)
    row = db.Row(1, 40, "flash_decode")
    db.judge(row, flash_decode(q, k.flip(2), v), want, yardstick)
    assert row.check != "pass"
    row = db.Row(1, 40, "flash_decode-lse")
    o, lse = flash_decode(q, k, v, return_softmax_lse=True)
    db.judge(row, o, want, yardstick, lse + 0.01, want_lse)
    assert row.check.startswith("lse off by")


# ------------------------------------------------------------ lengths without a device sync

def test_lengths_are_clamped_on_the_device_without_check_values():
    """No check of the values (no sync): a length past the cache reads the whole cache,
    a negative one nothing, and nothing is read outside the cache."""
    q, k, v = _inputs(b=3)
    wild = torch.tensor([25, -3, 20], device=DEVICE)
    got = flash_decode(q, k, v, cache_seqlens=wild, num_splits=2)
    want = flash_decode(q, k, v, cache_seqlens=torch.tensor([20, 0, 20], device=DEVICE), num_splits=2)
    assert torch.equal(got, want)
    assert torch.equal(got[1], torch.zeros_like(got[1]))


# ------------------------------------------------------------ a paged KV cache

def _paged_case(b, h, h_kv, n_new, n_max, lengths, d, page_size, seed, *, causal=True, num_splits=None,
                dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_new, d, generator=gen).to(dtype).to(DEVICE)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    seqlens = torch.tensor(lengths, device=DEVICE)
    kp, vp, table = paginate(k, v, page_size, generator=gen, spare=2)
    dense = flash_decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits, causal=causal)
    paged = flash_decode(q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=num_splits,
                         causal=causal, check_values=True)
    return q, k, v, dense, paged


@pytest.mark.parametrize("tile_in_page", [True, False])
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_paged_cache_gives_the_dense_result(page_size, causal, tile_in_page, monkeypatch):
    """Shuffled pages, spare pages, GQA, ragged lengths (one empty, one shorter than a
    page, one not a whole number of pages): the paged call reads the same keys as the
    dense one. With tiles of 16 keys in the interpreter the splits and tiles are the
    same, so the results agree bit for bit; and both are within the rule of float64.
    Both ways of finding a tile's rows: one page index per tile (pages of a tile or more,
    the default) and one per row (``decode.TILE_IN_PAGE`` off)."""
    monkeypatch.setattr(decode, "TILE_IN_PAGE", tile_in_page)
    decode._PLANS.clear()
    lengths = [70, 0, 9, 37]
    q, k, v, dense, paged = _paged_case(4, 4, 2, 3, 70, lengths, 16, page_size, seed=page_size,
                                        causal=causal, num_splits=3)
    assert torch.equal(dense, paged)
    want, yard = truth_and_yardstick(q, k, v, lengths, causal)
    assert checks.within_twice_yardstick("o", paged.cpu(), want, yard, head_dim=16) is None


@pytest.mark.parametrize("block_n", [32, 64])
def test_a_key_tile_may_span_several_pages(monkeypatch, block_n):
    """On a GPU a tile holds 64 keys at d = 128, so 16-token pages put four pages in one
    tile: each row of the tile is gathered from its own page. The interpreter's tiles are
    16 keys, so here they are widened to span 2 and 4 pages, with ragged lengths that end
    inside a page and inside a tile."""
    real = decode.decode_tiles
    monkeypatch.setattr(decode, "decode_tiles",
                        lambda *a, **kw: (real(*a, **kw)[0], block_n, 4, 1))
    lengths = [70, 0, 9, 37]
    q, k, v, dense, paged = _paged_case(4, 4, 2, 2, 70, lengths, 16, 16, seed=block_n, num_splits=2)
    want, yard = truth_and_yardstick(q, k, v, lengths, True)
    assert torch.equal(dense, paged)
    assert checks.within_twice_yardstick("o", paged.cpu(), want, yard, head_dim=16) is None


def test_pages_shared_between_sequences():
    """Two sequences that share a prefix store it once: sequence 1's first two pages are
    sequence 0's. Its result is the dense one over a cache whose prefix is sequence 0's."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 1, 16, generator=gen).half().to(DEVICE)
    k, v = (torch.randn(2, 1, 64, 16, generator=gen).half().to(DEVICE) for _ in range(2))
    k[1, :, :32], v[1, :, :32] = k[0, :, :32], v[0, :, :32]     # the shared prefix
    kp, vp, table = paginate(k, v, 16, generator=gen)
    table[1, :2] = table[0, :2]        # sequence 1 points at sequence 0's prefix pages
    lengths = torch.tensor([64, 50], device=DEVICE)
    got = flash_decode(q, kp, vp, cache_seqlens=lengths, block_table=table, num_splits=2)
    want = flash_decode(q, k, v, cache_seqlens=lengths, num_splits=2)
    assert torch.equal(got, want)


def test_paginate_keeps_every_key_where_the_table_says():
    gen = torch.Generator().manual_seed(2)
    k, v = (torch.randn(2, 3, 40, 16, generator=gen) for _ in range(2))
    kp, vp, table = paginate(k, v, 16, generator=gen, spare=4)
    assert kp.shape == (2 * 3 + 4, 3, 16, 16) and table.shape == (2, 3) and table.dtype == torch.int32
    for b in range(2):
        for pos in (0, 15, 16, 39):
            page, off = table[b, pos // 16], pos % 16
            assert torch.equal(kp[page, :, off], k[b, :, pos]) and torch.equal(vp[page, :, off], v[b, :, pos])


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "block_table": a["block_table"].float()}, TypeError, "block_table must be int32 or int64"),
    (lambda a: {**a, "block_table": a["block_table"][:1]}, ValueError, r"block_table must have shape \(2, 2\)"),
    (lambda a: {**a, "block_table": a["block_table"][0]}, ValueError, "block_table must be a 2-D tensor"),
    (lambda a: {**a, "block_table": a["block_table"][:, :0]}, ValueError, "at least one page per sequence"),
    (lambda a: {**a, "k_cache": a["k_cache"][:, :, :12], "v_cache": a["v_cache"][:, :, :12]}, ValueError,
     r"page_size \(axis 2\) must be one of"),
    (lambda a: {**a, "v_cache": a["v_cache"][:3]}, ValueError, "k_cache and v_cache must have the same shape"),
    (lambda a: {**a, "k_cache": a["k_cache"][0]}, ValueError, "k_cache must be a 4-D tensor of pages"),
    (lambda a: {**a, "block_table": a["block_table"] + 100, "check_values": True}, ValueError,
     r"block_table must be in \[0, 5\] \(pages of k_cache\)"),
    (lambda a: {**a, "block_table": a["block_table"] - 100, "check_values": True}, ValueError, "block_table must be in"),
    (lambda a: {**a, "cache_seqlens": torch.tensor([33, 5], device=DEVICE), "check_values": True}, ValueError,
     r"cache_seqlens must be in \[0, 32\] \(the pages of block_table hold\)"),
])
def test_bad_paged_arguments_are_named(change, error, match):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 1, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(2, 2, 32, 16, generator=gen).to(DEVICE) for _ in range(2))
    kp, vp, table = paginate(k, v, 16, generator=gen, spare=2)
    args = {"q": q, "k_cache": kp, "v_cache": vp, "block_table": table}
    args = change(args)
    with pytest.raises(error, match=match):
        flash_decode(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)


def test_paginate_refuses_a_page_size_it_cannot_read():
    k = torch.randn(1, 1, 20, 16)
    with pytest.raises(ValueError, match=re.escape(f"page_size must be one of {PAGE_SIZES}, got 48")):
        paginate(k, k, 48)


# ------------------------------------------------------------ a sliding window (flash-attn's window_size)

# (batch, heads, kv_heads, n_new, n_max, lengths, head_dim, causal, window, num_splits, dtype, page_size):
# lengths shorter than the window, 0, and shorter than n_new; GQA; the window's lower edge
# inside a key tile (16 keys in the interpreter) and inside a page
WINDOW_CASES = {
    "1-token-w20-causal": (4, 4, 2, 1, 80, [80, 9, 0, 47], 16, True, (19, 0), 3, "fp16", 16),
    "4-tokens-w21-causal": (4, 4, 2, 4, 80, [80, 9, 0, 47], 32, True, (20, 0), 2, "fp32", 32),
    "4-tokens-band-full": (3, 4, 2, 4, 70, [70, 3, 38], 16, False, (9, 2), 3, "fp16", 16),
    "3-tokens-right-only": (2, 4, 1, 3, 50, [50, 22], 16, False, (-1, 1), 2, "fp32", 16),
}


@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_window_matches_float64(case):
    """Dense and paged (shuffled pages, spare pages) against float64 with the window's mask
    (``masks.allowed``): token i of n_new at position length - n_new + i sees keys
    [pos - left, pos + right]; the paged call reads the same keys in the same tiles, so the
    two agree bit for bit."""
    b, h, h_kv, n_new, n_max, lengths, d, causal, window, splits, dtype, page_size = WINDOW_CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    q = torch.randn(b, h, n_new, d, generator=gen).to(DTYPES[dtype]).to(DEVICE)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=gen).to(DTYPES[dtype]).to(DEVICE) for _ in range(2))
    seqlens = torch.tensor(lengths, device=DEVICE)
    kw = dict(cache_seqlens=seqlens, num_splits=splits, causal=causal, window=window)
    dense = flash_decode(q, k, v, **kw)
    kp, vp, table = paginate(k, v, page_size, generator=gen, spare=2)
    paged = flash_decode(q, kp, vp, block_table=table, check_values=True, **kw)
    want, yard = truth_and_yardstick(q, k, v, lengths, causal, window=window)
    assert torch.equal(dense, paged) and not dense.isnan().any()
    assert checks.within_twice_yardstick("o", dense.cpu(), want, yard, head_dim=d) is None
    assert all(torch.equal(dense[i], torch.zeros_like(dense[i])) for i, n in enumerate(lengths) if n == 0)


@pytest.mark.parametrize("paged", [False, True])
def test_a_window_reads_only_its_keys(paged):
    """The keys below each sequence's window, [0, length - n_new - left), are NaN or inf,
    and so are those past its length; for the paged cache, the pages wholly below the window
    point at a page of NaN. A kernel that read any of them would give NaN (p = 0 times NaN
    is NaN); the window's kernel gives the result of the clean cache."""
    gen = torch.Generator().manual_seed(11)
    n_new, left, lengths = 2, 20, [90, 45, 10]
    q = torch.randn(3, 4, n_new, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(3, 2, 96, 16, generator=gen).to(DEVICE) for _ in range(2))
    kw = dict(cache_seqlens=torch.tensor(lengths, device=DEVICE), num_splits=2, window=(left, 0))
    want = flash_decode(q, k, v, **kw)
    bad_k, bad_v = k.clone(), v.clone()
    starts = [max(0, n - n_new - left) for n in lengths]
    for b, (start, n) in enumerate(zip(starts, lengths)):
        bad_k[b, :, :start], bad_v[b, :, :start] = float("nan"), float("inf")
        bad_k[b, :, n:], bad_v[b, :, n:] = float("inf"), float("nan")
    if paged:
        bad_k, bad_v, table = paginate(bad_k, bad_v, 16, generator=gen, spare=1)
        spare = sorted(set(range(bad_k.shape[0])) - set(table.flatten().tolist()))[0]
        bad_k[spare], bad_v[spare] = float("nan"), float("nan")
        for b, start in enumerate(starts):
            table[b, :start // 16] = spare
        kw["block_table"] = table
    got = flash_decode(q, bad_k, bad_v, **kw)
    assert torch.isfinite(got).all()
    assert torch.equal(got, want)   # the same keys in the same tiles: the same bits
    truth, _ = truth_and_yardstick(q, k, v, lengths, True, window=(left, 0))
    assert torch.allclose(got.cpu().double(), truth, rtol=0, atol=1e-5)


def test_window_offsets_and_the_split_count(monkeypatch):
    """What the kernel is told: no window, (-1, -1), (-1, 0) and a window wider than the
    cache take the plain kernel; the split count is chosen for the keys the window spans."""
    assert window_offsets(None, True, 4, 100) == window_offsets((-1, -1), True, 4, 100) == (True, False, 0, 0, 100)
    assert window_offsets((-1, 0), False, 4, 100) == window_offsets((100, 3), True, 4, 100) == (True, False, 0, 0, 100)
    assert window_offsets((-1, -1), False, 4, 100) == window_offsets((-1, 3), False, 4, 100) == (False, False, 0, 0, 100)
    assert window_offsets((10, 3), True, 4, 100) == (False, True, -10, 0, 14)
    assert window_offsets((10, 2), False, 4, 100) == (False, True, -10, 2, 14)
    assert window_offsets((10, 3), False, 4, 100) == (False, True, -10, 104, 14)   # right >= n_new - 1: none
    assert window_offsets((-1, 1), False, 4, 100) == (False, True, -104, 1, 100)
    seen = []
    monkeypatch.setattr(decode, "choose_num_splits", lambda *a, **kw: seen.append(a[2]) or 1)
    q, k, v = _inputs(n_max=200)
    flash_decode(q, k, v, window=(20, 0))
    flash_decode(q, k, v)
    assert seen == [21 + 16 - 1, 200]   # one key tile more than the window: its start is not aligned


@pytest.mark.parametrize("window, error, match", [
    ("20", TypeError, r"window must be a pair \(left, right\)"),
    ((20,), ValueError, r"window must be a pair \(left, right\), got 1 values"),
    ((-2, 0), ValueError, r"window\[0\] = -2: use -1 for no limit"),
    ((4, 1.5), TypeError, r"window\[1\] must be an int"),
    ((True, 0), TypeError, r"window\[0\] must be an int"),
])
def test_bad_windows_are_named(window, error, match):
    with pytest.raises(error, match=match):
        flash_decode(*_inputs(), window=window)


GPU_WINDOW_CASES = {  # (batch, heads, kv_heads, n_new, n_max, lengths, head_dim, causal, window, num_splits)
    "b4-mistral-4k-1-token": (4, 32, 8, 1, 20000, [20000, 4095, 4096, 9000], 128, True, (4095, 0), None),
    "b3-band-4-tokens-many-splits": (3, 16, 2, 4, 5000, [5000, 0, 1500], 64, False, (1000, 2), 16),
    "b2-16-tokens-w300": (2, 16, 1, 16, 3000, [3000, 7], 128, True, (300, 0), 3),
}


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("case", list(GPU_WINDOW_CASES))
def test_gpu_window_realistic_sizes(case, dtype):
    """The compiled window kernels, dense and paged (64-token pages, shuffled): within the
    yardstick of float64, and the same bits from both caches."""
    b, h, h_kv, n_new, n_max, lengths, d, causal, window, splits = GPU_WINDOW_CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    q = torch.randn(b, h, n_new, d, generator=gen).to(DTYPES[dtype]).to(DEVICE)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=gen).to(DTYPES[dtype]).to(DEVICE) for _ in range(2))
    kw = dict(cache_seqlens=torch.tensor(lengths, device=DEVICE), num_splits=splits, causal=causal, window=window)
    dense = flash_decode(q, k, v, **kw)
    kp, vp, table = paginate(k, v, 64, generator=gen)
    paged = flash_decode(q, kp, vp, block_table=table, **kw)
    want, yard = truth_and_yardstick(q, k, v, lengths, causal, window=window)
    assert checks.within_twice_yardstick("o", dense.cpu(), want, yard, head_dim=d) is None
    assert checks.within_twice_yardstick("o", paged.cpu(), want, yard, head_dim=d) is None


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_gpu_window_in_a_cuda_graph():
    """A windowed call captured in a CUDA graph follows new lengths written into the same
    tensor (the window's start is found on the GPU), with the eager call's bits."""
    from flashbook.timing import graph_replay

    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(s, generator=gen, device="cuda").to(torch.bfloat16)
               for s in ((4, 32, 1, 128), (4, 8, 8192, 128), (4, 8, 8192, 128)))
    lengths = torch.tensor([8192, 100, 5000, 4097], device="cuda", dtype=torch.int32)
    replay, out = graph_replay(lambda: flash_decode(q, k, v, cache_seqlens=lengths, window=(4095, 0)))
    for new in ([8000, 4096, 1, 6000], [17, 8192, 4095, 0]):
        lengths.copy_(torch.tensor(new, device="cuda", dtype=torch.int32))
        replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flash_decode(q, k, v, cache_seqlens=lengths, window=(4095, 0)))


@pytest.mark.parametrize("page_size, block_n, one_index", [(16, 16, True), (64, 16, True), (16, 64, False),
                                                          (32, 64, False), (64, 64, True), (128, 64, True)])
def test_a_tile_in_one_page_reads_one_page_index(monkeypatch, page_size, block_n, one_index):
    """Pages of at least a tile's keys take the one-index-per-tile loop; smaller ones gather
    each row's page (what the launch is told, for the interpreter's tiles and the GPU's)."""
    real = decode.decode_tiles
    monkeypatch.setattr(decode, "decode_tiles", lambda *a, **kw: (real(*a, **kw)[0], block_n, 4, 1))
    gen = torch.Generator().manual_seed(page_size)
    q = torch.randn(1, 2, 1, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(1, 1, 256, 16, generator=gen).to(DEVICE) for _ in range(2))
    kp, vp, table = paginate(k, v, page_size, generator=gen)
    plan = decode._plan(q, kp, vp, None, table, None, True, None, False)
    assert plan.split.kwargs["TILE_IN_PAGE"] is one_index
    assert decode._plan(q, k, v, None, None, None, True, None, False).split.kwargs["TILE_IN_PAGE"] is False
