"""Run commands and move files on a host, locally (``address: local``) or over SSH with Fabric.

Every operation has a timeout and either returns a dataclass or raises a ``RemoteError`` subclass (exit 4)
that names the host and carries the command, exit code and the tail of stderr. Guarantees (cases C18, C19):
- commands given as argv lists are shlex-quoted; a string is a command line the caller already quoted;
- a command that outlives its timeout is killed with its process group (on the remote side as well) and
  reported as ``CommandTimeout`` within timeout + 2 s;
- env values never appear on a command line: locally they go in the child's environment, over SSH in a
  0600 temp file that the command sources and deletes;
- ``sudo`` runs ``sudo -n`` unless ``sudo_password_env`` names a password source (sent on stdin);
- SSH host keys: unknown keys are refused with their SHA256 fingerprint, changed keys always
  (deployctl/hosts/known_hosts.py);
- ``start_background`` detaches fully (setsid, stdin from /dev/null, output appended to a log file).

Transports: deployctl/hosts/local.py (subprocess) and deployctl/hosts/ssh.py (the only fabric import);
the result and error types are in deployctl/hosts/base.py.
"""
from __future__ import annotations

import os
import queue
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, Optional, TypeVar

from deployctl import settings
from deployctl.hosts.base import (Argv, HostDeadline, RemoteCommandError, RunResult, SudoPasswordRequired, one_line, command_line,
                                  short_command, tail)

if TYPE_CHECKING:
    from deployctl.config import HostConfig
    from deployctl.hosts.fence import Fence

T = TypeVar("T")


class Host:
    """One host from deploy.yaml. Thread-safe enough for one thread per host (run_on_hosts); the SSH
    connection opens on first use and reopens after it drops."""

    def __init__(self, config: "HostConfig", transport):
        self.config = config
        self.name: str = config.name
        self.is_local: bool = config.address == "local"
        self._transport = transport
        self._lock = threading.Lock()
        # the deploy lock's generation this host's commands present (deployctl.hosts.fence); None: unguarded
        self.fence: Optional["Fence"] = None

    @property
    def connect_retries(self) -> int:
        """Handshakes the server dropped that were tried again so far (SSH; 0 for a local host)."""
        return getattr(self._transport, "connect_retries", 0)

    @classmethod
    def from_config(cls, cfg: "HostConfig", *, known_hosts: Path | None = None) -> "Host":
        """A Host for ``cfg``. ``known_hosts``: an extra known_hosts file read after the usual ones."""
        if cfg.address == "local":
            from deployctl.hosts.local import LocalTransport

            return cls(cfg, LocalTransport(cfg.name))
        from deployctl.hosts.ssh import SSHTransport

        return cls(cfg, SSHTransport(cfg, known_hosts=known_hosts))

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {'local' if self.is_local else self.config.address})"

    # -- commands ---------------------------------------------------------------------------------
    def run(self, argv: Argv, *, timeout: float = 60, check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None, on_stderr: Callable[[str], None] | None = None) -> RunResult:
        """Run ``argv`` (list: quoted; str: a command line) with ``timeout`` seconds. ``on_stderr``: called with
        each line of the command's stderr as it comes (progress of a long install); the result holds it all too.
        Raises CommandTimeout, RemoteCommandError (non-zero exit and check), HostUnreachable, AuthFailed,
        HostKeyUnknown, HostKeyChanged; Fenced (check or not) when the host carries a ``fence`` and a newer lock
        generation refused the command before it ran (deployctl.hosts.fence)."""
        cmd = command_line(argv)
        if env:
            for key in env:
                if not key.isidentifier():
                    raise RemoteCommandError(f"env name {key!r} for {self.name} is not a shell identifier",
                                             host=self.name, command=cmd)
        t0 = time.monotonic()
        fence = self.fence
        sent = f"{fence.guard(self.config)}\n{cmd}" if fence is not None else cmd
        result = self._transport.exec(sent, timeout=timeout, input=input, env=env, on_stderr=on_stderr)
        if fence is not None:
            fence.check(self.name, result.exit_code, result.stderr)
        trace = settings.current().trace_remote
        if trace is not None:
            _trace(trace, self.name, time.monotonic() - t0, result.exit_code, cmd)
        if check and result.exit_code != 0:
            raise RemoteCommandError(
                f"`{short_command(cmd)}` failed on {self.name} with exit code {result.exit_code}: "
                f"{one_line(result.stderr or result.stdout)}",
                host=self.name, command=cmd, remote_status=result.exit_code, stderr_tail=tail(result.stderr))
        return result

    def sudo(self, argv: Argv, *, timeout: float = 60, check: bool = True) -> RunResult:
        """Run as root: directly when already root, else ``sudo -n``, or ``sudo -S`` with the password
        read from $``sudo_password_env`` and sent on stdin. Raises SudoPasswordRequired when sudo wants
        a password that is not configured or was refused."""
        cmd = command_line(argv)
        if self._transport.login_user() == "root":
            return self.run(cmd, timeout=timeout, check=check)
        inner = shlex.quote(cmd) if isinstance(argv, str) else None
        target = f"/bin/sh -c {inner}" if inner else cmd
        env_name = self.config.sudo_password_env
        password: Optional[str] = None
        if env_name:
            password = settings.secret(env_name)
            if password is None:
                raise SudoPasswordRequired(
                    f"sudo on {self.name} requires a password, and ${env_name} (hosts[].sudo_password_env) "
                    "is not set", host=self.name, command=cmd, fix=f"export {env_name} before running deployctl")
            full = f"LC_ALL=C sudo -S -p '' -- {target}"
        else:
            full = f"LC_ALL=C sudo -n -- {target}"
        fence = self.fence
        if fence is not None:
            full = f"{fence.guard(self.config)}\n{full}"
        result = self._transport.exec(full, timeout=timeout, input=(password + "\n") if password else None,
                                      env=None, on_stderr=None)
        if fence is not None:
            fence.check(self.name, result.exit_code, result.stderr)
        err = result.stderr
        if result.exit_code != 0 and ("a password is required" in err or "incorrect password" in err
                                      or "no password was provided" in err or "Sorry, try again" in err):
            how = f"${env_name} was refused" if password else "no password source is configured"
            raise SudoPasswordRequired(
                f"sudo on {self.name} requires a password ({how})", host=self.name, command=cmd,
                remote_status=result.exit_code, stderr_tail=tail(err),
                fix="set hosts[].sudo_password_env, or allow the command with NOPASSWD in sudoers")
        if check and result.exit_code != 0:
            raise RemoteCommandError(
                f"`sudo {short_command(cmd)}` failed on {self.name} with exit code {result.exit_code}: "
                f"{one_line(err or result.stdout)}",
                host=self.name, command=cmd, remote_status=result.exit_code, stderr_tail=tail(err))
        return result

    def start_background(self, argv: list[str], *, log_file: str, pid_file: str | None = None,
                         env_file: str | None = None, cwd: str | None = None, timeout: float = 30) -> int:
        """Start ``argv`` detached (new session via setsid, stdin from /dev/null, stdout and stderr
        appended to ``log_file``) and return its pid at once. ``env_file`` (KEY=value lines, e.g. a
        0600 runtime.env) is sourced with ``set -a``; ``pid_file`` gets the pid."""
        q = shlex.quote
        lines = ["set -e"]
        if cwd:
            lines.append(f"cd -- {q(cwd)}")
        lines.append(f"mkdir -p -- {q(os.path.dirname(log_file) or '.')}")
        if env_file:
            lines.append(f"set -a; . {q(env_file)}; set +a")
        lines.append(f"setsid {command_line(argv)} </dev/null >>{q(log_file)} 2>&1 &")
        lines.append("pid=$!")
        if pid_file:
            lines.append(f"mkdir -p -- {q(os.path.dirname(pid_file) or '.')}")
            lines.append(f"echo \"$pid\" > {q(pid_file)}.tmp && mv -f -- {q(pid_file)}.tmp {q(pid_file)}")
        lines.append('echo "$pid"')
        result = self.run("\n".join(lines), timeout=timeout)
        try:
            return int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteCommandError(f"starting `{short_command(command_line(argv))}` on {self.name} printed no pid",
                                     host=self.name, command=result.command, stderr_tail=tail(result.stderr))

    # -- files ------------------------------------------------------------------------------------
    def put(self, local: Path, remote: str, *, mode: int | None = None, timeout: float = 300) -> None:
        """Copy local file ``local`` to ``remote`` atomically (temp file + rename); parents created. With a
        ``fence``, the rename is a guarded command (Fenced when refused; the temporary file is removed)."""
        self._fenced_put(remote, lambda dst: self._transport.put_file(Path(local), dst, mode=mode, timeout=timeout))

    def put_text(self, text: str, remote: str, *, mode: int | None = None, timeout: float = 60) -> None:
        """Write ``text`` to ``remote`` atomically; the temp file is 0600 from creation, then ``mode``. With a
        ``fence``, as ``put``."""
        self._fenced_put(remote, lambda dst: self._transport.write_bytes(dst, text.encode(), mode=mode,
                                                                         timeout=timeout))

    def _fenced_put(self, remote: str, write: Callable[[str], None]) -> None:
        if self.fence is None:
            write(remote)
            return
        import secrets

        tmp = f"{remote}.fenced-{secrets.token_hex(4)}"
        write(tmp)
        q = shlex.quote
        try:
            self.run(f"mv -f -- {q(tmp)} {q(remote)}", timeout=60)
        except BaseException:
            self._transport.exec(f"rm -f -- {q(tmp)}", timeout=30, input=None, env=None, on_stderr=None)
            raise

    def get(self, remote: str, local: Path, *, timeout: float = 300) -> None:
        """Copy ``remote`` to local file ``local``."""
        self._transport.get_file(remote, Path(local), timeout=timeout)

    def read_bytes(self, remote: str, *, timeout: float = 30) -> bytes:
        """The content of ``remote``. Raises RemoteCommandError if it cannot be read."""
        return self._transport.read_bytes(remote, timeout=timeout)

    def read_text(self, remote: str, *, timeout: float = 30) -> str:
        """The content of ``remote`` as UTF-8. Raises RemoteCommandError if it cannot be read."""
        return self._transport.read_bytes(remote, timeout=timeout).decode("utf-8", errors="replace")

    def exists(self, remote: str, *, timeout: float = 30) -> bool:
        """Whether ``remote`` exists (file, directory or symlink target)."""
        return self._transport.exists(remote, timeout=timeout)

    def close(self) -> None:
        """Close the SSH connection, if any. The Host reconnects on next use."""
        self._transport.close()

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class HostOutcome(Generic[T]):
    """One host's result in a group operation: ``value`` on success, else ``error``."""

    host: str
    value: Optional[T]
    error: Optional[Exception]

    @property
    def ok(self) -> bool:
        return self.error is None


# the longest any group operation waits when its caller names no deadline (a rollout step passes its own, derived
# from the timeouts of the remote calls it makes): every wait on parallel host work ends
DEFAULT_GROUP_DEADLINE_S = 1800.0


_trace_lock = threading.Lock()


def _trace(path: Path, host: str, seconds: float, exit_code: int, cmd: str) -> None:
    """One JSON line per remote command into $DEPLOYCTL_TRACE_REMOTE (settings): never the command's input, and
    the command cut at 300 characters (a rendered file's text is passed as input, not on the command line)."""
    import json

    line = json.dumps({"t": round(time.time(), 3), "host": host, "s": round(seconds, 4), "exit": exit_code,
                       "cmd": cmd[:300]})
    with _trace_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def run_on_hosts(hosts: list[Host], fn: Callable[[Host], T], *, max_workers: int = 8,
                 deadline_s: Optional[float] = None, what: str = "") -> list[HostOutcome[T]]:
    """Call ``fn(host)`` for every host, at most ``max_workers`` at once; one outcome per host, in input order.
    Every host's error is kept (not only the first), BaseExceptions included (KeyboardInterrupt, SystemExit).

    Bounded per host: a host whose call has not returned ``deadline_s`` seconds (default DEFAULT_GROUP_DEADLINE_S)
    after *its own* call started gets a ``HostDeadline`` outcome naming it and ``what``, and its worker slot goes
    to the next host waiting (a host queued behind ``max_workers`` others spends none of its time waiting). So the
    group returns within ceil(hosts / max_workers) × ``deadline_s``, and one stuck host delays the rest by at most
    one ``deadline_s``. The workers are daemon threads: an abandoned one (a remote call stuck past every timeout)
    never holds up the caller or the process's exit; while it lingers, up to ``max_workers`` others run beside it.
    The caller's thread waits in short ticks: a signal handler that only sets a flag runs promptly, and nothing is
    raised into the workers."""
    if not hosts:
        return []
    limit = DEFAULT_GROUP_DEADLINE_S if deadline_s is None else deadline_s
    workers = max(1, min(max_workers, len(hosts)))
    results: list = [None] * len(hosts)
    finished: "queue.SimpleQueue[tuple[int, HostOutcome[T]]]" = queue.SimpleQueue()
    started: dict[int, float] = {}  # index -> monotonic start, for the calls still counted as running
    waiting = list(range(len(hosts)))[::-1]  # popped from the end: input order

    def one(i: int, host: Host) -> None:
        try:
            outcome = HostOutcome(host.name, fn(host), None)
        except BaseException as exc:  # noqa: BLE001 - every host's outcome is reported, not only the first failure
            outcome = HostOutcome(host.name, None, exc)
        finished.put((i, outcome))

    while waiting or started:
        while waiting and len(started) < workers:
            i = waiting.pop()
            started[i] = time.monotonic()
            threading.Thread(target=one, args=(i, hosts[i]), name=f"deployctl-host-{hosts[i].name}",
                             daemon=True).start()
        now = time.monotonic()
        for i in [i for i, t in started.items() if now - t >= limit]:
            del started[i]  # abandoned: its outcome is the deadline, its slot the next host's
            results[i] = HostOutcome(hosts[i].name, None, HostDeadline(
                f"{hosts[i].name}: no result{f' from {what}' if what else ''} within {limit:g} s; it may still "
                "be running there", host=hosts[i].name,
                fix=f"check {hosts[i].name} (`deployctl status`), then act on it"))
        if not started:
            continue
        try:
            i, outcome = finished.get(timeout=max(0.0, min(0.1, min(started.values()) + limit - time.monotonic())))
        except queue.Empty:
            continue
        if started.pop(i, None) is not None:  # an abandoned call that ends late keeps its deadline outcome
            results[i] = outcome
    return results  # every host has its outcome or its deadline: the loop ends only then
