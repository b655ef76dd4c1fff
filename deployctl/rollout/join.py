"""A host (re)joining the serving fleet (issue 42: uncordon, scale out): bring the release the fleet serves onto it,
start or wake its engine, and verify it the way a rollback verifies a woken engine (ready, a sample inference with
the release header, then the release's recorded golden answers, goldenrecord.check) before any weight.

A release absent from the host is uploaded from what the fleet's peers hold: their ``release.json`` (id, config and
manifest hashes, wheel name and sha256) with this machine's runtime wheel, refused when that wheel is not the one
the release was built with (then ``deployctl deploy`` makes a new release for every host). The golden record, kept
only on the hosts that took part in the deploy that recorded it, is copied from a peer when the host lacks it.
"""
from __future__ import annotations

import json
import posixpath
import time
from typing import Optional

from deployctl.config import DeployConfig, layout
from deployctl.config.layout import release_dir
from deployctl.errors import CheckFailed
from deployctl.rollout import goldenrecord, hostops, release
from deployctl.service.engine import Engine


def install(fleet, host, release_id: str, peers: list) -> bool:
    """Upload ``release_id`` to ``host`` from a peer's release.json (module doc) unless it is there. Returns True
    when it uploaded. Raises CheckFailed (no peer holds it, or the wheel built here differs), RemoteError."""
    if host.exists(posixpath.join(release_dir(host.config, release_id), "release.json")):
        return False
    for p in peers:
        r = p.run(f"cat {posixpath.join(release_dir(p.config, release_id), 'release.json')} 2>/dev/null || true",
                  timeout=15)
        if r.stdout.strip():
            doc = json.loads(r.stdout)
            break
    else:
        raise CheckFailed(f"no serving host holds release {release_id} to install on {host.name}",
                          fix="run `deployctl deploy` to make a release for every host")
    info = release.ReleaseInfo(**{k: v for k, v in doc.items() if k in release.ReleaseInfo.__dataclass_fields__})
    if fleet.wheel is None:
        fleet.wheel = release.build_wheel()
    if release._sha256_file(fleet.wheel) != info.runtime_wheel_sha256:
        raise CheckFailed(f"the runtime wheel built here ({fleet.wheel.name}) is not the one release {release_id} "
                          f"was built with ({info.runtime_wheel}): cannot install that release on {host.name}",
                          fix="run `deployctl deploy`, which makes a new release for every serving host")
    fleet.check_disk(info, hosts=[host])  # the disk rule (deployctl.preflight.disk) before the upload
    fleet.upload_all(info, hosts=[host])
    return True


def share_golden(host, release_id: str, peers: list) -> bool:
    """Copy ``release_id``'s golden record from the first peer that has one when ``host`` has none. Returns True
    when copied."""
    if goldenrecord.read(host, release_id) is not None:
        return False
    for p in peers:
        rec = goldenrecord.read(p, release_id)
        if rec is not None:
            goldenrecord.write(host, rec)
            return True
    return False


def bring_up(fleet, host, cfg: DeployConfig, target: Optional[str], peers: list, *, when: str) -> dict:
    """Make ``host`` serve ``target`` (default: its ``current``), verified (module doc): install it when absent,
    start it when the engine does not run or runs another release (hostops.activate: switch, start, ready, sample),
    else check the running one (ready + sample); then the golden answers. Returns the timings in seconds. Raises
    HealthError / GoldenMismatch (exit 5; the engine is left running without weight), CheckFailed, RemoteError."""
    cur = release.current_release(host)
    target = target or cur
    if target is None:
        raise CheckFailed(f"{host.name} has no release and no serving host has one", fix="run `deployctl deploy`")
    t0 = time.monotonic()
    install(fleet, host, target, peers)
    share_golden(host, target, peers)
    t = {"upload_s": round(time.monotonic() - t0, 2)}
    eng = Engine(host, cfg, release=target)
    if cur != target or not eng.running():
        return {**t, **hostops.activate(host, cfg, target, golden=when).timings}
    t1 = time.monotonic()
    timeout, _ = hostops.verify_timeout(cfg, host)
    v = eng.verify(timeout=timeout)
    t.update(ready_s=round(v.ready_s, 2), verify_s=round(time.monotonic() - t1 - v.ready_s, 2))
    t["golden_s"] = hostops.golden_check(host, cfg, target, layout.service_port(cfg, host.config), when)
    return t
