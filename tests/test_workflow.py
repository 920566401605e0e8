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
