"""residency.resident_bytes on CUDA (what /sleep and /is_sleeping answer as resident_bytes): no GPU here, so the GPU
alone is stood in for: torch's allocator figure (torch.cuda.memory_reserved) is patched and NVML answers from
recorded facts (tests/support/fake_nvml). The mapping from the CUDA device to NVML's index, and which figure wins,
are the real code's."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from deployctl_runtime.server.residency import resident_bytes

TESTS = Path(__file__).resolve().parents[2]
FAKE_NVML = TESTS / "support" / "fake_nvml"
GiB = 2**30


def _ctx(device: str = "cuda") -> SimpleNamespace:
    runner = SimpleNamespace(device=torch.device("cuda", 0) if device == "cuda" else torch.device("cpu"))
    return SimpleNamespace(ledger=None, cfg=SimpleNamespace(device=device),
                           engine=SimpleNamespace(engine=SimpleNamespace(runner=runner)))


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """nvml(processes_on_gpu_1) -> writes the facts: two H100s, NVML index 1 holding those processes."""
    facts = json.loads((TESTS / "data" / "nvml" / "h100x2_serving.json").read_text())
    path = tmp_path / "facts.json"
    monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(path))
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: 1 * GiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the process's cuda:0 is NVML's GPU 1

    def write(processes) -> None:
        facts["gpus"][1]["processes"] = processes
        path.write_text(json.dumps(facts))

    return write


def test_nvml_per_process_figure_counts_the_context_beside_torchs_reserved_memory(nvml):
    nvml([{"pid": 4242, "usedGpuMemory": 70 * GiB}, {"pid": os.getpid(), "usedGpuMemory": 3 * GiB}])
    assert resident_bytes(_ctx()) == ({"1": 3 * GiB}, "torch+nvml")  # keyed by NVML's index, not cuda:0


def test_without_an_nvml_figure_for_this_pid_torchs_reserved_memory_is_reported(nvml):
    nvml([{"pid": 4242, "usedGpuMemory": 70 * GiB}])  # e.g. a PID namespace: NVML lists the host's pid
    assert resident_bytes(_ctx()) == ({"1": 1 * GiB}, "torch")
    nvml([{"pid": os.getpid(), "usedGpuMemory": None}])  # Not Available in some containers
    assert resident_bytes(_ctx()) == ({"1": 1 * GiB}, "torch")


def test_torch_figure_wins_when_larger_and_no_nvml_at_all_still_answers(nvml, monkeypatch):
    nvml([{"pid": os.getpid(), "usedGpuMemory": GiB // 2}])
    assert resident_bytes(_ctx()) == ({"1": 1 * GiB}, "torch+nvml")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert resident_bytes(_ctx()) == ({"1": 1 * GiB}, "torch")


def test_cpu_holds_no_device_memory():
    assert resident_bytes(_ctx("cpu")) == ({}, "cpu")
