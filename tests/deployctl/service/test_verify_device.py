"""C28, deploy side: verification fails a release that asked for cuda and runs on cpu (recorded /readyz facts)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from deployctl.config import parse_config
from deployctl.errors import HealthError
from deployctl.service import verify
from deployctl.service.engine import Engine
from deployctl.service.http import HttpResult

CPU_READYZ = {"status": "ready", "detail": "serving", "model": "m", "device": "cpu", "device_name": "AMD EPYC 7B13",
              "dtype": "float32", "kv_cache": {"num_blocks": 2048, "block_size": 16, "num_tokens": 32768}}
H200_READYZ = {**CPU_READYZ, "device": "cuda", "device_name": "NVIDIA H200", "dtype": "bfloat16"}


def _cfg(tmp_path, device: str):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return parse_config(f"""
service: {{name: svc}}
model: {{path: {model}}}
engine: {{device: {device}}}
hosts: [{{name: a, address: local, deploy_root: {tmp_path}/root, launcher: process}}]
""")


@pytest.fixture
def readyz(monkeypatch):
    answers = {}
    monkeypatch.setattr(Engine, "http", lambda self, method, path, body=None, timeout=10: answers["r"])
    monkeypatch.setattr(verify.launcher, "log_tail", lambda host, lines: "")
    return lambda body: answers.update(r=HttpResult(200, {}, json.dumps(body)))


HOST = SimpleNamespace(name="a", config=SimpleNamespace(deploy_root="/srv/svc"))


def test_a_cuda_release_running_on_cpu_fails_verification(tmp_path, readyz):
    readyz(CPU_READYZ)
    with pytest.raises(HealthError) as exc:
        Engine(HOST, _cfg(tmp_path, "cuda")).wait_ready(timeout=5)
    assert "runs on cpu (AMD EPYC 7B13" in str(exc.value) and "engine.device cuda" in str(exc.value)


@pytest.mark.parametrize("device,facts", [("cuda", H200_READYZ), ("cpu", CPU_READYZ),
                                          ("cuda", {"status": "ready"})])  # an older runtime says nothing
def test_the_device_asked_for_passes(tmp_path, readyz, device, facts):
    readyz(facts)
    assert Engine(HOST, _cfg(tmp_path, device)).wait_ready(timeout=5) >= 0
