"""The runtime (``python -m deployctl_runtime``) on CPU for tests: the seeded tiny checkpoint and a served process
on a free loopback port, and the session fixture ``slow_tiny_runtime`` (the bench and router tests share these)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from support.cli import repo_env
from support.paths import REPO

__all__ = ["make_tiny_model", "serve_runtime", "slow_tiny_runtime", "subprocess_env"]


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
                  ready_s: float = 180, port: int | None = None) -> Iterator[str]:
    """``python -m deployctl_runtime serve --model MODEL --device cpu ARGS`` on ``port`` (default a free loopback
    port), its log in ``log_path``; yields the base URL once /readyz answers 200; terminates it on exit."""
    if port is None:
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


TOKEN_DELAY_MS = 30  # per output token: streams last long enough to overlap and to show their spacing


@pytest.fixture(scope="session")
def slow_tiny_runtime(tmp_path_factory):
    """One runtime for the router and bench tests: the tiny model on CPU, max_num_seqs 8, TOKEN_DELAY_MS per token,
    served as "model". Yields {"url", "port", "model"}."""
    base = tmp_path_factory.mktemp("slow-tiny-runtime")
    model = make_tiny_model(base)
    with serve_runtime(model, base / "serve.log", "--max-num-seqs", "8",
                       env={"DEPLOYCTL_RUNTIME_FAULT": f"token_delay_ms={TOKEN_DELAY_MS}"}) as url:
        yield {"url": url, "port": int(url.rsplit(":", 1)[1]), "model": model}
