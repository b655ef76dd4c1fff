"""``deploy --detach``: the step machine in a background process on the control machine, so that a day-long canary
outlives the operator's terminal; ``rollout watch`` follows it from any shell.

The runner is ``python -m deployctl deploy --yes --runner SERVICE ...``, stdin from /dev/null, stdout and stderr
appended to ``<DEPLOYCTL_STATE>/<service>/runner.log``, started one of two ways (``DEPLOYCTL_DETACH``: ``auto``, the
default, picks the first that applies):

- ``systemd``: a transient service of the service manager (``systemd-run``; ``--user`` unless deployctl runs as
  root), unit ``deployctl-rollout-<service>.service``, used where systemd is the init system (``/run/systemd/system``
  is a directory, sd_booted(3)) and ``systemd-run`` is on PATH. The manager owns the runner, so neither a closed
  terminal nor logind's KillUserProcesses= at logout ends it (a ``--user`` unit lives as long as the user's manager:
  ``loginctl enable-linger`` keeps that past the last logout). deployctl's environment reaches it through a 0600
  ``runner.env`` (EnvironmentFile=, never the command line, which ``systemctl show`` and ``ps`` would print) that the
  runner deletes as it ends (a restart reads it again). ``--collect``: the unit is gone once it ends, failed or not.
  ``Restart=on-failure``: a runner killed by a signal (SIGKILL, the OOM killer) or ended by an exit status that is
  not deployctl's (RestartPreventExitStatus= lists ExitCode's: those ended the deploy and journaled how) is started
  again after RESTART_SEC, at most START_LIMIT_BURST starts in START_LIMIT_INTERVAL_S; the restarted runner continues
  the deploy from its journal (deployctl.rollout.runner). In ``auto``, a manager that refuses the unit (no user bus
  in this session) falls back to the process path, and says so.
- ``process``: a daemonized process, in a session of its own (``setsid``: no controlling terminal, so closing the
  launching shell's terminal sends it no SIGHUP). Nothing restarts it: a killed one is continued by `deploy --resume`.

Its files beside the journal (deployctl.rollout.journal.control_dir): ``runner.json`` (this spawn: ``token``, ``how``,
``unit``, ``spawned``; written before the start, read by every start of the runner), ``runner.pid`` (its pid,
written by the runner itself as it starts, again at each restart), ``runner.log``, ``runner.exit`` (its exit code,
written by the runner itself as it ends). A runner killed before it could write ``runner.exit`` is found by its pid
no longer being a runner (deployctl.rollout.procs): ``watch`` then waits for a systemd restart (a new runner.pid)
up to RESTART_SEC + RESTART_GRACE_S, else says it died and names ``deploy --resume``.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from deployctl import settings
from deployctl.errors import DeployctlError, ExitCode
from deployctl.rollout import procs
from deployctl.rollout.journal import Progress, control_dir, read
from deployctl.rollout.state import now_iso

# watch's exit when the runner died without recording an exit code (killed): the rollout is unfinished
RUNNER_DIED_EXIT = ExitCode.REMOTE

# the unit's restart policy (module doc); watch waits RESTART_SEC + RESTART_GRACE_S for a restarted runner
RESTART_SEC = 3
START_LIMIT_BURST = 4
START_LIMIT_INTERVAL_S = 600
RESTART_GRACE_S = 20
RESTART_PROPERTIES = ("Restart=on-failure", f"RestartSec={RESTART_SEC}",
                      "RestartPreventExitStatus=" + " ".join(str(int(c)) for c in ExitCode if c),
                      f"StartLimitIntervalSec={START_LIMIT_INTERVAL_S}", f"StartLimitBurst={START_LIMIT_BURST}")


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

    @property
    def env(self) -> Path:
        return self.dir / "runner.env"

    @property
    def spec(self) -> Path:
        return self.dir / "runner.json"


def spec(service: str) -> dict:
    """runner.json of ``service``'s last spawn ({} when absent or unreadable)."""
    try:
        data = json.loads(files(service).spec.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def files(service: str) -> RunnerFiles:
    return RunnerFiles(control_dir(service))


def runner_pid(service: str) -> Optional[int]:
    """The pid in runner.pid while that process is ``service``'s runner (deployctl.rollout.procs: a reused pid
    is not), else None."""
    try:
        pid = int(files(service).pid.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if procs.is_runner(pid, service) else None


def describe_runner(service: str, pid: int) -> str:
    """``pid N`` (``pid N (systemd unit NAME)`` in a unit) of ``service``'s runner, for messages."""
    unit = spec(service).get("unit")
    return f"pid {pid}" + (f" (systemd unit {unit})" if unit else "")


def unit_name(service: str) -> str:
    """The systemd unit of ``service``'s detached runner: ``deployctl-rollout-<service>.service`` (characters
    outside systemd's unit-name set become ``_``)."""
    return "deployctl-rollout-" + re.sub(r"[^A-Za-z0-9:_.-]", "_", service) + ".service"


def manager() -> str:
    """``"systemd"`` or ``"process"``: how spawn starts a runner (module doc; DEPLOYCTL_DETACH). Raises
    DeployctlError when DEPLOYCTL_DETACH=systemd and ``systemd-run`` is not on PATH."""
    want = settings.current().detach
    has_run = shutil.which("systemd-run") is not None
    if want == "systemd" and not has_run:
        raise DeployctlError("DEPLOYCTL_DETACH=systemd but systemd-run is not on PATH",
                             fix="install systemd, or set DEPLOYCTL_DETACH=process (or auto)")
    if want == "process" or not has_run:
        return "process"
    return "systemd" if want == "systemd" or os.path.isdir("/run/systemd/system") else "process"


def spawn(service: str, argv: list[str], *, note: Callable[[str], None] = lambda m: None) -> tuple[int, Path, str]:
    """Start ``python -m deployctl <argv>`` detached (module doc). Returns (pid, log path, how: ``"systemd unit
    NAME"`` or ``"process"``). ``note`` hears a fallback from systemd to the process path. Raises RunnerBusy when
    a runner of ``service`` still runs; DeployctlError when the unit cannot be started (DEPLOYCTL_DETACH=systemd) or
    its runner does not start within 30 s."""
    f = files(service)
    busy = runner_pid(service)
    if busy and procs.is_stopped(busy):
        raise RunnerBusy(f"a detached rollout of {service} is stopped (SIGSTOP) as {describe_runner(service, busy)}",
                         fix=f"continue it (kill -CONT {busy}), or take it over once its lease expired with "
                             "`deployctl deploy --resume` (in this shell) or `deployctl rollback`")
    if busy:
        raise RunnerBusy(f"a detached rollout of {service} runs as {describe_runner(service, busy)}",
                         fix="follow it with `deployctl rollout watch`, or stop it with `deployctl abort`")
    f.dir.mkdir(parents=True, exist_ok=True)
    for stale in (f.exit, f.pid, f.env, f.spec):
        stale.unlink(missing_ok=True)
    if f.log.exists():
        os.replace(f.log, f.dir / "runner.prev.log")
    # INVOCATION_ID: systemd's id of the unit deployctl itself may run in, not the runner's
    env = {k: v for k, v in settings.environ().items() if k not in ("COLUMNS", "LINES", "INVOCATION_ID")}
    env["COLUMNS"] = "200"  # the log is read later in terminals of any width
    command = [sys.executable, "-m", "deployctl", *argv]
    token = secrets.token_hex(6)
    how = manager()
    if how == "systemd":
        write_atomic(f.spec, json.dumps({"token": token, "how": "systemd", "unit": unit_name(service),
                                          "spawned": now_iso()}) + "\n")
        why = _start_unit(service, command, env, f)
        if why is None:
            return _wait_pid(service, f), f.log, f"systemd unit {unit_name(service)}"
        if settings.current().detach == "systemd":
            raise DeployctlError(f"systemd-run could not start {unit_name(service)}: {why}",
                                 fix="run it where a service manager answers (as root, or in a login session with "
                                     "a user bus), or set DEPLOYCTL_DETACH=process")
        note(f"systemd-run could not start {unit_name(service)} ({why}); the runner is a daemonized process instead")
    write_atomic(f.spec, json.dumps({"token": token, "how": "process", "spawned": now_iso()}) + "\n")
    with open(f.log, "ab") as log, open(os.devnull, "rb") as devnull:
        p = subprocess.Popen(command, stdin=devnull, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             close_fds=True, env=env)
    write_atomic(f.pid, f"{p.pid}\n")
    return p.pid, f.log, "process"


def _env_file_line(key: str, value: str) -> str:
    """One EnvironmentFile= assignment: the value double-quoted, with the escapes systemd.exec(5) reads there
    (backslash before any of ``"\\`$``; newlines kept verbatim inside the quotes)."""
    return f'{key}="' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def _start_unit(service: str, command: list[str], env: dict, f: RunnerFiles) -> Optional[str]:
    """Start ``command`` as the transient unit; None when systemd-run accepted it, else why not (its stderr)."""
    lines = [_env_file_line(k, v) for k, v in env.items() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    fd = os.open(f.env, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    user = ["--user"] if os.geteuid() != 0 else []
    argv = ["systemd-run", *user, f"--unit={unit_name(service)}", "--collect", "--quiet",
            f"--working-directory={os.getcwd()}", "-p", f"EnvironmentFile={f.env}", "-p", "StandardInput=null",
            *[a for prop in RESTART_PROPERTIES for a in ("-p", prop)],
            "-p", f"StandardOutput=append:{f.log}", "-p", f"StandardError=append:{f.log}", "--", *command]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        f.env.unlink(missing_ok=True)
        return str(exc) or type(exc).__name__
    if r.returncode != 0:
        f.env.unlink(missing_ok=True)
        return (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1][:300]
    return None


def _wait_pid(service: str, f: RunnerFiles, timeout_s: float = 30) -> int:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        pid = runner_pid(service)
        if pid:
            return pid
        code = _exit_code(f)
        if code is not None:
            raise DeployctlError(f"the detached runner ended at once (exit {code})", fix=f"read {f.log}")
        time.sleep(0.1)
    raise DeployctlError(f"{unit_name(service)} started but its runner wrote no runner.pid within {timeout_s:g} s",
                         fix=f"read {f.log} and `journalctl {'--user ' if os.geteuid() else ''}-u {unit_name(service)}`")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def watch(service: str, out: Callable[[str], None], *, poll_s: float = 0.2,
          timeout_s: Optional[float] = None) -> int:
    """Follow the service's runner: print its log from the start through ``out`` (one line at a time) until it
    ends; return its exit code. A runner in a systemd unit that dies without one is waited for RESTART_SEC +
    RESTART_GRACE_S: its restart (a new runner.pid) is followed on. Raises DeployctlError when there is no runner,
    RunnerDied (exit 4) when it ended without an exit code and nothing restarted it (killed: `deploy --resume`
    continues the rollout), and after ``timeout_s``. A runner that died after which its deploy was finished all the
    same (a `deploy --resume` from a shell) is reported so, with that finish's exit code."""
    f = files(service)
    if not f.pid.exists():
        raise DeployctlError(f"no detached rollout of {service} under {f.dir}",
                             fix="start one with `deployctl deploy --detach --yes`")
    pid = _read_pid(f)
    restarts = spec(service).get("how") == "systemd"
    end = None if timeout_s is None else time.monotonic() + timeout_s
    pos, buf, died_at = 0, b"", None
    while True:
        code = _exit_code(f)
        now_pid = _read_pid(f)
        if now_pid and now_pid != pid:
            pid = now_pid
            if died_at is not None:
                out(f"(rollout watch: the runner was restarted as pid {pid})")
                died_at = None
        alive = code is None and procs.is_runner(pid, service)
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
        if alive:
            died_at = None
        elif code is None and restarts and (died_at is None
                                            or time.monotonic() - died_at < RESTART_SEC + RESTART_GRACE_S):
            if died_at is None:
                died_at = time.monotonic()
                out(f"(rollout watch: the runner, pid {pid}, ended without finishing; waiting up to "
                    f"{RESTART_SEC + RESTART_GRACE_S} s for {unit_name(service)} to restart it)")
        else:
            code = _exit_code(f) if code is None else code
            if buf:
                out(buf.decode("utf-8", "replace"))
            finished = None if code is not None else _finished_without_runner(service, pid)
            if finished is not None:
                out(finished[0])
                return finished[1]
            if code is None:
                raise RunnerDied(f"the detached rollout runner (pid {pid}) ended without finishing (killed?)"
                                 + (" and was not restarted" if restarts else ""),
                                 fix="run `deployctl status`, then `deployctl deploy --resume` to continue it "
                                     "(or `deployctl rollback`)")
            return code
        if end is not None and time.monotonic() > end:
            raise DeployctlError(f"the detached rollout (pid {pid}) still runs after {timeout_s:.0f} s",
                                 fix="run `deployctl rollout watch` again")
        time.sleep(poll_s)


def _finished_without_runner(service: str, pid: int) -> Optional[tuple[str, int]]:
    """(what to say, exit code) when the runner died but the deploy it ran has finished since (a `deploy --resume`
    from a shell, or a rollback of it, wrote the journal's finish); None while that deploy is unfinished. The
    journal is this spawn's when its start record carries the spawn's token (runner.json)."""
    token = spec(service).get("token")
    p = Progress.of(read(service))
    if not token or p.start is None or p.start.get("runner") != token or p.finish is None:
        return None
    code = p.finish.get("exit_code")
    return (f"(rollout watch: the runner, pid {pid}, ended without finishing; the deploy it ran was finished since "
            f"by pid {p.pid or '?'}: {p.finish.get('result')} (exit {code}))", int(code) if code is not None else 1)


def _read_pid(f: RunnerFiles) -> int:
    try:
        return int(f.pid.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _exit_code(f: RunnerFiles) -> Optional[int]:
    try:
        return int(f.exit.read_text().strip())
    except (OSError, ValueError):
        return None
