"""Execute the book's notebooks side by side into the cache that `jupyter-book build` reads.

    python tools/prefill_cache.py [--jobs N]        (make book runs it first)

myst-nb executes notebooks one after another (``execution_mode: cache``), so on a machine
with two cores the book's build waits for about 130 s of notebooks run in a row. This runs
them ``--jobs`` at a time (default: one per core, at most 4), longest first, with the call
myst-nb itself makes (``jupyter_cache``'s ``single_nb_execution``, in the notebook's own
folder, with the book's timeout), and stores each executed notebook in
``_build/.jupyter_cache`` as myst-nb would. The build then finds every notebook in the
cache ("Using cached notebook") and executes none. A notebook that is already cached with
the same code is skipped; one that fails is left out of the cache, so the build runs it
again and reports its error as it always does. MyST Markdown pages that execute code
(``book/*.md``) are left to the build.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

import nbformat
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "_build", ".jupyter_cache")


def book_notebooks() -> list[str]:
    """Every .ipynb file the table of contents lists (``make_pdf.toc_pages``), as an absolute path."""
    from make_pdf import toc_pages   # beside this file

    return [path for path in (os.path.join(ROOT, page + ".ipynb") for page in toc_pages())
            if os.path.exists(path)]


def timeout_s() -> int:
    """The book's execution timeout (``execute.timeout`` in _config.yml), as the build uses it."""
    with open(os.path.join(ROOT, "_config.yml")) as f:
        config = yaml.safe_load(f)
    return int(config.get("execute", {}).get("timeout", 30))


def execute(path: str, timeout: int):
    """Run one notebook as myst-nb does; (path, executed notebook or None, seconds, error text).

    The kernel talks over IPC sockets in a folder of its own: kernels started side by side
    over TCP each pick a free port and bind it later, and two can pick the same one (the
    loser dies before it answers). Any failure, a kernel that never starts included, leaves
    the notebook to the build, which runs it again and reports its error."""
    import tempfile
    import traceback

    from jupyter_cache.executors.utils import single_nb_execution
    from jupyter_client.manager import KernelManager

    nb = nbformat.read(path, as_version=4)
    name = nb.metadata.get("kernelspec", {}).get("name") or "python3"
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="flashbook-kernel-") as sockets:
            km = KernelManager(kernel_name=name, transport="ipc", ip=os.path.join(sockets, "k"))
            try:
                result = single_nb_execution(nb, cwd=os.path.dirname(path), allow_errors=False,
                                             timeout=timeout, meta_override=True, km=km)
            finally:   # nbclient leaves a kernel it was handed running
                if km.has_kernel:
                    km.shutdown_kernel(now=True)
    except Exception:
        return path, None, time.perf_counter() - start, traceback.format_exc()
    return path, (None if result.err else nb), result.time, result.exc_string


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(CACHE)
    code_size = {}   # path -> characters of code, for the notebooks the cache does not hold
    for path in book_notebooks():
        nb = nbformat.read(path, as_version=4)
        try:
            cache.match_cache_notebook(nb)
        except KeyError:
            code_size[path] = sum(len(c.source) for c in nb.cells if c.cell_type == "code")
    # longest first (the size of the code is a fair guess), so no long one starts last
    todo = sorted(code_size, key=code_size.get, reverse=True)
    if not todo:
        print("prefill_cache: every notebook is cached already")
        return 0
    start = time.perf_counter()
    failed = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for path, nb, seconds, error in pool.map(execute, todo, [timeout_s()] * len(todo)):
            name = os.path.relpath(path, ROOT)
            if nb is None:
                failed.append(name)
                print(f"prefill_cache: {name} failed after {seconds:.1f} s (the build will run it again):\n"
                      f"{(error or '')[-2000:]}", file=sys.stderr)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"prefill_cache: {name} executed in {seconds:.1f} s")
    print(f"prefill_cache: {len(todo) - len(failed)} of {len(todo)} notebooks in "
          f"{time.perf_counter() - start:.0f} s, {args.jobs} at a time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
