"""``deploy --detach``: the step machine in a background process on the control machine, so that a day-long canary
outlives the operator's terminal; ``rollout watch`` follows it from any shell.

The runner is ``python -m deployctl deploy --yes --runner ...`` started in a session of its own (``setsid``: no
controlling terminal, so closing the launching shell's terminal sends it no SIGHUP), stdin from /dev/null, stdout
and stderr appended to ``<DEPLOYCTL_STATE>/<service>/runner.log``. Its files beside the journal
(deployctl.rollout.journal.control_dir): ``runner.pid`` (its pid), ``runner.log``, ``runner.exit`` (its exit code,
written by the runner itself as it ends). A runner killed before it could write ``runner.exit`` is found by its
pid no longer running: ``watch`` then says so and names ``deploy --resume``. (systemd transient units,
``systemd-run``, are not used yet: this daemon path is the one implemented and tested.)
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from deployctl import settings
from deployctl.errors import DeployctlError, ExitCode
from deployctl.rollout.journal import control_dir

# watch's exit when the runner died without recording an exit code (killed): the rollout is unfinished
RUNNER_DIED_EXIT = ExitCode.REMOTE


class RunnerBusy(DeployctlError):
    """A detached runner of this service is still running (exit 1)."""


class RunnerDied(DeployctlError):
    """The detached runner ended without an exit code (killed): its rollout is unfinished (exit 4)."""

    exit_code = RUNNER_DIED_EXIT


@dataclass(frozen=True)
class RunnerFiles:
    dir: Path

    @property
    def pid(self) -> Path:
        return self.dir / "runner.pid"

    @property
    def log(self) -> Path:
        return self.dir / "runner.log"

    @property
    def exit(self) -> Path:
        return self.dir / "runner.exit"


def files(service: str) -> RunnerFiles:
    return RunnerFiles(control_dir(service))


def pid_running(pid: int) -> bool:
    """Whether ``pid`` runs on this machine (a zombie, killed and not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def runner_pid(service: str) -> Optional[int]:
    """The pid in runner.pid when that process still runs, else None."""
    try:
        pid = int(files(service).pid.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_running(pid) else None


def spawn(service: str, argv: list[str]) -> tuple[int, Path]:
    """Start ``python -m deployctl <argv>`` detached (module doc). Returns (pid, log path). Raises RunnerBusy when
    a runner of ``service`` still runs."""
    f = files(service)
    busy = runner_pid(service)
    if busy:
        raise RunnerBusy(f"a detached rollout of {service} runs as pid {busy}",
                         fix="follow it with `deployctl rollout watch`, or stop it with `deployctl abort`")
    f.dir.mkdir(parents=True, exist_ok=True)
    f.exit.unlink(missing_ok=True)
    if f.log.exists():
        os.replace(f.log, f.dir / "runner.prev.log")
    env = {k: v for k, v in settings.environ().items() if k not in ("COLUMNS", "LINES")}
    env["COLUMNS"] = "200"  # the log is read later in terminals of any width
    with open(f.log, "ab") as log, open(os.devnull, "rb") as devnull:
        p = subprocess.Popen([sys.executable, "-m", "deployctl", *argv], stdin=devnull, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, env=env)
    _write_atomic(f.pid, f"{p.pid}\n")
    return p.pid, f.log


def record_exit(service: str, code: int) -> None:
    """The runner's last act: its exit code in runner.exit (atomically)."""
    _write_atomic(files(service).exit, f"{int(code)}\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def watch(service: str, out: Callable[[str], None], *, poll_s: float = 0.2,
          timeout_s: Optional[float] = None) -> int:
    """Follow the service's runner: print its log from the start through ``out`` (one line at a time) until it
    ends; return its exit code. Raises DeployctlError when there is no runner, RunnerDied (exit 4) when it ended
    without an exit code (killed: `deploy --resume` continues the rollout), and after ``timeout_s``."""
    f = files(service)
    if not f.pid.exists():
        raise DeployctlError(f"no detached rollout of {service} under {f.dir}",
                             fix="start one with `deployctl deploy --detach --yes`")
    pid = int(f.pid.read_text().strip() or 0)
    end = None if timeout_s is None else time.monotonic() + timeout_s
    pos, buf = 0, b""
    while True:
        code = _exit_code(f)
        alive = code is None and pid_running(pid)
        try:
            with open(f.log, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        pos += len(chunk)
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            out(line.decode("utf-8", "replace"))
        if code is not None or not alive:
            code = _exit_code(f) if code is None else code
            if buf:
                out(buf.decode("utf-8", "replace"))
            if code is None:
                raise RunnerDied(f"the detached rollout runner (pid {pid}) ended without finishing (killed?)",
                                 fix="run `deployctl status`, then `deployctl deploy --resume` to continue it "
                                     "(or `deployctl rollback`)")
            return code
        if end is not None and time.monotonic() > end:
            raise DeployctlError(f"the detached rollout (pid {pid}) still runs after {timeout_s:.0f} s",
                                 fix="run `deployctl rollout watch` again")
        time.sleep(poll_s)


def _exit_code(f: RunnerFiles) -> Optional[int]:
    try:
        return int(f.exit.read_text().strip())
    except (OSError, ValueError):
        return None
