"""Fixtures for the server tests: a tiny checkpoint and real `deployctl-runtime serve` processes on loopback."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

PORT_LINE = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """`python -m deployctl_runtime serve ... --port 0` in a subprocess; stderr is collected in `log`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, key: str | None = None):
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, text=True)
        self.lines: list[str] = []
        self.port: int | None = None
        self._port_seen = threading.Event()
        self.key = key
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = PORT_LINE.search(line)
            if m:
                self.port = int(m.group(1))
                self._port_seen.set()
        self._port_seen.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def wait_port(self, timeout: float = 60) -> "ServerProcess":
        if not self._port_seen.wait(timeout) or self.port is None:
            raise AssertionError(f"server did not bind within {timeout}s:\n{self.log}")
        return self

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        self.wait_port(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready within {timeout}s:\n{self.log}")

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture
def start_server():
    """Factory: start_server(args, env=None, key=None, ready=True) -> ServerProcess; all are stopped at teardown."""
    started: list[ServerProcess] = []

    def start(args: list[str], env: dict[str, str] | None = None, key: str | None = None, ready: bool = True):
        srv = ServerProcess(args, env, key)
        started.append(srv)
        return srv.wait_ready() if ready else srv

    yield start
    for srv in started:
        srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM, timeout=10)
