"""Fill the virtual environment that `make` uses: torch first, then requirements-dev.txt, then
flashbook itself (editable). Standard library only; run with the venv's own Python:

    .venv/bin/python tools/venv_install.py "torch==2.13.0"
    .venv/bin/python tools/venv_install.py "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

uv, installed into the venv from the package index first, installs the packages in about a
third of pip's time (measured on CI's two cores: torch 9 s against 17 s, the rest 14 s against
40 s, each with its bytecode compiled). Where uv cannot be had, pip does it all, as before.
uv reads no pip configuration, so where pip is told to look (``find-links``, ``index-url``,
``extra-index-url``: pip's config files and its PIP_* variables, as ``pip config list`` shows
them) is passed on, and uv, like pip, takes the best version found anywhere: a machine's own
wheels, a CPU build of torch say, are found by both.

The bytecode is compiled at install (pip's default; uv's ``--compile-bytecode``): where
PYTHONDONTWRITEBYTECODE is set (CI's machine sets it), nothing compiled later is kept.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pip_locations(listing: str) -> list[str]:
    """uv's options for where ``pip config list`` says pip looks for packages."""
    found = {"find-links": [], "index-url": [], "extra-index-url": []}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in found:
            for item in shlex.split(value.strip().strip("'\"")):
                if item not in found[name]:
                    found[name].append(item)
    options = []
    for name, values in found.items():
        for value in values[:1] if name == "index-url" else values:
            options += [f"--{name}", value]
    return options


def uv_command(python: str = sys.executable, env: dict | None = None) -> list[str] | None:
    """``[uv, pip, install, ...options]`` that installs into ``python``'s venv, after installing
    uv there with pip; None where uv cannot be installed."""
    if subprocess.run([python, "-m", "pip", "install", "-q", "uv"], capture_output=True, env=env).returncode != 0:
        return None
    uv = os.path.join(os.path.dirname(python), "uv")
    if not os.access(uv, os.X_OK):
        return None
    listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             env=env).stdout
    return [uv, "pip", "install", "-q", "--python", python, "--compile-bytecode",
            "--index-strategy", "unsafe-best-match", *pip_locations(listing)]


def install_packages(python: str, args, uv: list[str] | None = None, env: dict | None = None,
                     capture: bool = False) -> subprocess.CompletedProcess:
    """``pip install ARGS`` into ``python``'s venv: by ``uv`` (``uv_command``) where it is given,
    by pip where it is not or where uv fails on them. Returns the last installer's run (its
    output captured with ``capture``); the caller decides what a failure means."""
    if uv:
        done = subprocess.run([*uv, *args], capture_output=capture, text=True, env=env)
        if done.returncode == 0:
            return done
        if not capture:
            print(f"venv_install: uv failed on {' '.join(args)} (its words above); pip tries", file=sys.stderr)
    return subprocess.run([python, "-m", "pip", "install", "-q", *args], capture_output=capture, text=True, env=env)


def install(torch_spec: str) -> None:
    uv = uv_command()
    if uv is None:
        print("venv_install: uv could not be installed; pip installs everything", file=sys.stderr)
    have_torch = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    # TORCH_SPEC may carry pip's options: "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    steps = ([] if have_torch else [shlex.split(torch_spec)]) + [
        ["-r", os.path.join(ROOT, "requirements-dev.txt")],
        ["--no-deps", "-e", ROOT]]
    for args in steps:   # torch first, so that nothing pulls another build of it
        install_packages(sys.executable, args, uv).check_returncode()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} TORCH_SPEC   (e.g. torch==2.13.0)")
    install(sys.argv[1])
