"""Hand arithmetic of the capacity plan for published model shapes × TP × GPU, written from the engines' sources
(not from deployctl's code: this script imports nothing of deployctl). Writes tests/data/capacity_published_vectors.json,
which tests/deployctl/capacity/test_published_vectors.py compares `deployctl plan` against, and prints the table
docs/capacity.md quotes.

Usage: python bench/bench_capacity_vectors.py [--write]

Sources (vLLM 0.33.0, SGLang 0.5.23, as installed in .venv-engines):
- vllm/v1/worker/utils.py request_memory: requested = ceil(total × gpu_memory_utilization).
- vllm/v1/worker/gpu_worker.py determine_available_memory: KV = requested − non_kv_cache_memory − cudagraph estimate;
  vllm/utils/mem_utils.py memory_profiling: non_kv_cache_memory = weights + non-torch increase + transient peak.
- vllm/v1/worker/gpu_model_runner.py profile_cudagraph_memory: first capture + (n − 1) × max(per graph, 1 MiB) per mode.
- vllm/config/vllm.py _set_cudagraph_sizes: sizes [1, 2, 4] + range(8, 256, 8) + range(256, top + 1, 16),
  top = min(2 × max_num_seqs, 512).
- vllm/config/model.py get_num_kv_heads: max(1, kv_heads // TP).
- sglang/srt/mem_cache/kv_cache_configurator.py _profile_available_bytes: KV = free after load − free before load
  × (1 − mem_fraction_static).
Estimated constants (the engines measure these; deployctl.engines.reserve documents each): CUDA context 512 MiB,
NCCL 320 MiB at TP > 1, non-torch 256 MiB, activations (4 × hidden + 3 × MLP width / TP) × dtype bytes per token,
sampler logits max_num_seqs × vocab × 4 B × 2.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

MiB = 2**20
H100 = 85520809984  # NVML memory.total of an H100 SXM 80GB (81559 MiB)
H200 = 143771 * MiB  # NVML memory.total of an H200 (tests/data/facts/h200.json)

# Published config.json values (the models' own configs on their hubs).
MODELS = {
    "Llama-3.1-8B": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                         max_position_embeddings=131072, torch_dtype="bfloat16", tie_word_embeddings=False),
    "Llama-3.1-70B": dict(model_type="llama", num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                          hidden_size=8192, intermediate_size=28672, vocab_size=128256,
                          max_position_embeddings=131072, torch_dtype="bfloat16", tie_word_embeddings=False),
    "Qwen3-32B": dict(model_type="qwen3", num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, hidden_size=5120, intermediate_size=25600, vocab_size=151936,
                      max_position_embeddings=40960, torch_dtype="bfloat16", tie_word_embeddings=False),
    "Qwen2.5-72B": dict(model_type="qwen2", num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        hidden_size=8192, intermediate_size=29568, vocab_size=152064,
                        max_position_embeddings=32768, torch_dtype="bfloat16", tie_word_embeddings=False),
    "Qwen2.5-3B": dict(model_type="qwen2", num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       hidden_size=2048, intermediate_size=11008, vocab_size=151936,
                       max_position_embeddings=32768, torch_dtype="bfloat16", tie_word_embeddings=True),
    "Mixtral-8x7B": dict(model_type="mixtral", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         hidden_size=4096, intermediate_size=14336, vocab_size=32000, num_local_experts=8,
                         num_experts_per_tok=2, max_position_embeddings=32768, torch_dtype="bfloat16",
                         tie_word_embeddings=False),
    "Qwen3-30B-A3B": dict(model_type="qwen3_moe", num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, vocab_size=151936,
                          max_position_embeddings=40960, torch_dtype="bfloat16", tie_word_embeddings=False),
    "Llama-3.1-8B-AWQ-INT4": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32,
                                  num_key_value_heads=8, hidden_size=4096, intermediate_size=14336,
                                  vocab_size=128256, max_position_embeddings=131072, torch_dtype="float16",
                                  tie_word_embeddings=False,
                                  quantization_config=dict(bits=4, group_size=128, quant_method="awq",
                                                           version="gemm", zero_point=True)),
    "Llama-3.1-8B-FP8": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                             max_position_embeddings=131072, torch_dtype="bfloat16", tie_word_embeddings=False,
                             quantization_config=dict(quant_method="fp8", activation_scheme="dynamic")),
}
# Published parameter counts (B) the config arithmetic must land within 1% of.
PUBLISHED_PARAMS_B = {"Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.55, "Qwen3-32B": 32.8, "Qwen2.5-72B": 72.7,
                      "Qwen2.5-3B": 3.09, "Mixtral-8x7B": 46.7, "Qwen3-30B-A3B": 30.5}

ENGINE = dict(max_model_len=8192, max_num_seqs=256, max_num_batched_tokens=8192, block_size=16,
              gpu_memory_utilization=0.9)


def params(c: dict) -> tuple[int, int]:
    """(linear params, the rest) by hand: q,o = h × heads × head_dim each; k,v = h × kv_heads × head_dim each;
    MLP gate/up/down = 3 × h × width (× experts); router h × experts; 2 norms per layer + final norm; embeddings,
    lm_head unless tied."""
    h, L = c["hidden_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    attn = 2 * h * c["num_attention_heads"] * hd + 2 * h * c["num_key_value_heads"] * hd
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    if experts:
        width = c.get("moe_intermediate_size") or c["intermediate_size"]
        mlp, router = experts * 3 * h * width, h * experts
    else:
        mlp, router = 3 * h * c["intermediate_size"], 0
    embed = c["vocab_size"] * h
    rest = embed + (0 if c["tie_word_embeddings"] else embed) + L * (router + 2 * h) + h
    return L * (attn + mlp), rest


def weights(c: dict) -> int:
    linear, rest = params(c)
    q = c.get("quantization_config")
    if q and q["quant_method"] == "awq":
        groups = linear // q["group_size"]  # vllm awq.py: qweight in×out/8 int32, qzeros & scales per group
        return linear * q["bits"] // 8 + groups * 2 + groups * q["bits"] // 8 + rest * 2
    if q and q["quant_method"] == "fp8":  # vllm fp8.py: fp8 weight + fp32 per-channel scale
        return linear + linear // c["hidden_size"] * 4 + rest * 2
    return (linear + rest) * 2


def capture_sizes(max_num_seqs: int, tokens: int) -> list[int]:
    top = min(2 * max_num_seqs, 512, tokens)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def case(name: str, engine: str, tp: int, gpu_name: str, total: int) -> dict:
    c = MODELS[name]
    e = ENGINE
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_heads = max(1, c["num_key_value_heads"] // tp)
    per_token = 2 * c["num_hidden_layers"] * kv_heads * hd * 2
    w = weights(c) // tp
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    width = (c["num_experts_per_tok"] * (c.get("moe_intermediate_size") or c["intermediate_size"]) if experts
             else c["intermediate_size"])
    act_token = 2 * (4 * c["hidden_size"] + 3 * (width // tp))
    activation = e["max_num_batched_tokens"] * act_token + e["max_num_seqs"] * c["vocab_size"] * 4 * 2
    sizes = capture_sizes(e["max_num_seqs"], e["max_num_batched_tokens"])
    graphs = max(sizes) * act_token + (len(sizes) - 1) * MiB * 2
    non_torch, context, nccl = 256 * MiB, 512 * MiB, (320 * MiB if tp > 1 else 0)
    u = e["gpu_memory_utilization"]
    if engine == "vllm":
        budget = math.ceil(total * u) - w - (activation + graphs + non_torch)
        how = (f"ceil({total} × {u}) − {w} − ({activation} + {graphs} + {non_torch})")
    else:
        budget = math.floor((total - context - nccl) * u) - w
        how = f"floor(({total} − {context} − {nccl}) × {u}) − {w}"
    fits = budget >= e["max_model_len"] * per_token
    blocks = max(0, budget // (e["block_size"] * per_token)) if fits else None
    out = {"name": f"{name} {engine} TP{tp} {gpu_name}", "model": name, "engine": engine, "tp": tp, "gpu": gpu_name,
           "gpu_memory_bytes": total, **e, "config": c,
           "arithmetic": [f"weights/GPU = {weights(c)} // {tp} = {w}",
                          f"KV bytes/token/GPU = 2 × {c['num_hidden_layers']} × max(1, {c['num_key_value_heads']} // {tp})"
                          f" × {hd} × 2 = {per_token}",
                          f"activation = {e['max_num_batched_tokens']} × {act_token} + {e['max_num_seqs']} × "
                          f"{c['vocab_size']} × 8 = {activation}",
                          f"CUDA graphs = {max(sizes)} × {act_token} + ({len(sizes)} − 1) × 2 MiB = {graphs}",
                          f"KV budget = {how} = {budget}"],
           "expect": {"weights_per_gpu": w, "kv_bytes_per_token_per_gpu": per_token, "kv_replicated": c["num_key_value_heads"] < tp,
                      "activation_peak": activation, "cudagraph": graphs, "non_torch": non_torch,
                      "cuda_context": context, "nccl": nccl, "kv_budget_per_gpu": budget, "weights_fit": fits}}
    if fits:
        tokens = blocks * e["block_size"]
        out["arithmetic"].append(f"blocks = {budget} // (16 × {per_token}) = {blocks}; concurrency = {tokens} / 8192")
        out["expect"].update(num_blocks=blocks, kv_pool_tokens=tokens,
                             max_concurrency=round(tokens / e["max_model_len"], 4))
    return out


def build() -> list[dict]:
    cases = []
    for name in MODELS:
        heads = MODELS[name]["num_attention_heads"]
        for tp in (1, 2, 4, 8):
            if heads % tp:
                continue
            for gpu_name, total in (("H100-80GB", H100), ("H200-141GB", H200)):
                cases.append(case(name, "vllm", tp, gpu_name, total))
    for tp in (4, 8):
        cases.append(case("Llama-3.1-70B", "sglang", tp, "H100-80GB", H100))
    return cases


def main(argv: list[str]) -> None:
    cases = build()
    for name, want in PUBLISHED_PARAMS_B.items():
        got = sum(params(MODELS[name])) / 1e9
        assert abs(got / want - 1) < 0.01, (name, got, want)
    if "--write" in argv:
        path = Path(__file__).resolve().parent.parent / "tests" / "data" / "capacity_published_vectors.json"
        path.write_text(json.dumps({"source": __doc__.splitlines()[0] + " (bench/bench_capacity_vectors.py)",
                                    "cases": cases}, indent=1) + "\n")
    print(f"{'case':44} {'weights/GPU GiB':>15} {'KV B/tok':>9} {'reserve GiB':>11} {'KV GiB':>8} {'conc@8k':>8}")
    for c in cases:
        x = c["expect"]
        reserve = x["activation_peak"] + x["cudagraph"] + x["non_torch"]
        conc = f"{x['max_concurrency']:.2f}" if x["weights_fit"] else "no fit"
        print(f"{c['name']:44} {x['weights_per_gpu'] / 2**30:15.2f} {x['kv_bytes_per_token_per_gpu']:9d} "
              f"{reserve / 2**30:11.2f} {x['kv_budget_per_gpu'] / 2**30:8.2f} {conc:>8}")


if __name__ == "__main__":
    main(sys.argv[1:])
