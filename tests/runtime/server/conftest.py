"""Fixtures for the server tests: a tiny checkpoint and real `deployctl-runtime serve` processes on loopback."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[3] / "runtime"
PORT_LINE = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """`python -m deployctl_runtime serve ... --port 0` in a subprocess; stderr is collected in `log`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, key: str | None = None):
        # one intra-op thread: on a shared 2-core CI box, torch's spinning OpenMP threads cost 10-20x CPU per step
        full_env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNTIME_DIR), full_env.get("PYTHONPATH", "")) if p)
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

    def wait_metrics(self, predicate, timeout: float = 2.0) -> dict[str, float]:
        """Poll /metrics until predicate(metrics) holds; return the last metrics (the caller asserts)."""
        deadline = time.monotonic() + timeout
        m = self.metrics()
        while not predicate(m) and time.monotonic() < deadline:
            time.sleep(0.05)
            m = self.metrics()
        return m

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
def tiny_model(tiny_llama) -> Path:
    """The runtime's tiny Llama checkpoint (tests/runtime/conftest.py), with its manifest.sha256."""
    return tiny_llama


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


def running(args: list[str], *, clean_exit: bool = False, **kw):
    """For a fixture: ``yield from running([...])`` starts ``ServerProcess(args, **kw)``, yields it once ready and
    stops it after the tests (asserting exit 0 when ``clean_exit``)."""
    srv = ServerProcess(args, **kw)
    try:
        yield srv.wait_ready()
    finally:
        code = srv.stop()
        if clean_exit:
            assert code == 0, srv.log


@pytest.fixture(scope="session")
def api_server(tiny_model):
    """One plain server (served name "tiny", max_model_len 1024) shared by the API-surface test modules."""
    yield from running(["--model", str(tiny_model), "--max-model-len", "1024", "--kv-cache-memory", "16MiB",
                        "--served-model-name", "tiny"])


@pytest.fixture(scope="session")
def api_client(api_server):
    import openai

    return openai.OpenAI(base_url=api_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


OVERFLOW_TOKEN = 1023  # overflow_token_model's logits are NaN for any prompt holding this token id


@pytest.fixture(scope="session")
def overflow_token_model(tiny_model, tmp_path_factory) -> Path:
    """The tiny Llama with finite weights whose float32 activations overflow on one token (OVERFLOW_TOKEN) and
    nowhere else: that token's embedding is 1000 along hidden dimension 0 (every other token's is 0 there, and
    layer 0's attention writes nothing into it), layer 0's MLP squares dimension 0 through one intermediate unit
    and writes it back times 1e36. At that token the residual becomes inf (NaN logits from there on, for the
    positions after it too); elsewhere the unit adds 0. A stand-in for a float16 overflow on some prompts that
    passes the warm-up's check (token 0)."""
    from safetensors.torch import load_file, save_file

    from deployctl_runtime.tiny_model import write_manifest

    out = tmp_path_factory.mktemp("overflow") / "llama-overflow-on-token"
    shutil.copytree(tiny_model, out)
    w = load_file(str(out / "model.safetensors"))
    emb = w["model.embed_tokens.weight"]
    emb[:, 0] = 0
    emb[OVERFLOW_TOKEN] = 0
    emb[OVERFLOW_TOKEN, 0] = 1000
    w["model.layers.0.self_attn.o_proj.weight"][0, :] = 0
    w["model.layers.0.post_attention_layernorm.weight"][0] = 1
    gate, up, down = (w[f"model.layers.0.mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    gate[0], up[0] = 0, 0
    gate[0, 0], up[0, 0] = 10, 10
    down[:, 0] = 1e36
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / ".deployctl-verify-cache.json").unlink(missing_ok=True)
    write_manifest(out)
    return out
