"""preflight with a hosts[].python that cannot run the probe: the reach check names the python and gives a fix
(it showed the base64 blob of the probe's command line and fix null)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("python", ["/nonexistent/bin/python", "/usr/bin/false"])
def test_unusable_host_python_is_named_with_a_fix(tmp_path, python):
    (tmp_path / "m").mkdir()
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: '{tmp_path / 'm'}'}}\nengine: {{device: cpu}}\n"
                   f"hosts: [{{name: a, address: local, deploy_root: '{tmp_path / 'root'}', python: '{python}'}}]\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg), "--json"], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr
    (check,) = json.loads(proc.stdout)["hosts"][0]["checks"]
    assert check["name"] == "reach" and check["status"] == "fail"
    assert python in check["message"] and "base64" not in check["message"], check
    assert check["fix"] and "hosts[].python" in check["fix"], check


def test_repeated_host_flag_probes_the_host_once(tmp_path):
    # `--host a --host a` probed and reported host a twice, in parallel (two weight verifications racing on one
    # hash cache)
    (tmp_path / "m").mkdir()
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: '{tmp_path / 'm'}'}}\nengine: {{device: cpu}}\n"
                   f"hosts: [{{name: a, address: local, deploy_root: '{tmp_path / 'root'}', python: '{sys.executable}'}}]\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg), "--host", "a", "--host", "a",
                           "--json", "--skip-weights"], env=ENV, capture_output=True, text=True, timeout=120)
    assert [h["host"] for h in json.loads(proc.stdout)["hosts"]] == ["a"], proc.stderr
