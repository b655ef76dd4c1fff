"""Plan vs engine (issue 44): the engines' own start-log statements of their KV pool, recorded from public issues
(tests/data/enginelogs/*.log, each citing its source and version), parsed and compared with `deployctl plan`'s
sizing for the same config; logs of unknown versions say "not parsed"; the bundled runtime's own line equals the
plan."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.capacity.enginelog import GIB, compare, describe, parse
from deployctl.capacity.sizing import size_plan
from deployctl.config.models import EngineConfig
from support.paths import DATA

LOGS = DATA / "enginelogs"

LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False}
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 128,
             "num_key_value_heads": 4, "vocab_size": 151936, "max_position_embeddings": 40960,
             "torch_dtype": "bfloat16", "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8}
QWEN3_235B = {**QWEN3_MOE, "hidden_size": 4096, "num_attention_heads": 64, "num_hidden_layers": 94,
              "intermediate_size": 12288, "moe_intermediate_size": 1536}
QWEN3_30B = {**QWEN3_MOE, "hidden_size": 2048, "num_attention_heads": 32, "num_hidden_layers": 48,
             "intermediate_size": 6144, "moe_intermediate_size": 768}

# fixture -> (engine, format, model config, engine settings, GPU bytes, weights bytes per checkpoint,
#             expected tokens, expected bytes per GPU)
CASES = {
    # RTX 3090: total_gpu_memory=23.58GiB and "Loading model weights took 14.9888 GB" from the log itself
    "vllm-0.6-llama31-8b-rtx3090.log": ("vllm", "vllm V0 engine (0.6 - 0.7)", LLAMA31_8B,
                                        {"max_model_len": 20000, "gpu_memory_utilization": 0.9},
                                        int(23.58 * GIB), int(14.9888 * GIB), 1952 * 16, int(3.81 * GIB)),
    # 4x H100 80GB (NVML total 81,559 MiB); FP8 checkpoint of 235 GB (about 1 byte per parameter; approximate)
    "vllm-v1-qwen3-235b-fp8-tp4.log": ("vllm", "vllm V1 engine (>= 0.8)", QWEN3_235B,
                                       {"max_model_len": 40960, "gpu_memory_utilization": 0.9,
                                        "tensor_parallel_size": 4},
                                       81559 << 20, 235 * 10**9, 178880, int(8.11 * GIB)),
    "sglang-0.4-qwen3-235b-fp8-tp4.log": ("sglang", "sglang 0.4 (KV line without dtype)", QWEN3_235B,
                                          {"max_model_len": 40960, "gpu_memory_utilization": 0.93,
                                           "tensor_parallel_size": 4},
                                          81559 << 20, 235 * 10**9, 367404, int(round(8.23 * GIB)) * 2),
    # MI355X: avail mem 230.20 GB + mem usage 56.98 GB after the weights load (from the log itself)
    "sglang-0.5-qwen3-30b-a3b.log": ("sglang", "sglang 0.5 (KV line with dtype)", QWEN3_30B,
                                     {"max_model_len": 40960, "gpu_memory_utilization": 0.911},
                                     int((230.20 + 56.98) * GIB), int(56.98 * GIB), 1669816,
                                     int(round(76.44 * GIB)) * 2),
}


def _plan(tmp_path: Path, model: dict, settings: dict, engine: str, gpu: int, weights: int):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model))
    e = EngineConfig(kind=engine, device="cuda", max_num_seqs=1, **settings)
    return size_plan(e, None, model_config=path, gpu_memory=gpu, weights=weights).plan


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_engine_log_parsed_and_compared_with_the_plan(name, tmp_path):
    engine, fmt, model, settings, gpu, weights, tokens, nbytes = CASES[name]
    got = parse((LOGS / name).read_text(), engine)
    assert got.format == fmt and got.kv_tokens == tokens
    assert abs(got.kv_bytes - nbytes) <= 2, (got.kv_bytes, nbytes)
    plan = _plan(tmp_path, model, settings, engine, gpu, weights)
    per_token = plan.kv_bytes_per_token  # per GPU under TP
    # the engine's pool and the plan use the same bytes per token: tokens × per-token ≈ the logged bytes (±3%:
    # vLLM rounds its budget down to whole blocks and its tokens are summed over layer groups)
    assert abs(got.kv_tokens * per_token - got.kv_bytes) / got.kv_bytes < 0.03
    cmp = compare(plan.kv_pool_tokens, plan.kv_pool_tokens * per_token, got)
    print(describe(name, cmp))
    assert cmp["diff_tokens_pct"] == round(100 * (tokens - plan.kv_pool_tokens) / plan.kv_pool_tokens, 1)
    assert cmp["flagged"] == (abs(cmp["diff_tokens_pct"]) > 10 or abs(cmp["diff_bytes_pct"]) > 10)


def test_a_vllm_log_of_another_tp_rank_layout_is_parsed_per_gpu():
    got = parse((LOGS / "vllm-v1-0.10-tp2.log").read_text(), "vllm")
    assert (got.kv_tokens, got.kv_bytes) == (570848, int(round(26.13 * GIB)))


@pytest.mark.parametrize("name,engine", [("sglang-unknown-max-total-only.log", "sglang"),
                                         ("vllm-unknown-no-kv-line.log", "vllm"),
                                         ("sglang-0.4-qwen3-235b-fp8-tp4.log", "transformers")])
def test_a_log_of_an_unknown_version_says_not_parsed(name, engine):
    got = parse((LOGS / name).read_text(), engine)
    assert not got.parsed and got.kv_tokens is None
    assert got.note.startswith("not parsed:")
    cmp = compare(1000, 10**6, got)
    assert not cmp["flagged"] and "not parsed" in describe("h1", cmp)


def test_the_bundled_runtime_line_equals_the_plan(tmp_path):
    """runtime/deployctl_runtime/kv_sizing.KVPlan.summary (the line the runtime logs at start) parses back to
    the pool deployctl's plan computes for the same budget: plan vs actual 0%."""
    from deployctl_runtime.kv_sizing import KVPlan, kv_bytes_per_token, num_blocks_for

    from deployctl.capacity.formula import CapacityInputs, plan_capacity

    per_token = kv_bytes_per_token(32, 8, 128, 2)
    budget = 12 * GIB
    rt = KVPlan(num_blocks_for(budget, 16, per_token), 16, per_token, 8192, 16)
    plan = plan_capacity(CapacityInputs(num_hidden_layers=32, num_key_value_heads=8, head_dim=128, dtype_bytes=2,
                                        weights_bytes=0, block_size=16, max_model_len=8192, max_num_seqs=16,
                                        kv_cache_memory=budget))
    got = parse("2026-12-06 01:00:00,000 INFO deployctl_runtime: " + rt.summary(), "deployctl-runtime")
    cmp = compare(plan.kv_pool_tokens, plan.kv_pool_tokens * plan.kv_bytes_per_token, got)
    assert (cmp["diff_tokens_pct"], cmp["diff_bytes_pct"], cmp["flagged"]) == (0.0, 0.0, False)
    smaller = parse(KVPlan(int(rt.num_blocks * 0.85), 16, per_token, 8192, 16).summary(), "deployctl-runtime")
    off = compare(plan.kv_pool_tokens, plan.kv_pool_tokens * plan.kv_bytes_per_token, smaller,
                  others=[{"pid": 4242, "name": "python3", "used_memory": 2 * GIB}])
    assert off["flagged"] and off["diff_tokens_pct"] == -15.0
    assert "another process on the GPU: pid 4242 (python3) holds 2.00 GiB" in off["causes"]


def test_named_causes_utilization_and_graphs():
    got = parse((LOGS / "vllm-0.6-llama31-8b-rtx3090.log").read_text(), "vllm")
    cmp = compare(45000, 6 * GIB, got, utilization=0.95)
    assert cmp["flagged"]
    assert "gpu_memory_utilization: the engine ran at 0.9, deploy.yaml plans 0.95" in cmp["causes"]
    v1 = parse("Graph capturing finished in 12 secs, took 1.50 GiB\nAvailable KV cache memory: 5.00 GiB\n"
               "GPU KV cache size: 40,960 tokens", "vllm")
    cmp = compare(60000, 7 * GIB, v1, graphs_reserve_bytes=GIB // 4)
    assert cmp["causes"] == ["CUDA graphs: the engine's capture took 1.50 GiB, the plan reserved 0.25 GiB"]
