"""Who answers on a port: checked before every control call, so that a sleep, wake or drain meant for one engine
never reaches another (issue 39: with replicas, a sleep meant for release r7 reached r8's runtime on the same host,
which went to sleep, and the call returned success).

The bundled runtime says who it is on ``GET /identity``: ``{"release", "replica", "instance", "pid", "port",
"started_at", "phase"}`` (the release id and replica index it was started with, and an id of this start). An engine
without that route (vLLM, SGLang, an older runtime) is identified by the release header of its /healthz answer where
it sends one, and by the port's holder: the process listening there must belong to the supervisor deployctl started
for that port (its pidfile's process group, or the systemd unit's cgroup), else it is someone else's.

``expect(host, cfg, port, release=..., action=...)`` returns the Identity found, or raises IdentityMismatch (exit 5)
naming what was expected and what was found: nothing has been sent to that engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.errors import HealthError
from deployctl.service.http import http

RELEASE_HEADER = "X-Deployctl-Release"
INSTANCE_HEADER = "X-Deployctl-Instance"


class IdentityMismatch(HealthError):
    """The engine on a port is not the one a control call meant: ``expected`` and ``found`` in words."""

    def __init__(self, message: str, *, expected: str, found: str, fix: str = ""):
        super().__init__(message, fix=fix)
        self.expected, self.found = expected, found


@dataclass(frozen=True)
class Identity:
    """What the engine on ``port`` says (or shows) it is; None where it does not say. ``source``: ``route``
    (/identity), ``header`` (the release header of /healthz), ``none`` (nothing answered with either)."""

    port: int
    release: Optional[str] = None
    replica: Optional[int] = None
    instance: Optional[str] = None
    pid: Optional[int] = None
    phase: Optional[str] = None
    source: str = "none"

    def describe(self) -> str:
        parts = [f"release {self.release or '?'}"]
        if self.replica is not None:
            parts.append(f"replica {self.replica}")
        if self.instance:
            parts.append(f"instance {self.instance[:12]}")
        if self.pid:
            parts.append(f"pid {self.pid}")
        return ", ".join(parts)


def read(host, cfg: DeployConfig, port: int, *, timeout: float = 10) -> Identity:
    """What the engine on ``host`` at ``port`` says it is (module doc). Raises RemoteError (SSH trouble)."""
    r = http(host, cfg, "GET", "/identity", timeout=timeout, port=port)
    if r.status == 200:
        try:
            d = r.json()
            replica = d.get("replica")
            return Identity(port, d.get("release") or None, int(replica) if replica is not None else None,
                            d.get("instance") or None, int(d["pid"]) if d.get("pid") else None, d.get("phase"),
                            "route")
        except (ValueError, TypeError, AttributeError):
            pass
    h = http(host, cfg, "GET", "/healthz", timeout=timeout, port=port)
    release = h.header(RELEASE_HEADER)
    if release or h.status:
        return Identity(port, release, instance=h.header(INSTANCE_HEADER), source="header" if release else "none")
    return Identity(port)


def holder(host, cfg: DeployConfig, port: int, *, timeout: float = 30) -> Optional[str]:
    """For an engine without /identity: None when the process listening on ``port`` belongs to the supervisor
    deployctl started there on ``host`` (``runtime.<port>.pid``'s process group, or ``runtime.pid``'s on the
    configured port; the systemd unit's cgroup), or nothing listens; else that process in words ("pid 4242
    (python3)"). Raises RemoteError."""
    from deployctl.config import layout
    from deployctl.hostscripts import probe
    from deployctl.hostscripts.snippets import module_argv

    h = host.config
    files = [layout.spare_pid_file(h, port)] + ([layout.pid_file(h)] if port == layout.configured_port(cfg, h) else [])
    unit = layout.unit_name(cfg, h) if h.launcher == "systemd" else ""
    params = {"sections": ["port", "pids", "service"], "bind": cfg.server.bind, "port": int(port), "pid_files": files,
              "deploy_root": "", "unit": unit}
    r = host.run(module_argv(h.python, probe, json.dumps(params)), timeout=timeout)
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    ours = {p for pids in facts["pids"].values() for p in pids} | set(facts["service"]["pids"])
    others = [x for x in facts["port"]["holders"] if x.get("pid") and x["pid"] not in ours]
    if not others:
        return None
    return ", ".join(f"pid {x['pid']} ({x.get('name') or '?'})" for x in others)


def _expected(host, release: Optional[str]) -> str:
    h = host.config
    parts = [f"{host.name}'s engine", f"release {release or 'any'}"]
    replica = getattr(h, "replica", None)
    if replica is not None:
        parts.append(f"replica {replica}")
    return ", ".join(parts)


def expect(host, cfg: DeployConfig, port: int, *, release: Optional[str] = None, action: str) -> Identity:
    """Check that the engine on ``port`` is ``host``'s (its replica index, where deploy.yaml gives one) and runs
    ``release`` (None: any) before ``action`` ("sleep", "wake", "drain") is sent to it. An engine without the
    /identity route must at least hold the port from the supervisor deployctl started there (``holder``). Returns
    what was found. Raises IdentityMismatch naming both, RemoteError on SSH trouble."""
    found = read(host, cfg, port)
    wrong = []
    if found.source != "route":
        other = holder(host, cfg, port)
        if other:
            expected = _expected(host, release)
            raise IdentityMismatch(
                f"{host.name}: refusing to {action} the engine on port {port}: expected {expected} (the process "
                f"deployctl started there), found {other} holding the port; nothing was sent to it",
                expected=expected, found=other,
                fix=f"see who that is on {host.name} (`ss -ltnp`); stop it, or fix deploy.yaml's ports")
    if release and found.release and found.release != release:
        wrong.append("release")
    replica = getattr(host.config, "replica", None)
    if found.replica is not None and found.replica != (replica or 0):
        wrong.append("replica")
    if not wrong:
        return found
    expected = _expected(host, release)
    raise IdentityMismatch(
        f"{host.name}: refusing to {action} the engine on port {port}: expected {expected}, found "
        f"{found.describe()} ({' and '.join(wrong)} differ); nothing was sent to it",
        expected=expected, found=found.describe(),
        fix=f"the host's run files on {host.name} point at another engine's port (shared/run/*.pid, standby.json); "
            "check `deployctl status` and each engine's GET /identity, then run the command again")

