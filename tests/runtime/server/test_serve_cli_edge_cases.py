"""`deployctl-runtime serve --config FILE` with a broken file: one line naming the file (and line), exit 2."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import RUNTIME_DIR


@pytest.mark.parametrize("content,needles", [
    (b"max_model_len: [1\n", ["bad.yaml:2:1", "not valid YAML"]),  # was a 7-line pyyaml dump
    (b"\xff\xfe max_model_len: 1\n", ["bad.yaml", "UTF-8"]),  # was "'utf-8' codec can't decode byte 0xff ..."
], ids=["yaml-syntax", "not-utf8"])
def test_broken_config_file_is_one_line_naming_it(tmp_path, tiny_model, content, needles):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--model", str(tiny_model), "--port",
                           "0", "--config", str(bad)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(RUNTIME_DIR)})
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, lines
    for needle in needles:
        assert needle in lines[0], lines
