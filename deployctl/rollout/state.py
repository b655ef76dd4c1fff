"""Rollout state shared through the hosts' state/ directories, so any operator's shell sees the same story.

Files under ``<deploy_root>/state/`` on every host (written to all reachable hosts; read from all, newest wins):
- ``rollout.json``: the rollout in progress or the last one (``RolloutState``): release, step, weights,
  verdicts, status and the ``generation`` it runs under.
- ``control.json``: requests from other shells (``Control``): ``generation`` (a counter bumped by every
  deploy start, promote, abort and rollback), ``command`` and who sent it. A running deploy reads it before every
  step and during pauses; a generation other than its own means another shell intervened (C20). Only the deploy
  at its start and the intervening commands write it, so a deploy's progress writes can never erase a rollback.
- ``history.jsonl``: one JSON line per action (deploy, promote, abort, rollback) with who, when, release,
  result and reason; lines carry an ``id`` so copies on several hosts merge without duplicates.
"""
from __future__ import annotations

import json
import shlex
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from deployctl.config.layout import state_dir, state_file
from deployctl import settings
from deployctl.errors import RemoteError

IN_PROGRESS = ("running", "paused", "aborting")


class StateUnreadable(RemoteError):
    """A host's state file exists but does not parse (exit 4)."""


def now_iso() -> str:
    """Now in UTC, ISO 8601 with milliseconds and a ``Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class RolloutState:
    """The rollout in progress (or the last one). ``weights`` maps host -> share of traffic in percent."""

    action: str = "deploy"
    status: str = "running"  # running | paused | aborting | done | aborted | rolled_back | failed | interrupted
    release: Optional[str] = None
    from_release: Optional[str] = None
    generation: int = 0
    steps: list[int] = field(default_factory=list)
    step_index: int = -1
    weight: int = 0
    canary_hosts: list[str] = field(default_factory=list)
    stable_hosts: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    owner: str = field(default_factory=settings.operator)
    pid: int = 0
    started: str = field(default_factory=now_iso)
    updated: str = field(default_factory=now_iso)
    reason: Optional[str] = None

    @property
    def in_progress(self) -> bool:
        return self.status in IN_PROGRESS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RolloutState":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class Control:
    """The newest request from any shell: ``command`` is deploy | promote | abort | rollback."""

    generation: int = 0
    command: str = "none"
    by: str = ""
    at: str = ""
    reason: str = ""


# how long a polled control record stands (StateStore.poll_control): a deploy's checks tick every 0.25 s
POLL_MAX_AGE_S = 0.25


def _newest_control(texts: list[str]) -> Control:
    """The record of the highest generation among copies of control.json (unparsable copies skipped)."""
    best = Control()
    for text in texts:
        try:
            data = json.loads(text)
            c = Control(**{k: v for k, v in data.items() if k in Control.__dataclass_fields__})
        except (ValueError, TypeError):
            continue
        if c.generation > best.generation:
            best = c
    return best


class StateStore:
    """Reads and writes the state files on a set of hosts (``deployctl.hosts.Host``). Writes go to every
    reachable host; a write that reaches none raises the last host's error. Reads take the newest copy."""

    def __init__(self, hosts: list, *, timeout: float = 15, workers: int = 8):
        self.hosts = hosts
        self.timeout = timeout
        self.workers = workers  # hosts read or written at once (rollout.parallel_hosts: deployctl.rollout.fleet)
        self._dirs_made: set[str] = set()
        self._poll_lock = threading.Lock()
        self._polled: Optional[tuple[float, Control]] = None  # (monotonic time read, what was read)
        self._poll_next = 0  # the host the next poll reads

    # ---------------------------------------------------------------------------------------------- raw
    def _each(self, fn):
        from deployctl.hosts import run_on_hosts

        # a write is a mkdir + an SFTP put, each bounded by ``timeout``; a host that misses this is named
        return run_on_hosts(self.hosts, fn, max_workers=self.workers, deadline_s=3 * self.timeout + 15,
                            what="the state files")

    def _ensure_dir(self, host) -> None:
        if host.name not in self._dirs_made:
            host.run(["mkdir", "-p", state_dir(host.config)], timeout=self.timeout)
            self._dirs_made.add(host.name)

    def _write_all(self, name: str, text: str) -> list[str]:
        def write(host):
            self._ensure_dir(host)
            host.put_text(text, state_file(host.config, name), mode=0o644)

        outcomes = self._each(write)
        ok = [o.host for o in outcomes if o.error is None]
        if not ok:
            raise outcomes[-1].error
        return ok

    def _read_all(self, name: str, *, strict: bool = False) -> list[str]:
        return [text for _, text in self._read_each(name, strict=strict)]

    def _read_each(self, name: str, *, strict: bool = False) -> list[tuple[str, str]]:
        """[(host name, text)] of the non-empty copies of ``name``."""
        outcomes = self._each(lambda host: self._read_one(host, name))
        if strict:
            for o in outcomes:
                if o.error is not None:
                    raise o.error
        return [(o.host, o.value) for o in outcomes if o.error is None and o.value]

    def _read_one(self, host, name: str) -> str:
        """``name``'s text on ``host`` ("" when absent). Raises RemoteError."""
        path = state_file(host.config, name)
        return host.run(f"cat {shlex.quote(path)} 2>/dev/null || true", timeout=self.timeout).stdout

    def _path(self, host_name: str, name: str) -> str:
        return next(state_file(h.config, name) for h in self.hosts if h.name == host_name)

    def reachable(self) -> int:
        return len(self.hosts)

    # ---------------------------------------------------------------------------------------------- rollout
    def read_rollout(self, *, on_bad: Optional[Callable[[str], None]] = None) -> Optional[RolloutState]:
        """The newest rollout record of all hosts (None when no host has one). Writes are atomic
        (``Host.put_text``), so an unparsable copy is damage, not a write in flight: it raises StateUnreadable
        (exit 4) naming host and file, since reading past it could report "no rollout" while traffic is split.
        With ``on_bad`` (rollback, which must work on a damaged fleet) the message goes there and the copy is
        skipped."""
        best: Optional[RolloutState] = None
        for host_name, text in self._read_each("rollout.json"):
            try:
                data = json.loads(text)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                st = RolloutState.from_json(data)
            except (ValueError, TypeError) as e:
                path = self._path(host_name, "rollout.json")
                err = StateUnreadable(
                    f"{host_name}: {path} is not a valid rollout record ({str(e)[:80]})",
                    fix=f"check `deployctl status`, then move it aside (mv {path} {path}.bad) or run "
                        "`deployctl rollback`")
                if on_bad is None:
                    raise err from None
                on_bad(str(err))
                continue
            if best is None or (st.generation, st.updated) > (best.generation, best.updated):
                best = st
        return best

    def write_rollout(self, st: RolloutState) -> None:
        st.updated = now_iso()
        self._write_all("rollout.json", json.dumps(st.to_json(), indent=1, sort_keys=True) + "\n")

    # ---------------------------------------------------------------------------------------------- control
    def read_control(self, *, strict: bool = False) -> Control:
        """The newest control record. ``strict``: a host that cannot be read raises its RemoteError (a deploy
        must reach every host before each step)."""
        return _newest_control(self._read_all("control.json", strict=strict))

    def poll_control(self, *, max_age_s: float = POLL_MAX_AGE_S) -> Control:
        """The control record as a running deploy polls it between its step boundaries (pauses, analysis windows,
        readiness waits in every host worker): one host's copy, the next host each time, and one read per
        ``max_age_s`` shared by every thread (the last one's answer otherwise). A request from another shell is
        written to every host it reaches, so the next poll sees it; a host that cannot be read raises its
        RemoteError when its turn comes (within hosts × ``max_age_s`` seconds). On N hosts that is one remote
        read per ``max_age_s`` instead of N per check and N × N per parallel readiness wait."""
        with self._poll_lock:
            now = time.monotonic()
            if self._polled is not None and now - self._polled[0] < max_age_s:
                return self._polled[1]
            host = self.hosts[self._poll_next % len(self.hosts)]
            self._poll_next += 1
            text = self._read_one(host, "control.json")
            seen = _newest_control([text] if text else [])
            if self._polled is not None and self._polled[1].generation > seen.generation:
                seen = self._polled[1]  # a host the sender could not reach: what another host showed stands
            self._polled = (time.monotonic(), seen)
            return seen

    def send(self, command: str, reason: str = "") -> Control:
        """Bump the generation and record ``command`` from this operator. Returns the new Control."""
        cur = self.read_control()
        c = Control(generation=cur.generation + 1, command=command, by=settings.operator(), at=now_iso(), reason=reason)
        self._write_all("control.json", json.dumps(asdict(c), sort_keys=True) + "\n")
        with self._poll_lock:
            self._polled = (time.monotonic(), c)  # this shell's own request: no poll may read an older one
        return c

    # ---------------------------------------------------------------------------------------------- history
    def append_history(self, action: str, *, release: Optional[str], result: str, reason: str = "",
                       **extra: Any) -> dict[str, Any]:
        """Append one record to history.jsonl on every reachable host; returns the record."""
        rec = {"id": uuid.uuid4().hex[:12], "time": now_iso(), "user": settings.operator(), "action": action,
               "release": release, "result": result, "reason": reason, **extra}
        line = json.dumps(rec, sort_keys=True)

        def append(host):
            self._ensure_dir(host)
            path = state_file(host.config, "history.jsonl")
            host.run(f"printf '%s\\n' {shlex.quote(line)} >> {shlex.quote(path)}", timeout=self.timeout)

        outcomes = self._each(append)
        if all(o.error is not None for o in outcomes):
            raise outcomes[-1].error
        return rec

    def read_history(self) -> list[dict[str, Any]]:
        """Every host's history merged (by record id), oldest first."""
        seen: dict[str, dict[str, Any]] = {}
        for text in self._read_all("history.jsonl"):
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    seen.setdefault(rec.get("id") or line, rec)
        return sorted(seen.values(), key=lambda r: r.get("time", ""))


def read_doc(store: StateStore, name: str) -> dict[str, Any]:
    """The newest copy (by its ``updated`` field) of the JSON object ``name`` under state/ ({} when none).
    Unparsable copies are skipped (cordon and membership records are rewritten whole by every change)."""
    best: dict[str, Any] = {}
    for text in store._read_all(name):
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and str(doc.get("updated", "")) >= str(best.get("updated", "")):
            best = doc
    return best


def write_doc(store: StateStore, name: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` (stamped ``updated``) as state/``name`` on every reachable host. Raises RemoteError when none
    is reached."""
    doc["updated"] = now_iso()
    store._write_all(name, json.dumps(doc, indent=1, sort_keys=True) + "\n")
