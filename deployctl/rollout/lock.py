"""The per-service deploy lock: ``<deploy_root>/state/lock`` on every host of the service.

Created atomically with the shell's noclobber (``set -C``: open with O_CREAT|O_EXCL), holding one JSON line:
``{"owner": "user@machine", "machine", "pid", "started", "command", "token"}`` (and ``unit`` for a detached runner
in a systemd unit). A second deploy fails fast naming the owner; ``--break-lock`` removes a lock; rollback and
``deploy --resume`` break a stale one.

Heartbeat: while it holds the lock, the holder touches the file (its mtime) every ``heartbeat_s`` (a quarter of
the bound, at most 60 s) from a thread of its own, through every step and every pause, so a canary paused for
24 h keeps a fresh lock. A lock is stale when its pid is not running on the machine that took it (checked when
that machine is this one), or when its heartbeat (the file's age, read with the host's own clock: no skew between
machines) is older than ``max_age_s`` ($DEPLOYCTL_LOCK_MAX_AGE_S, 600 s): its holder was killed elsewhere, its
machine is gone or hangs, or its pid was reused by another process here. A live holder's lock is never stale.

Generation (a fencing token): every taking of the lock raises ``<deploy_root>/state/fence`` on every host and on the
``extra`` hosts (the router host) to one more than the highest found, in the same remote command that creates the
lock file, and records it in the lock (``generation``). From then on the holder's Host objects carry that
generation (deployctl.hosts.fence.Fence) and every command they run is refused on the host once a newer holder
raised the fence there: a holder stopped while its lock was taken over (rollback after its grace, or a
``deploy --resume`` once its heartbeat stopped) changes nothing when it runs again.
"""
from __future__ import annotations

import json
import re
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from deployctl.errors import DeployctlError
from deployctl.config.layout import state_dir, state_file
from deployctl.rollout.state import now_iso
from deployctl import settings

# the most seconds between two heartbeats (a quarter of the staleness bound when that is shorter)
HEARTBEAT_MAX_S = 60.0


def heartbeat_s(max_age_s: Optional[float] = None) -> float:
    """Seconds between a holder's heartbeats: a quarter of the staleness bound, at most HEARTBEAT_MAX_S."""
    max_age_s = settings.current().lock_max_age_s if max_age_s is None else max_age_s
    return min(HEARTBEAT_MAX_S, max_age_s / 4)


class LockHeld(DeployctlError):
    """Another deploy holds the lock (exit 1). ``owner`` is the lock's JSON record."""

    def __init__(self, message: str, *, owner: dict, fix: Optional[str] = None, host: str = ""):
        super().__init__(message, fix=fix)
        self.owner, self.host = owner, host


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
    """(stale, why) for a lock record (module doc). ``owner["heartbeat_age_s"]`` (set by ``read``: seconds since
    the holder last touched the file) is the heartbeat; a record without it (an old one) counts from ``started``.
    ``max_age_s`` defaults to $DEPLOYCTL_LOCK_MAX_AGE_S."""
    max_age_s = settings.current().lock_max_age_s if max_age_s is None else max_age_s
    pid = int(owner.get("pid") or 0)
    if owner.get("machine") == socket.gethostname() and pid and not _pid_alive(pid):
        return True, f"pid {pid} is not running on {owner.get('machine')}"
    age = owner.get("heartbeat_age_s")
    if age is None:
        started = owner.get("started", "")
        try:
            t0 = datetime.fromisoformat(started.replace("Z", "+00:00"))
        except ValueError:
            return True, f"unreadable start time {started!r}"
        age = (datetime.now(timezone.utc) - t0).total_seconds()
    if age > max_age_s:
        return True, (f"no heartbeat for {age:.0f} s (over DEPLOYCTL_LOCK_MAX_AGE_S {max_age_s:g} s): its holder "
                      "stopped refreshing it")
    return False, ""


def describe(owner: dict) -> str:
    unit = f", systemd unit {owner['unit']}" if owner.get("unit") else ""
    return (f"{owner.get('owner', '?')} pid {owner.get('pid', '?')} ({owner.get('command', '?')}{unit}) "
            f"since {owner.get('started', '?')}")


# the lock file's first line, then ``#heartbeat MTIME NOW`` (the host's clock for both); nothing when absent
_READ = ('if [ -f {path} ]; then head -n 1 {path}; m=$(stat -c %Y {path} 2>/dev/null) && '
         'echo "#heartbeat $m $(date +%s)"; fi; true')


def _parse(text: str) -> Optional[dict]:
    """The record of ``_READ``'s output, with ``heartbeat_age_s`` when the file's mtime came with it."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    beat = next((ln for ln in lines if ln.startswith("#heartbeat ")), "")
    lines = [ln for ln in lines if not ln.startswith("#heartbeat ")]
    if not lines:
        return None
    try:
        rec = json.loads(lines[0])
        if not isinstance(rec, dict):
            raise ValueError(lines[0])
    except ValueError:
        rec = {"owner": "?", "started": "", "raw": text[:200]}
    m = re.fullmatch(r"#heartbeat (\d+) (\d+)", beat)
    if m:
        rec["heartbeat_age_s"] = max(0, int(m.group(2)) - int(m.group(1)))
    return rec


class DeployLock:
    """The lock over all hosts of a service. Use ``acquire()``; ``release()`` removes only our own lock files."""

    def __init__(self, hosts: list, *, command: str, timeout: float = 15, runner=None, workers: int = 8,
                 extra: tuple = (), floor: int = 0):
        self.hosts = hosts
        self.floor = floor  # the generation is above this too (this machine's journal fence: deployctl.rollout.journal)
        self.extra = list(extra)  # fenced with the lock's generation, not locked (the router host)
        self.generation = 0  # the lock's generation once acquired (module doc)
        self.fence = None  # deployctl.hosts.fence.Fence once acquired
        self.workers = workers  # hosts read or released at once (rollout.parallel_hosts: deployctl.rollout.fleet)
        self.record = {"owner": settings.operator(), "machine": socket.gethostname(), "pid": os.getpid(),
                       "started": now_iso(), "command": command, "token": f"{os.getpid()}-{time.time_ns()}"}
        if runner is not None and runner.token:  # a detached runner (deployctl.rollout.runner.RunnerStart)
            self.record.update({"runner": runner.token, **({"unit": runner.unit} if runner.unit else {})})
        self.timeout = timeout
        self.held: list = []
        self._beating: Optional[threading.Event] = None  # set to stop the heartbeat thread

    def _line(self) -> str:
        return json.dumps(self.record, sort_keys=True)

    def _try_create(self, host) -> tuple[bool, Optional[dict]]:
        """(created, the holder's record when not created) in one remote command."""
        path = shlex.quote(state_file(host.config, "lock"))
        from deployctl.hosts.fence import write_command

        fence = write_command(host.config, self.generation, self.who())
        cmd = (f"mkdir -p {shlex.quote(state_dir(host.config))} && "
               f"if ( set -C; printf '%s\\n' {shlex.quote(self._line())} > {path} ) 2>/dev/null; then {fence}; "
               f"echo CREATED; else {_READ.format(path=path)}; fi")
        out = host.run(cmd, timeout=self.timeout).stdout.strip()
        if out == "CREATED":
            return True, None
        return False, _parse(out)

    def read(self, host) -> Optional[dict]:
        path = shlex.quote(state_file(host.config, "lock"))
        return _parse(host.run(_READ.format(path=path), timeout=self.timeout).stdout)

    def inspect(self) -> list[LockInfo]:
        """The locks currently on the hosts (not ours or ours)."""
        from deployctl.hosts import run_on_hosts

        out = []
        for o in run_on_hosts(self.hosts, self.read, max_workers=self.workers, deadline_s=3 * self.timeout + 15,
                              what="the lock"):
            if o.error is None and o.value is not None:
                stale, why = judge(o.value)
                out.append(LockInfo(o.host, o.value, stale, why))
        return out

    def who(self) -> str:
        """The holder as the fence file names it: ``COMMAND of USER@MACHINE, pid N, since TIME``."""
        r = self.record
        unit = f", systemd unit {r['unit']}" if r.get("unit") else ""
        return f"{r['command']} of {r['owner']}, pid {r['pid']}{unit}, since {r['started']}"

    def _next_generation(self) -> int:
        """One more than the highest fence generation on the hosts and the extra hosts (those that answer)."""
        from deployctl.hosts import run_on_hosts
        from deployctl.hosts.fence import read_command

        def read(host):
            return int((host.run(read_command(host.config), timeout=self.timeout).stdout.strip() or "0"))

        found = run_on_hosts([*self.hosts, *self.extra], read, max_workers=self.workers,
                             deadline_s=3 * self.timeout + 15, what="the lock's generation")
        return 1 + max([self.floor, *(o.value for o in found if o.error is None and o.value is not None)])

    def _fence_all(self) -> None:
        """Raise the extra hosts' fence to our generation; arm every Host of ours with it (module doc)."""
        from deployctl.hosts.fence import Fence, write_command

        for host in self.extra:
            host.run(f"mkdir -p {shlex.quote(state_dir(host.config))} && "
                     + write_command(host.config, self.generation, self.who()), timeout=self.timeout)
        self.fence = Fence(self.generation, self.record["command"])
        for host in [*self.hosts, *self.extra]:
            host.fence = self.fence

    def _remove(self, host) -> None:
        host.run(["rm", "-f", state_file(host.config, "lock")], timeout=self.timeout)

    def acquire(self, *, break_lock: bool = False, break_stale: bool = False, take_over: bool = False,
                on_break=None) -> None:
        """Create the lock on every host in order. A held lock raises LockHeld naming the owner unless
        ``break_lock`` (any lock), ``break_stale`` (stale ones) or ``take_over`` (any; used by rollback after
        its grace period) allows removing it (a stale lock of an earlier start of the same detached runner
        always); ``on_break(host, owner, why)`` is told about each removal.
        On failure the locks taken so far are released. Once every lock file is ours, the hosts carry its
        generation (module doc; ``generation``, ``fence``)."""
        self.generation = self._next_generation()
        self.record["generation"] = self.generation
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
                    # an earlier start of this same detached runner, killed before its journal: its own lock
                    again = bool(owner.get("runner")) and owner.get("runner") == self.record.get("runner")
                    if break_lock or take_over or ((break_stale or again) and stale):
                        if on_break:
                            on_break(host.name, owner, why or "broken on request")
                        self._remove(host)
                        continue
                    state = f"stale: {why}" if stale else "in progress"
                    raise LockHeld(
                        f"another deploy holds the lock on {host.name}: {describe(owner)} [{state}]",
                        owner=owner, host=host.name,
                        fix=("it is stale: rerun with --break-lock" if stale
                             else "wait for it to finish, or stop it with `deployctl abort` / `deployctl rollback`"),
                    )
                else:
                    raise LockHeld(f"could not take the lock on {host.name} after 3 tries", owner={})
            self._fence_all()
        except BaseException:
            self.release()
            raise
        self._start_heartbeat()

    def _token_text(self) -> str:
        return json.dumps({"token": self.record["token"]})[1:-1]  # '"token": "…"' as it appears in the file

    def _start_heartbeat(self) -> None:
        """Refresh the lock every heartbeat_s() seconds until ``release`` (module doc), from a daemon thread."""
        stop = self._beating = threading.Event()
        interval = heartbeat_s()

        def beat():
            while not stop.wait(interval):
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - a missed beat is retried; the lock goes stale only after several
                    pass

        threading.Thread(target=beat, name="deployctl-lock-heartbeat", daemon=True).start()

    def refresh(self) -> None:
        """The heartbeat: touch our lock files (their mtime), only where the file still holds our token."""
        from deployctl.hosts import run_on_hosts

        token = shlex.quote(self._token_text())

        def touch(host):
            path = shlex.quote(state_file(host.config, "lock"))
            host.run(f"grep -qF {token} {path} 2>/dev/null && touch -c {path} || true", timeout=self.timeout)

        run_on_hosts(list(self.held), touch, max_workers=self.workers, deadline_s=3 * self.timeout + 15,
                     what="the lock's heartbeat")

    def release(self) -> None:
        """Remove our lock files (only where the file still holds our token), on every host at once."""
        from deployctl.hosts import run_on_hosts

        if self._beating is not None:
            self._beating.set()
            self._beating = None
        token = self._token_text()

        def drop(host):
            path = shlex.quote(state_file(host.config, "lock"))
            host.run(f"grep -qF {shlex.quote(token)} {path} 2>/dev/null && rm -f {path} || true", timeout=self.timeout)

        # best effort: an unreachable host keeps a lock that reads as stale
        run_on_hosts(list(self.held), drop, max_workers=self.workers, deadline_s=3 * self.timeout + 15,
                     what="releasing the lock")
        self.held = []
