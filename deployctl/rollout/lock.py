"""The per-service deploy lock: ``<deploy_root>/state/lock`` on every host of the service.

Created atomically with the shell's noclobber (``set -C``: open with O_CREAT|O_EXCL), holding one JSON line:
``{"owner": "user@machine", "machine", "pid", "started", "command"}``. A lock is stale when its pid is not running
on the machine that took it (checked when that machine is this one) or when it is older than ``max_age_s``.
A second deploy fails fast naming the owner; ``--break-lock`` removes a lock; rollback breaks a stale one.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from deployctl.errors import DeployctlError
from deployctl.config.layout import state_dir, state_file
from deployctl.rollout.state import now_iso
from deployctl import settings


class LockHeld(DeployctlError):
    """Another deploy holds the lock (exit 1). ``owner`` is the lock's JSON record."""

    def __init__(self, message: str, *, owner: dict, fix: Optional[str] = None):
        super().__init__(message, fix=fix)
        self.owner = owner


@dataclass(frozen=True)
class LockInfo:
    host: str
    owner: dict
    stale: bool
    why_stale: str


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs here; a zombie (killed, not yet reaped by a parent that does not wait) does not."""
    from deployctl.rollout.procs import pid_running

    return pid_running(pid)


def judge(owner: dict, *, max_age_s: Optional[float] = None) -> tuple[bool, str]:
    """(stale, why) for a lock record; ``max_age_s`` defaults to $DEPLOYCTL_LOCK_MAX_AGE_S (6 h)."""
    max_age_s = settings.current().lock_max_age_s if max_age_s is None else max_age_s
    pid = int(owner.get("pid") or 0)
    if owner.get("machine") == socket.gethostname() and pid and not _pid_alive(pid):
        return True, f"pid {pid} is not running on {owner.get('machine')}"
    started = owner.get("started", "")
    try:
        t0 = datetime.fromisoformat(started.replace("Z", "+00:00"))
        age = (datetime.now(timezone.utc) - t0).total_seconds()
    except ValueError:
        return True, f"unreadable start time {started!r}"
    if age > max_age_s:
        return True, f"older than {max_age_s:.0f} s ({age:.0f} s)"
    return False, ""


def describe(owner: dict) -> str:
    return f"{owner.get('owner', '?')} pid {owner.get('pid', '?')} ({owner.get('command', '?')}) since {owner.get('started', '?')}"


def _parse(text: str) -> Optional[dict]:
    if not text:
        return None
    try:
        return json.loads(text.splitlines()[0])
    except ValueError:
        return {"owner": "?", "started": "", "raw": text[:200]}


class DeployLock:
    """The lock over all hosts of a service. Use ``acquire()``; ``release()`` removes only our own lock files."""

    def __init__(self, hosts: list, *, command: str, timeout: float = 15):
        self.hosts = hosts
        self.record = {"owner": settings.operator(), "machine": socket.gethostname(), "pid": os.getpid(),
                       "started": now_iso(), "command": command, "token": f"{os.getpid()}-{time.time_ns()}"}
        self.timeout = timeout
        self.held: list = []

    def _line(self) -> str:
        return json.dumps(self.record, sort_keys=True)

    def _try_create(self, host) -> tuple[bool, Optional[dict]]:
        """(created, the holder's record when not created) in one remote command."""
        path = shlex.quote(state_file(host.config, "lock"))
        cmd = (f"mkdir -p {shlex.quote(state_dir(host.config))} && "
               f"if ( set -C; printf '%s\\n' {shlex.quote(self._line())} > {path} ) 2>/dev/null; then echo CREATED; "
               f"else cat {path} 2>/dev/null; fi")
        out = host.run(cmd, timeout=self.timeout).stdout.strip()
        if out == "CREATED":
            return True, None
        return False, _parse(out)

    def read(self, host) -> Optional[dict]:
        path = state_file(host.config, "lock")
        r = host.run(f"cat {shlex.quote(path)} 2>/dev/null || true", timeout=self.timeout)
        return _parse(r.stdout.strip())

    def inspect(self) -> list[LockInfo]:
        """The locks currently on the hosts (not ours or ours)."""
        from deployctl.hosts import run_on_hosts

        out = []
        for o in run_on_hosts(self.hosts, self.read, deadline_s=3 * self.timeout + 15, what="the lock"):
            if o.error is None and o.value is not None:
                stale, why = judge(o.value)
                out.append(LockInfo(o.host, o.value, stale, why))
        return out

    def _remove(self, host) -> None:
        host.run(["rm", "-f", state_file(host.config, "lock")], timeout=self.timeout)

    def acquire(self, *, break_lock: bool = False, break_stale: bool = False, take_over: bool = False,
                on_break=None) -> None:
        """Create the lock on every host in order. A held lock raises LockHeld naming the owner unless
        ``break_lock`` (any lock), ``break_stale`` (stale ones) or ``take_over`` (any; used by rollback after
        its grace period) allows removing it; ``on_break(host, owner, why)`` is told about each removal.
        On failure the locks taken so far are released."""
        try:
            for host in self.hosts:
                for _attempt in range(3):
                    created, owner = self._try_create(host)
                    if created:
                        self.held.append(host)
                        break
                    if owner is None:
                        continue  # released meanwhile: try again
                    if owner.get("token") == self.record["token"]:
                        self.held.append(host)
                        break
                    stale, why = judge(owner)
                    if break_lock or take_over or (break_stale and stale):
                        if on_break:
                            on_break(host.name, owner, why or "broken on request")
                        self._remove(host)
                        continue
                    state = f"stale: {why}" if stale else "in progress"
                    raise LockHeld(
                        f"another deploy holds the lock on {host.name}: {describe(owner)} [{state}]",
                        owner=owner,
                        fix=("it is stale: rerun with --break-lock" if stale
                             else "wait for it to finish, or stop it with `deployctl abort` / `deployctl rollback`"),
                    )
                else:
                    raise LockHeld(f"could not take the lock on {host.name} after 3 tries", owner={})
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Remove our lock files (only where the file still holds our token), on every host at once."""
        from deployctl.hosts import run_on_hosts

        token = json.dumps({"token": self.record["token"]})[1:-1]  # '"token": "…"' as it appears in the file

        def drop(host):
            path = shlex.quote(state_file(host.config, "lock"))
            host.run(f"grep -qF {shlex.quote(token)} {path} 2>/dev/null && rm -f {path} || true", timeout=self.timeout)

        run_on_hosts(list(self.held), drop, deadline_s=3 * self.timeout + 15, what="releasing the lock")  # best effort: an unreachable host keeps a lock that reads as stale
        self.held = []
