"""rollout.gpufit.decide: whether a standby wakes beside the serving release or after it stops, from the host's
GPU facts (recorded NVML shapes; the stand-in ledger gives the same shape on the fleet tests)."""
from __future__ import annotations

from deployctl.config import parse_config
from deployctl.rollout.gpufit import decide

GiB = 2**30


def cfg(device: str = "cuda", kind: str = "vllm"):
    return parse_config(f"""
service: {{name: chat}}
model: {{path: /models/m}}
engine: {{kind: {kind}, device: {device}, {'version: "0.33.0", ' if kind == "vllm" else ""}gpu_memory_utilization: 0.9}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/d, python: /opt/v/bin/python, spare_port: 8081}}
""")


def gpu(total: int, procs: list[tuple[int, int | None]], used: int | None = None) -> dict:
    used = sum(u or 0 for _, u in procs) if used is None else used
    return {"nvidia": {"available": True, "gpus": [{"index": 0, "name": "NVIDIA H100", "memory_total": total,
                                                    "memory_free": total - used, "memory_used": used,
                                                    "processes": [{"pid": p, "used_memory": u} for p, u in procs]}]}}


def test_a_gpu_at_0_9_with_a_sleeper_cannot_hold_a_second_copy():
    c = cfg()
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, 72 * GiB), (200, 2 * GiB)]), {100}, {200})
    assert not fit.beside and fit.need_bytes == 70 * GiB and fit.free_bytes == 6 * GiB
    assert "two copies do not fit" in fit.why and "6.0 GiB free of 80.0 GiB" in fit.why and "needs 70.0 GiB" in fit.why


def test_a_small_model_on_a_big_gpu_wakes_beside():
    c = cfg()
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, 20 * GiB), (200, 1 * GiB)]), {100}, {200})
    assert fit.beside and fit.need_bytes == 19 * GiB and "two copies fit" in fit.why
    # a deploy's new release beside the serving one holds nothing yet: a whole copy must fit
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, 20 * GiB)]), {100}, None)
    assert fit.beside and fit.need_bytes == 20 * GiB
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, 72 * GiB)]), {100}, None)
    assert not fit.beside and fit.need_bytes == 72 * GiB


def test_per_process_memory_unknown_takes_the_share_and_the_adapters_residue():
    c = cfg()  # NVML without per-process figures (containers): one copy = 0.9 × total, the residue vLLM's 2 GiB
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, None), (200, None)], used=74 * GiB), {100}, {200})
    assert not fit.beside and fit.need_bytes == int(80 * GiB * 0.9) - 2 * GiB


def test_no_gpu_on_a_cpu_fleet_wakes_beside_but_unknown_gpu_memory_on_cuda_stops_first():
    c = cfg("cpu", "deployctl-runtime")
    assert decide(c, c.hosts[0], {"nvidia": {"available": False, "error": "NVML Shared Library Not Found"}},
                  set(), set()).beside
    c = cfg()
    fit = decide(c, c.hosts[0], {"nvidia": {"available": False, "error": "Driver Not Loaded"}}, set(), set())
    assert not fit.beside and "Driver Not Loaded" in fit.why


def test_a_residue_measured_after_the_sleep_replaces_the_adapters_estimate_where_nvml_has_no_per_process_memory():
    c = cfg()  # the adapter says 2 GiB; the host measured 9 GiB after the sleep (standby.json residue_bytes)
    facts = gpu(80 * GiB, [(100, None), (200, None)], used=74 * GiB)
    fit = decide(c, c.hosts[0], facts, {100}, {200}, recorded={"0": 9 * GiB})
    assert fit.need_bytes == int(80 * GiB * 0.9) - 9 * GiB and "the 9.0 GiB already held" in fit.why
    # a per-process figure NVML gives now wins over both
    fit = decide(c, c.hosts[0], gpu(80 * GiB, [(100, 72 * GiB), (200, 3 * GiB)]), {100}, {200},
                 recorded={"0": 9 * GiB})
    assert fit.need_bytes == 69 * GiB
