"""A real nginx (Debian's) for router tests: own prefix, own port on 127.0.0.1 (tests/conftest.py imports it).

``nginx_server(main_conf=None) -> Nginx``: a prefix directory (``logs/``, ``tmp/``), a free port
(``Nginx.port``, for router.listen) and the paths a deploy.yaml ``router:`` needs (``include`` for
upstream_conf, ``conf`` for nginx_conf, ``access_log``). ``main_conf`` is the text of nginx.conf
(e.g. render.render_nginx_main); by default a minimal one that includes ``Nginx.include`` inside
``http {}``, with pid, error_log and the five temp paths under the prefix (../shared/notes/test-fleet.md).
Write the include, then ``start()``; ``reload()`` returns once a new worker runs; stopped after the test.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

from fleet_sshd import _children, _free_port

__all__ = ["nginx_server", "Nginx"]

TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def _nginx_binary() -> Optional[str]:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "shutting down"  # exited


class Nginx:
    """One nginx master started with ``-p prefix -c conf`` in the foreground (``daemon off``)."""

    def __init__(self, binary: str, prefix: Path, main_conf: Optional[str]):
        self.binary = binary
        self.prefix = prefix
        self.port = _free_port()
        self.conf = prefix / "nginx.conf"
        self.include = prefix / "conf.d" / "deployctl-upstream.conf"
        self.access_log = prefix / "logs" / "access.log"
        self.error_log = prefix / "logs" / "error.log"
        self.proc: Optional[subprocess.Popen] = None
        for sub in ["logs", "conf.d"] + [f"tmp/{d}" for d in TEMP_DIRS]:
            (prefix / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(main_conf if main_conf is not None else self.default_main_conf())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def default_main_conf(self) -> str:
        temps = "\n".join(f"    {d}_temp_path {self.prefix}/tmp/{d};" for d in TEMP_DIRS)
        return (f"worker_processes 1;\npid {self.prefix}/nginx.pid;\nerror_log {self.error_log} warn;\n"
                f"events {{ worker_connections 256; }}\nhttp {{\n{temps}\n"
                f"    access_log {self.access_log};\n    include {self.include};\n}}\n")

    def _cmd(self, *extra: str) -> list[str]:
        return [self.binary, "-p", str(self.prefix), "-c", str(self.conf), *extra]

    def test(self) -> subprocess.CompletedProcess:
        """``nginx -t`` on the current files: returncode 0 when valid; the reason in stderr."""
        return subprocess.run(self._cmd("-t", "-q"), capture_output=True, text=True, timeout=30)

    def start(self, timeout: float = 10) -> None:
        """Start nginx and wait until its port accepts connections. Raises RuntimeError with nginx's error."""
        if not self.include.exists():
            self.include.write_text("")
        daemon = [] if "daemon" in self.conf.read_text() else ["-g", "daemon off;"]
        self.proc = subprocess.Popen(self._cmd(*daemon), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"nginx did not listen on {self.port} within {timeout} s")

    def reload(self, timeout: float = 10) -> None:
        """``nginx -s reload``; returns once a new worker runs and every old worker has stopped accepting
        (exited, or titled "is shutting down"), so the next new connection sees the new config."""
        before = set(_children(self.proc.pid))
        subprocess.run(self._cmd("-s", "reload"), check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = set(_children(self.proc.pid))
            if now - before and all(_title(pid).endswith("shutting down") for pid in now & before):
                return
            time.sleep(0.02)
        raise RuntimeError(f"nginx did not start a new worker within {timeout} s of reload")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None


@pytest.fixture
def nginx_server():
    """Factory: ``nginx_server(main_conf=None) -> Nginx`` (not started; call ``.start()``)."""
    binary = _nginx_binary()
    if binary is None:
        pytest.skip("nginx is not installed (tests/setup.sh installs it)")
    root = Path(tempfile.mkdtemp(prefix="deployctl-nginx-", dir="/tmp"))
    os.chmod(root, 0o755)  # workers run as nobody when the master is root
    servers: list[Nginx] = []

    def factory(main_conf: Optional[str] = None) -> Nginx:
        prefix = root / f"nginx{len(servers)}"
        prefix.mkdir()
        os.chmod(prefix, 0o755)
        server = Nginx(binary, prefix, main_conf)
        servers.append(server)
        return server

    try:
        yield factory
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
