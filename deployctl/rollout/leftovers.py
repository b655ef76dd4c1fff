"""What killed uploads leave under a host's releases/ (the names: deployctl.hostscripts.probe.is_upload_leftover)
and their removal by the next upload (deployctl.rollout.release.upload); the disk rule counts their bytes as free
(deployctl.preflight.disk)."""
from __future__ import annotations

import posixpath
import shlex

from deployctl.config.layout import releases_dir
from deployctl.hostscripts.probe import is_upload_leftover


def remove_leftovers(host, *, timeout: float = 30) -> list[dict]:
    """Remove what killed uploads left under the host's releases/: deployctl's own temporary names only
    (hostscripts.probe.is_upload_leftover; a release never matches), which no other upload writes meanwhile (a
    deploy holds the lock). Returns [{"name", "bytes"}] removed (bytes: ``du -s -B1``, what they held on disk)."""
    d = releases_dir(host.config)
    r = host.run(f"ls -A {shlex.quote(d)} 2>/dev/null || true", timeout=timeout)
    paths = [posixpath.join(d, n) for n in r.stdout.splitlines() if n and is_upload_leftover(n)]
    if not paths:
        return []
    r = host.run(["bash", "-c", 'du -s -B1 -- "$@" 2>/dev/null; rm -rf -- "$@"', "rm", *paths], timeout=timeout)
    sizes = {p: int(b) for b, _, p in (line.partition("\t") for line in r.stdout.splitlines()) if b.isdigit()}
    return [{"name": posixpath.basename(p), "bytes": sizes.get(p, 0)} for p in paths]
