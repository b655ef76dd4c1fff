"""The runtime's GPU gauges on /metrics, from recorded NVML answers (tests/data/nvml; no GPU here): a real server
with the stand-in pynvml (tests/support/fake_nvml) first on its PYTHONPATH, read over HTTP."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
FAKE_NVML = TESTS / "support" / "fake_nvml"
FACTS = TESTS / "data" / "nvml" / "h100x2_serving.json"
P = "deployctl_runtime_"


def test_gpu_gauges_beside_kv_usage_for_the_visible_gpu_only(tiny_model, start_server, tmp_path):
    facts = tmp_path / "nvml.json"
    shutil.copy(FACTS, facts)
    srv = start_server(["--model", str(tiny_model), "--kv-cache-memory", "16MiB"],
                       env={"PYTHONPATH": str(FAKE_NVML), "DEPLOYCTL_TEST_NVML_FACTS": str(facts),
                            "CUDA_VISIBLE_DEVICES": "1"})
    m = srv.metrics()
    assert P + "kv_cache_usage_ratio" in m
    assert m[P + 'gpu_utilization_ratio{gpu="1"}'] == 0.87
    assert m[P + 'gpu_memory_used_bytes{gpu="1"}'] == 77199310848
    assert m[P + 'gpu_memory_total_bytes{gpu="1"}'] == 85520809984
    assert m[P + 'gpu_temperature_celsius{gpu="1"}'] == 64
    assert m[P + 'gpu_ecc_errors_total{gpu="1",type="corrected"}'] == 12
    assert m[P + 'gpu_ecc_errors_total{gpu="1",type="uncorrected"}'] == 0
    assert m[P + 'gpu_remapped_rows_pending{gpu="1"}'] == 0
    assert m[P + 'gpu_row_remap_failure{gpu="1"}'] == 0
    assert not any('gpu="0"' in k for k in m), "GPU 0 is not in CUDA_VISIBLE_DEVICES"
    assert not any("retired_pages_pending" in k for k in m), "NVML answers Not Supported on Hopper: no series"
    assert not any("xid_errors" in k for k in m), "no Xid event yet"
    assert "GPU metrics from NVML for GPU(s) 1" in srv.log

    # read at scrape time: the next scrape shows what NVML answers now, and each Xid event is counted once
    recorded = json.loads(facts.read_text())
    recorded["gpus"][1]["memory"]["used"] = 80000000000
    recorded["gpus"][1]["xid_events"] = [79]
    facts.write_text(json.dumps(recorded))
    m = srv.metrics()
    assert m[P + 'gpu_memory_used_bytes{gpu="1"}'] == 80000000000
    assert m[P + 'gpu_xid_errors_total{gpu="1",xid="79"}'] == 1
    assert srv.metrics()[P + 'gpu_xid_errors_total{gpu="1",xid="79"}'] == 1


def _fake_pynvml(monkeypatch, facts: Path):
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(facts))
    return module


def test_no_gpu_series_without_nvml_or_visible_gpus(monkeypatch, tmp_path):
    from deployctl_runtime.server.gpu_metrics import open_visible_gpus

    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    collector, why = open_visible_gpus({})
    assert collector is None and "not importable" in why
    _fake_pynvml(monkeypatch, FACTS)
    assert open_visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == (None, "CUDA_VISIBLE_DEVICES is empty")  # device cpu
    collector, why = open_visible_gpus({})  # unset: every GPU
    assert why == "GPU(s) 0,1" and sorted(collector.gpus) == [0, 1]
    uuid = json.loads(FACTS.read_text())["gpus"][1]["uuid"]
    assert sorted(open_visible_gpus({"CUDA_VISIBLE_DEVICES": uuid})[0].gpus) == [1]
    no_driver = tmp_path / "no_driver.json"
    no_driver.write_text(json.dumps({"init_error": 9, "gpus": []}))
    monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(no_driver))
    assert open_visible_gpus({}) == (None, "NVML: Driver Not Loaded")
