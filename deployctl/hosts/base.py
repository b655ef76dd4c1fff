"""What every host operation shares: the result of a command, the host errors (all ``RemoteError``, exit 4),
and the helpers that quote and shorten command lines for them. No transport here: deployctl/hosts/host.py
is the Host, deployctl/hosts/local.py and deployctl/hosts/ssh.py its transports."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from deployctl.errors import RemoteError

Argv = Union[list, str]
TAIL_CHARS = 800


def known_hosts_path() -> Path:
    """The deployctl-managed known_hosts file: $DEPLOYCTL_KNOWN_HOSTS or ~/.config/deployctl/known_hosts."""
    from deployctl import settings

    return settings.current().known_hosts


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``, stripped."""
    text = (text or "").strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def command_line(argv: Argv) -> str:
    """A shell command line: a list is shlex-quoted word by word; a string is taken as already quoted."""
    if isinstance(argv, str):
        return argv
    return " ".join(shlex.quote(str(a)) for a in argv)


@dataclass(frozen=True)
class RunResult:
    """A finished command. ``duration_s`` is wall-clock seconds as seen by deployctl."""

    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float


class LineSink:
    """A text stream that hands each complete line (without its newline) to ``on_line`` as it is written: a
    command's stderr streamed while it runs (``Host.run(on_stderr=...)``). ``close()`` hands over a last line that
    has no newline. A callback that raises is not the command's failure: its error is dropped."""

    def __init__(self, on_line: Optional[Callable[[str], None]]):
        self.on_line = on_line
        self._part = ""

    def write(self, text: str) -> int:
        self._part += text
        *lines, self._part = self._part.split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def _emit(self, line: str) -> None:
        if self.on_line is not None:
            try:
                self.on_line(line.rstrip("\r"))
            except Exception:  # noqa: BLE001 - progress display must not fail the command
                pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._part:
            self._emit(self._part)
            self._part = ""


class HostError(RemoteError):
    """Base of every host error (exit 4, the class's ``exit_code``): carries host, command, ``remote_status`` (the
    remote command's exit status; None if it never ran or never finished) and stderr_tail."""

    def __init__(self, message: str, *, host: str, command: str | None = None, remote_status: int | None = None,
                 stderr_tail: str = "", fix: str | None = None):
        super().__init__(message, fix=fix)
        self.host = host
        self.command = command
        self.remote_status = remote_status
        self.stderr_tail = stderr_tail


class RemoteCommandError(HostError):
    """A command exited non-zero with check=True."""


class CommandTimeout(HostError):
    """A command outlived its timeout and was killed."""


class HostUnreachable(HostError):
    """The host could not be reached: connection refused, DNS, timeout, or the connection was lost."""


class AuthFailed(HostError):
    """SSH authentication failed: wrong user or wrong key."""


class HostKeyUnknown(HostError):
    """The host offered a key that no known_hosts file holds. ``fingerprint`` is "SHA256:..."."""

    def __init__(self, message: str, *, host: str, fingerprint: str, **kw):
        super().__init__(message, host=host, **kw)
        self.fingerprint = fingerprint


class HostKeyChanged(HostError):
    """The host offered a key different from the one in known_hosts; never accepted mid-rollout."""

    def __init__(self, message: str, *, host: str, fingerprint: str, expected: str, **kw):
        super().__init__(message, host=host, **kw)
        self.fingerprint = fingerprint
        self.expected = expected


class HostDeadline(HostError):
    """A host's part of a group operation (run_on_hosts) gave no result within the operation's deadline: the
    caller goes on without it. The work may still be running on that host (its thread is abandoned)."""


class SudoPasswordRequired(HostError):
    """sudo asked for a password and no password source is configured (or it was refused)."""


def one_line(text: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= limit else line[:limit] + "…"


def short_command(cmd: str, limit: int = 120) -> str:
    """``cmd`` on one line, cut to ``limit`` characters (for messages)."""
    one = " ".join(cmd.split())
    return one if len(one) <= limit else one[:limit] + "…"
