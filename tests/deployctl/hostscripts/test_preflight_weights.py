"""C15: partial or corrupt weight files. Real safetensors shards, a real manifest, full hashing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from deployctl.hostscripts.weights import HashCache, verify, write_manifest

from support.paths import REPO
LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 6291592\n")


@pytest.fixture
def sharded(tmp_path) -> Path:
    """Two safetensors shards (the second 6 MiB, beyond one 4 MiB read), an index, a manifest."""
    d = tmp_path / "model"
    d.mkdir()
    rng = np.random.default_rng(0)
    save_file({"embed.weight": rng.standard_normal((256, 64), dtype=np.float32)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"layers.0.w": rng.standard_normal((1536, 1024), dtype=np.float32)}, str(d / "model-00002-of-00002.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "embed.weight": "model-00001-of-00002.safetensors", "layers.0.w": "model-00002-of-00002.safetensors"}}))
    out, issues = write_manifest(d, cache=None)
    assert issues == [] and out == d / "manifest.sha256"
    return d


def kinds(report) -> dict:
    return {(i.file, i.kind): i for i in report.issues}


SHARD2 = "model-00002-of-00002.safetensors"


def test_clean_model_verifies_and_manifest_is_sha256sum_format(sharded):
    rep = verify(sharded)
    assert rep.ok and rep.issues == [] and rep.files_total == 4 and rep.files_hashed == 4
    proc = subprocess.run(["sha256sum", "-c", "--strict", "manifest.sha256"], cwd=sharded, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_git_lfs_pointer(sharded):
    (sharded / SHARD2).write_text(LFS_POINTER)
    rep = verify(sharded)
    issue = kinds(rep)[(SHARD2, "git_lfs_pointer")]
    assert not rep.ok and "git-lfs pointer, not weights" in issue.message and SHARD2 in issue.message


def test_b_truncated_to_60_percent(sharded):
    p = sharded / SHARD2
    full = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(int(full * 0.6))
    found = kinds(verify(sharded))
    size = found[(SHARD2, "size_mismatch")]
    assert f"data ends at byte {full}" in size.message and f"{int(full * 0.6)} bytes on disk" in size.message
    assert (SHARD2, "sha256_mismatch") in found


def test_c_one_byte_flipped_deep_inside_and_incomplete_leftover(sharded):
    p = sharded / SHARD2
    size = p.stat().st_size
    expected = (sharded / "manifest.sha256").read_text().split(f"  {SHARD2}")[0].split()[-1]
    with open(p, "r+b") as f:  # past the first 4 MiB read: a prefix hash would miss it
        f.seek(5 * 2**20)
        b = f.read(1)
        f.seek(5 * 2**20)
        f.write(bytes([b[0] ^ 0xFF]))
    (sharded / "model-00002-of-00002.safetensors.incomplete").write_bytes(b"\0" * 100)
    rep = verify(sharded)
    found = kinds(rep)
    mismatch = found[(SHARD2, "sha256_mismatch")]
    assert p.stat().st_size == size
    assert mismatch.expected == expected and mismatch.actual != expected and len(mismatch.actual) == 64
    assert f"expected {expected}, actual {mismatch.actual}" in mismatch.message
    assert ("model-00002-of-00002.safetensors.incomplete", "incomplete_leftover") in found


def test_d_shard_named_by_index_is_missing(sharded):
    (sharded / SHARD2).unlink()
    rep = verify(sharded)
    assert [(i.file, i.kind) for i in rep.issues] == [(SHARD2, "missing_shard")]
    assert "missing shard (named by model.safetensors.index.json)" in rep.issues[0].message


def test_cache_reused_only_while_size_mtime_ctime_inode_unchanged(sharded, tmp_path):
    cache_file = tmp_path / "cache.json"
    first = verify(sharded, cache=HashCache(cache_file))
    assert first.ok and first.files_hashed == 4 and first.files_cached == 0
    warm = verify(sharded, cache=HashCache(cache_file))
    assert warm.ok and warm.files_hashed == 0 and warm.files_cached == 4
    # flip a byte and put the mtime back: ctime still changes, so the file is hashed again
    p = sharded / SHARD2
    st = p.stat()
    with open(p, "r+b") as f:
        f.seek(100_000)
        b = f.read(1)
        f.seek(100_000)
        f.write(bytes([b[0] ^ 1]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    rep = verify(sharded, cache=HashCache(cache_file))
    assert rep.files_hashed == 1 and (SHARD2, "sha256_mismatch") in kinds(rep)
    # same content, same mtime, new inode (copy + rename): hashed again, and passes
    with open(p, "r+b") as f:
        f.seek(100_000)
        f.write(b)
    verify(sharded, cache=HashCache(cache_file))
    shutil.copy2(p, sharded / "tmp")
    os.replace(sharded / "tmp", p)
    rep = verify(sharded, cache=HashCache(cache_file))
    assert rep.ok and rep.files_hashed == 1 and rep.files_cached == 3


def test_no_manifest_fails_but_still_checks_files(sharded):
    (sharded / "manifest.sha256").unlink()
    (sharded / "model-00001-of-00002.safetensors").write_text(LFS_POINTER)
    found = kinds(verify(sharded))
    assert ("manifest.sha256", "no_manifest") in found
    assert ("model-00001-of-00002.safetensors", "git_lfs_pointer") in found


def test_weights_script_runs_standalone_from_stdin(sharded, tmp_path):
    """What preflight does on a remote host: `python - verify DIR` with the source on stdin, -I (no
    PYTHONPATH, no deployctl importable), reporting the same issues as JSON."""
    (sharded / SHARD2).write_text(LFS_POINTER)
    src = (REPO / "deployctl" / "hostscripts" / "weights.py").read_text()
    proc = subprocess.run([sys.executable, "-I", "-", "verify", str(sharded), "--cache", str(tmp_path / "c.json")],
                          input=src, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["ok"] is False and [(i["file"], i["kind"]) for i in rep["issues"]] == [(SHARD2, "git_lfs_pointer")]


def test_cli_manifest_writes_and_refuses_broken_dirs(sharded):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "DEPLOYCTL_HASH_CACHE": str(sharded.parent / "cli-cache.json")}
    (sharded / "manifest.sha256").unlink()
    proc = subprocess.run([sys.executable, "-m", "deployctl", "manifest", str(sharded)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert subprocess.run(["sha256sum", "-c", "manifest.sha256"], cwd=sharded, capture_output=True).returncode == 0
    before = (sharded / "manifest.sha256").read_text()
    (sharded / SHARD2).write_text(LFS_POINTER)
    proc = subprocess.run([sys.executable, "-m", "deployctl", "manifest", str(sharded)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and f"{SHARD2}: git-lfs pointer, not weights" in proc.stderr
    assert (sharded / "manifest.sha256").read_text() == before
