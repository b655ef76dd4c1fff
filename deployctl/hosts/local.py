"""The transport for ``address: local``: bash in a new process group via subprocess, files via os.

A command that outlives its timeout gets SIGTERM on its whole process group, then SIGKILL 0.5 s later.
env values go in the child's environment (never on its command line).
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from deployctl.hosts.base import CommandTimeout, LineSink, RemoteCommandError, RunResult, short_command, tail

KILL_GRACE_S = 0.5


def _text(data) -> str:
    return data if isinstance(data, str) else (data or b"").decode(errors="replace")


class _StderrReader(threading.Thread):
    """A command's stderr, read line by line as it comes: each line to ``on_line`` (LineSink) and kept in
    ``parts``."""

    def __init__(self, stream, on_line):
        super().__init__(name="deployctl-stderr", daemon=True)
        self.stream, self.sink, self.parts = stream, LineSink(on_line), []

    def run(self) -> None:
        try:
            for raw in iter(self.stream.readline, b""):
                line = raw.decode(errors="replace")
                self.parts.append(line)
                self.sink.write(line)
        except (OSError, ValueError):  # the stream closed under us (a killed command's descendants)
            pass
        finally:
            self.sink.close()


class LocalTransport:
    """Runs on this machine. ``host`` is the deploy.yaml name used in results and errors."""

    def __init__(self, host: str):
        self.host = host

    def login_user(self) -> str:
        return "root" if os.geteuid() == 0 else getpass.getuser()

    def exec(self, command: str, *, timeout: float, input: str | None, env: dict | None,
             on_stderr=None) -> RunResult:
        child_env = dict(os.environ, **env) if env else None
        start = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/bash", "-c", command], stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env, start_new_session=True)
        reader = self._stream_stderr(proc, on_stderr) if on_stderr is not None else None
        try:
            out, err = proc.communicate(input.encode() if input is not None else None, timeout=timeout)
            if reader is not None:  # a descendant that keeps stderr open: what came within the timeout
                reader.join(timeout=max(0.1, start + timeout - time.monotonic()))
                err = "".join(reader.parts)
        except subprocess.TimeoutExpired:
            out, err = self._kill_group(proc)
            if reader is not None:
                reader.join(timeout=1)
                err = "".join(reader.parts)
            raise CommandTimeout(
                f"`{short_command(command)}` on {self.host} timed out after {timeout:g} s and was killed",
                host=self.host, command=command, remote_status=None, stderr_tail=tail(_text(err)),
                fix="raise the step's timeout or find out why it hangs") from None
        return RunResult(self.host, command, proc.returncode, _text(out), _text(err), time.monotonic() - start)

    @staticmethod
    def _stream_stderr(proc: subprocess.Popen, on_line) -> "_StderrReader":
        """Read ``proc``'s stderr in a thread, each line to ``on_line`` as it comes (communicate() then sees none)."""
        reader = _StderrReader(proc.stderr, on_line)
        proc.stderr = None
        reader.start()
        return reader

    @staticmethod
    def _kill_group(proc: subprocess.Popen) -> tuple[str, str]:
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 1.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = proc.communicate(timeout=grace)
                return _text(out), _text(err)
            except subprocess.TimeoutExpired:
                continue
        # A descendant that left the group still holds our pipes: stop waiting for them.
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
        proc.wait(timeout=1)
        return "", ""

    # -- files ------------------------------------------------------------------------------------
    def _atomic(self, verb: str, remote: str, fill, mode: int) -> None:
        """Write ``remote`` through a 0600 temp file in its directory (``fill(fd, tmp)`` writes it), chmod ``mode``,
        rename over ``remote``. Raises RemoteCommandError."""
        target = Path(remote)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # 0600
            try:
                fill(fd, tmp)
                os.chmod(tmp, mode)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise self._file_error(verb, remote, exc) from None

    def write_bytes(self, remote: str, data: bytes, *, mode: int | None, timeout: float) -> None:
        def fill(fd: int, tmp: str) -> None:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)

        self._atomic("write", remote, fill, 0o644 if mode is None else mode)

    def put_file(self, local: Path, remote: str, *, mode: int | None, timeout: float) -> None:
        def fill(fd: int, tmp: str) -> None:
            os.close(fd)
            shutil.copyfile(local, tmp)

        try:
            mode = (Path(local).stat().st_mode & 0o777) if mode is None else mode
        except OSError as exc:
            raise self._file_error("put", remote, exc) from None
        self._atomic("put", remote, fill, mode)

    def get_file(self, remote: str, local: Path, *, timeout: float) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as exc:
            raise self._file_error("get", remote, exc) from None

    def read_bytes(self, remote: str, *, timeout: float) -> bytes:
        try:
            return Path(remote).read_bytes()
        except OSError as exc:
            raise self._file_error("read", remote, exc) from None

    def exists(self, remote: str, *, timeout: float) -> bool:
        return os.path.exists(remote)

    def close(self) -> None:
        pass

    def _file_error(self, verb: str, path: str, exc: OSError) -> RemoteCommandError:
        return RemoteCommandError(f"cannot {verb} {path} on {self.host}: {exc.strerror or exc}",
                                  host=self.host, command=f"{verb} {path}", stderr_tail=str(exc))

