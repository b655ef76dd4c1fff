"""Capacity per engine and per GPU under tensor parallelism against hand arithmetic on recorded H100/H200 totals
(tests/data/engines/tp_capacity_vectors.json: Llama-3-8B at TP 1/2/4/8, a 70B shape at TP 8 with vLLM and SGLang
semantics, a 2-KV-head shape at TP 4 with replicated heads), and ``deployctl plan`` on a TP config."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.engines.capacity import plan_gpu
from support import paths

REPO = paths.REPO
VECTORS = json.loads((REPO / "tests" / "data" / "engines" / "tp_capacity_vectors.json").read_text())["cases"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_per_gpu_plan_matches_hand_arithmetic(case):
    p = plan_gpu(engine=case["engine"], tp=case["tp"], gpu_memory_bytes=case["gpu_memory_bytes"],
                 utilization=case["utilization"], weights_bytes=case["weights_bytes"],
                 num_hidden_layers=case["num_hidden_layers"], num_key_value_heads=case["num_key_value_heads"],
                 head_dim=case["head_dim"], dtype_bytes=case["dtype_bytes"], block_size=case["block_size"],
                 max_model_len=case["max_model_len"], reserve_bytes=case["reserve_bytes"])
    got = p.to_json()
    for key, want in case["expect"].items():
        assert (round(got[key], 4) if isinstance(want, float) else got[key]) == want, (key, got[key], want)


def test_tensor_parallel_multiplies_concurrency_and_splits_weights():
    c = {x["name"]: x["expect"] for x in VECTORS}
    tp1, tp8 = c["Llama-3-8B vllm TP1 H100-80GB"], c["Llama-3-8B vllm TP8 H100-80GB"]
    assert tp8["weights_per_gpu"] * 8 == tp1["weights_per_gpu"]
    assert tp8["kv_bytes_per_token_per_gpu"] * 8 == tp1["kv_bytes_per_token_per_gpu"]
    assert tp8["max_concurrency"] > 9 * tp1["max_concurrency"]  # and the freed weight memory holds KV too
    assert c["Qwen2-1.5B vllm TP4 H100-80GB"]["kv_replicated"] and c["Qwen2-1.5B vllm TP4 H100-80GB"]["kv_heads_per_gpu"] == 1


def _plan(tmp_path, tp: int) -> subprocess.CompletedProcess:
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}))
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: {model}, dtype: bfloat16}}\n"
                   f"engine: {{kind: vllm, version: 0.33.0, tensor_parallel_size: {tp}, max_num_seqs: 256}}\n"
                   "hosts: [{name: a, address: local, deploy_root: /tmp/x, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(cfg), "--gpu-memory", "85520809984",
                           "--json"], env=env, capture_output=True, text=True, timeout=60)


def test_plan_cli_is_per_gpu_under_tp_and_refuses_tp_not_dividing_heads(tmp_path):
    one, eight = _plan(tmp_path, 1), _plan(tmp_path, 8)
    assert one.returncode in (0, 1) and eight.returncode == 0, (one.stderr, eight.stderr)
    p1, p8 = json.loads(one.stdout), json.loads(eight.stdout)
    assert p8["kv_bytes_per_token"] * 8 == p1["kv_bytes_per_token"] == 131072
    assert p8["max_concurrency"] > 8 * p1["max_concurrency"]
    # the multi-GPU start-up deadline from the plan's load time (engines.startup): 2 × (120 s + weights / 125 MiB/s)
    load = 120 + p8["weights_bytes"] * 8 / (125 * 2**20)
    assert f"start-up deadline {2 * load:.0f} s: 2 × the plan's load time {load:.0f} s" in " ".join(p8["notes"])
    assert not any("start-up deadline" in n for n in p1["notes"])
    bad = _plan(tmp_path, 3)
    assert bad.returncode == 3 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "engine.tensor_parallel_size 3 does not divide the model's 32 attention heads" in bad.stderr
