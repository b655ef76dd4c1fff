"""Model directory verification against `manifest.sha256` before loading (case C15, runtime side).

The manifest is in `sha256sum` format (`<hex>  <relative path>`). Every listed file is hashed in full (streamed,
1 MiB reads); a result is cached per file keyed by (path, size, mtime_ns, inode) in
`<model_dir>/.deployctl-verify-cache.json`, or `$XDG_CACHE_HOME/deployctl-runtime/verify-cache.json` when the model
directory is read-only, and reused only while all four are unchanged. Self-contained: the runtime cannot import
deployctl.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.sha256"
CACHE_NAME = ".deployctl-verify-cache.json"
LFS_POINTER_PREFIX = b"version https://git-lfs"


class VerificationError(Exception):
    """The model directory does not match its manifest; the message names the file and what is wrong."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cache_path(model_dir: Path) -> Path:
    if os.access(model_dir, os.W_OK):
        return model_dir / CACHE_NAME
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "deployctl-runtime" / "verify-cache.json"


def parse_manifest(text: str, manifest: Path) -> list[tuple[str, str]]:
    """Return (sha256, relative path) pairs. Raises VerificationError on a malformed line."""
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition(" ")
        name = name.lstrip(" *")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise VerificationError(f"{manifest}:{n}: not a sha256sum line: {line[:80]!r}")
        entries.append((digest.lower(), name))
    return entries


def verify_model_dir(model_dir: str | os.PathLike, log=None) -> int:
    """Verify every file named in MODEL_DIR/manifest.sha256; return the number of files checked (0: no manifest).

    Raises VerificationError naming the first bad file: missing, a git-lfs pointer, or expected vs actual sha256.
    """
    root = Path(model_dir)
    manifest = root / MANIFEST
    if not manifest.is_file():
        return 0
    entries = parse_manifest(manifest.read_text(), manifest)
    cache_file = _cache_path(root)
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    changed = False
    for expected, name in entries:
        path = root / name
        try:
            st = path.stat()
        except FileNotFoundError:
            raise VerificationError(f"model file {path} is listed in {MANIFEST} but missing") from None
        key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        actual = cache.get(key)
        if actual is None:
            actual = _sha256(path)
            cache[key] = actual
            changed = True
        if actual != expected:
            with open(path, "rb") as f:
                head = f.read(len(LFS_POINTER_PREFIX))
            kind = " (a git-lfs pointer, not weights: run `git lfs pull`)" if head == LFS_POINTER_PREFIX else ""
            raise VerificationError(
                f"model file {path} fails verification{kind}: expected sha256 {expected}, got {actual}; "
                f"re-download it, or pass --skip-verify to start anyway"
            )
    if changed:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_file)
        except OSError as exc:
            if log:
                log(f"could not write the verification cache {cache_file}: {exc}")
    return len(entries)
