"""Weight verification: manifest (sha256sum format), parallel streamed hashing with a cache, and
file sanity (safetensors header, git-lfs pointers, leftovers, missing shards). Case C15.

Stdlib only and importing nothing of deployctl: preflight ships this file's source to a host and runs
it there with the host's python (``python - verify MODEL_DIR --cache FILE --json``) to hash remotely.

- Manifest: ``MODEL_DIR/manifest.sha256``, lines ``<64 hex>  <relative path>`` as ``sha256sum`` writes
  them (``sha256sum -c manifest.sha256`` run inside MODEL_DIR checks it too).
- Hashing: every file of the manifest is hashed in full (never size-only or a prefix), read in 4 MiB
  chunks; files are hashed on a thread pool (hashlib releases the GIL on large updates).
- Cache: a JSON file mapping the real path to (size, mtime_ns, ctime_ns, inode, sha256). A cached hash is
  reused only while size, mtime, ctime and inode are all unchanged (ctime cannot be set back by
  ``touch -d``, so an in-place edit with a restored mtime still re-hashes).
- Safetensors layout (https://github.com/huggingface/safetensors#format): 8-byte little-endian header
  length N, N bytes of JSON header, then the data; every tensor's ``data_offsets`` end must lie within
  the file.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import struct
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

MANIFEST_NAME = "manifest.sha256"
CHUNK = 4 * 2**20
LFS_PREFIX = b"version https://git-lfs.github.com/spec/"
_SKIP_DIRS = {".git", ".cache", "__pycache__"}
# the runtime's hash cache (deployctl_runtime/server/verify.py CACHE_NAME): rewritten at every start, not a model file
_SKIP_FILES = {".deployctl-verify-cache.json"}
ProgressFn = Callable[[int], None]  # called with the number of bytes just hashed (or found cached)


@dataclass(frozen=True)
class FileIssue:
    """One problem with one file. kind: missing, missing_shard, git_lfs_pointer, size_mismatch,
    bad_header, sha256_mismatch, incomplete_leftover, no_manifest, bad_manifest, unlisted, bad_name."""

    file: str
    kind: str
    message: str
    expected: Optional[str] = None
    actual: Optional[str] = None


@dataclass
class VerifyReport:
    """Result of verifying one model directory. Bytes are integers, durations seconds."""

    model_dir: str
    manifest: str
    ok: bool = True
    files_total: int = 0
    bytes_total: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    files_cached: int = 0
    duration_s: float = 0.0
    issues: List[FileIssue] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "VerifyReport":
        data = dict(data)
        data["issues"] = [FileIssue(**i) for i in data.get("issues", [])]
        return cls(**data)


# ------------------------------------------------------------------------------------------------
# Hash cache


class HashCache:
    """JSON cache of sha256 by real path, valid while size, mtime_ns, ctime_ns and inode match."""

    def __init__(self, path: Optional[Path]):
        self.path = path
        self._lock = threading.Lock()
        self._data: Dict[str, dict] = {}
        self._dirty = False
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                self._data = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self._data = {}

    @staticmethod
    def _key(st: os.stat_result) -> dict:
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}

    def get(self, real: str, st: os.stat_result) -> Optional[str]:
        entry = self._data.get(real)
        if entry and all(entry.get(k) == v for k, v in self._key(st).items()):
            return entry.get("sha256")
        return None

    def put(self, real: str, st: os.stat_result, digest: str) -> None:
        with self._lock:
            self._data[real] = {**self._key(st), "sha256": digest}
            self._dirty = True

    def save(self) -> None:
        """Write atomically (temp file + rename); an unwritable cache is skipped, never fatal."""
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=str(self.path.parent), prefix=".hash-cache.")
            with os.fdopen(fd, "w") as f:
                json.dump(self._data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass


def default_cache_path() -> Path:
    """$DEPLOYCTL_HASH_CACHE, else ~/.cache/deployctl/hash-cache.json."""
    env = os.environ.get("DEPLOYCTL_HASH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "deployctl" / "hash-cache.json"


# ------------------------------------------------------------------------------------------------
# Hashing


def sha256_file(path: Path, progress: Optional[ProgressFn] = None) -> str:
    """Hex sha256 of the whole file, streamed in CHUNK reads; ``progress(n)`` after each chunk."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if progress:
                progress(n)
    return h.hexdigest()


def hash_files(paths: List[Path], *, cache: Optional[HashCache] = None, progress: Optional[ProgressFn] = None,
               max_workers: Optional[int] = None) -> Dict[Path, tuple]:
    """sha256 of each path in parallel: {path: (hexdigest, from_cache)}. Raises OSError of a file."""
    results: Dict[Path, tuple] = {}
    todo = []
    for p in paths:
        st = p.stat()
        real = os.path.realpath(p)
        cached = cache.get(real, st) if cache else None
        if cached:
            results[p] = (cached, True)
            if progress:
                progress(st.st_size)
        else:
            todo.append((p, real))
    lock = threading.Lock()

    def locked_progress(n: int) -> None:
        with lock:
            progress(n)  # type: ignore[misc]

    def one(item):
        p, real = item
        st = p.stat()
        digest = sha256_file(p, locked_progress if progress else None)
        if cache and p.stat().st_mtime_ns == st.st_mtime_ns:
            cache.put(real, st, digest)
        return p, digest

    workers = max_workers or min(8, os.cpu_count() or 1)
    # Largest first: the pool then ends with small files and all workers finish together.
    todo.sort(key=lambda item: -item[0].stat().st_size)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for p, digest in pool.map(one, todo):
            results[p] = (digest, False)
    return results


# ------------------------------------------------------------------------------------------------
# Manifest and sanity


def read_manifest(path: Path) -> Dict[str, str]:
    """{relative path: sha256} from a sha256sum-format file. Raises ValueError naming the line."""
    entries: Dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, sep, name = line.partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest) or not name:
            raise ValueError(f"{path}:{lineno}: not a sha256sum line ({line[:80]!r})")
        entries[name] = digest.lower()
    return entries


def model_files(model_dir: Path, manifest_name: str = MANIFEST_NAME) -> List[str]:
    """Relative paths of the regular files a manifest covers (no manifest, .git, *.incomplete, the runtime's cache)."""
    out = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), model_dir)
            if (rel != manifest_name and name not in _SKIP_FILES and not name.endswith(".incomplete")
                    and not name.endswith(".lock")):
                out.append(rel)
    return out


def sanity_issues(path: Path, rel: str) -> List[FileIssue]:
    """git-lfs pointer and safetensors header problems of one file (reads at most its header)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if size < 1024 and (head + f.read(len(LFS_PREFIX))).startswith(LFS_PREFIX):
            return [FileIssue(rel, "git_lfs_pointer", f"{rel}: git-lfs pointer, not weights ({size} bytes)")]
        if not rel.endswith(".safetensors"):
            return []
        if len(head) < 8:
            return [FileIssue(rel, "bad_header", f"{rel}: {size} bytes, too short for a safetensors header")]
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 * 2**20):
            return [FileIssue(rel, "bad_header", f"{rel}: safetensors header length {n} exceeds the file ({size} bytes)")]
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError):
            return [FileIssue(rel, "bad_header", f"{rel}: safetensors header is not valid JSON with data_offsets")]
    data_end = 8 + n + max(ends, default=0)
    if data_end > size:
        return [FileIssue(rel, "size_mismatch",
                          f"{rel}: size mismatch: {size} bytes on disk, the safetensors header says the data ends at "
                          f"byte {data_end} ({100 * size / data_end:.0f}%); the file is truncated",
                          expected=str(data_end), actual=str(size))]
    return []


def _index_shards(model_dir: Path) -> List[tuple]:
    out = []
    for index in sorted(model_dir.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            out.append((index.name, None))
            continue
        out.extend((index.name, shard) for shard in sorted(set(weight_map.values())))
    return out


def verify(model_dir: Path, *, manifest: str = MANIFEST_NAME, cache: Optional[HashCache] = None,
           progress: Optional[ProgressFn] = None, max_workers: Optional[int] = None) -> VerifyReport:
    """Verify ``model_dir`` against its manifest; every problem becomes a FileIssue (never raises for
    bad files). ``progress(bytes)`` is called as bytes are hashed or found in the cache."""
    start = time.monotonic()
    model_dir = Path(model_dir)
    rep = VerifyReport(model_dir=str(model_dir), manifest=manifest)
    issues = rep.issues
    if not model_dir.is_dir():
        issues.append(FileIssue(str(model_dir), "missing", f"model directory {model_dir} does not exist"))
        rep.ok = False
        return rep
    for leftover in sorted(p for p in model_dir.rglob("*.incomplete")):
        rel = str(leftover.relative_to(model_dir))
        issues.append(FileIssue(rel, "incomplete_leftover", f"{rel}: leftover of an interrupted download"))
    for index_name, shard in _index_shards(model_dir):
        if shard is None:
            issues.append(FileIssue(index_name, "bad_header", f"{index_name}: not valid JSON with a weight_map"))
        elif not (model_dir / shard).is_file():
            issues.append(FileIssue(shard, "missing_shard", f"{shard}: missing shard (named by {index_name})"))
    mpath = model_dir / manifest
    if mpath.is_file():
        try:
            entries = read_manifest(mpath)
        except ValueError as exc:
            issues.append(FileIssue(manifest, "bad_manifest", str(exc)))
            entries = {}
    else:
        issues.append(FileIssue(manifest, "no_manifest", f"no {manifest} in {model_dir}"))
        entries = {rel: "" for rel in model_files(model_dir, manifest)}
    to_hash = []
    missing_shards = {i.file for i in issues if i.kind == "missing_shard"}
    for rel, expected in entries.items():
        path = model_dir / rel
        if not path.is_file():
            if rel not in missing_shards:
                issues.append(FileIssue(rel, "missing", f"{rel}: listed in {manifest} but missing"))
            continue
        rep.files_total += 1
        rep.bytes_total += path.stat().st_size
        found = sanity_issues(path, rel)
        issues.extend(found)
        if expected and not any(i.kind == "git_lfs_pointer" for i in found):
            to_hash.append((rel, path, expected))
    if mpath.is_file() and entries:
        for rel in model_files(model_dir, manifest):
            if rel not in entries and rel.endswith((".safetensors", ".bin", ".json", ".model")):
                issues.append(FileIssue(rel, "unlisted", f"{rel}: not listed in {manifest}"))
    hashes = hash_files([p for _, p, _ in to_hash], cache=cache, progress=progress, max_workers=max_workers)
    for rel, path, expected in to_hash:
        digest, cached = hashes[path]
        rep.files_cached += cached
        if not cached:
            rep.files_hashed += 1
            rep.bytes_hashed += path.stat().st_size
        if digest != expected:
            issues.append(FileIssue(rel, "sha256_mismatch", f"{rel}: sha256 mismatch: expected {expected}, actual {digest}",
                                    expected=expected, actual=digest))
    if cache:
        cache.save()
    rep.ok = not any(i.kind not in ("unlisted",) for i in issues)
    rep.duration_s = round(time.monotonic() - start, 3)
    return rep


def write_manifest(model_dir: Path, *, manifest: str = MANIFEST_NAME, cache: Optional[HashCache] = None,
                   progress: Optional[ProgressFn] = None) -> tuple:
    """Hash every file of ``model_dir`` and write the manifest; returns (manifest path, [FileIssue]).
    Nothing is written when a file fails the sanity checks (lfs pointer, bad header, leftovers)."""
    model_dir = Path(model_dir)
    rels = model_files(model_dir, manifest)
    issues = [FileIssue(str(p.relative_to(model_dir)), "incomplete_leftover",
                        f"{p.relative_to(model_dir)}: leftover of an interrupted download")
              for p in sorted(model_dir.rglob("*.incomplete"))]
    for rel in rels:
        if "\n" in rel or "\r" in rel:
            issues.append(FileIssue(rel, "bad_name", f"{rel!r}: a file name with a line break cannot be listed in "
                                    "a sha256sum manifest; rename or remove it"))
        elif not (model_dir / rel).is_file():  # a dangling or looping symlink
            issues.append(FileIssue(rel, "missing", f"{rel}: broken symlink (its target does not exist)"))
        else:
            issues.extend(sanity_issues(model_dir / rel, rel))
    if issues:
        return None, issues
    hashes = hash_files([model_dir / r for r in rels], cache=cache, progress=progress)
    text = "".join(f"{hashes[model_dir / r][0]}  {r}\n" for r in rels)
    out = model_dir / manifest
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    if cache:
        cache.save()
    return out, []


def main(argv: Optional[List[str]] = None) -> int:
    """``verify MODEL_DIR [--manifest NAME] [--cache FILE] [--no-cache]``: print the report as JSON."""
    ap = argparse.ArgumentParser(prog="weights")
    ap.add_argument("command", choices=["verify"])
    ap.add_argument("model_dir")
    ap.add_argument("--manifest", default=MANIFEST_NAME)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args(argv)
    cache = None if args.no_cache else HashCache(Path(args.cache) if args.cache else default_cache_path())
    report = verify(Path(args.model_dir), manifest=args.manifest, cache=cache)
    sys.stdout.write(json.dumps(report.to_json()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
