"""Fetch one model version onto this host, verify it, publish it with one rename (issue 43). Stdlib only.

Shipped like the other scripts here (snippets.module_argv) and run with the host's python:
``python -c ... fetch [PLAN_JSON]`` (else the plan is in the environment, DEPLOYCTL_FETCH_PLAN: its URLs
are capabilities, and the environment travels over SFTP, never on a command line that a trace or ps shows) / ``list STORE NAME`` / ``prune STORE NAME VERSION...``.

PLAN_JSON: {"store": model root, "name": model name, "version": str, "manifest": manifest.sha256 text,
"files": [{"path": relative, "url": plain-HTTP(S) GET URL (S3 presigned, file server, HF resolve), "sha256": 64 hex,
"size": bytes, "fallback"?: the source's URL when "url" is a peer's (peer copy)}], "prunable": [versions the operator would prune, counted as free], "meta": {...}}.

- Layout: ``STORE/NAME/VERSION/`` once published; ``STORE/NAME/.VERSION.partial/`` while fetching. Publication is
  one ``os.rename`` of the partial directory (atomic on one filesystem, POSIX rename(2)); a version directory
  therefore always holds a complete, verified copy.
- Resume: a file already partly in ``.partial`` continues with ``Range: bytes=N-`` (RFC 9110 §14.2); a server that
  answers 200 instead of 206 is read from the start. A connection dropped mid-body is resumed the same way, up to
  RESUME_TRIES times per file.
- Verify: each file's sha256 over its whole content against the manifest; a mismatch is fetched once more from
  zero, then the script fails (exit 3) naming the file and both hashes, and publishes nothing.
- Disk: before any byte moves, the bytes still to fetch against statvfs free space on the store (f_bavail *
  f_frsize, what an unprivileged writer may use) plus the sizes of the ``prunable`` versions; refused (exit 4)
  naming both figures.
- Peer copy: a file whose ``url`` fails (HTTP error, refused, dropped RESUME_TRIES times) or does not verify, and
  that carries a ``fallback`` URL, continues from that URL (same .partial, same Range resume, same check);
  such files are listed in "fallbacks".
- Output: progress lines ``{"event": "progress", "bytes": N, "total": T}`` on stderr (at most 4 a second), and
  one JSON object on stdout: {"ok": true, "path", "bytes_fetched", "bytes_total", "resumed": [paths],
  "refetched": [paths], "fallbacks": [paths], "seconds"} or {"ok": false, "error", "file"?, "expected"?, "actual"?, ...}.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request

CHUNK = 1 << 20
RESUME_TRIES = 5
META_NAME = ".deployctl-model.json"
MANIFEST_NAME = "manifest.sha256"
TIMEOUT_S = 60


class FetchFailed(Exception):
    def __init__(self, code: int, **info):
        super().__init__(info.get("error", ""))
        self.code, self.info = code, info


class _Progress:
    def __init__(self, total: int):
        self.total, self.done, self.last = total, 0, 0.0

    def add(self, n: int, force: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if force or now - self.last >= 0.25:
            self.last = now
            sys.stderr.write(json.dumps({"event": "progress", "bytes": self.done, "total": self.total}) + "\n")
            sys.stderr.flush()


def dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def store_free(store: str) -> int:
    st = os.statvfs(store)
    return st.f_bavail * st.f_frsize


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _get(url: str, dest: str, size: int, progress: _Progress) -> bool:
    """Bring ``dest`` to ``size`` bytes from ``url``, resuming by Range. Returns True when a resume happened."""
    resumed = False
    for _attempt in range(RESUME_TRIES):
        have = os.path.getsize(dest) if os.path.exists(dest) else 0
        if have > size:
            os.unlink(dest)
            have = 0
        if have == size:
            return resumed
        req = urllib.request.Request(url)
        if have:
            req.add_header("Range", f"bytes={have}-")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                if have and resp.status != 206:
                    have = 0  # the server ignored Range: start over
                mode = "ab" if have else "wb"
                resumed = resumed or bool(have)
                with open(dest, mode) as out:
                    while True:
                        block = resp.read(CHUNK)
                        if not block:
                            break
                        out.write(block)
                        progress.add(len(block))
        except urllib.error.HTTPError as exc:
            raise FetchFailed(2, error=f"GET {os.path.basename(dest)}: HTTP {exc.code} {exc.reason}",
                              file=os.path.basename(dest)) from None
        except (OSError, http.client.HTTPException):
            continue  # dropped mid-body (IncompleteRead, RemoteDisconnected, reset): resume from what arrived
    have = os.path.getsize(dest) if os.path.exists(dest) else 0
    if have != size:
        raise FetchFailed(2, error=f"{os.path.basename(dest)}: {have} of {size} bytes after {RESUME_TRIES} tries; "
                                   "run again to resume", file=os.path.basename(dest))
    return resumed


def fetch(plan: dict) -> dict:
    t0 = time.monotonic()
    store, name, version = plan["store"], plan["name"], plan["version"]
    base = os.path.join(store, name)
    final = os.path.join(base, version)
    files = plan["files"]
    total = sum(int(f["size"]) for f in files)
    if os.path.isdir(final) and os.path.exists(os.path.join(final, META_NAME)):
        return {"ok": True, "path": final, "bytes_fetched": 0, "bytes_total": total, "resumed": [],
                "refetched": [], "seconds": 0.0, "already": True}
    partial = os.path.join(base, f".{version}.partial")
    os.makedirs(partial, exist_ok=True)
    have = sum(min(os.path.getsize(os.path.join(partial, f["path"])), int(f["size"]))
               for f in files if os.path.isfile(os.path.join(partial, f["path"])))
    need = total - have
    prunable = [v for v in plan.get("prunable", []) if v != version and os.path.isdir(os.path.join(base, v))]
    free = store_free(store) + sum(dir_bytes(os.path.join(base, v)) for v in prunable)
    if need > free:
        pruned = f"versions {', '.join(prunable)} that would be pruned counted as free" if prunable else \
            "no version to prune"
        raise FetchFailed(4, error=f"{need} bytes to fetch but {free} free on {store} ({pruned})", need=need,
                          free=free)
    for v in prunable:  # make room before the bytes come
        if store_free(store) < need:
            shutil.rmtree(os.path.join(base, v), ignore_errors=True)
    progress = _Progress(total)
    progress.add(have, force=True)
    fetched0 = progress.done
    resumed, refetched, fallbacks = [], [], []
    for f in files:
        dest = os.path.join(partial, f["path"])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        before = os.path.getsize(dest) if os.path.exists(dest) else 0
        url = f["url"]
        try:
            if _get(url, dest, int(f["size"]), progress):
                resumed.append(f["path"])
        except FetchFailed:
            if not f.get("fallback"):
                raise
            url = f["fallback"]
            fallbacks.append(f["path"])
            _get(url, dest, int(f["size"]), progress)
        if before and before < int(f["size"]) and f["path"] not in resumed:
            resumed.append(f["path"])
        got = sha256_of(dest)
        if got != f["sha256"] and f.get("fallback") and url != f["fallback"]:
            url = f["fallback"]  # a peer's copy that does not verify: the source's, once
            fallbacks.append(f["path"])
            os.unlink(dest)
            progress.add(-int(f["size"]))
            _get(url, dest, int(f["size"]), progress)
            got = sha256_of(dest)
        if got != f["sha256"]:
            first = got
            os.unlink(dest)
            progress.add(-int(f["size"]))
            refetched.append(f["path"])
            _get(url, dest, int(f["size"]), progress)
            got = sha256_of(dest)
            if got != f["sha256"]:
                os.unlink(dest)
                raise FetchFailed(3, error=f"{f['path']}: sha256 {got} (first try {first}), manifest says "
                                           f"{f['sha256']}; fetched twice, nothing published",
                                  file=f["path"], expected=f["sha256"], actual=got, first=first)
    progress.add(0, force=True)
    with open(os.path.join(partial, MANIFEST_NAME), "w") as out:
        out.write(plan["manifest"])
    meta = dict(plan.get("meta", {}), version=version, verified_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                bytes=total, files=len(files))
    with open(os.path.join(partial, META_NAME), "w") as out:
        json.dump(meta, out)
    os.rename(partial, final)
    return {"ok": True, "path": final, "bytes_fetched": progress.done - fetched0, "bytes_total": total,
            "resumed": resumed, "refetched": refetched, "fallbacks": fallbacks, "seconds": round(time.monotonic() - t0, 3)}


def list_versions(store: str, name: str) -> list:
    base = os.path.join(store, name)
    out = []
    for v in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        d = os.path.join(base, v)
        if not os.path.isdir(d):
            continue
        meta = {}
        try:
            with open(os.path.join(d, META_NAME)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            pass
        out.append({"version": v[1:-len(".partial")] if v.endswith(".partial") else v, "partial": v.endswith(".partial"),
                    "bytes": dir_bytes(d), "verified_at": meta.get("verified_at"), "source": meta.get("source")})
    return out


def prune(store: str, name: str, versions: list) -> list:
    gone = []
    for v in versions:
        d = os.path.join(store, name, v)
        if v and "/" not in v and not v.startswith(".") and os.path.isdir(d):
            shutil.rmtree(d, ignore_errors=True)  # two hosts sharing one store may prune it at once
            gone.append(v)
    return gone


def main(argv: list) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "fetch":
        try:
            plan = argv[1] if len(argv) > 1 else os.environ["DEPLOYCTL_FETCH_PLAN"]
            print(json.dumps(fetch(json.loads(plan))))
            return 0
        except FetchFailed as exc:
            print(json.dumps(dict(exc.info, ok=False)))
            return exc.code
    if cmd == "list":
        print(json.dumps(list_versions(argv[1], argv[2])))
        return 0
    if cmd == "prune":
        print(json.dumps(prune(argv[1], argv[2], argv[3:])))
        return 0
    sys.stderr.write("usage: fetch PLAN_JSON | list STORE NAME | prune STORE NAME VERSION...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
