"""The runtime's KV sizing against the shared vectors that also pin deployctl/capacity/formula.py (one formula)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl_runtime import kv_sizing

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "data" / "capacity_vectors.json").read_text())


@pytest.mark.parametrize("v", VECTORS, ids=[v.get("name", str(i)) for i, v in enumerate(VECTORS)])
def test_vector(v):
    per_token = kv_sizing.kv_bytes_per_token(v["num_hidden_layers"], v["num_key_value_heads"], v["head_dim"],
                                             v["dtype_bytes"])
    blocks = kv_sizing.num_blocks_for(v["budget_bytes"], v["block_size"], per_token, v["num_gpu_blocks_override"])
    plan = kv_sizing.KVPlan(blocks, v["block_size"], per_token, max_model_len=1, max_num_seqs=1)
    assert {"kv_bytes_per_token": per_token, "num_blocks": blocks, "kv_pool_tokens": plan.pool_tokens} == v["expect"]


def test_vectors_cover_override_and_negative_budget():
    assert any(v["num_gpu_blocks_override"] is not None for v in VECTORS)
    assert any(v["budget_bytes"] < 0 for v in VECTORS)


def test_head_dim_from_config_or_hidden_over_heads():
    assert kv_sizing.head_dim_of({"hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128}) == 128
    assert kv_sizing.head_dim_of({"hidden_size": 4096, "num_attention_heads": 32}) == 128


def test_cuda_budget_is_floor_of_total_times_utilization_minus_weights_and_peak():
    assert kv_sizing.cuda_budget_bytes(80 * 2**30, 0.9, 16 * 10**9, 2 * 10**9) == int(80 * 2**30 * 0.9) - 18 * 10**9
    assert kv_sizing.cuda_budget_bytes(1001, 0.5, 0, 0) == 500
