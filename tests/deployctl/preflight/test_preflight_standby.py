"""Preflight and the plan with hosts[].spare_port (issue 25): the sleeping standby's GPU residue comes out of the
new release's KV budget; its weights must fit in the host's available RAM (both numbers when not); a start beside
the serving release without sleep on a GPU host is refused unless two full copies fit. Recorded facts
(tests/data/facts) for the host; the stand-in GPU ledger (runtime/deployctl_runtime/gpu_ledger.py, read by the
probe's probe_fake_gpu) for the GPU where its contents matter."""
from __future__ import annotations

import copy
import json
import os

from deployctl.config import parse_config
from deployctl.hostscripts.probe import probe_fake_gpu
from deployctl.preflight import check_facts
from deployctl.preflight.capacity import plan_from_facts
from support.paths import DATA

GiB = 2**30


def facts(name: str = "h200") -> dict:
    return json.loads((DATA / "facts" / f"{name}.json").read_text())


def config(host: str = "spare_port: 8081", rollout: str = "", engine: str = "") -> object:
    return parse_config(f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
engine:
  device: cuda
  max_model_len: 8192
  max_num_seqs: 64
{engine}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/chat-8b, python: /opt/deployctl/venv/bin/python,
      {host}}}
{rollout}
""")


def checks(cfg, f: dict) -> dict:
    rep = check_facts(cfg, [(cfg.hosts[0], f)], {})
    return {c.name: c for c in rep.hosts[0].checks}


def test_the_sleepers_residue_comes_out_of_the_new_releases_kv_budget():
    kept, _ = plan_from_facts(config(), config().hosts[0], facts())
    none, _ = plan_from_facts(config("server_port: 8080"), config("server_port: 8080").hosts[0], facts())
    # the bundled runtime's residue (deployctl.engines.runtime: 512 MiB, an estimate)
    assert kept.standby_residue_bytes == 512 * 2**20 and none.standby_residue_bytes == 0
    assert none.plan.kv_budget_bytes - kept.plan.kv_budget_bytes == 512 * 2**20
    assert "sleeping standby's GPU residue" in kept.plan.budget_source
    assert any("keeps 512.0 MiB per GPU" in n and "estimate" in n for n in kept.notes), kept.notes
    # standby_s 0: nothing sleeps, nothing is taken off
    off, _ = plan_from_facts(config(rollout="rollout: {standby_s: 0}"), config().hosts[0], facts())
    assert off.standby_residue_bytes == 0 and off.plan.kv_budget_bytes == none.plan.kv_budget_bytes


def test_a_sleepers_weights_that_do_not_fit_in_host_ram_fail_with_both_numbers():
    f = facts()
    f["memory"] = {"total_bytes": 32 * GiB, "available_bytes": 9 * GiB, "error": None}
    c = checks(config(), f)["standby_ram"]
    assert c.status == "fail", c
    assert "15.0 GiB" in c.message and "9.0 GiB available of 32.0 GiB" in c.message and "gpu-a" in c.message
    assert "rollout.standby_s: 0" in c.fix and "spare_port" in c.fix
    f["memory"]["available_bytes"] = 200 * GiB
    assert checks(config(), f)["standby_ram"].status == "pass"
    # recorded facts from before the memory probe: unknown, said so
    c = checks(config(), facts())["standby_ram"]
    assert c.status == "warn" and "available RAM is unknown" in c.message
    # no spare_port: no standby, no check
    assert "standby_ram" not in checks(config("server_port: 8080"), f)


def _fake_gpu(tmp_path, total: int, taken: int = 0) -> dict:
    ledger = tmp_path / "gpu0.json"
    allocs = {str(os.getpid()): {"bytes": taken, "what": "another process", "label": ""}} if taken else {}
    ledger.write_text(json.dumps({"total_bytes": total, "allocations": allocs}))
    f = facts()  # the recorded driver and CUDA versions; the GPU's memory from the ledger
    f["nvidia"]["gpus"] = probe_fake_gpu(str(ledger))["gpus"]
    return f


def test_spare_port_without_sleep_on_a_gpu_host_is_refused_unless_two_copies_fit(tmp_path):
    f = _fake_gpu(tmp_path, 80 * GiB)
    cfg = config(rollout="rollout: {standby_s: 0}")
    c = checks(cfg, f)["spare_port_gpu"]
    assert c.status == "fail", c
    assert "two copies need" in c.message and "GPU 0 (80.0 GiB) has 80.0 GiB" in c.message, c.message
    assert "weights 15.0 GiB + KV pool" in c.message and "rollout.standby_s is 0" in c.message
    assert "gpu_memory_utilization <= 0.50" in c.fix and "remove hosts[gpu-a].spare_port" in c.fix
    # the plan shows two full copies fit: allowed
    small = config(rollout="rollout: {standby_s: 0}", engine="  gpu_memory_utilization: 0.45")
    assert checks(small, f)["spare_port_gpu"].status == "pass"
    # ... until another process takes memory on that GPU
    c = checks(small, _fake_gpu(tmp_path, 80 * GiB, 20 * GiB))["spare_port_gpu"]
    assert c.status == "fail" and "has 60.0 GiB" in c.message
    # with a sleeping standby the old copy sleeps: this check does not apply
    assert "spare_port_gpu" not in checks(config(), f)


def test_plan_cli_takes_the_residue_off_with_spare_port_and_says_so(tmp_path):
    import subprocess
    import sys

    import yaml

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(facts()["model"]["config"]))
    docs = {}
    for name, host in (("kept", {"spare_port": 8081}), ("none", {})):
        cfg = {"service": {"name": "chat"}, "model": {"path": str(model)},
               "engine": {"kind": "vllm", "version": "0.33.0", "device": "cuda", "max_model_len": 8192},
               "hosts": [{"name": "gpu-a", "address": "10.0.0.1", "deploy_root": "/opt/d", **host}]}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(path), "--gpu-memory", "80GiB",
                            "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode in (0, 1), r.stderr
        docs[name] = json.loads(r.stdout)
    assert docs["kept"]["standby_residue_bytes"] == 2 * GiB and docs["none"]["standby_residue_bytes"] == 0
    assert docs["none"]["kv_budget_bytes"] - docs["kept"]["kv_budget_bytes"] == 2 * GiB
    assert any("vLLM tests/basic_correctness/test_cumem.py" in n for n in docs["kept"]["notes"])


def test_the_port_held_by_the_hosts_own_sleeping_standby_passes_naming_it_and_a_stranger_still_fails():
    """After a deploy that kept the old release asleep on server.port (every other deploy), the serving runtime is
    on spare_port: the holder of server.port is this service's standby (gather.standby_facts: standby.json and its
    supervisor's process group), not a foreign process to kill."""
    cfg = config()
    f = copy.deepcopy(facts())
    f["service"] = {"pids": [500, 501]}
    f["port"] = {"port": 8080, "free": False, "bind_error": "Address already in use (errno 98)",
                 "holders": [{"address": "0.0.0.0:8080", "pid": 701, "name": "python", "cmdline": "python -m x"}]}
    f["standby"] = {"release": "20260101T000000Z-aaaa", "port": 8080, "pids": [700, 701], "residue_bytes": None}
    c = checks(cfg, f)["port"]
    assert c.status == "pass" and "sleeping standby of 20260101T000000Z-aaaa" in c.message and "701" in c.message
    # the standby sleeps on another port: whoever holds this one is a stranger
    f["standby"]["port"] = 8081
    c = checks(cfg, f)["port"]
    assert c.status == "fail" and "kill 701" in c.fix
    f["standby"] = None
    assert checks(cfg, f)["port"].status == "fail"


def test_a_residue_measured_on_the_host_replaces_the_adapters_estimate_in_the_plan():
    f = copy.deepcopy(facts())
    f["standby"] = {"release": "r1", "port": 8081, "pids": [], "residue_bytes": {"0": 3 * GiB},
                    "measured": {"how": "nvml"}}
    sized, _ = plan_from_facts(config(), config().hosts[0], f)
    none, _ = plan_from_facts(config("server_port: 8080"), config("server_port: 8080").hosts[0], facts())
    assert sized.standby_residue_bytes == 3 * GiB
    assert none.plan.kv_budget_bytes - sized.plan.kv_budget_bytes == 3 * GiB
    assert any("measured on gpu-a after the last sleep (nvml)" in n for n in sized.notes), sized.notes


def test_a_residue_measured_at_the_last_sleep_that_leaves_no_room_warns_or_fails_per_standby_misfit():
    f = copy.deepcopy(facts())
    gpu = f["nvidia"]["gpus"][0]
    gpu.update(memory_total=80 * GiB, memory_used=76 * GiB, memory_free=4 * GiB,
               processes=[{"pid": 500, "used_memory": 72 * GiB}, {"pid": 700, "used_memory": 2 * GiB}])
    # the standby the deploy stops first (pid 700, 2 GiB) counts as free: 6 GiB of room, a 9 GiB residue
    f["standby"] = {"release": "r1", "port": 8081, "pids": [700], "residue_bytes": {"0": 9 * GiB},
                    "measured": {"how": "nvml"}}
    c = checks(config(), f)["standby_fit"]
    assert c.status == "warn" and "9.0 GiB, is more than the 6.0 GiB free" in c.message and "drops the standby" in c.message
    c = checks(config(rollout="rollout: {standby_misfit: fail}"), f)["standby_fit"]
    assert c.status == "fail" and "stops there" in c.message and "standby_misfit: drop" in c.fix
    f["standby"]["residue_bytes"] = {"0": 5 * GiB}
    assert checks(config(rollout="rollout: {standby_misfit: fail}"), f)["standby_fit"].status == "pass"
    f["standby"] = None  # nothing measured: no check (the capacity plan uses the adapter's estimate)
    assert "standby_fit" not in checks(config(), f)
