"""Deploy's disk check, before the lock and any upload: on every host, the release's payload measured here (its
tar file, built as the upload will send it), the host's free space, leftovers and engine venv read there (the
probe's ``space`` section: one SSH round trip), judged by deployctl.preflight.disk. A host where it does not fit
refuses the deploy with nothing changed on any host (DiskShort, exit 1, naming each such host, its path, what is
needed part by part, what is free, and the fix). ``status`` reads the same facts (``host_disk``)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed
from deployctl.preflight.disk import Verdict, verdicts


class DiskShort(CheckFailed):
    """The release does not fit on a host's disk (exit 1: a check failed before anything changed; the host's
    disk, not the release, is what to fix)."""


def space_facts(host, cfg: DeployConfig) -> dict:
    """The probe's ``space`` section on ``host`` (hostscripts.probe.probe_space) as facts for the disk rule.
    Raises RemoteError."""
    from deployctl.hostscripts import probe as probe_module
    from deployctl.hostscripts.snippets import module_argv
    from deployctl.preflight.gather import probe_params

    params = {**probe_params(cfg, host.config), "sections": ["space"]}
    r = host.run(module_argv(host.config.python, probe_module, json.dumps(params)), timeout=60)
    line = next((ln for ln in reversed(r.stdout.strip().splitlines()) if ln.startswith("{")), "{}")
    return {"space": json.loads(line).get("space") or {}}


def payload_bytes(info, wheel: Path, files: list, platform: Optional[dict] = None) -> int:
    """Bytes of the tar file release.upload sends for ``files`` (built in a temporary directory and measured)."""
    from deployctl.rollout.release import tarball

    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "release.tar"
        tarball(info, wheel, files, out, platform)
        return out.stat().st_size


def check(fleet, info, files_for: Callable, hosts: Optional[list] = None) -> dict[str, list[Verdict]]:
    """Judge every host of ``fleet`` (or those of ``hosts``) for release ``info`` (``files_for(host)``: its rendered
    files, as the upload renders them). Says one line per host; returns {host: verdicts}. Raises DiskShort when any does not fit, or
    the first host's RemoteError when one cannot be read."""
    from deployctl.errors import DeployctlError, RemoteError, about
    from deployctl.rollout import hostops

    def one(h) -> list[Verdict]:
        size = payload_bytes(info, fleet.wheel, files_for(h), fleet.platform.get(h.name))
        return verdicts(fleet.cfg, h.config, space_facts(h, fleet.cfg), size)

    hosts = list(fleet.hosts.values()) if hosts is None else hosts
    ok, bad = fleet.on_hosts(hosts, one, deadline_s=hostops.QUICK_DEADLINE_S, what="reading free disk space")
    if bad:
        name, err = next(iter(bad.items()))
        raise err if isinstance(err, DeployctlError) else RemoteError(about(name, err))
    names = [h.name for h in hosts]
    short = [v for n in names for v in ok[n] if not v.ok]
    for n in names:
        for v in ok[n]:
            if v.ok:
                fleet.say("info", f"disk: {v.line()}", host=n)
    if short:
        raise DiskShort(f"release {info.id} does not fit: " + "; ".join(v.line() for v in short)
                        + "; nothing was uploaded or changed", fix=short[0].fix())
    return ok


def host_disk(h, cfg: DeployConfig) -> Optional[dict]:
    """``status``'s disk line of one host: the deploy_root verdict as JSON (free_bytes, need_bytes: what the next
    deploy would need with the current release's size as its payload, fits) plus ``low``: free space (leftovers
    counted) under what the next deploy needs; None when it cannot be read."""
    from deployctl.errors import DeployctlError

    try:
        found = verdicts(cfg, h.config, space_facts(h, cfg))
    except (DeployctlError, ValueError):
        return None
    if not found:
        return None
    doc = found[0].to_json()
    doc["low"] = not all(v.ok for v in found)
    doc["line"] = found[0].line()
    return doc
