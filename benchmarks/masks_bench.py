"""flashbook's masks against PyTorch's FlexAttention on the same masks: right, and how fast.

    PYTHONPATH=. python3 benchmarks/masks_bench.py --out DIR [--head-dims 64,128]
        [--seqs 4K,8K,16K,32K] [--windows 1K,4K] [--masks window,documents,softcap,window-softcap,causal]
        [--check-seq 4K] [--repeat 3] [--budget-s 500]

Masks (all causal, bf16): a sliding window of W keys (Mistral, Gemma), packed documents of
mixed lengths (varlen: ``flash_attention_varlen`` here, a document ``mask_mod`` there), the
soft cap c = 50 (Gemma 2), the window with the cap, and plain causal attention (the
reference: how fast the kernels are with no mask beyond causal). FlexAttention runs compiled
(``torch.compile(flex_attention)``) with the ``BlockMask`` of the same mask, so it skips the
same empty tiles. Each is called on leaf tensors in its own API's layout (``native``): Flex on
(1, H, N, d), packed documents as (N, H, d) for ``flash_attention_varlen``, as flash-attn's varlen
functions take them (until masks_h200-5 flashbook's packed call got views of Flex's tensors, and
its timings carried autograd's work on those views).

For each shape: forward and forward+backward times (``flashbook.bench.time_ms``: CUDA
events, median), each measured ``--repeat`` times with the two implementations taking turns
(the row keeps every repeat, and its median and spread), TFLOP/s counted two ways (over the pairs the mask allows, and over the
tiles flashbook's forward visits: ``masks.tile_counts`` at its block sizes), and
flashbook / Flex time. At ``--check-seq`` every output and gradient of both is checked
against float64 by the book's rule (``checks.within_twice_yardstick``, bf16 PyTorch as the
yardstick). DIR/masks.json: every row and the provenance.

``flex_mask``, ``flex_score`` and ``documents`` are what the tests check on the CPU against
``flashbook.masks`` (tests/test_masks_bench.py): the comparison is of the same function.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flashbook  # noqa: E402  (decides GPU or interpreter before triton is imported)
from flashbook import masks, reference  # noqa: E402

MASKS = ("window", "documents", "softcap", "window-softcap", "causal")
SOFTCAP = 50.0


def flex_mask(n_q: int, n_k: int, *, causal: bool = True, window=(-1, -1), doc_ids=None):
    """A FlexAttention ``mask_mod`` for flash-attn's window convention (bottom-right aligned,
    causal sets right to 0) and, with ``doc_ids`` (one id per token, queries and keys packed
    alike, n_q == n_k), no attention across documents."""
    left, right = masks.check_window(window)
    right = 0 if causal else right
    diagonal = n_k - n_q

    def mask_mod(b, h, q_idx, kv_idx):
        ok = kv_idx >= 0
        if right >= 0:
            ok = ok & (kv_idx <= q_idx + diagonal + right)
        if left >= 0:
            ok = ok & (kv_idx >= q_idx + diagonal - left)
        if doc_ids is not None:
            ok = ok & (doc_ids[q_idx] == doc_ids[kv_idx])
        return ok

    return mask_mod


_SCORES = {}


def flex_score(softcap):
    """The soft cap as a FlexAttention ``score_mod`` (None: no score_mod); one function per
    cap, so that a cap seen before is not a new function to compile."""
    cap = masks.check_softcap(softcap)
    if cap is None:
        return None
    if cap not in _SCORES:
        _SCORES[cap] = lambda score, b, h, q_idx, kv_idx: cap * torch.tanh(score / cap)
    return _SCORES[cap]


#: cu_seqlens of documents of mixed lengths that fill n tokens (``flashbook.masks.random_documents``)
documents = masks.random_documents


def allowed_pairs(n: int, causal: bool, window, cu) -> int:
    """How many (query, key) pairs the mask allows, row by row (no n x n array)."""
    left, right = masks.check_window(window)
    right = 0 if causal else right
    i = np.arange(n)
    lo = np.zeros(n, dtype=np.int64) if left < 0 else np.maximum(i - left, 0)
    hi = np.full(n, n - 1, dtype=np.int64) if right < 0 else np.minimum(i + right, n - 1)
    if cu is not None:
        doc = np.searchsorted(cu, i, side="right") - 1
        lo, hi = np.maximum(lo, cu[doc]), np.minimum(hi, cu[doc + 1] - 1)
    return int(np.maximum(hi - lo + 1, 0).sum())


def native(name: str, x: torch.Tensor) -> torch.Tensor:
    """A (1, H, n, d) tensor in the layout flashbook's call for mask ``name`` takes: packed
    documents (n, H, d), as ``flash_attention_varlen`` (flash-attn's varlen functions) takes
    them, a copy; the others as they are. Each side is timed on tensors in its own API's layout,
    so that neither pays for views the other's caller would not make."""
    return x.squeeze(0).transpose(0, 1).contiguous() if name == "documents" else x


def native_leaves(name: str, tensors) -> list:
    """``tensors`` (q, k, v, dO of shape (1, H, n, d)) as leaves in flashbook's layout for mask
    ``name`` (``native``), each requiring grad as its original does."""
    return [native(name, x).detach().requires_grad_(x.requires_grad) for x in tensors]


def from_native(name: str, x: torch.Tensor) -> torch.Tensor:
    """``native``'s inverse (a view): flashbook's output as (1, H, n, d)."""
    return x.transpose(0, 1).unsqueeze(0) if name == "documents" else x


def _calls(name, n, window, q, k, v, cu):
    """(flashbook call, flex call) computing the same masked attention: Flex of (1, H, n, d)
    inputs, flashbook of the same in its layout (``native``)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cap = SOFTCAP if "softcap" in name else None
    win = window if "window" in name else (-1, -1)
    doc_ids = None
    if name == "documents":
        doc_ids = torch.as_tensor(masks.doc_ids_from_cu_seqlens(cu), device=q.device)
        cu_t = torch.as_tensor(cu, device=q.device)
        longest = int(np.diff(cu).max())

        def ours(q, k, v):   # (total, heads, head_dim): the layout flash_attn_varlen_func takes (native)
            return flashbook.flash_attention_varlen(q, k, v, cu_t, cu_t, longest, longest, causal=True,
                                                    check_values=False)
    elif name == "causal":   # the reference: the same Triton kernels with no mask beyond causal
        def ours(q, k, v):
            return flashbook.flash_attention(q, k, v, causal=True, backend="triton")
    else:
        def ours(q, k, v):
            return flashbook.flash_attention(q, k, v, causal=True, window=win, softcap=cap)
    block_mask = create_block_mask(flex_mask(n, n, causal=True, window=win, doc_ids=doc_ids), None, None, n, n,
                                   device=q.device)
    compiled = _compiled_flex(flex_attention)
    score = flex_score(cap)

    def flex(q, k, v):
        return compiled(q, k, v, block_mask=block_mask, score_mod=score, enable_gqa=k.shape[1] != q.shape[1])
    return ours, flex, dict(causal=True, window=win, softcap=cap)


_COMPILED = {}


def _compiled_flex(flex_attention):
    """One compiled FlexAttention for every shape and mask. Each new shape or score_mod is a
    recompile; dynamo's default limit of 8 per function would then run FlexAttention eagerly
    (every score materialised), which is not the kernel a user gets, so the limit is raised."""
    if "flex" not in _COMPILED:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 1024)
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def check(name, n, d, window, seed) -> dict:
    """Both implementations against float64 by the book's rule, at one shape (H = 4)."""
    from flashbook.kernels import checks

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, 4, n, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    cu = documents(n, seed)
    ours, flex, mask = _calls(name, n, window, q, k, v, cu)
    allowed = torch.as_tensor(masks.allowed(n, n, causal=True, window=mask["window"],
                                            doc_ids_q=masks.doc_ids_from_cu_seqlens(cu) if name == "documents" else None,
                                            doc_ids_k=masks.doc_ids_from_cu_seqlens(cu) if name == "documents" else None))

    def grads(fn, dtype, layout=lambda x: x, back=lambda x: x):
        leaves = [layout(x.detach().to(dtype)).requires_grad_() for x in (q, k, v)]
        o = fn(*leaves)
        o.backward(layout(do.to(dtype)))
        return tuple(back(x) for x in (o.detach(), *(x.grad for x in leaves)))

    def torch_fn(q_, k_, v_):
        return reference.torch_attention(q_, k_, v_, allowed=allowed, softcap=mask["softcap"])

    truth = grads(torch_fn, torch.float64)
    yardstick = grads(torch_fn, torch.bfloat16)
    out = {}
    for impl, fn in (("flashbook", ours), ("flex", flex)):
        got = grads(fn, torch.bfloat16, *((lambda x: native(name, x), lambda x: from_native(name, x))
                                          if impl == "flashbook" else ()))
        problems = [p for p in (checks.within_twice_yardstick(g, x, t, y, head_dim=d)
                                for g, x, t, y in zip(("o", "dq", "dk", "dv"), got, truth, yardstick)) if p]
        out[impl] = {"ok": not problems, "problems": problems,
                     "max_error": {g: checks.max_error(x, t)[0] for g, x, t in zip(("o", "dq", "dk", "dv"), got, truth)}}
    out["yardstick_error"] = {g: checks.max_error(y, t)[0] for g, y, t in zip(("o", "dq", "dk", "dv"), yardstick, truth)}
    return out


def spread(times) -> float:
    """(slowest - fastest) / median of repeated medians: 0.03 means 3%."""
    return float((max(times) - min(times)) / np.median(times)) if times else float("nan")


def time_one(name, n, d, window, seed, repeat: int = 1) -> dict:
    from flashbook import bench
    from flashbook.kernels import configs

    heads = 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, heads, n, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    cu = documents(n, seed)
    ours, flex, mask = _calls(name, n, window, q, k, v, cu)
    pairs = allowed_pairs(n, True, mask["window"], cu if name == "documents" else None)
    from flashbook.kernels.mask_args import kernel_mask, tiles_of

    # the forward's tiles as the library chooses them (a short window has its own: configs.tiles_for)
    causal_k, _, extra = kernel_mask(True, mask["window"], mask["softcap"], n, n, d ** -0.5)
    tiles_causal, tiles_window = tiles_of(causal_k, True, mask["window"], extra, configs.block_d(d))
    fwd_cfg = configs.default("forward", cc=90, block_d=configs.block_d(d), elem_bytes=2, causal=tiles_causal,
                              window=tiles_window)
    ids = masks.doc_ids_from_cu_seqlens(cu) if name == "documents" else None
    tiles = masks.tile_counts(n, n, fwd_cfg.block_m, fwd_cfg.block_n, causal=True, window=mask["window"],
                              doc_ids_q=ids, doc_ids_k=ids)
    row = {"mask": name, "seq": n, "head_dim": d, "heads": heads, "window": list(mask["window"]),
           "softcap": mask["softcap"], "documents": len(cu) - 1 if name == "documents" else None,
           "allowed_pairs": pairs, "allowed_fraction": pairs / (n * n), "tiles": tiles,
           "forward_tile": [fwd_cfg.block_m, fwd_cfg.block_n]}
    useful = 4 * heads * pairs * d                       # 2 matrix products of 2*d FLOPs per allowed pair
    visited = 4 * heads * tiles["visited"] * fwd_cfg.block_m * fwd_cfg.block_n * d
    times = {"flashbook": {"fwd": [], "fwd_bwd": []}, "flex": {"fwd": [], "fwd_bwd": []}}
    inputs = {"flashbook": native_leaves(name, (q, k, v, do)), "flex": (q, k, v, do)}
    for _ in range(repeat):   # the two take turns, so that a slow spell of the GPU hits both
        for impl, fn in (("flashbook", ours), ("flex", flex)):
            if impl in row:
                continue
            try:
                q_, k_, v_, do_ = inputs[impl]
                fn(q_, k_, v_)
                times[impl]["fwd"].append(bench.time_ms(lambda: fn(q_, k_, v_)))
                times[impl]["fwd_bwd"].append(bench.time_ms(lambda: torch.autograd.grad(fn(q_, k_, v_), (q_, k_, v_),
                                                                                         do_)))
                if impl == "flashbook":
                    row["backend"] = flashbook.last_backend()
            except Exception as exc:  # noqa: BLE001 - recorded, the others still run
                row[impl] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    for impl in ("flashbook", "flex"):
        if impl in row:
            continue
        fwd, both = (float(np.median(times[impl][k])) for k in ("fwd", "fwd_bwd"))
        row[impl] = {"fwd_ms": fwd, "fwd_bwd_ms": both, "fwd_tflops_useful": useful / fwd / 1e9,
                     "fwd_bwd_tflops_useful": 3.5 * useful / both / 1e9,
                     "repeats": times[impl], "spread": {k: spread(v) for k, v in times[impl].items()}}
        if impl == "flashbook":
            row[impl]["fwd_tflops_visited"] = visited / fwd / 1e9
    if "error" not in row["flashbook"] and "error" not in row["flex"]:
        row["flex_over_flashbook_fwd"] = row["flex"]["fwd_ms"] / row["flashbook"]["fwd_ms"]
        row["flex_over_flashbook_fwd_bwd"] = row["flex"]["fwd_bwd_ms"] / row["flashbook"]["fwd_bwd_ms"]
    return row


def _size(text: str) -> int:
    return int(float(text[:-1]) * 1024) if text[-1] in "Kk" else int(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqs", default="4K,8K,16K,32K")
    p.add_argument("--windows", default="1K,4K")
    p.add_argument("--masks", default=",".join(MASKS))
    p.add_argument("--check-seq", default="4K")
    p.add_argument("--repeat", type=int, default=3, help="time each shape this many times (medians and spread)")
    p.add_argument("--skip-checks", action="store_true", help="time only (the checks ran in an earlier call)")
    p.add_argument("--budget-s", type=float, default=500.0, help="stop starting new shapes after this")
    p.add_argument("--document-order", choices=("heaviest-first", "given"), default="heaviest-first",
                   help="packed documents' program rows: the library's (varlen.longest_first) or as packed")
    args = p.parse_args(argv)
    from flashbook.bench.records import collect_provenance
    from flashbook.kernels import varlen

    varlen.ORDER["longest_first"] = args.document_order == "heaviest-first"

    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/masks_bench.py"),
              "checks": [], "rows": [],
              "layouts": "each implementation timed on leaf tensors in its own API's layout: Flex (1, H, N, d), "
                         "flash_attention_varlen (N, H, d), flash_attention (1, H, N, d)",
              "document_order": args.document_order}
    start = time.perf_counter()
    head_dims = [int(x) for x in args.head_dims.split(",")]
    windows = [_size(x) for x in args.windows.split(",")]
    names = args.masks.split(",")
    if set(names) - set(MASKS):
        p.error(f"--masks takes names from {','.join(MASKS)}, got {args.masks}")

    def save():
        with open(os.path.join(args.out, "masks.json"), "w") as f:
            json.dump(record, f, indent=1)

    for d in head_dims if not args.skip_checks else []:
        for name in names:
            for window in (windows if "window" in name else [windows[0]]):
                result = check(name, _size(args.check_seq), d, (window, 0), seed=d + window)
                record["checks"].append({"mask": name, "head_dim": d, "window": window, **result})
                print(f"check {name} d={d} W={window}: flashbook {result['flashbook']['ok']} flex {result['flex']['ok']}",
                      flush=True)
                save()
    for d in head_dims:
        for n in (_size(x) for x in args.seqs.split(",")):
            for name in names:
                for window in (windows if "window" in name else [None]):
                    if time.perf_counter() - start > args.budget_s:
                        record["stopped"] = f"budget of {args.budget_s} s reached"
                        save()
                        return 0
                    row = time_one(name, n, d, (window, 0) if window else (-1, -1), seed=n + d, repeat=args.repeat)
                    record["rows"].append(row)
                    print(f"{name} N={n} d={d} W={window}: " + ", ".join(
                        f"{impl} {row[impl].get('fwd_ms', float('nan')):.3f}/{row[impl].get('fwd_bwd_ms', float('nan')):.3f} ms"
                        for impl in ("flashbook", "flex"))
                        + f"; flex/flashbook {row.get('flex_over_flashbook_fwd', float('nan')):.2f} fwd, "
                          f"{row.get('flex_over_flashbook_fwd_bwd', float('nan')):.2f} fwd+bwd", flush=True)
                    save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
