"""Malformed deploy.yaml files through the real CLI: each is one line on stderr naming the file, exit 3 (config
error), never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def plan(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(path), "--gpu-memory", "80GiB"],
                          env=ENV, capture_output=True, text=True, timeout=60)


def assert_config_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 3, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    for needle in needles:
        assert needle in err, err
    return err


def test_non_utf8_file_is_a_config_error(tmp_path):
    bad = tmp_path / "deploy.yaml"
    bad.write_bytes(b"service: {name: x}\n\xff\xfe garbage\n")
    assert_config_error(plan(bad), str(bad), "UTF-8")
