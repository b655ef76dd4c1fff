"""The runtime (``python -m deployctl_runtime``) on CPU for tests: the seeded tiny checkpoint and a served process
on a free loopback port (the bench and router tests share these)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from support.cli import repo_env
from support.paths import REPO

__all__ = ["make_tiny_model", "serve_runtime", "subprocess_env"]


def subprocess_env() -> dict[str, str]:
    """os.environ with both packages on PYTHONPATH and no API keys or proxies leaking in."""
    env = repo_env()
    for name in ("DEPLOYCTL_API_KEY", "OPENAI_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(name, None)
    return env


def make_tiny_model(directory: Path) -> Path:
    """The runtime's seeded tiny checkpoint in ``directory``/model."""
    model = directory / "model"
    made = subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(model)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stderr[-2000:]
    return model


@contextlib.contextmanager
def serve_runtime(model: Path, log_path: Path, *args: str, env: dict[str, str] | None = None,
                  ready_s: float = 180) -> Iterator[str]:
    """``python -m deployctl_runtime serve --model MODEL --device cpu ARGS`` on a free loopback port, its log in
    ``log_path``; yields the base URL once /readyz answers 200; terminates it on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    full_env = {**subprocess_env(), "OMP_NUM_THREADS": "1", **(env or {})}  # torch's spinning threads starve the loop
    log = open(log_path, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--model", str(model), "--port",
                             str(port), "--device", "cpu", *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            assert proc.poll() is None, f"runtime exited: {Path(log_path).read_text()[-3000:]}"
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"runtime not ready within {ready_s} s"
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
