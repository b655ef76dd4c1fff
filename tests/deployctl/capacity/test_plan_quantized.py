"""Issue 44, quantized honesty: the config-only estimate reads compressed-tensors (config_groups.*.weights.num_bits),
GPTQ/AWQ (bits) and fp8 configs; with safetensors headers present both are computed and a difference over 5% is
noted; `plan --json` gives weights_by_dtype, experts_total, experts_active and weights_source. Real safetensors
checkpoints (seeded tensors, torch's float8_e4m3fn)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deployctl.capacity.modelinfo import parse_model_config

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048,
         "torch_dtype": "bfloat16", "tie_word_embeddings": False}
CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                          "strategy": "channel"}}}}


def _plan(model_dir, *args):
    proc = subprocess.run([sys.executable, "-m", "deployctl", "plan", "--model-config", str(model_dir),
                           "--gpu-memory", "24GiB", "--max-model-len", "1024", "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("q,bits", [(CT_FP8, 8), ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4),
                                    ({"quant_method": "awq", "bits": 4, "group_size": 128}, 4),
                                    ({"quant_method": "fp8"}, 8)])
def test_config_only_estimate_reads_the_quantization_config(q, bits):
    plain = parse_model_config(LLAMA)
    quant = parse_model_config({**LLAMA, "quantization_config": q})
    assert quant.quant_bits == bits
    full, est = plain.estimated_weights_bytes(2), quant.estimated_weights_bytes(2)
    linear, rest = plain._linear_params()
    # the linear layers at `bits` (plus their scales), the rest at bf16: never the bf16 size of the whole model
    assert linear * bits // 8 + rest * 2 <= est < full
    assert est <= linear * bits // 8 + rest * 2 + linear // 16, (est, linear, rest)


def _fp8_checkpoint(d, config: dict) -> dict:
    """A compressed-tensors-style FP8 checkpoint of LLAMA's shape: linear weights F8_E4M3 with an F32 scale per
    output channel, embeddings, lm_head and norms BF16. Returns bytes per safetensors dtype."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    h, v, i = LLAMA["hidden_size"], LLAMA["vocab_size"], LLAMA["intermediate_size"]
    t = {"model.embed_tokens.weight": torch.randn(v, h, dtype=torch.bfloat16),
         "lm_head.weight": torch.randn(v, h, dtype=torch.bfloat16), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for n in range(LLAMA["num_hidden_layers"]):
        p = f"model.layers.{n}."
        for name, (o, k) in {"self_attn.q_proj": (h, h), "self_attn.k_proj": (h, h), "self_attn.v_proj": (h, h),
                             "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h),
                             "mlp.down_proj": (h, i)}.items():
            t[p + name + ".weight"] = torch.randn(o, k).to(torch.float8_e4m3fn)
            t[p + name + ".weight_scale"] = torch.rand(o, 1, dtype=torch.float32)
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    save_file(t, str(d / "model.safetensors"))
    by: dict = {}
    tag = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}
    for x in t.values():
        by[tag[x.dtype]] = by.get(tag[x.dtype], 0) + x.numel() * x.element_size()
    return by


def test_fp8_headers_and_config_agree_and_a_config_that_says_bf16_is_noted(tmp_path):
    by = _fp8_checkpoint(tmp_path / "fp8", {**LLAMA, "quantization_config": CT_FP8})
    doc = _plan(tmp_path / "fp8")
    assert doc["weights_source"] == "safetensors headers"
    assert doc["weights_by_dtype"] == by and doc["weights_bytes"] == sum(by.values())
    assert not any(n.startswith("weights: the safetensors headers") for n in doc["notes"]), doc["notes"]
    assert (doc["experts_total"], doc["experts_active"]) == (0, 0)

    # the same headers under a config without its quantization_config: the estimate is bf16, +40% here: noted
    _fp8_checkpoint(tmp_path / "unmarked", LLAMA)
    doc = _plan(tmp_path / "unmarked")
    note = next(n for n in doc["notes"] if n.startswith("weights: the safetensors headers"))
    assert f"hold {sum(by.values()):,} bytes" in note and "the plan uses the headers" in note
    assert doc["weights_bytes"] == sum(by.values())


def test_config_only_plan_json_names_source_dtypes_and_experts(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    moe = {**LLAMA, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 128, "quantization_config": CT_FP8}
    (d / "config.json").write_text(json.dumps(moe))
    doc = _plan(d)
    assert doc["weights_source"] == "config estimate (compressed-tensors 8-bit)"
    assert (doc["experts_total"], doc["experts_active"]) == (8, 2)
    assert set(doc["weights_by_dtype"]) == {"compressed-tensors 8-bit", "bfloat16"}
    assert sum(doc["weights_by_dtype"].values()) == doc["weights_bytes"]
    bf16 = parse_model_config({**moe, "quantization_config": None}).estimated_weights_bytes(2)
    assert doc["weights_bytes"] == parse_model_config(moe).estimated_weights_bytes(2)
    assert bf16 > 1.6 * doc["weights_bytes"]  # not sized as bf16 (before: num_bits unread, the bf16 size)
