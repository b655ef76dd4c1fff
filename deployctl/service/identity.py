"""Who answers on a port: checked before every control call, so that a sleep, wake or drain meant for one engine
never reaches another (issue 39: with replicas, a sleep meant for release r7 reached r8's runtime on the same host,
which went to sleep, and the call returned success).

The bundled runtime says who it is on ``GET /identity``: ``{"release", "replica", "instance", "pid", "port",
"started_at", "phase"}`` (the release id and replica index it was started with, and an id of this start). An engine
without that route (vLLM, SGLang, an older runtime) is identified by the release header of its /healthz answer where
it sends one, and by the port's holder: the process listening there must belong to the supervisor deployctl started
for that port (its pidfile's process group, or the systemd unit's cgroup), else it is someone else's.

The engine handle asks and checks (``Engine.identity``, ``Engine.expect`` in deployctl.service.engine): ``expect``
returns the Identity found, or raises IdentityMismatch (exit 5) naming what was expected and what was found:
nothing has been sent to that engine. Here: what is found and the error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deployctl.errors import HealthError

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
