"""Build hook: the wheel carries the recorded GPU runs (chapters 9 and 10 read them).

``benchmarks/results/`` stays where the benchmark scripts write it; building the
package copies its CSV, JSON and JUnit XML files and each run's provenance.txt (not the
archived executed notebooks or the logs) into
``flashbook/data/results`` of the build, so a plain ``pip install`` (from git, an
sdist or a wheel) has them. ``flashbook.resources.results_dir`` finds them.
Everything else about the package is in pyproject.toml.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "benchmarks" / "results"
SHIPPED = ("*.csv", "*.json", "*.xml", "provenance.txt")


class BuildPyWithResults(build_py):
    def run(self):
        super().run()
        if not RESULTS.is_dir():  # e.g. an sdist built without them: nothing to ship
            return
        target = Path(self.build_lib) / "flashbook" / "data" / "results"
        if target.exists():
            shutil.rmtree(target)
        for pattern in SHIPPED:
            for src in RESULTS.rglob(pattern):
                dst = target / src.relative_to(RESULTS)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


setup(cmdclass={"build_py": BuildPyWithResults})
