"""Correctness under repetition on a GPU: every shape class, many seeds, outputs poisoned.

    PYTHONPATH=. python3 benchmarks/stress.py --out DIR [--repro N] [--classes] [--runs R]
                                              [--kernels attention,decode,gluon,varlen] [--subset K] [--repeat N]

--repro N   the class of the intermittent dV (bf16, head_dim 128, seq_q = seq_k = 1, causal,
            batch 2, 8 query heads, GQA groups 1 and 4): N seeded runs per group, each
            checked in the closed form one key allows (P = 1: o is V of the row's KV head,
            lse = scale q.k, dV of a KV head is the sum of dO over its query heads, dQ =
            dK = 0), for the library's default dK/dV configuration and for the others
            named by --variants;
--classes   every class of ``flashbook.kernels.stress`` for the kernels named, R runs each
            (fresh inputs, NaN-poisoned outputs, float64 references);
--subset K  only the first K cases of each class (for compute-sanitizer, which is slow);
--repeat N  each case N times in a row with fresh inputs (the second call of a decode
            signature takes ``flash_decode``'s short path: the compiled kernels' launchers).

DIR/stress.json holds the counts, every failure with its seed, and the provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashbook  # noqa: E402,F401  (decides GPU or interpreter before triton is imported)
import torch  # noqa: E402
from flashbook.bench.records import collect_provenance  # noqa: E402
from flashbook.kernels import stress  # noqa: E402
from flashbook.kernels.autograd import flash_backward, flash_forward, poisoned_outputs  # noqa: E402
from flashbook.kernels.configs import Config  # noqa: E402

#: dK/dV configurations tried on the repro class (None: what the library picks)
VARIANTS = {"default": None, "64x128w8s3": Config(64, 128, 8, 3), "64x128w8s2": Config(64, 128, 8, 2),
            "64x128w8s1": Config(64, 128, 8, 1), "64x64w4s2": Config(64, 64, 4, 2),
            "64x64w4s3": Config(64, 64, 4, 3)}


def closed_form_errors(q, k, v, do, o, lse, dq, dk, dv, group):
    """Largest error of each output against what one key makes of attention."""
    b, h, _, d = q.shape
    f = lambda x: x.double()  # noqa: E731
    o_want = f(v).repeat_interleave(group, 1)
    lse_want = (f(q) * f(k).repeat_interleave(group, 1)).sum(-1) * d ** -0.5
    dv_want = f(do).view(b, h // group, group, 1, d).sum(2)
    err = lambda x, y: float((f(x) - y).abs().nan_to_num(float("inf")).max())  # noqa: E731
    return {"o": err(o, o_want), "lse": err(lse, lse_want), "dv": err(dv, dv_want),
            "dq": err(dq, torch.zeros_like(f(dq))), "dk": err(dk, torch.zeros_like(f(dk)))}


def repro(runs: int, variants, *, sync: bool = False):
    """The issue's class, ``runs`` seeds per group and variant; the failures described."""
    out = {}
    tol = {"o": 1e-2, "lse": 2e-2, "dv": 0.1, "dq": 0.05, "dk": 0.05}   # bf16: one key is exact up to rounding
    for group in (1, 4):
        for name in variants:
            cfg = VARIANTS[name]
            fails, worst = [], {}
            start = time.time()
            for seed in range(runs):
                torch.manual_seed(seed)
                q = torch.randn(2, 1, 8, 128, device="cuda").to(torch.bfloat16).transpose(1, 2)
                k = torch.randn(2, 8 // group, 1, 128, device="cuda").to(torch.bfloat16)
                v = torch.randn(2, 8 // group, 1, 128, device="cuda").to(torch.bfloat16)
                do = torch.randn(2, 8, 1, 128, device="cuda").to(torch.bfloat16)
                with poisoned_outputs():
                    o, lse = flash_forward(q, k, v, causal=True)
                    if sync:
                        torch.cuda.synchronize()
                    dq, dk, dv = flash_backward(q, k, v, o, lse, do, causal=True, config_dkdv=cfg)
                errs = closed_form_errors(q, k, v, do, o, lse, dq, dk, dv, group)
                for key, e in errs.items():
                    worst[key] = max(worst.get(key, 0.0), e)
                bad = {key: e for key, e in errs.items() if not e <= tol[key]}
                if bad:
                    # which KV heads / columns of dv are off, and by how much
                    dv_want = do.double().view(2, 8 // group, group, 1, 128).sum(2)
                    off = (dv.double() - dv_want).abs() > tol["dv"]
                    fails.append({"seed": seed, "errors": bad,
                                  "dv_bad_heads": off.any(-1).squeeze(-1).nonzero().tolist(),
                                  "dv_bad_cols": int(off.sum())})
            out[f"g{group}-{name}{'-sync' if sync else ''}"] = {
                "runs": runs, "failed": len(fails), "worst": worst, "failures": fails[:20],
                "seconds": round(time.time() - start, 1)}
            print(f"repro g={group} {name}{' sync' if sync else ''}: {len(fails)}/{runs} failed; worst {worst}",
                  flush=True)
    return out


FWD_VARIANTS = {"default": None, "128x64w8s3": Config(128, 64, 8, 3), "128x64w8s2": Config(128, 64, 8, 2),
                "128x64w8s1": Config(128, 64, 8, 1), "64x64w4s3": Config(64, 64, 4, 3),
                "64x64w4s1": Config(64, 64, 4, 1), "32x32w4s1": Config(32, 32, 4, 1),
                "16x16w4s1": Config(16, 16, 4, 1)}


def forward_repro(runs: int, variants, *, seq_q=1, seq_k=1, head_dim=128, causal=True, group=4,
                  padded=False, poison=True):
    """The forward alone on one key, ``runs`` seeds per variant: how often o or lse is off.

    ``padded``: k and v are the first seq_k rows of tensors four tiles longer, filled with
    finite numbers, so a read past their end finds finite values instead of whatever
    (poisoned or stale) memory follows them."""
    out = {}
    for name in variants:
        cfg = FWD_VARIANTS[name]
        nan_o = inf_lse = wrong = 0
        examples = []
        for seed in range(runs):
            torch.manual_seed(seed)
            q = torch.randn(2, seq_q, 8, head_dim, device="cuda").to(torch.bfloat16).transpose(1, 2)
            extra = 256 if padded else 0
            k = torch.randn(2, 8 // group, seq_k + extra, head_dim, device="cuda").to(torch.bfloat16)[:, :, :seq_k]
            v = torch.randn(2, 8 // group, seq_k + extra, head_dim, device="cuda").to(torch.bfloat16)[:, :, :seq_k]
            with poisoned_outputs(poison):
                o, lse = flash_forward(q, k, v, causal=causal, config=cfg)
            want = stress.checks.torch_attention(q.double(), k.double(), v.double(), causal=causal)
            bad = (o.double() - want).abs().nan_to_num(float("inf")) > 0.05
            if bad.any():
                wrong += 1
                nan_o += int(o.isnan().any())
                inf_lse += int(lse.isinf().any())
                if len(examples) < 5:
                    examples.append({"seed": seed, "bad_heads": bad.any(-1).any(-1).nonzero().tolist(),
                                     "o_nan": int(o.isnan().sum()), "lse": lse.flatten().tolist()[:16]})
        key = (f"{name}-q{seq_q}k{seq_k}-d{head_dim}-{'causal' if causal else 'full'}-g{group}"
               + ("-padded" if padded else "") + ("" if poison else "-nopoison"))
        out[key] = {"runs": runs, "wrong": wrong, "o_nan": nan_o, "lse_inf": inf_lse, "examples": examples}
        print(f"fwd {key}: {wrong}/{runs} wrong (o NaN {nan_o}, lse inf {inf_lse})", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repro", type=int, default=0)
    p.add_argument("--variants", default="default")
    p.add_argument("--sync", action="store_true", help="repro: synchronise between forward and backward")
    p.add_argument("--forward", type=int, default=0, help="forward repro: runs per variant")
    p.add_argument("--classes", action="store_true")
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--kernels", default=",".join(stress.KERNELS))
    p.add_argument("--subset", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="classes: each case this many times in a row, fresh inputs (a decode call whose "
                        "signature was seen takes flash_decode's short path)")
    p.add_argument("--launch-only", action="store_true",
                   help="classes: the kernels alone, no references (for compute-sanitizer)")
    p.add_argument("--specialised", type=int, default=0,
                   help="forward repro, N runs with Triton's default specialisation of the lengths and N without")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    record = {"provenance": collect_provenance(sys.argv[1:], program="python3 benchmarks/stress.py")}
    path = os.path.join(args.out, "stress.json")

    def save():
        with open(path, "w") as f:
            json.dump(record, f, indent=1)

    if args.repro:
        record["repro"] = repro(args.repro, args.variants.split(","), sync=args.sync)
        save()
    if args.forward:
        found = {}
        n = args.forward
        found.update(forward_repro(n, list(FWD_VARIANTS)))
        found.update(forward_repro(n, ["default"], padded=True))
        found.update(forward_repro(n, ["default"], poison=False))
        for sq, sk, d, causal in ((1, 1, 128, False), (1, 1, 64, True), (1, 1, 256, True), (1, 2, 128, True),
                                  (2, 2, 128, True), (3, 3, 128, True), (1, 65, 128, True), (17, 17, 128, True)):
            found.update(forward_repro(n, ["default"], seq_q=sq, seq_k=sk, head_dim=d, causal=causal))
        for d in (64, 128):
            found.update(forward_repro(n, ["default"], head_dim=d, group=1))
        record["forward"] = found
        save()
    if args.specialised:
        import triton
        from flashbook.kernels import autograd

        plain = autograd._attn_fwd
        found = {}
        for label, kernel in (("specialised", triton.jit(plain.fn)), ("unspecialised", plain)):
            autograd._attn_fwd = kernel
            try:
                for group in (1, 4):
                    res = forward_repro(args.specialised, ["default"], group=group)
                    found.update({f"{label}-{key}": value for key, value in res.items()})
            finally:
                autograd._attn_fwd = plain
        record["specialisation"] = found
        save()
    if args.classes:
        kernels = args.kernels.split(",")
        results, total, failed = [], 0, 0
        start = time.time()
        for name, cases in stress.all_classes(kernels, args.runs):
            if args.subset:
                cases = cases[:args.subset]
            cases = [case for case in cases for _ in range(args.repeat)]
            res = stress.run_class(name, cases, "cuda", first_seed=1000 * len(results), check=not args.launch_only)
            total += res.runs
            failed += len(res.failures)
            results.append({"class": name, "runs": res.runs, "failed": len(res.failures),
                            "failures": res.failures[:10]})
            if res.failures:
                print(stress.report(res), flush=True)
        record["classes"] = {"kernels": kernels, "runs_per_class": args.runs, "classes": len(results),
                             "runs": total, "failed_runs": failed, "seconds": round(time.time() - start, 1),
                             "by_class": results}
        print(f"classes: {len(results)}, runs: {total}, failed runs: {failed}, "
              f"{time.time() - start:.0f} s", flush=True)
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
