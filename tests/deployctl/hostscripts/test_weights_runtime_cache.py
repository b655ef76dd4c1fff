"""The runtime's own verification cache inside a model directory is not a model file: `deployctl manifest` must not
list it and preflight must not flag it (found by replaying C15 after a runtime had started on the directory)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployctl.hostscripts.weights import verify

from support.paths import REPO
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")])}
RUNTIME_VERIFY = "import sys; from deployctl_runtime.server.verify import verify_model_dir; verify_model_dir(sys.argv[1])"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True, timeout=120)


def test_manifest_after_a_runtime_start_leaves_the_runtime_cache_out(tmp_path):
    model = tmp_path / "m"
    assert run("-m", "deployctl_runtime", "tiny-model", str(model)).returncode == 0
    # the runtime verifies at start and writes its hash cache next to the weights
    assert run("-c", RUNTIME_VERIFY, str(model)).returncode == 0
    cache_files = [p.name for p in model.iterdir() if p.name.startswith(".")]
    assert cache_files, "the runtime wrote no cache file in the model dir; this test no longer replays the bug"

    r = run("-m", "deployctl", "manifest", str(model))
    assert r.returncode == 0, r.stderr
    listed = [line.split("  ", 1)[1] for line in (model / "manifest.sha256").read_text().splitlines()]
    assert "model.safetensors" in listed
    assert not set(cache_files) & set(listed), listed

    # the runtime starts again (rewriting its cache), and both sides still agree the directory is intact
    for _ in range(2):
        r = run("-c", RUNTIME_VERIFY, str(model))
        assert r.returncode == 0, r.stderr
    rep = verify(model, cache=None)
    assert rep.ok and rep.issues == [], [i.message for i in rep.issues]


def test_manifest_refuses_broken_symlinks_and_line_breaks_in_names_in_one_line(tmp_path):
    # a dangling symlink (common in pruned HF caches) crashed `deployctl manifest` with an OSError traceback;
    # a name with a line break was written raw, splitting its manifest line in two
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    r = run("-m", "deployctl", "manifest", str(model))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "model-00002-of-00002.safetensors" in r.stderr and "broken symlink" in r.stderr
    assert not (model / "manifest.sha256").exists()

    (model / "model-00002-of-00002.safetensors").unlink()
    (model / "notes\nmore.txt").write_text("x")
    r = run("-m", "deployctl", "manifest", str(model))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "line break" in r.stderr, r.stderr
    assert not (model / "manifest.sha256").exists()
