"""No API key outside the 0600 env file after a run of an engine that logs its arguments (issue 26).

SGLang takes its key only as ``--api-key`` (deployctl adds it inside the process: engine_main.py) and logs its whole
``server_args``, key included, from the main process and again from its schedulers. The engine here is a stand-in
that does the same on CPU: a real sglang release is rendered (engine_main.py, launch.sh, runtime.env) for a
process-launcher host (``nvidia-smi`` a stub listing one GPU), and the release's engine interpreter runs a ``sglang.launch_server`` module that parses its
argv, logs ``server_args=ServerArgs(..., api_key='...')`` on stderr, prints its argv on stdout, has a child process
log the arguments again, writes the key across two writes, serves /health, and on SIGTERM logs once more before it
exits. After start, readiness and stop, every file under the host's deploy_root but runtime.env is read for the key.
"""
from __future__ import annotations

import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deployctl.config import HostConfig
from deployctl.hosts import Host
from deployctl.render import render_release
from deployctl.service.engine import Engine
from support.ports import free_port
from support.render import make_config

KEY = "sk-standin-SECRET-0123456789abcdefXYZ"

STANDIN = r'''
"""Stand-in for sglang.launch_server: logs its arguments the way SGLang does."""
import argparse, dataclasses, http.server, logging, signal, subprocess, sys, threading, time

logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")  # stderr, like SGLang's logger
p = argparse.ArgumentParser()
p.add_argument("--model-path"); p.add_argument("--port", type=int); p.add_argument("--api-key")
args, _ = p.parse_known_args()

@dataclasses.dataclass
class ServerArgs:
    model_path: str
    port: int
    api_key: str

server_args = ServerArgs(args.model_path, args.port, args.api_key)
print("argv:", " ".join(sys.argv), flush=True)
logging.info(f"server_args={server_args}")
subprocess.run([sys.executable, "-c", "import sys; print('scheduler TP0: server_args api_key=' + sys.argv[1]); "
                "sys.stderr.write('scheduler TP0 stderr ' + sys.argv[1] + '\\n')", args.api_key], check=True)
sys.stdout.write("split key: " + args.api_key[:7]); sys.stdout.flush(); time.sleep(0.3)
sys.stdout.write(args.api_key[7:] + " end\n"); sys.stdout.flush()

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), H)

def on_term(*_):
    logging.info(f"SIGTERM received. Draining requests and shutting down... server_args={server_args}")
    threading.Thread(target=srv.shutdown).start()

signal.signal(signal.SIGTERM, on_term)
print("The server is fired up and ready to roll!", flush=True)
srv.serve_forever()
logging.info("stopped")
'''


HF_TOKEN = "hf_standinTOKEN0123456789abcdefghij"


@pytest.fixture
def sglang_standin(tmp_path, monkeypatch):
    yield from _standin(tmp_path, monkeypatch, {})


@pytest.fixture
def sglang_standin_env(tmp_path, monkeypatch):
    """The same, with deploy.yaml's engine.env, engine.secret_env (HF_TOKEN from deployctl's environment) and
    engine.cache_dir."""
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    extra = {"env": {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "1"}, "secret_env": ["HF_TOKEN"],
             "cache_dir": str(tmp_path / "cache" / "engine")}
    yield from _standin(tmp_path, monkeypatch, extra)


def _standin(tmp_path, monkeypatch, engine_extra: dict):
    root = tmp_path / "root"
    port = free_port()
    cfg = make_config(
        model={"path": str(tmp_path / "model"), "served_name": "m"},
        engine={"kind": "sglang", "version": "0.5.23", "device": "cuda", "tensor_parallel_size": 1, **engine_extra},
        server={"bind": "127.0.0.1", "startup_timeout_s": 60, "drain_timeout_s": 5},
        hosts=[{"name": "h", "address": "local", "deploy_root": str(root), "python": sys.executable,
                "launcher": "process", "gpus": [0], "server_port": port}])
    rel = root / "releases" / "r1"
    rel.mkdir(parents=True)
    for f in render_release(cfg, cfg.hosts[0], "r1", api_key=KEY):
        (rel / f.path).write_text(f.content)
        (rel / f.path).chmod(f.mode)
    (root / "current").symlink_to("releases/r1")
    pkg = tmp_path / "standin" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.5.23'\n")
    (pkg / "launch_server.py").write_text(STANDIN)
    engine_bin = rel / "engine" / "bin"
    engine_bin.mkdir(parents=True)
    (engine_bin / "python").write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'standin'} exec {sys.executable} \"$@\"\n")
    (engine_bin / "python").chmod(0o755)
    stubs = tmp_path / "stubs"  # the GPU stand-in: launch.sh waits for `nvidia-smi -i 0 -L` before the start
    stubs.mkdir()
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n")
    (stubs / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
    host = Host.from_config(HostConfig(name="h", address="local", deploy_root=str(root), launcher="process",
                                       python=sys.executable, gpus=[0]))
    yield cfg, host, root, port
    Engine(host, cfg).stop(timeout=5)
    host.close()


def _wait_health(port: int, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the stand-in never answered /health on {port}")


def _wait_last_words(root: Path, deadline_s: float = 15) -> None:
    """Until the stand-in's last line ("stopped", written after its SIGTERM handler's) is in a log: the scrubber
    outlives the engine and may be behind it on a busy machine."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if any(b"] stopped\n" in p.read_bytes() for p in root.rglob("*.log") if p.is_file()):
            return
        time.sleep(0.1)


def test_the_key_reaches_the_engine_but_no_file_the_run_wrote(sglang_standin):
    cfg, host, root, port = sglang_standin
    Engine(host, cfg).start()
    _wait_health(port)
    child = int((root / "shared" / "run" / "runtime.child.pid").read_text())
    assert KEY.encode() not in Path(f"/proc/{child}/cmdline").read_bytes()  # not on the command line (ps)
    assert Engine(host, cfg).stop() == "stopped"
    _wait_last_words(root)  # the scrubber writes the engine's last lines once the engine is gone
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    leaked = [str(p.relative_to(root)) for p in files if p.name != "runtime.env" and KEY.encode() in p.read_bytes()]
    assert not leaked, f"the API key is in {leaked}"
    assert oct((root / "releases" / "r1" / "runtime.env").stat().st_mode & 0o777) == "0o600"
    log = next(p for p in files if p.name.endswith(".log") and b"server_args" in p.read_bytes()).read_text()
    # the engine got the key (it logged it: the scrubber replaced every occurrence, its children's included)
    assert "server_args=ServerArgs(model_path=" in log and "api_key='<redacted>'" in log, log[-3000:]
    assert "launch_server.py --model-path" in log and "--api-key <redacted>" in log
    assert "scheduler TP0: server_args api_key=<redacted>" in log and "scheduler TP0 stderr <redacted>" in log
    # a key split across two writes: the scrubber holds back the key's first 7 bytes until the rest comes, so no
    # part of it is written; the engine's stdout and stderr are two pipes, so a line the other stream wrote in the
    # meantime may stand between "split key: " and the rest (as it may when a busy machine delays the scrubber)
    assert KEY[:7] not in log and re.search(r"split key: .*?<redacted> end", log, re.S), log[-3000:]
    assert "Draining requests and shutting down... server_args=ServerArgs" in log  # its last words, scrubbed
    assert "The server is fired up and ready to roll!" in log


def test_engine_env_secrets_and_cache_dir_reach_the_engine_and_the_secret_no_other_file(sglang_standin_env, tmp_path):
    cfg, host, root, port = sglang_standin_env
    Engine(host, cfg).start()
    _wait_health(port)
    child = int((root / "shared" / "run" / "runtime.child.pid").read_text())
    environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{child}/environ").read_text().split("\0") if "=" in kv)
    cache = str(tmp_path / "cache" / "engine")
    assert environ["HF_TOKEN"] == HF_TOKEN and environ["NCCL_DEBUG"] == "WARN" and environ["HF_HUB_OFFLINE"] == "1"
    assert environ["XDG_CACHE_HOME"] == cache and environ["HF_HOME"] == f"{cache}/huggingface"
    assert environ["VLLM_CACHE_ROOT"] == f"{cache}/vllm" and environ["TRITON_CACHE_DIR"] == f"{cache}/triton"
    assert environ["TORCHINDUCTOR_CACHE_DIR"] == f"{cache}/torchinductor"
    assert Path(cache).is_dir()  # launch.sh made it before the start
    assert HF_TOKEN.encode() not in Path(f"/proc/{child}/cmdline").read_bytes()
    assert Engine(host, cfg).stop() == "stopped"
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    leaked = [str(p.relative_to(root)) for p in files if p.name != "runtime.env" and HF_TOKEN.encode() in p.read_bytes()]
    assert not leaked, f"HF_TOKEN is in {leaked}"
    assert f"HF_TOKEN={HF_TOKEN}" in (root / "releases" / "r1" / "runtime.env").read_text()
