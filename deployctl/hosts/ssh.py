"""The SSH transport: Fabric's Connection with host keys enforced, commands bounded on both ends.

- Connecting: ssh_config is honoured (Fabric); known_hosts are loaded and a reject policy set before the
  first connect (deployctl/hosts/known_hosts.py). A handshake the server dropped (EOF or reset during the banner
  or key exchange: MaxStartups) is tried again with jittered exponential backoff within connect_timeout_s
  (deployctl/hosts/handshake.py). Each connection starts at its sshd endpoint's ``hosts[].connect_rate``
  (deployctl/hosts/startrate.py); ``hosts[].jump`` goes through a bastion first (deployctl/hosts/jump.py). Errors
  become HostUnreachable, AuthFailed, HostKeyUnknown or HostKeyChanged, each one line naming the host or its bastion
  (deployctl/hosts/connect_errors.py).
- Commands run as ``timeout -k 1 T /bin/bash -c CMD`` so the remote side kills the whole process group at
  T (SIGKILL at T+1); the client closes the channel at T+1.5 whatever happens. Either way: CommandTimeout.
- env values are written over SFTP to a 0600 temp file that the command sources and deletes.
- Files move over SFTP, atomically (temp name in the same directory, then posix rename).
- Keepalive (deployctl.hosts.sshalive): every ``hosts[].keepalive_interval_s`` a keepalive asks for a reply; none for
  interval × ``keepalive_count`` closes the connection, and the command in flight fails with HostUnreachable naming
  the keepalive bound (a frozen peer, a connection a firewall dropped).
- Channels per connection are bounded by ``hosts[].max_channels`` (default 8, below OpenSSH's MaxSessions 10): one
  is SFTP's, the others commands. A command beyond them waits for a free one (a semaphore taken where a channel
  opens, for as long as it is open), up to its own timeout (CommandTimeout naming the bound), instead of being
  refused by sshd while the golden thread, the metric scrapes, the control polls and the host workers share one
  connection. A refused channel open is tried again for up to REFUSED_RETRY_S (OpenSSH frees a closed session's
  slot a turn of its loop later, so MaxSessions == max_channels refused an open right after a close); one the
  server still refuses (its MaxSessions below max_channels: "administratively prohibited") is a RemoteCommandError
  naming MaxSessions and the setting, not a lost connection.
"""
from __future__ import annotations

import io
import math
import os
import posixpath
import secrets
import shlex
import socket
import threading
import time
from pathlib import Path

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, ThreadException

from deployctl import settings
from deployctl.hosts import connect_errors, handshake, jump, known_hosts as hostkeys, startrate
from deployctl.hosts.sshalive import Keepalive
from deployctl.hosts.base import (AuthFailed, CommandTimeout, HostError, HostUnreachable, LineSink, RemoteCommandError,
                                  RunResult, short_command, tail)

REMOTE_KILL_AFTER_S = 1.0
CLIENT_GRACE_S = 1.5
REFUSED_RETRY_S = 2.0  # how long a channel sshd refuses is tried again (_run_opening)


def fabric_connection(cfg, **kwargs) -> Connection:
    """A Fabric Connection for ``cfg`` (not yet open). ssh_config is honoured: $DEPLOYCTL_SSH_CONFIG
    (like ``ssh -F``) if set, else ~/.ssh/config and /etc/ssh/ssh_config; port and user from
    deploy.yaml win only when given there."""
    path = settings.current().ssh_config
    config = Config(runtime_ssh_path=str(path)) if path else None
    port = cfg.port if "port" in cfg.model_fields_set else None  # else ssh_config's Port, or 22
    return Connection(host=cfg.address, user=cfg.user, port=port, config=config, **kwargs)


class SSHTransport:
    """One host over SSH. Opens lazily, reopens after the connection drops."""

    def __init__(self, cfg, *, known_hosts: Path | None = None):
        self.cfg = cfg
        self.host = cfg.name
        self._extra_known_hosts = known_hosts
        self._conn: Connection | None = None
        self._alive: Keepalive | None = None
        self._lock = threading.RLock()
        # command channels at once on this host's connection: max_channels less SFTP's one (module doc)
        self._channels = threading.BoundedSemaphore(cfg.max_channels - 1)
        self.connect_retries = 0  # handshakes the server dropped and that were tried again (_open_retrying)
        self._turn_waited = 0.0  # seconds the last _open waited for its turns at the connect rate

    # -- connection -------------------------------------------------------------------------------
    def _new_connection(self) -> Connection:
        cfg = self.cfg
        t = float(cfg.connect_timeout_s)
        kwargs = {"banner_timeout": t, "auth_timeout": t, "channel_timeout": t}
        if cfg.ssh_key:
            key = os.path.expanduser(cfg.ssh_key)
            if not os.path.isfile(key):
                raise AuthFailed(f"ssh_key {cfg.ssh_key} for {self.host} does not exist",
                                 host=self.host, fix="fix hosts[].ssh_key in deploy.yaml")
            kwargs.update(key_filename=key, look_for_keys=False, allow_agent=False)
        gateway = jump.gateway(cfg, kwargs, max(1, math.ceil(t))) if cfg.jump else None
        conn = fabric_connection(cfg, connect_timeout=max(1, math.ceil(t)), connect_kwargs=kwargs, gateway=gateway)
        user_files = conn.ssh_config.get("userknownhostsfile")
        if isinstance(user_files, str):
            user_files = user_files.split()
        for c in (conn, gateway) if gateway is not None else (conn,):
            hostkeys.secure_client(c.client, user_files=user_files, extra=self._extra_known_hosts)
        return conn

    def _open(self, conn: Connection) -> None:
        """Open ``conn`` (through its bastion first, hosts[].jump), each connection starting at its endpoint's
        connect rate (deployctl.hosts.startrate); ``_turn_waited``: the seconds it waited for its turns."""
        gateway = conn.gateway
        self._turn_waited = 0.0
        if isinstance(gateway, Connection):
            self._turn_waited += startrate.wait_turn(gateway.host, gateway.port, self.cfg.connect_rate)
            gateway.open()
        self._turn_waited += startrate.wait_turn(conn.host, conn.port, self.cfg.connect_rate)
        conn.open()

    def connection(self) -> Connection:
        """The open Connection; connects first if needed. Raises the connect errors of the module doc."""
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            self._drop()
            self._conn = self._open_retrying()
            conn = self._conn
            transport = conn.client.get_transport()
            if self.cfg.keepalive_interval_s > 0 and transport is not None:
                self._alive = Keepalive(transport, self.cfg.keepalive_interval_s, self.cfg.keepalive_count,
                                        host=self.host).start()
            return conn

    def _open_retrying(self) -> Connection:
        """Open a new Connection; a handshake the server dropped (deployctl.hosts.handshake) is tried again after a
        jittered exponential pause while hosts[].connect_timeout_s since the first try allows, each try waiting for
        the banner only as long as is left (the first try's wait for its turn at the connect rate not counted).
        ``connect_retries`` counts the retries (all connections of this transport). Raises the connect errors of the
        module doc."""
        deadline = time.monotonic() + float(self.cfg.connect_timeout_s)
        attempt = 0
        while True:
            conn = self._new_connection()
            left = deadline - time.monotonic()
            if attempt:  # the banner (and auth) wait no longer than the deadline
                conn.connect_kwargs.update(banner_timeout=max(0.5, left), auth_timeout=max(0.5, left))
            gateway = conn.gateway if isinstance(conn.gateway, Connection) else None
            try:
                self._open(conn)
                return conn
            except Exception as exc:
                bastion = gateway is not None and not gateway.is_connected  # the bastion's leg failed
                _close(conn)
                if not attempt:
                    deadline += self._turn_waited
                if gateway is not None and not bastion and isinstance(exc, paramiko.ChannelException):
                    raise jump.forward_refused(self.cfg, exc) from None
                leg, name = (gateway, jump.label(self.cfg)) if bastion else (conn, None)
                fix = jump.bastion_fix(self.cfg) if bastion else None
                if not handshake.is_dropped(exc):
                    raise connect_errors.connect_error(self.cfg, leg, exc, retries=attempt, name=name,
                                                        fix=fix) from None
                pause = handshake.pause_s(attempt)
                if time.monotonic() + pause + 0.5 > deadline:
                    raise connect_errors.connect_error(self.cfg, leg, exc, retries=attempt, dropped=True, name=name,
                                                        fix=fix) from None
                time.sleep(pause)
                attempt += 1
                self.connect_retries += 1

    def _drop(self) -> None:
        if self._alive is not None:
            self._alive.stop()
            self._alive = None
        if self._conn is not None:
            _close(self._conn)
            self._conn = None

    def _lost(self, exc: BaseException, command: str) -> HostError:
        if isinstance(exc, paramiko.ChannelException):
            return self._refused(exc, command)
        with self._lock:
            dead = self._alive.dead if self._alive is not None else None
            self._drop()
        if dead:
            return HostUnreachable(f"lost the SSH connection to {self.host} during `{short_command(command)}`: {dead}",
                                   host=self.host, command=command,
                                   fix=f"check that {self.host} is up and not hung (sshd answers), and the network "
                                       "path; a firewall that drops idle connections needs a keepalive_interval_s "
                                       "below its idle timeout")
        return HostUnreachable(f"lost the SSH connection to {self.host} during `{short_command(command)}`: "
                               f"{' '.join(str(exc).split()) or type(exc).__name__}", host=self.host,
                               command=command)

    def _refused(self, exc: "paramiko.ChannelException", command: str) -> RemoteCommandError:
        """The server refused to open a channel: with OpenSSH that is MaxSessions (sessions per connection)."""
        n = self.cfg.max_channels
        return RemoteCommandError(
            f"{self.host} refused to open an SSH channel for `{short_command(command)}` ({exc.text or exc}, code "
            f"{exc.code}): sshd's MaxSessions there is below hosts[].max_channels {n} (deployctl opens up to {n} "
            "sessions on one connection: one for SFTP, the rest for commands in parallel)", host=self.host,
            command=command, stderr_tail=str(exc),
            fix=f"set hosts[].max_channels for {self.host} to its sshd's MaxSessions or less (OpenSSH's default is "
                f"10), or raise MaxSessions in {self.host}'s sshd_config")

    def _channel(self, command: str, timeout: float) -> None:
        """Take a command channel (module doc): wait up to ``timeout`` seconds, else CommandTimeout naming the bound."""
        if not self._channels.acquire(timeout=max(timeout, 0.001)):
            n = self.cfg.max_channels
            raise CommandTimeout(
                f"`{short_command(command)}` on {self.host} waited {timeout:g} s for a free SSH channel and did not "
                f"run: all {n - 1} command channels of hosts[].max_channels {n} stayed busy", host=self.host,
                command=command, fix=f"raise hosts[].max_channels for {self.host} (at most its sshd's MaxSessions), "
                                     "or find out what holds the other commands")

    def login_user(self) -> str:
        return self._conn.user if self._conn else fabric_connection(self.cfg).user

    def close(self) -> None:
        with self._lock:
            self._drop()

    # -- commands ---------------------------------------------------------------------------------
    def exec(self, command: str, *, timeout: float, input: str | None, env: dict | None,
             on_stderr=None) -> RunResult:
        conn = self.connection()
        script = command
        if env:
            env_path = f"/tmp/.deployctl-env-{secrets.token_hex(8)}"
            body = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())
            self.write_bytes(env_path, body.encode(), mode=0o600, timeout=timeout)
            q = shlex.quote(env_path)
            script = f". {q} || {{ rm -f -- {q}; exit 97; }}; rm -f -- {q}\n{command}"
        if input is not None:
            # invoke feeds a non-tty stdin one byte per 10 ms: ship the input as a 0600 file instead.
            in_path = f"/tmp/.deployctl-in-{secrets.token_hex(8)}"
            self.write_bytes(in_path, input.encode(), mode=0o600, timeout=timeout)
            q = shlex.quote(in_path)
            script = f"exec < {q} || {{ rm -f -- {q}; exit 97; }}; rm -f -- {q}\n{script}"
        wrapped = (f"exec timeout -k {REMOTE_KILL_AFTER_S:g} {max(timeout, 0.001):.3f}s "
                   f"/bin/bash -c {shlex.quote(script)}")
        self._channel(command, timeout)
        start = time.monotonic()
        # stderr streamed line by line when asked (invoke writes what it does not hide to err_stream as it reads)
        sink = LineSink(on_stderr) if on_stderr is not None else None
        streams = {"hide": "out", "err_stream": sink} if sink is not None else {"hide": True}
        try:
            res = self._run_opening(conn, wrapped, timeout, streams)
        except CommandTimedOut as exc:
            raise self._timeout(command, timeout, exc.result.stderr) from None
        except paramiko.ChannelException as exc:
            raise self._refused(exc, command) from None
        except (ThreadException, OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc, command) from None
        finally:
            self._channels.release()  # invoke's run returns once the channel closed (or gave up on it)
            if sink is not None:
                sink.close()
        duration = time.monotonic() - start
        # 124: timeout's TERM worked; 137 or -1 (killed by a signal, no exit status): its group SIGKILL
        if res.exited in (124, 137, -1) and duration >= timeout - 0.05:
            raise self._timeout(command, timeout, res.stderr)
        if res.exited == -1 and not conn.is_connected:
            raise self._lost(EOFError("channel closed without an exit status"), command)
        return RunResult(self.host, command, res.exited, res.stdout, res.stderr, duration)

    def _run_opening(self, conn: Connection, wrapped: str, timeout: float, streams: dict):
        """``conn.run`` with its channel open retried while sshd refuses it for up to REFUSED_RETRY_S (or
        ``timeout``): OpenSSH frees a closed session's slot only when it collects the channel, on a later turn of its
        loop, so a channel opened right after another closed can be refused under MaxSessions although deployctl is
        within max_channels. Nothing ran on a refused channel, so trying again is safe. Raises ChannelException when
        sshd still refuses (then _refused names MaxSessions)."""
        deadline = time.monotonic() + min(REFUSED_RETRY_S, timeout)
        attempt = 0
        while True:
            try:
                return conn.run(wrapped, warn=True, pty=False, echo=False, in_stream=io.StringIO(""),
                                timeout=timeout + CLIENT_GRACE_S, **streams)
            except paramiko.ChannelException:
                pause = handshake.pause_s(attempt)
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                attempt += 1

    def _timeout(self, command: str, timeout: float, stderr: str) -> CommandTimeout:
        return CommandTimeout(f"`{short_command(command)}` on {self.host} timed out after {timeout:g} s and "
                              "was killed", host=self.host, command=command, stderr_tail=tail(stderr),
                              fix="raise the step's timeout or find out why it hangs")

    # -- files ------------------------------------------------------------------------------------
    def _sftp(self, timeout: float) -> paramiko.SFTPClient:
        sftp = self.connection().sftp()
        sftp.get_channel().settimeout(timeout)
        return sftp

    def _file_op(self, verb: str, path: str, timeout: float, fn):
        with self._lock:
            try:
                return self._on_sftp(fn, timeout)
            except HostError:
                raise
            except (socket.timeout, TimeoutError):
                raise CommandTimeout(f"{verb} {path} on {self.host} timed out after {timeout:g} s",
                                     host=self.host, command=f"{verb} {path}") from None
            except OSError as exc:
                if isinstance(exc, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError)):
                    raise self._lost(exc, f"{verb} {path}") from None
                raise RemoteCommandError(f"cannot {verb} {path} on {self.host}: {exc.strerror or exc}",
                                         host=self.host, command=f"{verb} {path}", stderr_tail=str(exc)) from None
            except (EOFError, paramiko.SSHException) as exc:
                raise self._lost(exc, f"{verb} {path}") from None

    def _on_sftp(self, fn, timeout: float):
        """``fn(sftp)``; once more on a fresh SFTP channel when the server closed this one while the connection lives
        (seen under MaxSessions on a loaded host: "Server connection dropped"). Whole-file operations: safe to repeat.
        Fabric memoizes its SFTP client in ``Connection._sftp``: forgetting it opens a new channel."""
        try:
            return fn(self._sftp(timeout))
        except (EOFError, paramiko.SSHException, OSError):
            conn = self._conn
            old = getattr(conn, "_sftp", None)
            if old is None or not old.get_channel().closed or conn.transport is None or not conn.transport.is_active():
                raise
            conn._sftp = None
            return fn(self._sftp(timeout))

    def _mkdirs(self, sftp: paramiko.SFTPClient, path: str) -> None:
        if path in ("", "/", "."):
            return
        try:
            sftp.stat(path)
            return
        except FileNotFoundError:
            pass
        self._mkdirs(sftp, posixpath.dirname(path))
        try:
            sftp.mkdir(path)
        except OSError:
            sftp.stat(path)  # created meanwhile is fine; anything else raises

    def write_bytes(self, remote: str, data: bytes, *, mode: int | None, timeout: float) -> None:
        def op(sftp):
            parent, base = posixpath.split(remote)
            self._mkdirs(sftp, parent)
            tmp = posixpath.join(parent, f".{base}.tmp-{secrets.token_hex(4)}")
            try:
                with sftp.open(tmp, "wb") as fh:
                    sftp.chmod(tmp, 0o600)  # before any byte is written
                    fh.write(data)
                sftp.chmod(tmp, 0o644 if mode is None else mode)
                sftp.posix_rename(tmp, remote)
            except BaseException:
                _quiet_remove(sftp, tmp)
                raise

        self._file_op("write", remote, timeout, op)

    def put_file(self, local: Path, remote: str, *, mode: int | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout

        def progress(_done: int, _total: int) -> None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"put took longer than {timeout:g} s")

        def op(sftp):
            parent, base = posixpath.split(remote)
            self._mkdirs(sftp, parent)
            tmp = posixpath.join(parent, f".{base}.tmp-{secrets.token_hex(4)}")
            try:
                with sftp.open(tmp, "wb"):
                    sftp.chmod(tmp, 0o600)
                sftp.put(str(local), tmp, callback=progress, confirm=True)
                sftp.chmod(tmp, (local.stat().st_mode & 0o777) if mode is None else mode)
                sftp.posix_rename(tmp, remote)
            except BaseException:
                _quiet_remove(sftp, tmp)
                raise

        self._file_op("put", remote, timeout, op)

    def get_file(self, remote: str, local: Path, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout

        def progress(_done: int, _total: int) -> None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"get took longer than {timeout:g} s")

        self._file_op("get", remote, timeout, lambda sftp: sftp.get(remote, str(local), callback=progress))

    def read_bytes(self, remote: str, *, timeout: float) -> bytes:
        def op(sftp):
            with sftp.open(remote, "rb") as fh:
                fh.prefetch()
                return fh.read()

        return self._file_op("read", remote, timeout, op)

    def exists(self, remote: str, *, timeout: float) -> bool:
        def op(sftp):
            try:
                sftp.stat(remote)
                return True
            except FileNotFoundError:
                return False

        return self._file_op("stat", remote, timeout, op)


def _close(conn: Connection) -> None:
    """Close ``conn`` and its bastion's connection (Fabric's close leaves a gateway open); never raises: closing a dead
    connection must not mask the real error."""
    for c in (conn, conn.gateway):
        if isinstance(c, Connection):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - see the docstring
                pass


def _quiet_remove(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except Exception:  # the temp file may not exist; the original error matters
        pass
