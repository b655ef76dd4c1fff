"""Model verification against manifest.sha256 (C15, runtime side): full hashes, a cache keyed by stat, clear errors."""
from __future__ import annotations

import hashlib
import os

import pytest

from deployctl_runtime.server import verify
from deployctl_runtime.server.verify import VerificationError, verify_model_dir


@pytest.fixture
def model_dir(tmp_path):
    files = {"config.json": b'{"a": 1}\n', "model-00001.safetensors": os.urandom(4096),
             "model-00002.safetensors": os.urandom(8192)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "manifest.sha256").write_text(
        "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()))
    return tmp_path


@pytest.fixture
def hash_calls(monkeypatch):
    calls = []
    real = verify._sha256

    def counting(path):
        calls.append(path.name)
        return real(path)

    monkeypatch.setattr(verify, "_sha256", counting)
    return calls


def test_good_dir_verifies_and_the_cache_is_reused_while_stat_is_unchanged(model_dir, hash_calls):
    assert verify_model_dir(model_dir) == 3 and len(hash_calls) == 3
    assert verify_model_dir(model_dir) == 3 and len(hash_calls) == 3  # all from the cache
    shard = model_dir / "model-00002.safetensors"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: hashed again
    verify_model_dir(model_dir)
    assert hash_calls[3:] == ["model-00002.safetensors"]


def test_same_size_flipped_byte_names_file_and_both_hashes(model_dir):
    shard = model_dir / "model-00002.safetensors"
    verify_model_dir(model_dir)  # cache the good hash first: a rewrite changes mtime, so it is not reused
    data = bytearray(shard.read_bytes())
    data[6000] ^= 0xFF
    expected = hashlib.sha256(shard.read_bytes()).hexdigest()
    shard.write_bytes(bytes(data))
    with pytest.raises(VerificationError) as exc:
        verify_model_dir(model_dir)
    msg = str(exc.value)
    assert str(shard) in msg and expected in msg and hashlib.sha256(bytes(data)).hexdigest() in msg
    assert "--skip-verify" in msg


def test_git_lfs_pointer_and_missing_file(model_dir):
    shard = model_dir / "model-00001.safetensors"
    shard.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 4096\n")
    with pytest.raises(VerificationError, match="git-lfs pointer, not weights"):
        verify_model_dir(model_dir)
    shard.unlink()
    with pytest.raises(VerificationError, match="model-00001.safetensors is listed in manifest.sha256 but missing"):
        verify_model_dir(model_dir)


def test_no_manifest_is_not_an_error_and_a_bad_line_is(tmp_path):
    assert verify_model_dir(tmp_path) == 0
    (tmp_path / "manifest.sha256").write_text("not-a-hash  file\n")
    with pytest.raises(VerificationError, match="not a sha256sum line"):
        verify_model_dir(tmp_path)
