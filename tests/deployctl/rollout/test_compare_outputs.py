"""`deployctl compare-outputs`, the golden-output check the k8s-rollout AnalysisTemplate's Job runs: a real runtime
on CPU with the tiny model answers the golden prompts; the same release agrees with itself (exit 0), a canary that
does not answer fails (exit 1). One server for the module."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.cli import run_cli
from support.render import write_config
from support.runbook_fleet import make_tiny_model

ROOT = Path(__file__).resolve().parents[3]
PORT_LINE = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
KEY = "sk-compare-outputs-test"


@pytest.fixture(scope="module")
def runtime_url(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DEPLOYCTL_RUNTIME_API_KEY": KEY,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--port", "0", "--model", str(model),
                             "--max-model-len", "128", "--kv-cache-memory", "8MiB", "--served-model-name", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    lines, port = [], []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            m = PORT_LINE.search(line)
            if m:
                port.append(int(m.group(1)))

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if port:
                try:
                    if httpx.get(f"http://127.0.0.1:{port[0]}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        else:
            raise AssertionError("runtime did not become ready:\n" + "".join(lines))
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def deploy_yaml(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The capital of France is"}\n{"prompt": "One, two, three,"}\n')
    return write_config(tmp_path / "deploy.yaml", model={"path": "/models/tiny", "served_name": "tiny"},
                        rollout={"analysis": {"outputs": {"prompts": str(prompts), "max_tokens": 6, "timeout_s": 30}}})


def test_the_same_release_agrees_with_itself(runtime_url, deploy_yaml):
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", runtime_url, "--stable-url", runtime_url,
                "--no-chat", "--json", env={"LLM_API_KEY": KEY})
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    report = json.loads(r.stdout)
    assert (report["result"], report["mode"], report["compared"], report["identical"]) == ("pass", "exact", 2, 2)


def test_a_canary_that_does_not_answer_fails(runtime_url, deploy_yaml):
    from support.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", dead, "--stable-url", runtime_url,
                "--no-chat", env={"LLM_API_KEY": KEY})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "golden outputs" in r.stderr


def test_a_bad_mode_is_a_usage_error(deploy_yaml):
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", "http://a:1", "--stable-url", "http://b:1",
                "--mode", "fuzzy")
    assert r.returncode == 2 and "--mode 'fuzzy' is not exact, prefix or skip" in r.stderr
