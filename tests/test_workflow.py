"""The publishing workflow: valid for GitHub Actions (checked offline), and doing
what the book needs: test, build, Pages with .nojekyll, the Colab edition's branch."""
import os
import shutil
import subprocess
import sys

import yaml

from conftest import ROOT, require

WORKFLOW = os.path.join(ROOT, ".github", "workflows", "book.yml")
sys.path.insert(0, os.path.join(ROOT, "tools"))
from colab_edition import COLAB_BRANCH  # noqa: E402


def _check(path):
    exe = shutil.which("check-jsonschema") or os.path.join(os.path.dirname(sys.executable), "check-jsonschema")
    require(os.path.exists(exe), "check-jsonschema is missing: pip install -r requirements-dev.txt")
    # the schema ships inside check-jsonschema: no network
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", path],
                          capture_output=True, text=True)


def test_workflow_validates_offline(tmp_path):
    done = _check(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"  # the check does catch a malformed workflow
    broken.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps: [{uses: 3, run: 4}]\n")
    assert _check(str(broken)).returncode != 0


def test_workflow_tests_builds_and_publishes_both_places():
    flow = yaml.safe_load(open(WORKFLOW))
    on = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert on["push"]["branches"] == ["main"]
    text = open(WORKFLOW).read()
    runs = [s.get("run", "") for job in flow["jobs"].values() for s in job.get("steps", [])]
    uses = [s.get("uses", "") for job in flow["jobs"].values() for s in job.get("steps", [])]
    assert "make test" in runs and any(".nojekyll" in r for r in runs)
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    assert f"-b {COLAB_BRANCH}" in text and f" {COLAB_BRANCH}\n" in text
    assert "_build/colab/" in text and "_build/student/" in text
    # the caches that outlive a checkout are kept between runs too
    cached = [s["with"]["path"] for job in flow["jobs"].values() for s in job.get("steps", [])
              if s.get("uses", "").startswith("actions/cache")]
    assert cached == ["~/.cache/flashbook"]


def test_pips_locations_are_passed_to_uv():
    """uv reads no pip configuration: tools/venv_install.py passes on where pip looks, each place
    once, one index-url, find-links and extra indexes in pip's own order."""
    import venv_install

    listing = ("global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
               "global.find-links='/opt/wheels'\n:env:.find-links='/opt/wheels'\n"
               "global.index-url='https://mirror/simple'\n:env:.index-url='https://other/simple'\n"
               "global.cert='/etc/ssl/certs/ca-certificates.crt'\n:env:.default-timeout='180'\n")
    assert venv_install.pip_locations(listing) == [
        "--find-links", "/opt/wheels", "--index-url", "https://mirror/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple"]
    assert venv_install.pip_locations("") == []
    make = open(os.path.join(ROOT, "Makefile")).read()
    assert 'tools/venv_install.py "$(TORCH_SPEC)"' in make


def test_what_uv_cannot_install_pip_installs(monkeypatch, capsys):
    """uv first, torch before the rest; a step uv fails on goes to pip, and without uv pip does all."""
    import venv_install

    calls = []

    def run(command, **kwargs):
        calls.append(command)
        failed = command[0] == "uv" and "-r" in command   # uv cannot resolve requirements-dev.txt
        torch_missing = command[1:3] == ["-c", "import torch"]
        return subprocess.CompletedProcess(command, int(failed or torch_missing), "", "")

    monkeypatch.setattr(venv_install.subprocess, "run", run)
    monkeypatch.setattr(venv_install, "uv_command", lambda *a, **k: ["uv", "pip", "install"])
    venv_install.install("torch==2.13.0")
    installers = [c[0] if c[0] == "uv" else "pip" for c in calls[1:]]
    assert installers == ["uv", "uv", "pip", "uv"], calls
    assert calls[1][-1] == "torch==2.13.0" and calls[2][-2:] == calls[3][-2:] and calls[3][-2] == "-r"
    assert "pip tries" in capsys.readouterr().err
    calls.clear()
    monkeypatch.setattr(venv_install, "uv_command", lambda *a, **k: None)
    venv_install.install("torch==2.13.0")
    assert [c[1:4] for c in calls[1:]] == [["-m", "pip", "install"]] * 3
    # TORCH_SPEC may carry pip's options (how_to_run's CPU-only build): they reach pip as options
    calls.clear()
    venv_install.install("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert calls[1][-3:] == ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"], calls[1]


def test_the_colab_like_base_is_rebuilt_when_its_list_or_its_age_says_so(tmp_path):
    import datetime
    import json

    import colab_like

    stamp = tmp_path / ".installed"
    built = datetime.date(2026, 1, 1)
    stamp.write_text(json.dumps(dict(colab_like.wanted(), built=built.isoformat())))
    assert colab_like.up_to_date(stamp, today=built + datetime.timedelta(days=colab_like.MAX_AGE_DAYS))
    assert not colab_like.up_to_date(stamp, today=built + datetime.timedelta(days=colab_like.MAX_AGE_DAYS + 1))
    other = dict(colab_like.wanted(), packages=["torch==1.0"], built=built.isoformat())
    stamp.write_text(json.dumps(other))
    assert not colab_like.up_to_date(stamp, today=built)
    stamp.write_text(json.dumps(colab_like.wanted()))   # a stamp from before the date was kept
    assert not colab_like.up_to_date(stamp, today=built)
    assert not colab_like.up_to_date(tmp_path / "missing", today=built)
    # one folder per list and Python, outside the checkout
    assert colab_like.BASE.name.startswith("colab-venv-") and ROOT not in str(colab_like.BASE)


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path):
    """`make gpu-test` runs the stress classes with --dist loadgroup so that the classes which
    compile the same kernels share one worker (tests/test_stress_gpu.py). pytest 9.2 made xdist
    drop the groups without a word (pytest-xdist issue 1386; requirements-dev.txt pins below it):
    here two groups of four tests must land on one worker each."""
    (tmp_path / "test_groups.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.parametrize('i', [pytest.param(i, marks=pytest.mark.xdist_group(f'g{i % 2}'))\n"
        "                               for i in range(8)])\n"
        "def test_one(i):\n"
        "    with open(os.path.join(os.environ['GROUPS_OUT'], str(i)), 'w') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'])\n")
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadgroup", "test_groups.py"], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, GROUPS_OUT=str(out)))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    worker = {int(p.name): p.read_text() for p in out.iterdir()}
    assert sorted(worker) == list(range(8))
    for group in (0, 1):
        assert len({worker[i] for i in range(group, 8, 2)}) == 1, worker
