"""The detached runner's own side (deployctl.rollout.detach starts it; ``deploy --runner SERVICE``).

Its first act, ``started``: its pid in runner.pid (a systemd unit's runner is not deployctl's child, so only it knows
its pid), and which start of its spawn this is. Every spawn has a ``token`` (runner.json); the runner's journal
records (``start``, ``resume``) and its lock carry it. So a start that finds its token in an unfinished journal is a
restart of a killed runner (systemd's Restart=on-failure) and resumes the deploy from the journal; the first start
does what its command line says (a fresh deploy, or ``--resume``). A restart whose deploy had already finished (the
runner was killed between its journal's ``finish`` and runner.exit) records that finish's exit code and ends.

Its last act, ``record_exit``: its exit code in runner.exit (atomically), and runner.env (deployctl's environment,
kept for a restart) deleted.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from deployctl.rollout import detach
from deployctl.rollout.journal import Progress, read


@dataclass(frozen=True)
class RunnerStart:
    """One start of a detached runner: its spawn's ``token`` and ``unit`` (None outside systemd), whether it is a
    ``restart`` of a killed runner with an unfinished deploy to resume, and the journal's ``finish`` record when
    that deploy had already finished."""

    token: Optional[str]
    unit: Optional[str] = None
    restart: bool = False
    finish: Optional[dict] = None


def started(service: str) -> RunnerStart:
    """The runner's first act (module doc)."""
    f = detach.files(service)
    f.dir.mkdir(parents=True, exist_ok=True)
    detach.write_atomic(f.pid, f"{os.getpid()}\n")
    spec = detach.spec(service)
    token = spec.get("token")
    records = read(service)
    ours = bool(token) and any(r.get("kind") in ("start", "resume") and r.get("runner") == token for r in records)
    if not ours:
        return RunnerStart(token, spec.get("unit"))
    p = Progress.of(records)
    return RunnerStart(token, spec.get("unit"), restart=p.unfinished, finish=p.finish)


def record_exit(service: str, code: int) -> None:
    """The runner's last act (module doc)."""
    f = detach.files(service)
    detach.write_atomic(f.exit, f"{int(code)}\n")
    f.env.unlink(missing_ok=True)
