"""deployctl's own processes on the control machine, told apart from strangers by their command line.

A pid written down (``runner.pid``, the journal's ``start``/``resume`` records, rollout.json) outlives its process,
and the kernel reuses numbers (pid_max 32768 wraps within minutes on a busy machine): a number alone names a
stranger as often as not, and taking one for a live runner makes ``deploy --detach`` refuse forever and ``rollout
watch`` wait forever. So a pid counts as a deploy of a service only while its command line says so — the rule
``hostscripts.snippets.SH_OURS`` applies on the hosts to runtime pids (the command line names the deploy root's
``releases/``), here applied to deployctl's command line:

- a deployctl process: ``python -m deployctl ...`` or the ``deployctl`` console script (``.../bin/deployctl ...``);
- the detached runner of service S: a deployctl process with ``--runner S`` (deployctl.rollout.detach starts it so);
- a deploy of service S: S's runner, or a foreground ``deployctl deploy`` (its command line names deploy.yaml, not
  the service: any live one counts, which errs on the side of "still running").
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

RUNNER_FLAG = "--runner"


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped on this machine (state T: SIGSTOP, SIGTSTP; t: a debugger's trace stop): alive,
    and doing nothing until it is continued."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


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


def command_line(pid: int) -> Optional[list[str]]:
    """``pid``'s argv while it runs (None when it does not, or its command line cannot be read)."""
    if not pid_running(pid):
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode("utf-8", "replace").split("\0")[:-1] if raw else None


def deployctl_args(argv: Optional[list[str]]) -> Optional[list[str]]:
    """The arguments after ``-m deployctl`` or the ``deployctl`` console script in ``argv``; None when ``argv`` is
    not a deployctl command line."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "deployctl":
        return argv[1:]
    i = 1  # after the interpreter: its options, then ``-m deployctl`` or the script
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return argv[i + 2:] if argv[i + 1:i + 2] == ["deployctl"] else None
        if a == "-c":
            return None
        if a in ("-X", "-W"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return argv[i + 1:] if os.path.basename(a) == "deployctl" else None
    return None


def _command(args: list[str]) -> Optional[str]:
    """The subcommand: the first word that is not an option (global options before it take no value)."""
    return next((a for a in args if not a.startswith("-")), None)


def runner_service(args: list[str]) -> Optional[str]:
    """The service a runner's arguments name (``--runner S`` or ``--runner=S``), None when they are not a runner's."""
    for i, a in enumerate(args):
        if a == RUNNER_FLAG and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(RUNNER_FLAG + "="):
            return a.split("=", 1)[1]
    return None


def is_runner(pid: int, service: str) -> bool:
    """``pid`` is the live detached runner of ``service`` (module doc)."""
    args = deployctl_args(command_line(pid))
    return args is not None and _command(args) == "deploy" and runner_service(args) == service


def is_deploy(pid: int, service: str) -> bool:
    """``pid`` is a live deploy of ``service``: its runner, or a foreground ``deployctl deploy`` (module doc)."""
    args = deployctl_args(command_line(pid))
    if args is None or _command(args) != "deploy":
        return False
    named = runner_service(args)
    return named is None or named == service
