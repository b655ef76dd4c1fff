"""C29: a model without a chat template deploys. The tiny model with chat_template removed from
tokenizer_config.json (manifest re-hashed): preflight warns and advises /v1/completions, and the deploy on two local
hosts verifies through /v1/completions (saying so) and succeeds, where verification used to send a chat request
that the runtime refuses (400 no_chat_template) and every deploy aborted."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import yaml

pytestmark = pytest.mark.slow


def _no_template_model(src, dst):
    shutil.copytree(src, dst)
    tc = dst / "tokenizer_config.json"
    doc = json.loads(tc.read_text())
    assert doc.pop("chat_template", None), "the tiny model was expected to carry a chat template"
    tc.write_text(json.dumps(doc))
    lines = []
    for line in (dst / "manifest.sha256").read_text().splitlines():
        _, name = line.split(None, 1)
        lines.append(f"{hashlib.sha256((dst / name).read_bytes()).hexdigest()}  {name}")
    (dst / "manifest.sha256").write_text("\n".join(lines) + "\n")
    return dst


def _cli(path, *args, env):
    return subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(path)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def test_c29_model_without_chat_template_deploys(tmp_path, rollout_model, rollout_cache, rollout_python):
    from support.ports import free_port

    model = _no_template_model(rollout_model, tmp_path / "tiny-nochat")
    ports = [free_port(), free_port()]
    cfg = {
        "service": {"name": "nochat"},
        "model": {"path": str(model), "served_name": "tiny-nochat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"startup_timeout_s": 90},
        "hosts": [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "launcher": "process",
                   "python": rollout_python, "server_port": p} for n, p in zip(("a", "b"), ports)],
    }
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"DEPLOYCTL_CACHE": str(rollout_cache), "DEPLOYCTL_SKIP_PREFLIGHT": "1", "DEPLOYCTL_VERIFY_TIMEOUT_S": "90"}
    try:
        r = _cli(path, "preflight", env=env)
        out = r.stdout + r.stderr
        assert "no chat template" in out and "/v1/completions" in out, out

        r = _cli(path, "deploy", "--yes", env=env)
        assert r.returncode == 0, r.stderr
        # verification says which endpoint it used, on both hosts
        for n in ("a", "b"):
            assert f"{n}: ready in" in r.stderr
        assert r.stderr.count("via /v1/completions (the model has no chat template)") == 2, r.stderr
        for p in ports:  # the deployed runtimes really serve completions (and refuse chat, as advised)
            c = httpx.post(f"http://127.0.0.1:{p}/v1/completions", timeout=30,
                           json={"model": "tiny-nochat", "prompt": "Hi", "max_tokens": 2})
            assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] >= 1
            chat = httpx.post(f"http://127.0.0.1:{p}/v1/chat/completions", timeout=30,
                              json={"model": "tiny-nochat", "messages": [{"role": "user", "content": "Hi"}]})
            assert chat.status_code == 400 and chat.json()["error"]["code"] == "no_chat_template"
    finally:
        for n in ("a", "b"):
            pidf = tmp_path / n / "shared" / "run" / "runtime.pid"
            try:
                os.killpg(int(pidf.read_text().strip()), 9)
            except (OSError, ValueError):
                pass
