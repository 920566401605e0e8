"""flash_decode's soft cap and lse, and ``flash_attn_with_kvcache`` (flash-attn's decoding call).

Every output is compared with float64 attention (``reference.torch_attention``, each sequence
cut to its own length) by the book's rule (``checks.within_twice_yardstick``: at most twice the
error of the same PyTorch math in the input dtype, plus floors). The lse is compared with the
float64 logsumexp of the same scores: the kernel forms them in float32 from the rounded inputs,
so its error is float32 accumulation (head_dim products of size |q||k|), a few 1e-6 here;
1e-4 leaves room for the GPU's approximate exp2/log2 and stays far below any real mistake
(a missing scale or cap moves the lse by whole units). On the interpreter: fp16 and fp32;
``-m gpu``: bf16 and fp16 at serving sizes, many seeds, outputs poisoned.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from flashbook import flash_attn_with_kvcache, runtime
from flashbook.kernels import autograd, checks, decode, flash_decode
from flashbook.kernels.decode import paginate

DEVICE = runtime.device()
LSE_TOLERANCE = 1e-4


def _truth(q, k, v, lengths, *, causal=True, softcap=None, window=None, scale=None):
    """float64 (o, lse) and the same-dtype yardstick o, (batch, heads, n_new, ...), per sequence
    over its own keys; ``window`` (left, right) as flash-attn, bottom-right aligned."""
    n_new = q.shape[2]
    want = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    yard = torch.zeros(q.shape, dtype=q.dtype)
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        qb, kb, vb = q[b:b + 1].cpu(), k[b:b + 1, :, :n].cpu(), v[b:b + 1, :, :n].cpu()
        position = torch.arange(n_new)[:, None] + n - n_new
        key = torch.arange(n)[None, :]
        allowed = key <= position if causal else torch.ones(n_new, n, dtype=torch.bool)
        if window is not None:
            left, right = window
            allowed = allowed & ((key >= position - left) if left >= 0 else True) & (
                (key <= position + right) if right >= 0 else True)
        o64, l64 = checks.torch_attention(qb.double(), kb.double(), vb.double(), allowed=allowed, softcap=softcap,
                                          scale=scale, return_lse=True)
        want[b], lse[b] = o64[0], l64[0]
        yard[b] = checks.torch_attention(qb, kb, vb, allowed=allowed, softcap=softcap, scale=scale)[0]
    return want, lse, yard


def _inputs(seed, b=3, h=4, h_kv=2, n_new=2, n_max=70, d=32, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_new, d, generator=g).to(dtype).to(DEVICE)
    k, v = (torch.randn(b, h_kv, n_max, d, generator=g).mul(s).to(dtype).to(DEVICE) for s in (3.0, 1.0))
    return q, k, v


def _check(o, lse, want, want_lse, yard, head_dim):
    assert not o.isnan().any()
    problem = checks.within_twice_yardstick("o", o.cpu(), want, yard, head_dim=head_dim)
    assert problem is None, problem
    seen = torch.isfinite(want_lse)
    assert seen.any()
    assert torch.equal(torch.isfinite(lse.cpu()), seen) and (lse.cpu()[~seen] == -math.inf).all()
    assert (lse.cpu().double() - want_lse)[seen].abs().max() <= LSE_TOLERANCE


# ------------------------------------------------------------ flash_decode: softcap and lse

@pytest.mark.parametrize("window", [None, (5, 0)], ids=["no-window", "window5"])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_softcap_and_lse_match_float64(dtype, paged, num_splits, window):
    """Scores scaled by 3 so that the cap of 2.5 bends them; lengths full, empty and ragged."""
    q, k, v = _inputs(int(torch.randint(0, 2**30, ())), dtype=dtype)
    lengths = [70, 0, 33]
    caches, extra = (k, v), {}
    if paged:
        *caches, table = paginate(k, v, 16, generator=torch.Generator().manual_seed(1), spare=2)
        extra = dict(block_table=table)
    with autograd.poisoned_outputs():
        o, lse = flash_decode(q, *caches, cache_seqlens=torch.tensor(lengths, device=DEVICE), num_splits=num_splits,
                              softcap=2.5, window=window, return_softmax_lse=True, **extra)
    assert o.shape == q.shape and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    _check(o, lse, *_truth(q, k, v, lengths, softcap=2.5, window=window), q.shape[-1])
    # the cap changes the answer: without it the same call is another attention
    plain = flash_decode(q, *caches, cache_seqlens=torch.tensor(lengths, device=DEVICE), window=window, **extra)
    assert (plain - o).abs().max() > 0.01


def test_lse_merges_two_halves_of_a_cache_exactly():
    """What the lse is for: attention over keys [0, m) and [m, n) merged by their lse (chapter 3)
    is attention over [0, n), as a cascade or a cache split across devices does it."""
    q, k, v = _inputs(5, n_new=1, dtype=torch.float32)
    n, m = 70, 29
    first = flash_decode(q, k[:, :, :m], v[:, :, :m], causal=False, return_softmax_lse=True)
    second = flash_decode(q, k[:, :, m:n], v[:, :, m:n], causal=False, return_softmax_lse=True)
    whole, whole_lse = flash_decode(q, k, v, causal=False, return_softmax_lse=True)
    top = torch.maximum(first[1], second[1])
    w1, w2 = torch.exp(first[1] - top)[..., None], torch.exp(second[1] - top)[..., None]
    merged = (w1 * first[0] + w2 * second[0]) / (w1 + w2)
    assert torch.allclose(merged, whole, atol=1e-6, rtol=1e-5)
    assert torch.allclose(top + torch.log(w1 + w2)[..., 0], whole_lse, atol=1e-6, rtol=1e-6)


def test_without_softcap_or_lse_the_call_is_unchanged():
    """softcap=None / 0 and return_softmax_lse=False are the plain call, bit for bit."""
    q, k, v = _inputs(7)
    lengths = torch.tensor([70, 12, 0], device=DEVICE)
    plain = flash_decode(q, k, v, cache_seqlens=lengths, num_splits=2)
    assert torch.equal(flash_decode(q, k, v, cache_seqlens=lengths, num_splits=2, softcap=0), plain)
    o, _ = flash_decode(q, k, v, cache_seqlens=lengths, num_splits=2, softcap=None, return_softmax_lse=True)
    assert torch.equal(o, plain)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(softcap=-1.0), ValueError, "softcap must be a finite number > 0"),
    (dict(softcap="5"), TypeError, "softcap must be a real number"),
    (dict(return_softmax_lse=1), TypeError, "return_softmax_lse"),
])
def test_bad_softcap_and_lse_flags_are_named(kwargs, error, match):
    q, k, v = _inputs(1)
    with pytest.raises(error, match=match):
        flash_decode(q, k, v, **kwargs)


def test_softcap_and_lse_are_part_of_the_call_signature(monkeypatch):
    monkeypatch.setattr(decode.runtime, "INTERPRET", False)   # the short path's key, as on a GPU
    q, k, v = _inputs(2)

    def key(softcap=None, lse=False):
        return decode._signature(q, k, v, None, None, None, True, None, False, None, softcap, lse)

    keys = [key(), key(softcap=5.0), key(softcap=6.0), key(lse=True)]
    assert None not in keys and len(set(keys)) == 4
    assert key(softcap=torch.tensor(5.0)) is None and key(lse=1) is None


# ------------------------------------------------------------ flash_attn_with_kvcache

def _flash_attn_inputs(seed, b=3, capacity=80, h=4, h_kv=2, d=32, n_new=2, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    caches = [torch.randn(b, capacity, h_kv, d, generator=g).to(dtype).to(DEVICE) for _ in range(2)]
    q = torch.randn(b, n_new, h, d, generator=g).to(dtype).to(DEVICE)
    new = [torch.randn(b, n_new, h_kv, d, generator=g).to(dtype).to(DEVICE) for _ in range(2)]
    return q, caches, new


@pytest.mark.parametrize("int_lengths", [False, True], ids=["tensor-lengths", "int-length"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged16"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_kvcache_appends_in_place_then_attends(dtype, paged, int_lengths):
    """flash-attn's step: k and v land in the caches at each length (through block_table into its
    pages), then q attends to lengths + new keys, causal, capped; the output in flash-attn's layout."""
    seed = int(torch.randint(0, 2**30, ()))
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(seed, dtype=dtype)
    n_new = k.shape[1]
    lengths = [40, 40, 40] if int_lengths else [10, 0, 78]
    appended = [x.clone() for x in (k_cache, v_cache)]
    for b, n in enumerate(lengths):
        appended[0][b, n:n + n_new], appended[1][b, n:n + n_new] = k[b], v[b]
    extra = {}
    if paged:   # the caches as shuffled 16-token pages in flash-attn's (num_pages, page_size, kv_heads, d)
        *pages, table = paginate(k_cache.transpose(1, 2), v_cache.transpose(1, 2), 16,
                                 generator=torch.Generator().manual_seed(seed), spare=2)
        k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in pages)
        extra = dict(block_table=table)
    else:
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
    seqlens = 40 if int_lengths else torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with autograd.poisoned_outputs():
        o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True, softcap=4.0,
                                         return_softmax_lse=True, **extra)
    assert o.shape == q.shape and o.is_contiguous() and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    if paged:   # every appended row is in its page and slot
        for b, n in enumerate(lengths):
            position = torch.arange(n, n + n_new, device=DEVICE)
            page, slot = table[b, position // 16].long(), position % 16
            assert torch.equal(k_cache[page, slot], k[b]) and torch.equal(v_cache[page, slot], v[b])
    else:
        assert torch.equal(k_cache, appended[0]) and torch.equal(v_cache, appended[1])
    want, want_lse, yard = _truth(q.transpose(1, 2), *(x.transpose(1, 2) for x in appended),
                                  [n + n_new for n in lengths], softcap=4.0)
    _check(o.transpose(1, 2), lse, want, want_lse, yard, q.shape[-1])


def test_kvcache_without_new_keys_is_flash_decode_in_flash_attns_layout():
    """No k/v: the caches are read, not written; causal defaults to False, as flash-attn's."""
    q, (k_cache, v_cache), _ = _flash_attn_inputs(11, dtype=torch.float32)
    before = k_cache.clone()
    lengths = torch.tensor([80, 5, 33], dtype=torch.int32, device=DEVICE)
    o = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, window_size=(6, -1), num_splits=2)
    assert torch.equal(k_cache, before)
    want = flash_decode(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), cache_seqlens=lengths,
                        causal=False, window=(6, -1), num_splits=2)
    assert torch.equal(o, want.transpose(1, 2))


def test_kvcache_one_head_several_tokens_does_not_warn():
    """q (batch, 4 tokens, 1 head, d) over one KV head is flash-attn's layout by construction:
    flash_decode's layout warning, meant for its own callers, stays quiet."""
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(3, h=1, h_kv=1, n_new=4, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=20, causal=True)


@pytest.mark.parametrize("change,error,match", [
    (dict(rotary_cos="cos"), ValueError, "rotary_cos and rotary_sin must be given together"),
    (dict(rotary_cos="cos", rotary_sin="cos", k=None, v=None), ValueError, "only with k and v"),
    (dict(rotary_cos="wide", rotary_sin="wide"), ValueError, r"rotary_cos must have 1 to head_dim / 2 = 16 columns"),
    (dict(rotary_cos="short", rotary_sin="short"), ValueError,
     r"rotary_cos and rotary_sin must hold at least the cache's 80 positions \(axis 0, as flash-attn asks\)"),
    (dict(cache_batch_idx=torch.tensor([0, 1, 2]), block_table="table"), ValueError,
     "cache_batch_idx and block_table cannot be given together"),
    (dict(cache_batch_idx=torch.tensor([0, 1, 5]), check_values=True), ValueError,
     r"cache_batch_idx must be in \[0, 2\]"),
    (dict(cache_leftpad=0), NotImplementedError, "does not take cache_leftpad"),
    (dict(alibi_slopes=0), NotImplementedError, "does not take alibi_slopes"),
    (dict(v=None), ValueError, "k and v must be given together"),
    (dict(cache_seqlens=None), ValueError, "k and v need cache_seqlens"),
    (dict(cache_seqlens=79), ValueError, r"cache_seqlens must be in \[0, 78\]"),
    (dict(num_splits=-1), ValueError, "num_splits must be an int >= 0"),
    (dict(k="k"), ValueError, "k must be a 4-D tensor in flash-attn's layout"),
    (dict(q="q"), ValueError, "q must be a 4-D tensor in flash-attn's layout"),
    (dict(q_tokens=17), ValueError, r"q must hold 1 to 16 new tokens per sequence \(axis 1 in flash-attn.s layout\)"),
    (dict(k_heads=3), ValueError, r"k must have shape \(3, new keys, 2, 32\)"),
    (dict(k_dtype=torch.float64), ValueError, "k must have the cache's dtype"),
    (dict(cache_seqlens="tensor-too-long", check_values=True), ValueError,
     r"cache_seqlens must be in \[0, 78\] \(the cache holds 80 positions and k adds 2\)"),
])
def test_kvcache_bad_arguments_are_named(change, error, match):
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(4, dtype=torch.float32)
    call = dict(k=k, v=v, cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32, device=DEVICE))
    if "q_tokens" in change:
        q = torch.randn(3, change.pop("q_tokens"), 4, 32, device=DEVICE)
    if "k_heads" in change:
        call["k"] = torch.randn(3, 2, change.pop("k_heads"), 32, device=DEVICE)
    if "k_dtype" in change:
        call["k"] = k.to(change.pop("k_dtype"))
    for name in ("rotary_cos", "rotary_sin"):   # 80 positions, 8 columns; "short": 4 positions; "wide": 17 columns
        if change.get(name) in ("cos", "short", "wide"):
            change[name] = torch.randn(4 if change[name] == "short" else 80, 17 if change[name] == "wide" else 8,
                                       device=DEVICE)
    if change.get("block_table") == "table":
        change["block_table"] = torch.zeros(3, 5, dtype=torch.int32, device=DEVICE)
    if isinstance(change.get("cache_batch_idx"), torch.Tensor):
        change["cache_batch_idx"] = change["cache_batch_idx"].to(DEVICE)
    if change.get("cache_seqlens") == "tensor-too-long":
        change["cache_seqlens"] = torch.tensor([1, 79, 3], dtype=torch.int32, device=DEVICE)
    call.update(change)
    q = call.pop("q", q)
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(q, k_cache, v_cache, **call)


@pytest.mark.parametrize("change,error,match", [
    (dict(q_dtype=torch.float16), TypeError, "q, k_cache and v_cache must have the same dtype"),
    (dict(num_splits=200), ValueError, "num_splits"),
    (dict(q_heads=3), ValueError, r"k_cache's number of heads \(2\) must divide q's \(3\) \(grouped-query "
                                  r"attention\), got q \(3, 2, 3, 32\), k_cache \(3, 80, 2, 32\)$"),
    (dict(q_dim=16), ValueError, r"k_cache must have q's head_dim 16, got k_cache \(3, 80, 2, 32\)"),
    (dict(pages=8), ValueError, r"k_cache's page_size \(axis 1 of \(num_pages, page_size, kv_heads, head_dim\)\)"),
    (dict(pages="vllm"), ValueError, r"got shape \(12, 2, 16, 32\) \(pages laid out \(num_pages, kv_heads"),
    (dict(table_1d=True), ValueError, r"block_table must be a 2-D tensor \(batch, pages per sequence\), got \(8,\)"),
    (dict(strided=True), ValueError, r"k_cache must have a contiguous last axis \(stride 1, as flash-attn asserts\)"),
])
def test_a_refused_call_leaves_the_caches_as_they_were(change, error, match):
    """Every check runs before the append, and the errors print the shapes as passed (flash-attn's
    layout) without advice to transpose them."""
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(41, dtype=torch.float32)
    call = dict(cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32, device=DEVICE), causal=True)
    if "q_dtype" in change:
        q = q.to(change.pop("q_dtype"))
    if "q_heads" in change:
        q = torch.randn(3, 2, change.pop("q_heads"), 32, device=DEVICE)
    if "q_dim" in change:
        q = torch.randn(3, 2, 4, change.pop("q_dim"), device=DEVICE)
    pages = change.pop("pages", None)
    if pages is not None:   # 12 pages of 8 tokens, or vLLM's (num_pages, kv_heads, page_size, d)
        shape = (12, 8, 2, 32) if pages == 8 else (12, 2, 16, 32)
        k_cache, v_cache = (torch.randn(shape, device=DEVICE) for _ in range(2))
        call["block_table"] = torch.arange(12, dtype=torch.int32, device=DEVICE).reshape(3, 4)
    if change.pop("table_1d", False):
        k_cache, v_cache = (torch.randn(12, 16, 2, 32, device=DEVICE) for _ in range(2))
        call["block_table"] = torch.arange(8, dtype=torch.int32, device=DEVICE)
    if change.pop("strided", False):
        k_cache = torch.randn(3, 80, 2, 64, device=DEVICE)[..., ::2]
    call.update(change)
    before = [x.clone() for x in (k_cache, v_cache)]
    with pytest.raises(error, match=match) as raised:
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **call)
    assert "transpose" not in str(raised.value)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_kvcache_one_head_compiles_whole():
    """One query head and one KV head with three new tokens: no warning to silence, so the step
    compiles with fullgraph=True (no graph break)."""
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(43, h=1, h_kv=1, n_new=3, dtype=torch.float32)
    lengths = torch.tensor([5, 0, 70], dtype=torch.int32, device=DEVICE)

    def step(q, k_cache, v_cache, k, v, lengths):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=True)

    eager_caches = [x.clone() for x in (k_cache, v_cache)]
    eager = step(q, *eager_caches, k, v, lengths)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k_cache, v_cache, k, v, lengths)
    assert torch.equal(compiled, eager) and torch.equal(k_cache, eager_caches[0])


def test_apply_rotary_reads_only_the_rows_it_needs():
    """flash-attn users pass float16 tables of every position: the rows for this step are gathered
    before the float32 conversion, so the table's length does not cost a conversion per call."""
    from flashbook.kernels.kvcache import apply_rotary

    table = torch.randn(4096, 8).half()
    x = torch.randn(2, 1, 2, 16).half()
    converted = []
    real_to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        converted.append(self.shape[0])
        return real_to(self, *args, **kwargs)

    torch.Tensor.to = spy
    try:
        apply_rotary(x, table, table, torch.tensor([[7], [300]]))
    finally:
        torch.Tensor.to = real_to
    assert 4096 not in converted


def _rotary_tables(positions, rotary_dim, base=10000.0):
    """cos and sin (positions, rotary_dim / 2) in float32, from float64 angles, and the angles."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(DEVICE), angles.sin().float().to(DEVICE), angles


def _rotate_float64(x, angles, positions, interleaved):
    """The rotation as complex multiplication in float64, independent of ``apply_rotary``: each
    pair of features is a complex number times e^(i angle) (x: (batch, n, heads, d) on the CPU)."""
    x = x.double().cpu()
    half = angles.shape[1]
    turn = torch.polar(torch.ones_like(angles), angles)[positions.cpu()][:, :, None, :]   # (batch, n, 1, half)
    head = x[..., :2 * half]
    if interleaved:
        z = torch.view_as_complex(head.reshape(*head.shape[:-1], half, 2).contiguous()) * turn
        head = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(head[..., :half], head[..., half:]) * turn
        head = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((head, x[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full", "half-of-head"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["gpt-j", "neox"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_kvcache_rotary_matches_complex_rotation_in_float64(causal, interleaved, rotary_dim):
    """k rotated at its cache positions (and stored so), q at the same positions when causal, at
    each cache's length when not (flash-attn's rule); features past rotary_dim untouched."""
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(21, dtype=torch.float32)
    lengths = torch.tensor([7, 0, 60], dtype=torch.int32, device=DEVICE)
    cos, sin, angles = _rotary_tables(100, rotary_dim)
    k_before, q_before = k.clone(), q.clone()
    eager_caches = [x.clone() for x in (k_cache, v_cache)]
    o = flash_attn_with_kvcache(q, *eager_caches, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths,
                                causal=causal, rotary_interleaved=interleaved)
    assert torch.equal(k, k_before) and torch.equal(q, q_before)   # inputs are not rotated in place
    n_new = k.shape[1]
    k_positions = lengths.long()[:, None] + torch.arange(n_new, device=DEVICE)
    q_positions = k_positions if causal else lengths.long()[:, None].expand(-1, n_new)
    k_rot = _rotate_float64(k, angles, k_positions, interleaved)
    q_rot = _rotate_float64(q, angles, q_positions, interleaved)
    for b, n in enumerate(lengths.tolist()):   # the caches hold the rotated keys, to float32 rounding
        assert torch.allclose(eager_caches[0][b, n:n + n_new].cpu().double(), k_rot[b], atol=1e-5, rtol=1e-5)
        assert torch.equal(eager_caches[1][b, n:n + n_new], v[b])
    if rotary_dim < q.shape[-1]:
        assert torch.equal(eager_caches[0][2, 60:62, :, rotary_dim:], k[2, :, :, rotary_dim:])
    appended = [x.cpu().double() for x in (k_cache, v_cache)]
    for b, n in enumerate(lengths.tolist()):
        appended[0][b, n:n + n_new], appended[1][b, n:n + n_new] = k_rot[b], v[b].cpu().double()
    want, _, yard = _truth(q_rot.transpose(1, 2), *(x.transpose(1, 2) for x in appended),
                           [n + n_new for n in lengths.tolist()], causal=causal)
    problem = checks.within_twice_yardstick("o", o.transpose(1, 2).cpu().double(), want, yard.double(),
                                            head_dim=q.shape[-1])
    assert problem is None, problem


def test_kvcache_batch_index_reads_and_writes_the_rows_it_names():
    """cache_batch_idx: sequence b uses cache row idx[b] of a cache with more rows than the batch,
    read as pages over the rows (a view); the same answer as the rows gathered by hand."""
    q, _, (k, v) = _flash_attn_inputs(31, dtype=torch.float32)
    g = torch.Generator().manual_seed(31)
    k_cache, v_cache = (torch.randn(5, 96, 2, 32, generator=g).to(DEVICE) for _ in range(2))   # 96: pages of 32
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=DEVICE)
    lengths = torch.tensor([90, 3, 41], dtype=torch.int32, device=DEVICE)
    gathered = [x[idx.long()].clone() for x in (k_cache, v_cache)]
    o = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, cache_batch_idx=idx, causal=True,
                                softcap=6.0, num_splits=2)
    want = flash_attn_with_kvcache(q, *gathered, k, v, cache_seqlens=lengths, causal=True, softcap=6.0)
    assert torch.allclose(o, want, atol=1e-6, rtol=1e-5)
    for b, row in enumerate(idx.tolist()):   # appended into the named rows, the others untouched
        assert torch.equal(k_cache[row], gathered[0][b]) and torch.equal(v_cache[row], gathered[1][b])
    with pytest.raises(ValueError, match=r"capacity \(axis 1\) must be a multiple of 16, got 90"):
        flash_attn_with_kvcache(q, k_cache[:, :90], v_cache[:, :90], cache_seqlens=5, cache_batch_idx=idx)
    with pytest.raises(ValueError, match=r"k_cache must be one block per row"):
        wide = torch.randn(5, 192, 2, 32, device=DEVICE)[:, :96]
        flash_attn_with_kvcache(q, wide, v_cache, cache_seqlens=5, cache_batch_idx=idx)


def test_kvcache_step_compiles_to_the_eager_bits():
    """A decoding step (rotary, append, attend) inside torch.compile: the rotation and the append
    traced as PyTorch operations (index_put_ on the caches, an input mutation the compiler keeps),
    the attention as flashbook::decode."""
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(8, dtype=torch.float32)
    lengths = torch.tensor([3, 50, 0], dtype=torch.int32, device=DEVICE)

    cos, sin, _ = _rotary_tables(100, 16)

    def step(q, k_cache, v_cache, k, v, lengths):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=lengths, causal=True, softcap=3.0)

    eager_caches = [x.clone() for x in (k_cache, v_cache)]
    eager = step(q, *eager_caches, k, v, lengths)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k_cache, v_cache, k, v, lengths)
    assert torch.equal(compiled, eager) and eager.abs().max() > 0
    assert torch.equal(k_cache, eager_caches[0]) and torch.equal(v_cache, eager_caches[1])


def test_kvcache_is_exported_where_flash_attn_users_look():
    import flashbook
    from flashbook import kernels

    assert flashbook.flash_attn_with_kvcache is kernels.flash_attn_with_kvcache
    assert flashbook.flash_decode is kernels.flash_decode
    names = flash_attn_with_kvcache.__code__.co_varnames[:flash_attn_with_kvcache.__code__.co_argcount]
    assert names == ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                     "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size",
                     "softcap", "rotary_interleaved", "alibi_slopes", "num_splits", "return_softmax_lse")


# ------------------------------------------------------------ on a GPU

GPU_SHAPES = {   # (batch, capacity, heads, kv_heads, head_dim, new tokens, page_size)
    "b4-8k-gqa-1-token": (4, 8192, 32, 8, 128, 1, 0),
    "b8-4k-mqa-4-tokens-paged": (8, 4096, 16, 1, 128, 4, 64),
    "b2-16k-d64-2-tokens-paged16": (2, 16384, 8, 2, 64, 2, 16),
}


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
def test_gpu_kvcache_softcap_and_lse_many_seeds(shape, dtype):
    """13 seeds of ragged lengths per shape (one at the cache's end, one empty), outputs poisoned:
    the appended caches exact, o within the rule, lse within LSE_TOLERANCE of float64."""
    b, capacity, h, h_kv, d, n_new, page_size = GPU_SHAPES[shape]
    for seed in range(13):
        q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(seed, b, capacity, h, h_kv, d, n_new, dtype)
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(0, capacity - n_new + 1, (b,), generator=g)
        lengths[0], lengths[1] = capacity - n_new, 0
        appended = [x.clone() for x in (k_cache, v_cache)]
        for i, n in enumerate(lengths.tolist()):
            appended[0][i, n:n + n_new], appended[1][i, n:n + n_new] = k[i], v[i]
        extra = {}
        if page_size:
            *pages, table = paginate(k_cache.transpose(1, 2), v_cache.transpose(1, 2), page_size, generator=g)
            k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in pages)
            extra = dict(block_table=table)
        with autograd.poisoned_outputs():
            o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths.to(DEVICE).int(),
                                             causal=True, softcap=30.0, return_softmax_lse=True, **extra)
        torch.cuda.synchronize()
        if not page_size:
            assert torch.equal(k_cache, appended[0]) and torch.equal(v_cache, appended[1]), seed
        want, want_lse, yard = _truth(q.transpose(1, 2), *(x.transpose(1, 2) for x in appended),
                                      [n + n_new for n in lengths.tolist()], softcap=30.0)
        _check(o.transpose(1, 2), lse, want, want_lse, yard, d)


# ------------------------------------------------------------ the writes' kernel (kernels/append.py)

def _rotate_torch(x, cos, sin, positions, interleaved):
    """The rotation as PyTorch float32 operations (the formula the kernel promises bit for bit):
    (a, b) -> (a cos - b sin, a sin + b cos), products rounded before the sums; positions outside
    the tables are left unturned."""
    half = cos.shape[1]
    known = (positions >= 0) & (positions < cos.shape[0])
    at = positions.clamp(0, cos.shape[0] - 1).long()
    c = torch.where(known[..., None], cos[at].float(), 1.0)[:, :, None, :]
    s = torch.where(known[..., None], sin[at].float(), 0.0)[:, :, None, :]
    head = x[..., :2 * half].float()
    a, b = (head[..., 0::2], head[..., 1::2]) if interleaved else (head[..., :half], head[..., half:])
    a, b = a * c - b * s, b * c + a * s
    head = torch.stack((a, b), dim=-1).flatten(-2) if interleaved else torch.cat((a, b), dim=-1)
    return torch.cat((head.to(x.dtype), x[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("page_size", [0, 16], ids=["dense", "paged16"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["gpt-j", "neox"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_append_kernel_is_the_pytorch_formula_bit_for_bit(dtype, interleaved, page_size):
    """append_kv and rotate against PyTorch float32 on strided inputs, a float16 table shorter than
    some positions (left unturned), partial rotary_dim, and a length past the capacity (not
    written: every other cache row is unchanged)."""
    from flashbook.kernels import append

    g = torch.Generator().manual_seed(5)
    b, n, h_kv, d, capacity, half = 4, 3, 2, 40, 48, 12            # d = 40: a padded head, rotary_dim 24
    k = torch.randn(b, n, h_kv, d, generator=g).to(dtype).to(DEVICE)
    k_wide = torch.randn(b, n, 2 * h_kv, d, generator=g).to(dtype).to(DEVICE)[:, :, ::2]   # strided heads
    v = torch.randn(b, n, h_kv, d, generator=g).to(dtype).to(DEVICE)
    cos, sin = (torch.randn(30, half, generator=g).half().to(DEVICE) for _ in range(2))  # 30 positions only
    lengths = torch.tensor([0, 25, 45, 47], dtype=torch.int32, device=DEVICE)      # 27..29 past the table; 47 + 2 past the cache
    caches = [torch.randn(b, capacity, h_kv, d, generator=g).to(dtype).to(DEVICE) for _ in range(2)]
    extra = {}
    if page_size:
        *pages, table = paginate(*(x.transpose(1, 2) for x in caches), page_size, generator=g, spare=1)
        caches = [x.transpose(1, 2).contiguous() for x in pages]
        extra = dict(block_table=table.to(DEVICE))
    for src in (k, k_wide):
        work = [x.clone() for x in caches]
        append.append_kv(src, v, *work, lengths, extra.get("block_table"), cos, sin, interleaved)
        positions = lengths.long()[:, None] + torch.arange(n, device=DEVICE)
        want_k = _rotate_torch(src, cos, sin, positions, interleaved)
        expect = [x.clone() for x in caches]
        for i, row in enumerate(positions.tolist()):
            for t, p in enumerate(row):
                if p >= capacity:
                    continue
                if page_size:
                    where = (extra["block_table"][i, p // page_size].long(), p % page_size)
                else:
                    where = (i, p)
                expect[0][where], expect[1][where] = want_k[i, t], v[i, t]
        assert torch.equal(work[0], expect[0]) and torch.equal(work[1], expect[1])
    q = torch.randn(b, n, 2 * h_kv, d, generator=g).to(dtype).to(DEVICE)
    for step in (0, 1):
        positions = lengths.long()[:, None] + step * torch.arange(n, device=DEVICE)
        got = append.rotate(q, cos, sin, lengths, step, interleaved)
        assert torch.equal(got, _rotate_torch(q, cos, sin, positions, interleaved)) and got.is_contiguous()


def test_append_to_cache_and_apply_rotary_refuse_what_the_kernel_cannot_take():
    from flashbook.kernels.kvcache import append_to_cache, apply_rotary

    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(2, dtype=torch.float32)
    lengths = torch.tensor([1, 2, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"positions must have shape \(3, 2\)"):
        apply_rotary(q, torch.ones(9, 4, device=DEVICE), torch.zeros(9, 4, device=DEVICE), lengths)
    with pytest.raises(ValueError, match=r"cache_seqlens must be in \[0, 78\]"):
        append_to_cache(k_cache, v_cache, k, v, torch.tensor([1, 79, 3], device=DEVICE), check_values=True)
    before = k_cache.clone()
    far = torch.tensor([1, 79, 3], dtype=torch.int32, device=DEVICE)   # unchecked: row 1's second token is dropped
    append_to_cache(k_cache, v_cache, k, v, far)
    assert torch.equal(k_cache[1, 79], k[1, 0]) and torch.equal(k_cache[1, :79], before[1, :79])
    if DEVICE == "cpu":
        with pytest.raises(TypeError, match="k is bfloat16, which Triton's CPU interpreter cannot compute"):
            append_to_cache(*(x.bfloat16() for x in (k_cache, v_cache, k, v)), lengths)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_append_kernel_is_the_pytorch_formula_many_seeds(dtype):
    """On the GPU, in bf16 too: 13 seeds x (dense, 64-token pages) x (GPT-J, NeoX) x (full, half
    rotary_dim), serving shapes (32 query heads, 8 KV heads, d = 128, 1 and 4 new tokens); the
    rotated q written into a NaN-filled buffer, the caches exact against PyTorch float32, then a
    whole rotary step through flash_attn_with_kvcache against float64."""
    from flashbook.kernels import append

    for seed in range(13):
        g = torch.Generator().manual_seed(seed)
        n_new = 1 + 3 * (seed % 2)
        b, capacity, h, h_kv, d = 4, 2048, 32, 8, 128
        half = (64, 32)[seed % 2 == 0]
        interleaved = seed % 3 == 0
        q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(seed, b, capacity, h, h_kv, d, n_new, dtype)
        angles = torch.arange(capacity, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(half) / half)
        cos, sin = angles.cos().to(dtype).to(DEVICE), angles.sin().to(dtype).to(DEVICE)
        lengths = torch.randint(0, capacity - n_new + 1, (b,), generator=g)
        lengths[0], lengths[1] = capacity - n_new, 0
        lengths = lengths.to(DEVICE).int()
        for page_size in (0, 64):
            caches = [x.clone() for x in (k_cache, v_cache)]
            table = None
            if page_size:
                *pages, table = paginate(*(x.transpose(1, 2) for x in caches), page_size, generator=g)
                caches = [x.transpose(1, 2).contiguous() for x in pages]
            before = [x.clone() for x in caches]
            append.append_kv(k, v, *caches, lengths, table, cos, sin, interleaved)
            q_rot = torch.full_like(q, float("nan"))
            append.rotate_into(q, q_rot, cos, sin, lengths, 1, interleaved)
            torch.cuda.synchronize()
            positions = lengths.long()[:, None] + torch.arange(n_new, device=DEVICE)
            assert torch.equal(q_rot, _rotate_torch(q, cos, sin, positions, interleaved)), (seed, page_size)
            k_rot = _rotate_torch(k, cos, sin, positions, interleaved)
            for i, row in enumerate(positions.tolist()):
                for t, pos in enumerate(row):
                    where = (table[i, pos // page_size].long(), pos % page_size) if page_size else (i, pos)
                    before[0][where], before[1][where] = k_rot[i, t], v[i, t]
            assert torch.equal(caches[0], before[0]) and torch.equal(caches[1], before[1]), (seed, page_size)
        caches = [x.clone() for x in (k_cache, v_cache)]
        with autograd.poisoned_outputs():
            o = flash_attn_with_kvcache(q, *caches, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lengths,
                                        causal=True, rotary_interleaved=interleaved)
        torch.cuda.synchronize()
        q_turned = _rotate_torch(q, cos, sin, positions, interleaved)
        want, _, yard = _truth(q_turned.transpose(1, 2), *(x.transpose(1, 2) for x in caches),
                               [n + n_new for n in lengths.tolist()])
        problem = checks.within_twice_yardstick("o", o.transpose(1, 2).cpu(), want, yard, head_dim=d)
        assert problem is None, (seed, problem)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_compiled_rotary_step_gives_the_eager_bits(mode):
    """A rotary decoding step under Inductor (and CUDA graphs, where the compiler allows them with
    the caches mutated in place): the writes are flashbook::append_kv and flashbook::rotate, so
    the compiled step's output and caches are the eager step's bits, 13 seeds, dense and paged."""
    for page_size in (0, 64):
        torch._dynamo.reset()

        def step(q, k_cache, v_cache, k, v, lengths, cos, sin, table):
            return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                           cache_seqlens=lengths, block_table=table, causal=True)

        compiled = torch.compile(step, fullgraph=True, dynamic=False, mode=mode)
        for seed in range(13):
            q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(seed, 4, 1024, 16, 4, 128, 1, torch.bfloat16)
            g = torch.Generator().manual_seed(seed)
            cos, sin = (torch.randn(1024, 64, generator=g).bfloat16().to(DEVICE) for _ in range(2))
            lengths = torch.randint(0, 1024, (4,), generator=g).int().to(DEVICE)
            table = None
            if page_size:
                *pages, table = paginate(k_cache.transpose(1, 2), v_cache.transpose(1, 2), page_size, generator=g)
                k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in pages)
            caches = [x.clone() for x in (k_cache, v_cache)]
            eager = step(q, k_cache, v_cache, k, v, lengths, cos, sin, table)
            got = compiled(q, *caches, k, v, lengths, cos, sin, table).clone()
            assert torch.isfinite(eager).all() and torch.equal(got, eager), (page_size, seed)
            assert torch.equal(caches[0], k_cache) and torch.equal(caches[1], v_cache), (page_size, seed)


def test_a_known_call_signature_skips_the_shape_checks_not_the_values(monkeypatch):
    """A call whose signature passed every check (on a GPU; here call_key made to answer in the
    interpreter too) skips the shape checks the next time: the same bits, and the checks that read
    values (an int length against the capacity) still run; a new signature is checked."""
    from flashbook.kernels import kvcache, launch

    def any_machine_key(tensors, flags):
        try:
            return tuple(launch.tensor_key(x) for x in tensors) + tuple(flags)
        except (AttributeError, TypeError):
            return None

    monkeypatch.setattr(kvcache, "call_key", any_machine_key)
    monkeypatch.setattr(kvcache, "_CHECKED", launch.Plans())
    checked = []
    real = kvcache._check_call
    monkeypatch.setattr(kvcache, "_check_call", lambda *a: checked.append(1) or real(*a))
    looked_up = []   # the known path runs the kept launches and plan: none of these is called again
    for name in ("append_kv", "rotate_into"):
        real_fn = getattr(kvcache, name)
        monkeypatch.setattr(kvcache, name, lambda *a, _f=real_fn, _n=name: looked_up.append(_n) or _f(*a))
    real_plan = kvcache.decode.plan_of
    monkeypatch.setattr(kvcache.decode, "plan_of", lambda *a, **kw: looked_up.append("plan_of") or real_plan(*a, **kw))
    q, (k_cache, v_cache), (k, v) = _flash_attn_inputs(12, dtype=torch.float32)
    cos, sin, _ = _rotary_tables(80, 16)
    outs, written = [], []
    for _ in range(2):
        caches = [x.clone() for x in (k_cache, v_cache)]
        outs.append(flash_attn_with_kvcache(q, *caches, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=30,
                                            causal=True))
        written.append(caches)
    assert checked == [1] and torch.equal(outs[0], outs[1]) and len(kvcache._CHECKED) == 1
    assert looked_up == ["plan_of", "append_kv", "rotate_into"]        # the first call only
    assert all(torch.equal(a, b) for a, b in zip(*written))            # the kept append wrote the same
    assert not torch.equal(written[1][0], k_cache)                     # and it did write
    with pytest.raises(ValueError, match=r"cache_seqlens must be in \[0, 78\]"):   # a value: checked every call
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=79, causal=True)
    with pytest.raises(ValueError, match=r"k must have shape \(3, new keys, 2, 32\)"):   # a new signature
        flash_attn_with_kvcache(q, k_cache, v_cache, k[:, :, :1], v[:, :, :1], rotary_cos=cos, rotary_sin=sin,
                                cache_seqlens=30, causal=True)
    assert len(checked) == 2 and len(kvcache._CHECKED) == 1   # the value error took the known path
