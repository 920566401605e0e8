"""The Colab-like base environment of tests/test_colab.py: the one list of its packages
and the one way to build it (what it pins: /work/shared/colab-like.md).

    python tests/colab_like.py [DIR]    # default: see BASE; `make colab-venv` runs it

The base is a venv with torch (``$FLASHBOOK_TEST_TORCH`` or torch==2.13.0, installed first
so that nothing pulls another build) and COLAB_LIKE; nothing of flashbook, no myst-nb, no
jupyter-book. Its stamp (``DIR/.installed``) records what it holds and when it was built; a
base whose stamp differs from what is wanted now, or that is older than MAX_AGE_DAYS, is
rebuilt from scratch. It lives in the user's cache folder (``user_cache``), named by what it
holds, so that it outlives the checkout as pip's own cache does: on a machine that has run the
tests before, a fresh clone's `make test` finds it built (about 45 CPU-seconds of pip saved on
CI's two cores). Standard library only: make runs this with the system Python while .venv is
still being filled.

The test never installs into the base: ``layer`` makes a fresh venv that sees the base's
packages through a .pth file, and pip installs flashbook into the fresh venv alone.
"""
import datetime
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

#: What a Colab runtime has that the chapters touch, plus a kernel and nbclient to execute;
#: no jupyter-book, no myst-nb. pandas is Colab's 2.2.2 (googlecolab/colabtools#4870, still 2.2
#: in 2026): its ``.loc`` differs from pandas 3's where an index repeats keys, and a chapter
#: that ran under pandas 3 once failed under 2 (``flashbook.bench.profiles.one``).
COLAB_LIKE = ["numpy==2.0.2", "ipywidgets==7.7.1", "matplotlib", "pandas==2.2.2", "scipy",
              "tabulate", "tqdm", "triton", "ipykernel", "nbclient"]
TORCH = os.environ.get("FLASHBOOK_TEST_TORCH", "torch==2.13.0")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from venv_install import install_packages, uv_command  # noqa: E402  (standard library only, as this file)

#: A base older than this is built again: the unpinned packages (matplotlib, pandas, scipy,
#: triton...) move on as Colab's do.
MAX_AGE_DAYS = 30

#: The venvs see neither this checkout nor an override of the recorded runs.
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLASHBOOK_RESULTS")}


def pip(py, *args, uv=None):
    """``py -m pip install -q ARGS`` (or ``uv`` from ``venv_install.uv_command``, which installs
    the same packages in about a third of pip's time); the installer's own words on failure.
    The bytecode is compiled at install, as Colab's packages come: where PYTHONDONTWRITEBYTECODE
    is set nothing compiled later is kept, and each chapter's kernel would compile torch, numpy
    and the rest again (torch's import alone: 1.6 s with its bytecode, 2.6 s without, measured here)."""
    done = install_packages(str(py), args, uv, env=ENV, capture=True)   # what uv cannot do, pip may
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def site_packages(venv) -> Path:
    """The venv's site-packages (POSIX layout: lib/pythonX.Y/site-packages)."""
    return Path(venv) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def wanted() -> dict:
    """What the stamp of an up-to-date base says (and when it was built, which is not compared)."""
    return {"python": platform.python_version(), "packages": [TORCH, *COLAB_LIKE]}


def user_cache(*parts) -> Path:
    """A folder under ``$FLASHBOOK_CACHE``, else under ``flashbook`` in the user's cache folder
    (``$XDG_CACHE_HOME``, by default ~/.cache); ``rm -r`` it to start cold."""
    root = os.environ.get("FLASHBOOK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "flashbook")
    return Path(root, *parts)


#: The base venv: in the user's cache, one folder per list of packages and Python version.
BASE = user_cache("colab-venv-" + hashlib.sha256(json.dumps(wanted()).encode()).hexdigest()[:12])


def up_to_date(stamp: Path, today: datetime.date | None = None) -> bool:
    """Whether a base's stamp says it holds ``wanted()`` and is at most MAX_AGE_DAYS old."""
    try:
        found = json.loads(stamp.read_text())
        built = datetime.date.fromisoformat(found.pop("built"))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return found == wanted() and ((today or datetime.date.today()) - built).days <= MAX_AGE_DAYS


def build(base=BASE) -> Path:
    """The base venv at ``base``, built unless its stamp says it holds ``wanted()`` (``up_to_date``)."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    stamp = base / ".installed"
    with open(f"{base}.lock", "w") as lock:  # two builders at once: the second one waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if up_to_date(stamp):
            return base
        shutil.rmtree(base, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(base)], check=True)
        py = base / "bin" / "python"
        uv = uv_command(str(py), env=ENV)   # uv in the base while it is filled, then gone again
        pip(py, TORCH, uv=uv)  # first, so that nothing pulls another torch build
        pip(py, *COLAB_LIKE, uv=uv)
        if uv:
            subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "uv"], check=True, env=ENV,
                           capture_output=True)
        # Compiled once, here: under PYTHONDONTWRITEBYTECODE (set on the test machines) no
        # kernel writes the caches, and each one compiled torch, numpy, pandas... from source
        # at every import (the 13 chapters ran in 131 s against 55-88 s compiled); without it,
        # the first run would write them into the base. compileall exits 1 on the few files
        # that are not Python 3 (templates, test data), which pip passes over too.
        subprocess.run([str(py), "-m", "compileall", "-q", "-j", "0", str(site_packages(base))],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stamp.write_text(json.dumps(dict(wanted(), built=datetime.date.today().isoformat())) + "\n")
    return base


def layer(venv, base=BASE) -> str:
    """A fresh, empty venv at ``venv`` on top of ``base``: a .pth file in its site-packages
    appends the base's site-packages to sys.path, so that Python, pip and importlib.metadata
    see the base's packages after the venv's own. pip (the base's) installs into the venv
    only, and never uninstalls from the base: it is outside the venv's environment. Returns
    the venv's python.

    Without a pip of its own: ensurepip's setuptools (65) would shadow the base's, which
    torch's wheel needs at >= 77, and the setup cell would upgrade it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    own = site_packages(venv)
    assert own.is_dir(), f"no {own}"
    (own / "colab_like_base.pth").write_text(f"{site_packages(base)}\n")
    return str(Path(venv) / "bin" / "python")


def snapshot(base=BASE) -> set:
    """(path, size, mtime) of every file in the base but bytecode caches, which Python may
    write there when it imports a module that was not compiled at install time."""
    found = set()
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            found.add((os.path.relpath(os.path.join(folder, name), base), st.st_size, st.st_mtime_ns))
    return found


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else BASE)
