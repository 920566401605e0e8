"""Shared test settings.

Importing flashbook first makes sure TRITON_INTERPRET is decided before any test
imports triton (no GPU: the interpreter).
"""
import os

import numpy as np
import pytest

import flashbook  # noqa: F401  (decides GPU vs interpreter before triton is imported)

#: CI sets CI=true: there, a test that cannot run is a failure, not a skip.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module, as running it sees itself: its folder
    on sys.path (the scripts import each other) and the module in sys.modules."""
    import importlib
    import sys

    folder = os.path.join(ROOT, "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def require(condition: bool, why: str):
    """Skip locally when a prerequisite is missing, but fail in CI."""
    if not condition:
        if IN_CI:
            pytest.fail(f"required in CI: {why}")
        pytest.skip(why)


RESULTS = os.path.join(ROOT, "benchmarks", "results")


@pytest.fixture(autouse=True)
def _release_gpu_memory(request):
    """After each ``gpu`` test, hand PyTorch's cached GPU memory back. Each xdist worker keeps
    what its largest test allocated: eight workers held 12 to 36 GiB each and ran a 78 GiB
    H100 out of memory (benchmarks/results/notebook_08_h100_ee10cd7), failing tests that
    pass alone."""
    yield
    if request.node.get_closest_marker("gpu") is not None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def recorded_chapter9():
    """chapter9.build on the recorded runs of benchmarks/results/ (read-only for the tests)."""
    from flashbook import bench
    from flashbook.bench import chapter9

    require(bench.latest_results(RESULTS) is not None, "no recorded results")
    return chapter9.build(RESULTS)


@pytest.fixture(scope="module")
def recorded_chapter10():
    """chapter10.build on the recorded runs (chapter 10 and the lab notes read it; read-only)."""
    from flashbook.bench import chapter10

    require(os.path.isfile(os.path.join(RESULTS, "index.json")), "no recorded runs")
    return chapter10.build(RESULTS)


@pytest.fixture
def rng():
    """Fresh random numbers on every run (the seed is printed when a test fails)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def compile_cache() -> str:
    """Triton's on-disk cache for the tests that compile kernels for a GPU this machine does not
    have (test_compile_targets, test_hopper, test_gluon_bwd_lab): ``$FLASHBOOK_COMPILE_CACHE``,
    else ``triton-targets`` in flashbook's user cache (``colab_like.user_cache``: ~/.cache/flashbook
    by default). It outlives the checkout, as pip's cache does: a run on a machine that has run the
    suite before, from a fresh clone too, compiles only what changed. Triton's key holds the
    kernel's source and the source of every function it calls, the target, the options and
    Triton's own version, so an edited kernel is compiled and checked again. A cold cache costs
    about 170 worker-seconds of the suite on CI's two cores (131 in test_compile_targets, 34 in
    test_hopper, 5 in test_gluon_bwd_lab); ``FLASHBOOK_COMPILE_CACHE=$(mktemp -d)`` measures it."""
    from colab_like import user_cache   # beside this file

    folder = os.environ.get("FLASHBOOK_COMPILE_CACHE") or str(user_cache("triton-targets"))
    os.makedirs(folder, exist_ok=True)
    return folder


def compile_probe(tmp_path, code: str, timeout: int = 600) -> str:
    """Run ``code`` in a fresh Python that compiles kernels for a GPU target this machine does not
    have (TRITON_INTERPRET=0, ``compile_cache``, Triton's FP fusion on as its default up to 3.9,
    in the repository's root) and return what it printed; a failure shows its stderr. The code
    is written to a file first: Triton reads a kernel's source from its file."""
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(code)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=compile_cache(), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def expected_seconds(item) -> float:
    """How long a test is expected to take: ``@pytest.mark.slow(seconds=N)`` (measured on CI's
    two cores from cold caches), 10 for a bare ``slow`` mark, 0 otherwise."""
    slow = item.get_closest_marker("slow")
    return 0.0 if slow is None else float(slow.kwargs.get("seconds", 10))


def pytest_collection_modifyitems(config, items):
    """The longest tests first, longest first (the Colab-like run, the PDF, the compilations for
    three chips, the grader), the rest in their files' order. `make test` runs the suite with
    ``--dist loadgroup --no-loadscope-reorder``: each worker takes the next test when it is
    nearly out of work, so the long ones spread over both workers and the many short ones fill
    in beside them (xdist's default ``load`` gave the first 173 tests, all the long ones, to one
    worker, which ran 96 s after the other had finished). A module whose tests share a costly
    fixture (the printed PDF, the student edition's run) is one ``xdist_group``, so it is set up once."""
    items.sort(key=lambda item: -expected_seconds(item))
