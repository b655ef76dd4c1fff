"""Preflight's gpu_health check over recorded NVML answers (tests/data/nvml; no GPU here): the host probe's real
NVML code run against the stand-in pynvml (tests/support/fake_nvml), its facts judged by the real checks."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from deployctl.config import parse_config
from deployctl.hostscripts.probe import probe_nvidia
from deployctl.preflight import check_facts
from support.paths import DATA, REPO


FAKE_NVML = REPO / "tests" / "support" / "fake_nvml" / "pynvml.py"


@pytest.fixture
def nvml(monkeypatch):
    """nvml(name): the probe's ``nvidia`` section as NVML answers from tests/data/nvml/<name>.json."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)

    def probe(name: str) -> dict:
        monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(DATA / "nvml" / f"{name}.json"))
        monkeypatch.delenv("DEPLOYCTL_FAKE_GPU_MEMORY", raising=False)
        return probe_nvidia()

    return probe


def on_gpu(index: int = 0, device: str = "cuda"):
    """A deploy.yaml of test_preflight_checks' kind on GPU ``index`` of host gpu-a."""
    return parse_config(f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
engine: {{device: {device}, max_model_len: 8192}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, gpu: {index}, deploy_root: /opt/deployctl/chat-8b,
      python: /opt/deployctl/venv/bin/python}}
""")


def run(cfg, f: dict):
    rep = check_facts(cfg, [(cfg.hosts[0], f)], {})
    return rep, {c.name: c for c in rep.hosts[0].checks}


def host_facts(nvidia: dict) -> dict:
    """tests/data/facts/h200.json (a host that passes every check) with this ``nvidia`` section."""
    f = json.loads((DATA / "facts" / "h200.json").read_text())
    f["nvidia"] = nvidia
    return f


def test_probe_records_lost_gpus_and_pending_repairs(nvml):
    nv = nvml("h100x4_faults")
    assert nv["available"] and [g["index"] for g in nv["gpus"]] == [0, 1, 3]
    assert nv["gpu_errors"] == [{"index": 2, "error": "GPU is lost", "lost": True}]
    by = {g["index"]: g for g in nv["gpus"]}
    assert by[0]["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert by[1]["remapped_rows"]["pending"] is True and by[3]["remapped_rows"]["failure"] is True
    assert by[0]["retired_pages_pending"] is None  # Hopper: Not Supported


@pytest.mark.parametrize("gpu, words, fix", [
    (1, ["GPU 1 (NVIDIA H100 80GB HBM3) on gpu-a: a row remap is pending (1 row(s) remapped"],
     "nvidia-smi -r -i 1"),
    (2, ["GPU 2 on gpu-a has fallen off the bus (NVML: GPU is lost)"], "reboot gpu-a"),
    (3, ["GPU 3 (NVIDIA H100 80GB HBM3) on gpu-a: a row remap failed (no spare rows)"], "have it replaced (RMA)"),
])
def test_service_gpu_with_pending_repair_or_off_the_bus_fails(nvml, gpu, words, fix):
    cfg = on_gpu(gpu)
    rep, checks = run(cfg, host_facts(nvml("h100x4_faults")))
    c = checks["gpu_health"]
    assert c.status == "fail" and not rep.ok, c
    assert all(w in c.message for w in words), c.message
    assert fix in c.fix


def test_healthy_service_gpu_passes_and_a_lost_neighbour_warns(nvml):
    rep, checks = run(on_gpu(0), host_facts(nvml("h100x4_faults")))
    c = checks["gpu_health"]
    assert c.status == "warn" and "GPU 2 on gpu-a has fallen off the bus" in c.message, c
    _, checks = run(on_gpu(1), host_facts(nvml("h100x2_serving")))
    assert checks["gpu_health"].status == "pass"
    _, checks = run(on_gpu(2, "cpu"), host_facts(nvml("h100x4_faults")))
    assert checks["gpu_health"].message == "skipped: device is cpu"
