"""Did a change to the kernels change the code they compile to? Compare their PTX.

    TRITON_INTERPRET=0 PYTHONPATH=<old checkout> python tools/ptx_compare.py dump OLD_DIR
    TRITON_INTERPRET=0 PYTHONPATH=<new checkout> python tools/ptx_compare.py dump NEW_DIR
    python tools/ptx_compare.py diff OLD_DIR NEW_DIR

``dump`` compiles every kernel variant (``flashbook.kernels.targets.compile_kernel``:
the three kernels, sm_80 and sm_90, head_dim 64/80/128, fp16/bf16/fp32, causal or not,
atomic dQ or not; each with the library's default configuration) and writes its PTX
without debug information (file paths and line tables) or comments. ``diff`` sorts each
pair into "identical", "same body, more parameters" (the same instructions in the same
order; the kernel takes arguments it does not use here, ``body``), "same instructions,
reordered" (equal as a multiset once register numbers and labels are erased) or "DIFFERENT". Both dumps must come from the same Triton.
"""
from __future__ import annotations

import collections
import itertools
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def variants():
    for kernel in ("forward", "backward_dkdv", "backward_dq"):
        for cc, d, dtype, causal in itertools.product((80, 90), (64, 80, 128), ("fp16", "bf16", "fp32"),
                                                      (False, True)):
            for atomic in ((False, True) if kernel == "backward_dkdv" else (False,)):
                yield dict(kernel=kernel, cc=cc, head_dim=d, dtype=dtype, causal=causal, atomic_dq=atomic)


def name_of(v: dict) -> str:
    return (f"{v['kernel']}-sm{v['cc']}-d{v['head_dim']}-{v['dtype']}-{'causal' if v['causal'] else 'full'}"
            + ("-atomic" if v["atomic_dq"] else ""))


def code_lines(ptx: str) -> list[str]:
    """The PTX's instructions and declarations: no comments, no debug sections or their data."""
    out = []
    for line in ptx.splitlines():
        s = line.split("//")[0].strip()
        if s.startswith(".section"):
            break  # DWARF from here on
        if s and not s.startswith((".loc", ".file")):
            out.append(s)
    return out


def dump_one(args) -> str:
    from flashbook.kernels import configs, targets

    v, out_dir = args
    config = configs.default(v["kernel"], cc=v["cc"], block_d=configs.block_d(v["head_dim"]),
                             elem_bytes=ELEM_BYTES[v["dtype"]], causal=v["causal"])
    path = os.path.join(out_dir, name_of(v) + ".ptx")
    if not os.path.exists(path):
        compiled = targets.compile_kernel(v["kernel"], cc=v["cc"], config=config, head_dim=v["head_dim"],
                                          dtype=v["dtype"], causal=v["causal"], atomic_dq=v["atomic_dq"])
        with open(path, "w") as f:
            f.write("\n".join(code_lines(compiled.asm["ptx"])) + "\n")
    return path


def body(lines: list[str]) -> list[str]:
    """The instructions alone: no parameter declarations, parameters by one name, and no
    ``$L__tmp`` labels (debug-line anchors, one per inlined call). Two kernels with equal
    bodies run the same instructions in the same order; one may take more arguments (a
    new run-time argument that a compile-time switch leaves unused)."""
    kept = (re.sub(r"_param_\d+", "_param", s) for s in lines if not s.startswith(".param"))
    return [s for s in kept if not re.fullmatch(r"\$L__tmp\d+:", s)]


def erased(lines: list[str]) -> collections.Counter:
    return collections.Counter(re.sub(r"%[a-z]+\d+", "%r", re.sub(r"\$?L\w*\d+", "L", s)) for s in lines)


def diff(old_dir: str, new_dir: str) -> dict:
    kinds = collections.Counter()
    for name in sorted(os.listdir(new_dir)):
        old = os.path.join(old_dir, name)
        if not name.endswith(".ptx") or not os.path.exists(old):
            continue
        a, b = (open(p).read().splitlines() for p in (old, os.path.join(new_dir, name)))
        kind = ("identical" if a == b else "same body, more parameters" if body(a) == body(b)
                else "same instructions, reordered" if erased(a) == erased(b) else "DIFFERENT")
        kinds[kind] += 1
        print(f"{kind:30s} {name}")
    print(dict(kinds))
    return dict(kinds)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "dump":
        os.makedirs(argv[1], exist_ok=True)
        workers = int(argv[2]) if len(argv) > 2 else 1
        with ProcessPoolExecutor(workers) as pool:
            paths = list(pool.map(dump_one, [(v, argv[1]) for v in variants()]))
        print(f"{len(paths)} variants in {argv[1]}")
        return 0
    if len(argv) == 3 and argv[0] == "diff":
        return 1 if diff(argv[1], argv[2]).get("DIFFERENT") else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
