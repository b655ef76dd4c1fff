"""The rollout journal: every step of a deploy's step machine, written on the control machine before and after it
acts, so that a deploy killed at any point (``kill -9``, a closed laptop) can be continued or rolled back by
``deployctl deploy --resume``.

Where: ``<DEPLOYCTL_STATE>/<service.name>/journal.jsonl`` (default ``~/.local/state/deployctl``), beside the
detached runner's ``runner.log``, ``runner.pid`` and ``runner.exit`` (deployctl.rollout.detach). One JSON object a
line, appended with O_APPEND and fsync'd before the step acts (the write of one short line is all or nothing;
a torn last line, the only one a kill can tear, is ignored: its step counts as not begun). A new deploy starts a
new journal (the old one is renamed ``journal.prev.jsonl``), atomically (temporary file, then rename).

Records (``kind``): ``start`` (the plan: release info, hosts, steps, batches, generation), ``begin``/``end`` of a
step (``step``: upload, drain, activate, validate, outputs (at weight 0), weight:I, batch:J, route, prune;
``hosts`` where it acts on hosts), ``point`` (a moment inside a step: one host's upload put, ``pause`` with ``began`` when a weight step's
pause began, ``window`` with each analysis window's numbers, verdict and reason:
deployctl.rollout.replay.window_record), ``abort`` (the abort began: reason), ``finish``
(result and exit code). ``Progress.of(records)`` reads them back.

Fencing: ``<DEPLOYCTL_STATE>/<service.name>/fence`` holds the newest deploy lock generation taken on this machine
(``raise_fence``: line 1 the generation, line 2 who took it). A Journal given the ``generation`` its deploy holds
refuses to write once the file names a newer one (Fenced, exit 7): a deploy stopped while ``rollback`` or
``deploy --resume`` took its lock over appends nothing when it runs again. (The check and the append are two
system calls of one process: a process stopped exactly between them writes one record late; the hosts' own
checks, deployctl.hosts.fence, are atomic with what they guard.)

Test-only kill hook: DEPLOYCTL_TEST_KILL_AT=N makes the process SIGKILL itself right after writing its N-th
record (counted from 1 in this process), DEPLOYCTL_TEST_KILL_AT=KIND[:STEP] right after the first record of that
kind and step (``begin:activate``, ``point:upload:put``, ``abort``): the production path, with a kill between any
two journaled moments. DEPLOYCTL_TEST_STOP_AT (the same forms) SIGSTOPs it there instead: a process frozen between
two moments, for the fencing tests.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from deployctl import settings
from deployctl.errors import Fenced
from deployctl.rollout.state import now_iso

JOURNAL = "journal.jsonl"
FENCE = "fence"


def control_dir(service: str) -> Path:
    """``<DEPLOYCTL_STATE>/<service>``: the journal and the detached runner's files (created on first use)."""
    return Path(settings.current().state_dir) / service


def read_fence(service: str) -> tuple[int, str]:
    """(generation, who) of this machine's fence file for ``service`` ((0, "") when there is none)."""
    try:
        lines = (control_dir(service) / FENCE).read_text(encoding="utf-8").splitlines()
        return int(lines[0]), (lines[1] if len(lines) > 1 else "")
    except (OSError, ValueError, IndexError):
        return 0, ""


def raise_fence(service: str, generation: int, who: str) -> None:
    """Raise this machine's fence for ``service`` to ``generation`` (never lower it; atomic: temporary file and
    rename). Called by whoever takes the deploy lock here (deployctl.rollout.fleet.Fleet.lock)."""
    d = control_dir(service)
    d.mkdir(parents=True, exist_ok=True)
    if read_fence(service)[0] >= generation:
        return
    tmp = d / f".{FENCE}.{os.getpid()}"
    tmp.write_text(f"{int(generation)}\n{who}\n", encoding="utf-8")
    os.replace(tmp, d / FENCE)


class Journal:
    """The journal of one deploy (``path``). ``begin``/``end``/``point``/``abort``/``finish`` append a record;
    every write is durable (fsync) before it returns. Thread-safe (host workers write ``point`` records)."""

    def __init__(self, service: str, *, runner: Optional[str] = None):
        self.runner = runner  # the detached runner's spawn token (deployctl.rollout.runner), in start and resume
        self.dir = control_dir(service)
        self.path = self.dir / JOURNAL
        self._lock = threading.Lock()
        self._written = 0
        self._kill_at = settings.current().test_kill_at
        self._stop_at = settings.current().test_stop_at
        self.service = service
        self.generation = 0  # the deploy lock's generation this deploy holds (0: not fenced yet)

    # ------------------------------------------------------------------------------------------ write
    def start(self, record: dict[str, Any]) -> None:
        """Begin a new journal whose first line is ``record`` (kind ``start``); the previous one is kept as
        journal.prev.jsonl. Atomic: written to a temporary file, fsync'd, renamed over."""
        self.dir.mkdir(parents=True, exist_ok=True)
        mark = {"runner": self.runner} if self.runner else {}
        line = json.dumps({"kind": "start", "time": now_iso(), "pid": os.getpid(), **mark, **record}, sort_keys=True)
        tmp = self.dir / f".{JOURNAL}.{os.getpid()}"
        with self._lock:
            self._fenced()
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():
                os.replace(self.path, self.dir / "journal.prev.jsonl")
            os.replace(tmp, self.path)
            _fsync_dir(self.dir)
            self._after_write({"kind": "start"})

    def adopt(self) -> None:
        """Continue the existing journal (``deploy --resume``): later records are appended to it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._append({"kind": "resume", "pid": os.getpid(), **({"runner": self.runner} if self.runner else {})})

    def begin(self, step: str, **data: Any) -> None:
        self._append({"kind": "begin", "step": step, **data})

    def end(self, step: str, **data: Any) -> None:
        self._append({"kind": "end", "step": step, **data})

    def point(self, what: str, **data: Any) -> None:
        self._append({"kind": "point", "what": what, **data})

    def abort(self, reason: str) -> None:
        self._append({"kind": "abort", "reason": reason})

    def finish(self, result: str, exit_code: int, message: str = "") -> None:
        self._append({"kind": "finish", "result": result, "exit_code": int(exit_code), "message": message})

    def _append(self, rec: dict[str, Any]) -> None:
        line = json.dumps({"time": now_iso(), **rec}, sort_keys=True) + "\n"
        with self._lock:
            self._fenced()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._after_write(rec)

    def _fenced(self) -> None:
        """Raise Fenced when a newer lock generation than ours was taken on this machine (module doc)."""
        if not self.generation:
            return
        current, who = read_fence(self.service)
        if current > self.generation:
            raise Fenced(f"deploy (lock generation {self.generation}) was taken over: its journal {self.path} "
                         f"refused a record, the generation is {current}" + (f", taken over by {who}" if who else ""),
                         generation=self.generation, current=current, by=who,
                         fix="this process changed nothing after the takeover; see `deployctl status` and "
                             "`deployctl history`")

    def _after_write(self, rec: dict[str, Any]) -> None:
        self._written += 1
        key = ":".join(str(x) for x in (rec.get("kind"), rec.get("step") or rec.get("what")) if x)
        for spec, sig in ((self._kill_at, signal.SIGKILL), (self._stop_at, signal.SIGSTOP)):
            if spec and ((spec.isdigit() and self._written == int(spec)) or spec == key):
                os.kill(os.getpid(), sig)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(service: str) -> list[dict[str, Any]]:
    """The records of the service's journal, oldest first ([] when there is none); a torn last line is left out."""
    path = control_dir(service) / JOURNAL
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill mid-write: its step never began
        if isinstance(rec, dict):
            out.append(rec)
    return out


@dataclass
class Progress:
    """What a journal says: the plan (``start``), the steps that ended (``done``), the step begun and not ended
    (``open_step``, None when the last step ended), the hosts any begun step acted on (``touched``), whether an
    abort began (``abort_reason``), how it finished (``finish``: None while unfinished), the pid of the deploy
    that wrote it last (``pid``), and per step when its pause first began (``pause_began``, Unix time) and how many
    of its analysis windows passed (``passes``): a resumed step waits only the rest (deployctl.rollout.weightstep)."""

    start: Optional[dict[str, Any]] = None
    done: set[str] = field(default_factory=set)
    open_step: Optional[str] = None
    touched: set[str] = field(default_factory=set)
    abort_reason: Optional[str] = None
    finish: Optional[dict[str, Any]] = None
    pid: int = 0  # the process that wrote the last ``start`` or ``resume`` record
    pause_began: dict[str, float] = field(default_factory=dict)  # step -> Unix time its pause first began
    passes: dict[str, int] = field(default_factory=dict)  # step -> analysis windows that passed in it
    ended: list[str] = field(default_factory=list)  # the steps in ``done``, in the order they ended
    # step -> its analysis windows' numbers as journaled (deployctl.rollout.replay.window_record), oldest first
    windows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, records: list[dict[str, Any]]) -> "Progress":
        p = cls()
        for rec in records:
            kind = rec.get("kind")
            if kind in ("start", "resume"):
                if kind == "start":
                    p = cls(start=rec)
                p.pid = int(rec.get("pid") or 0)
            elif kind == "begin":
                p.open_step = rec.get("step")
                p.touched.update(rec.get("switch") or [])
            elif kind == "point" and p.open_step:  # a point belongs to the step begun and not ended
                if rec.get("what") == "pause":
                    p.pause_began.setdefault(p.open_step, float(rec.get("began") or 0))
                elif rec.get("what") == "window":
                    p.passes[p.open_step] = p.passes.get(p.open_step, 0) + (rec.get("result") == "pass")
                    p.windows.setdefault(p.open_step, []).append(
                        {k: v for k, v in rec.items() if k not in ("kind", "what", "pid", "runner")})
            elif kind == "end":
                if rec.get("step") not in p.done:
                    p.ended.append(rec.get("step"))
                p.done.add(rec.get("step"))
                if p.open_step == rec.get("step"):
                    p.open_step = None
            elif kind == "abort":
                p.abort_reason = rec.get("reason") or "aborted"
            elif kind == "finish":
                p.finish = rec
        return p

    @property
    def unfinished(self) -> bool:
        return self.start is not None and self.finish is None

    def label(self, step: str) -> str:
        """A step id as a person reads it: ``weight:0`` (the first weight step, which reads like 0%) as
        ``weight step 1/2 (5%)`` from the plan's steps, ``batch:1`` as ``batch 2/3``; other ids as they are."""
        step = str(step)
        kind, _, index = step.partition(":")
        plan = self.start or {}
        listed = {"weight": plan.get("steps"), "batch": plan.get("batches")}.get(kind)
        if not re.fullmatch(r"[0-9]{1,6}", index) or not isinstance(listed, list) or int(index) >= len(listed):
            return step
        i = int(index)
        return (f"weight step {i + 1}/{len(listed)} ({listed[i]}%)" if kind == "weight"
                else f"batch {i + 1}/{len(listed)}")
