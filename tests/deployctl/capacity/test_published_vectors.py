"""The capacity plan against hand arithmetic for published shapes × TP × GPU (tests/data/capacity_published_vectors.json,
written by bench/bench_capacity_vectors.py from vLLM 0.33.0's and SGLang 0.5.23's sources, not from deployctl's
code): weights, KV bytes/token, the reserve's parts, the KV budget and max concurrency per GPU; weights that do not
fit are refused with the smallest TP that fits. AWQ and FP8 weights also from real safetensors files."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deployctl.capacity.sizing import size_plan
from deployctl.config import EngineConfig
from support.paths import DATA

VECTORS = json.loads((DATA / "capacity_published_vectors.json").read_text())["cases"]


def _engine(case: dict, **changes) -> EngineConfig:
    return EngineConfig(kind=case["engine"], version="0.33.0", tensor_parallel_size=case["tp"],
                        max_model_len=case["max_model_len"], max_num_seqs=case["max_num_seqs"],
                        max_num_batched_tokens=case["max_num_batched_tokens"], block_size=case["block_size"],
                        gpu_memory_utilization=case["gpu_memory_utilization"], **changes)


def _model(tmp_path, case: dict):
    d = tmp_path / case["model"]
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(case["config"]))
    return d


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_plan_matches_the_hand_arithmetic(tmp_path, case):
    sized = size_plan(_engine(case), _model(tmp_path, case), dtype="auto", gpu_memory=case["gpu_memory_bytes"])
    want, p, r = case["expect"], sized.plan, sized.reserve
    got = {"weights_per_gpu": p.weights_bytes, "kv_bytes_per_token_per_gpu": p.kv_bytes_per_token,
           "kv_replicated": sized.kv_replicated, "activation_peak": r.activation_peak, "cudagraph": r.cudagraph,
           "non_torch": r.non_torch, "cuda_context": r.cuda_context, "nccl": r.nccl,
           "kv_budget_per_gpu": p.kv_budget_bytes, "weights_fit": sized.weights_problem is None}
    if want["weights_fit"]:
        got.update(num_blocks=p.num_blocks, kv_pool_tokens=p.kv_pool_tokens, max_concurrency=round(p.max_concurrency, 4))
    else:
        assert f"raise engine.tensor_parallel_size to {sized.smallest_tp}" in sized.weights_problem
        bigger = next(c for c in VECTORS if c["model"] == case["model"] and c["engine"] == case["engine"]
                      and c["gpu"] == case["gpu"] and c["tp"] == sized.smallest_tp)
        smaller = [c for c in VECTORS if c["model"] == case["model"] and c["engine"] == case["engine"]
                   and c["gpu"] == case["gpu"] and case["tp"] <= c["tp"] < sized.smallest_tp]
        assert bigger["expect"]["weights_fit"] and not any(c["expect"]["weights_fit"] for c in smaller)
    assert got == {k: want[k] for k in got}, case["arithmetic"]


def test_vectors_cover_the_issue():
    models = {c["model"] for c in VECTORS}
    assert {"Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-32B", "Qwen2.5-72B", "Qwen2.5-3B", "Mixtral-8x7B", "Qwen3-30B-A3B",
            "Llama-3.1-8B-AWQ-INT4", "Llama-3.1-8B-FP8"} <= models
    assert {c["gpu"] for c in VECTORS} == {"H100-80GB", "H200-141GB"} and {c["tp"] for c in VECTORS} == {1, 2, 4, 8}
    # the issue's findings: Mixtral cannot load on one 80 GB GPU; a flat 1.5 GiB reserve overstated 70B TP2 concurrency
    mixtral = next(c for c in VECTORS if c["name"] == "Mixtral-8x7B vllm TP1 H100-80GB")
    assert mixtral["expect"]["weights_per_gpu"] > 90e9 and not mixtral["expect"]["weights_fit"]
    replicated = next(c for c in VECTORS if c["name"] == "Qwen2.5-3B vllm TP4 H100-80GB")
    assert replicated["expect"]["kv_replicated"] and replicated["expect"]["kv_bytes_per_token_per_gpu"] == 18432


def test_enforce_eager_drops_the_cudagraph_part_and_fp8_kv_halves_bytes_per_token(tmp_path):
    case = next(c for c in VECTORS if c["name"] == "Llama-3.1-70B vllm TP4 H100-80GB")
    d = _model(tmp_path, case)
    base = size_plan(_engine(case), d, gpu_memory=case["gpu_memory_bytes"])
    eager = size_plan(_engine(case, enforce_eager=True), d, gpu_memory=case["gpu_memory_bytes"])
    assert eager.reserve.cudagraph == 0 and eager.reserve.num_capture_sizes == 0
    assert eager.plan.kv_budget_bytes == base.plan.kv_budget_bytes + base.reserve.cudagraph
    fp8 = size_plan(_engine(case, kv_cache_dtype="fp8"), d, gpu_memory=case["gpu_memory_bytes"])
    assert fp8.plan.kv_bytes_per_token * 2 == base.plan.kv_bytes_per_token
    assert fp8.plan.num_blocks == base.plan.kv_budget_bytes // (16 * fp8.plan.kv_bytes_per_token)


def _plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", *args], capture_output=True, text=True, timeout=60)


def test_cli_refuses_weights_that_do_not_fit_even_with_a_block_override(tmp_path):
    case = next(c for c in VECTORS if c["name"] == "Llama-3.1-70B vllm TP1 H100-80GB")
    d = _model(tmp_path, case)
    proc = _plan_cli("--model-config", str(d), "--gpu-memory", str(case["gpu_memory_bytes"]),
                     "--num-gpu-blocks-override", "64", "--max-model-len", "1024", "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "fail" and doc["smallest_tensor_parallel_size"] == 2
    assert "num_gpu_blocks_override 64 does not shrink the weights" in doc["message"]
    assert "use engine.kind vllm or sglang with tensor_parallel_size 2" in doc["message"]  # the runtime has no TP
    assert "weights_bytes" in doc["per_gpu"] and doc["tensor_parallel_size"] == 1


def _write_st(path, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def test_awq_and_fp8_weights_from_real_safetensors_headers(tmp_path):
    import torch

    h, inter, vocab, group = 256, 512, 1000, 128
    awq, fp8 = tmp_path / "awq", tmp_path / "fp8"
    for d, q in ((awq, {"bits": 4, "group_size": group, "quant_method": "awq", "version": "gemm", "zero_point": True}),
                 (fp8, {"quant_method": "fp8", "activation_scheme": "dynamic"})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({
            "model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hidden_size": h, "intermediate_size": inter, "vocab_size": vocab, "max_position_embeddings": 4096,
            "torch_dtype": "float16", "tie_word_embeddings": False, "quantization_config": q}))
    shapes = {"q_proj": (h, h), "k_proj": (h, 128), "v_proj": (h, 128), "o_proj": (h, h),
              "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}  # (in, out)
    t_awq = {"model.embed_tokens.weight": torch.zeros(vocab, h, dtype=torch.float16),
             "lm_head.weight": torch.zeros(vocab, h, dtype=torch.float16)}
    t_fp8 = dict(t_awq)
    for name, (i, o) in shapes.items():  # AutoAWQ GEMM layout: int32-packed 8 × 4-bit along out
        t_awq[f"{name}.qweight"] = torch.zeros(i, o // 8, dtype=torch.int32)
        t_awq[f"{name}.qzeros"] = torch.zeros(i // group, o // 8, dtype=torch.int32)
        t_awq[f"{name}.scales"] = torch.zeros(i // group, o, dtype=torch.float16)
        t_fp8[f"{name}.weight"] = torch.zeros(o, i, dtype=torch.float8_e4m3fn)
        t_fp8[f"{name}.weight_scale"] = torch.zeros(o, 1, dtype=torch.float32)
    _write_st(awq / "model.safetensors", t_awq)
    _write_st(fp8 / "model.safetensors", t_fp8)
    linear = sum(i * o for i, o in shapes.values())
    embed = 2 * vocab * h * 2
    by_hand_awq = embed + sum(i * o // 2 + (i // group) * (o // 2) + (i // group) * o * 2 for i, o in shapes.values())
    by_hand_fp8 = embed + linear + sum(o * 4 for _, o in shapes.values())
    engine = EngineConfig(max_model_len=1024, max_num_seqs=4)
    for d, by_hand in ((awq, by_hand_awq), (fp8, by_hand_fp8)):
        sized = size_plan(engine, d, gpu_memory=24 * 2**30)
        assert (sized.plan.weights_bytes, sized.weights_source) == (by_hand, "safetensors headers"), d.name
        (d / "model.safetensors").unlink()
        estimate = size_plan(engine, d, gpu_memory=24 * 2**30)
        # the config estimate (norms included, fp8 scales per output channel) lands within 1% of the file's bytes
        assert estimate.plan.weights_bytes == pytest.approx(by_hand, rel=0.01), d.name
        assert "config estimate" in estimate.weights_source


def test_preflight_warns_at_gpu_memory_utilization_097_and_above(tmp_path):
    from deployctl.preflight.capacity import check_capacity

    case = next(c for c in VECTORS if c["name"] == "Llama-3.1-8B vllm TP1 H100-80GB")
    d = _model(tmp_path, case)
    ok = check_capacity(size_plan(_engine(case).model_copy(update={"max_num_seqs": 32}), d,
                                  gpu_memory=case["gpu_memory_bytes"]), None)
    assert ok.status == "pass", ok.message
    engine = _engine(case).model_copy(update={"gpu_memory_utilization": 0.97, "max_num_seqs": 32})
    high = check_capacity(size_plan(engine, d, gpu_memory=case["gpu_memory_bytes"]), None)
    assert high.status == "warn" and "gpu_memory_utilization 0.97 leaves 2,447 MiB" in high.message
    assert high.fix == "set engine.gpu_memory_utilization to 0.90–0.95"


def test_a_share_the_cuda_context_leaves_no_room_for_is_said(tmp_path):
    # vLLM's request_memory refuses when free memory (total − context − NCCL) < ceil(total × utilization)
    case = next(c for c in VECTORS if c["name"] == "Llama-3.1-8B vllm TP2 H100-80GB")
    engine = _engine(case).model_copy(update={"gpu_memory_utilization": 0.995})
    notes = " ".join(size_plan(engine, _model(tmp_path, case), gpu_memory=case["gpu_memory_bytes"]).notes)
    assert "gpu_memory_utilization 0.995 asks for" in notes and "vLLM refuses to start; set it to at most 0.98" in notes
    sglang = next(c for c in VECTORS if c["name"] == "Llama-3.1-70B sglang TP8 H100-80GB")
    tight = _engine(sglang).model_copy(update={"gpu_memory_utilization": 0.99, "max_num_batched_tokens": 65536})
    notes = " ".join(size_plan(tight, _model(tmp_path, sglang), gpu_memory=sglang["gpu_memory_bytes"]).notes)
    assert "mem_fraction_static 0.99 leaves" in notes and "activations + CUDA graphs + non-torch need" in notes
