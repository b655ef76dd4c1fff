"""Issue 44, fp8 KV: the plan says where the KV scales come from (the checkpoint's config or headers, or 1.0 with a
warning); preflight fails fp8 KV on a GPU below the engine's minimum compute capability, naming both (recorded
NVML facts, tests/data/facts/h100x8_vllm.json). vLLM 0.33's own parser has no --calculate-kv-scales, which is why
deployctl does not render it: tests/deployctl/engines/test_engines_parsers.py checks that with the real parser."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

from deployctl.config import parse_config
from deployctl.preflight import check_facts
from support import paths

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048,
         "torch_dtype": "bfloat16"}
FACTS = json.loads((paths.DATA / "facts" / "h100x8_vllm.json").read_text())


def _notes(model_dir) -> list[str]:
    cfg = model_dir.parent / f"{model_dir.name}.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: {model_dir}, dtype: bfloat16}}\n"
                   "engine: {kind: vllm, version: 0.33.0, device: cuda, max_model_len: 1024}\n"
                   "hosts:\n  - {name: h0, address: 10.0.0.1, deploy_root: /opt/x}\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(cfg), "--gpu-memory", "24GiB",
                           "--kv-cache-dtype", "fp8", "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)["notes"]


def _checkpoint(d, config: dict, with_scales: bool) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    t = {"model.embed_tokens.weight": np.zeros((1000, 256), np.float16)}
    if with_scales:
        t |= {f"model.layers.{n}.self_attn.{x}": np.ones((), np.float32) for n in range(2) for x in ("k_scale", "v_scale")}
    save_file(t, str(d / "model.safetensors"))


def test_plan_names_where_the_kv_scales_come_from(tmp_path):
    _checkpoint(tmp_path / "calibrated", LLAMA, with_scales=True)
    assert "KV scales: from the checkpoint (fp8 KV cache)" in _notes(tmp_path / "calibrated")
    _checkpoint(tmp_path / "plain", LLAMA, with_scales=False)
    warn = [n for n in _notes(tmp_path / "plain") if n.startswith("fp8 KV cache with scale 1.0")]
    assert warn and "the safetensors headers carry no calibrated k_scale/v_scale" in warn[0]
    scheme = tmp_path / "scheme"
    scheme.mkdir()
    (scheme / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {},
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}))
    assert "KV scales: from the checkpoint (fp8 KV cache)" in _notes(scheme)


def _preflight(cc: str | None, kv: str = "fp8") -> dict:
    cfg = parse_config(f"""
service: {{name: llama-8b}}
model: {{path: /models/llama-3-8b-instruct, dtype: bfloat16}}
engine: {{kind: vllm, version: 0.33.0, gpu_memory_utilization: 0.9, kv_cache_dtype: {kv}}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/llama-8b, python: /opt/deployctl/venv/bin/python,
      gpus: [4]}}
""")
    facts = copy.deepcopy(FACTS)
    for g in facts["nvidia"]["gpus"]:
        if g["index"] == 4 and cc != "recorded":
            g["compute_capability"] = cc  # the recorded H100 (9.0), or an older GPU's figure
    rep = check_facts(cfg, [(cfg.hosts[0], facts)], {})
    return {c.name: c for c in rep.hosts[0].checks}


def test_preflight_fails_fp8_kv_below_the_engines_minimum_compute_capability():
    ok = _preflight("recorded")["kv_cache_dtype"]
    assert ok.status == "pass" and "compute capability 8.9 or later" in ok.message
    low = _preflight("8.0")["kv_cache_dtype"]
    assert low.status == "fail"
    assert "GPU 4 (NVIDIA H100 80GB HBM3) compute capability 8.0, below the 8.9 that vllm's fp8 KV cache needs" \
        in low.message, low.message
    assert "kv_cache_dtype: auto" in low.fix
    assert _preflight(None)["kv_cache_dtype"].status == "warn"
    assert "kv_cache_dtype" not in _preflight("8.0", kv="auto")  # bf16 KV: nothing to check
