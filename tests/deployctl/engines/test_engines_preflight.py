"""Preflight per engine over recorded NVML facts (tests/data/facts/h100x8_vllm.json: 8 × H100, vllm 0.33.0 in the
runtime env, a foreign training process on GPU 3): the pinned engine at that version in the host's environment
(the version read there), every tensor-parallel GPU with the free memory of its per-GPU share, foreign processes
named per GPU. And the probe really reads an engine's version with the host's python."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from deployctl.config import parse_config
from deployctl.hostscripts.probe import probe_engine
from deployctl.preflight import check_facts
from support import paths

FACTS = json.loads((paths.DATA / "facts" / "h100x8_vllm.json").read_text())


def _checks(gpus: list[int], tp: int, version: str = "0.33.0", facts: dict = FACTS, replicas: int = 1,
            host: int = 0) -> dict:
    cfg = parse_config(f"""
service: {{name: llama-8b}}
model: {{path: /models/llama-3-8b-instruct, dtype: bfloat16}}
engine: {{kind: vllm, version: {version}, tensor_parallel_size: {tp}, gpu_memory_utilization: 0.9}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/llama-8b, python: /opt/deployctl/venv/bin/python,
      gpus: {gpus}, replicas: {replicas}}}
""")
    rep = check_facts(cfg, [(cfg.hosts[host], copy.deepcopy(facts))], {})
    return {c.name: c for c in rep.hosts[0].checks}


def test_tp4_on_free_gpus_passes_with_per_gpu_shares():
    c = _checks([4, 5, 6, 7], 4)
    assert c["engine"].status == "pass" and "vllm 0.33.0" in c["engine"].message
    assert c["gpu_memory"].status == "pass", c["gpu_memory"].message
    assert all(f"GPU {i} (NVIDIA H100 80GB HBM3" in c["gpu_memory"].message for i in (4, 5, 6, 7))
    assert "weights 3,829 MiB" in c["gpu_memory"].message  # 16,060,522,496 bytes / 4 ranks
    assert c["capacity"].status == "pass" and c["torch"].status == "pass"


def test_a_foreign_process_on_one_tp_gpu_fails_naming_it_on_that_gpu():
    c = _checks([0, 1, 2, 3], 4)
    g = c["gpu_memory"]
    assert g.status == "fail" and "GPU 3 (NVIDIA H100 80GB HBM3" in g.message
    assert "held by other processes: pid 5120 (python3) 40,960 MiB" in g.message
    assert g.message.count("held by other processes") == 1  # GPUs 0-2 are free


def test_engine_version_is_read_not_assumed():
    c = _checks([4, 5], 2, version="0.34.0")
    assert c["engine"].status == "warn" and "vllm 0.33.0 in /opt/deployctl/venv/bin/python; engine.version is 0.34.0" in c["engine"].message
    assert "pip install vllm==0.34.0" in c["engine"].fix
    assert "the first release pip-installs vllm==0.34.0 into /opt/deployctl/llama-8b/shared/engines/vllm-0.34.0" \
        in c["engine"].message and "within engine.install_timeout_s 1800 s" in c["engine"].message
    missing = dict(FACTS, engine={"python": "/usr/bin/python3", "version": None, "importable": False,
                                  "error": "distribution vllm is not installed"})
    c = _checks([4, 5], 2, facts=missing)
    assert c["engine"].status == "warn" and "not importable by /usr/bin/python3" in c["engine"].message
    shared = {"python": "/opt/deployctl/llama-8b/shared/engines/vllm-0.33.0/bin/python", "version": "0.33.0",
              "importable": True, "error": None}
    c = _checks([4, 5], 2, facts=dict(FACTS, engine=dict(missing["engine"], shared=shared)))
    assert c["engine"].status == "pass" and "in this host's shared engine venv" in c["engine"].message


def test_tp_beyond_the_gpus_torch_sees_fails():
    f = copy.deepcopy(FACTS)
    f["torch"]["device_count"] = 2
    c = _checks([0, 1, 2, 3], 4, facts=f)
    assert c["torch"].status == "fail" and "torch sees 2 GPU(s)" in c["torch"].message


def test_probe_reads_the_version_with_the_hosts_python():
    import pydantic

    got = probe_engine(sys.executable, "pydantic", "pydantic")
    assert got["version"] == pydantic.VERSION and got["importable"]
    absent = probe_engine(sys.executable, "vllm-not-installed-here", "vllm_not_here")
    assert absent["version"] is None and not absent["importable"] and "not installed" in absent["error"]


def test_transformers_told_more_blocks_than_the_plan_holds_fails_naming_the_plans_count():
    """transformers serve allocates exactly --cb-num-blocks: 128 × ceil(8192 / 16) = 65,536 blocks (128 GiB of KV for
    Llama-3-8B) on an 80 GB H100 is an OOM at start; preflight names the plan's count instead (issue 26)."""
    def checks(extra: str) -> dict:
        cfg = parse_config(f"""
service: {{name: llama-8b}}
model: {{path: /models/llama-3-8b-instruct, served_name: /models/llama-3-8b-instruct, dtype: bfloat16}}
engine: {{kind: transformers, version: "5.24.0", max_model_len: 8192, max_num_seqs: 128, gpu_memory_utilization: 0.9{extra}}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/llama-8b, python: /opt/deployctl/venv/bin/python,
      gpus: [4]}}
""")
        rep = check_facts(cfg, [(cfg.hosts[0], copy.deepcopy(FACTS))], {})
        return {c.name: c for c in rep.hosts[0].checks}

    c = checks("")["capacity"]
    assert c.status == "fail" and "transformers is told 65,536 KV blocks" in c.message, c.message
    assert "128.0 GiB" in c.message or "128 GiB" in c.message, c.message
    plan_blocks = int(c.fix.split("num_gpu_blocks_override: ")[1].split(" ")[0])
    assert 20_000 < plan_blocks < 40_000  # (80 GiB × 0.9 − 16.06 GB weights) / (16 × 128 KiB per token)
    c = checks(f", num_gpu_blocks_override: {plan_blocks}")["capacity"]
    assert c.status != "fail", c.message  # told the plan's count: it allocates what fits


def test_gpus_listed_beyond_tensor_parallel_are_named_idle():
    c = _checks([0, 1, 2, 3, 4, 5, 6, 7], 2)["gpus"]
    assert c.status == "warn" and "lists 8 GPUs" in c.message and "GPU(s) 2,3,4,5,6,7 would sit idle" in c.message
    assert "list 2 GPU ids in hosts[gpu-a].gpus" in c.fix
    assert _checks([4, 5], 2)["gpus"].status == "pass"


def test_gpus_listed_beyond_replicas_times_tensor_parallel_are_named_idle_once():
    # 3 replicas x TP 2 on an 8-GPU host: replicas take 0-5, nothing takes 6 and 7
    first = _checks([0, 1, 2, 3, 4, 5, 6, 7], 2, replicas=3)["gpus"]
    assert first.status == "warn" and "GPU(s) 6,7 beyond its replicas" in first.message, first.message
    assert "hosts[gpu-a].replicas" in first.fix and "drop 6,7 from hosts[gpu-a].gpus" in first.fix
    assert _checks([0, 1, 2, 3, 4, 5, 6, 7], 2, replicas=3, host=1)["gpus"].status == "pass"  # said once, on r0
    assert _checks([0, 1, 2, 3, 4, 5, 6, 7], 2, replicas=4)["gpus"].status == "pass"  # 4 x 2 take all 8


def test_an_unset_engine_secret_fails_preflight_naming_it_and_a_set_one_passes_unshown():
    cfg = parse_config("""
service: {name: llama-8b}
model: {path: /models/llama-3-8b-instruct, dtype: bfloat16}
engine: {kind: vllm, version: 0.33.0, gpu_memory_utilization: 0.9, secret_env: [HF_TOKEN]}
hosts:
  - {name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/llama-8b, python: /opt/deployctl/venv/bin/python}
""")
    host = cfg.hosts[0]
    bad = {c.name: c for c in check_facts(cfg, [(host, copy.deepcopy(FACTS))], {}).hosts[0].checks}["engine_secrets"]
    assert bad.status == "fail" and "HF_TOKEN is not set" in bad.message and "export HF_TOKEN=" in bad.fix
    good = {c.name: c for c in check_facts(cfg, [(host, copy.deepcopy(FACTS))], {"HF_TOKEN": "hf_abc123"})
            .hosts[0].checks}["engine_secrets"]
    assert good.status == "pass" and "hf_abc123" not in good.message
