"""Issue 44: `plan` follows deploy.yaml's rules for the engine (one home: engines.validate.check_engine_settings),
and counts a tied checkpoint's weights as the engines load them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deployctl.config import parse_config
from deployctl.errors import ConfigError

LLAMA_TINY = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048,
              "torch_dtype": "float32"}


def _deploy_yaml(model, engine: str) -> str:
    return (f"service: {{name: x}}\nmodel: {{path: {model}, dtype: float32}}\n"
            f"engine: {{{engine}}}\nhosts:\n  - {{name: h0, address: 10.0.0.1, deploy_root: /opt/x}}\n")


def _plan(cfg, *args):
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(cfg), "--gpu-memory", "8GiB", *args],
                          capture_output=True, text=True, timeout=60)


def test_plan_refuses_fp8_kv_on_the_bundled_runtime_as_deploy_yaml_does(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_TINY))
    with pytest.raises(ConfigError) as refused:
        parse_config(_deploy_yaml(model, "max_model_len: 1024, kv_cache_dtype: fp8"), "deploy.yaml")
    says = "engine.kv_cache_dtype 'fp8': deployctl-runtime has no such setting; remove it or use engine.kind vllm or sglang"
    assert says in str(refused.value)
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(_deploy_yaml(model, "max_model_len: 1024"))
    proc = _plan(cfg, "--kv-cache-dtype", "fp8", "--json")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert _plan(cfg, "--json").returncode == 0
    # vLLM takes it: the same override plans
    cfg.write_text(_deploy_yaml(model, "kind: vllm, version: 0.33.0, device: cuda, max_model_len: 1024"))
    assert _plan(cfg, "--kv-cache-dtype", "fp8", "--json").returncode in (0, 1)


def _checkpoint(model, *, tied: bool, with_lm_head: bool) -> dict:
    """A real safetensors checkpoint of LLAMA_TINY's shape (float32, numpy), with both the embedding and, when
    ``with_lm_head``, a stored lm_head.weight. Returns the tensors' byte sizes by name."""
    import numpy as np
    from safetensors.numpy import save_file

    model.mkdir()
    c = {**LLAMA_TINY, "tie_word_embeddings": tied}
    (model / "config.json").write_text(json.dumps(c))
    h, v, i = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    tensors = {"model.embed_tokens.weight": np.zeros((v, h), np.float32), "model.norm.weight": np.ones(h, np.float32)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors |= {p + f"self_attn.{x}_proj.weight": np.zeros((h, h), np.float32) for x in "qkvo"}
        tensors |= {p + "mlp.gate_proj.weight": np.zeros((i, h), np.float32),
                    p + "mlp.up_proj.weight": np.zeros((i, h), np.float32),
                    p + "mlp.down_proj.weight": np.zeros((h, i), np.float32),
                    p + "input_layernorm.weight": np.ones(h, np.float32),
                    p + "post_attention_layernorm.weight": np.ones(h, np.float32)}
    if with_lm_head:
        tensors["lm_head.weight"] = np.zeros((v, h), np.float32)
    save_file(tensors, str(model / "model.safetensors"))
    return {name: t.nbytes for name, t in tensors.items()}


def _weights(tmp_path, name: str, **kw) -> tuple[int, dict]:
    model = tmp_path / name
    sizes = _checkpoint(model, **kw)
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(_deploy_yaml(model, "max_model_len: 1024"))
    proc = _plan(cfg, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    return doc["weights_bytes"], sizes  # tensor_parallel_size 1: the GPU holds them all


def test_a_tied_checkpoint_that_stores_lm_head_counts_it_once(tmp_path):
    tied, sizes = _weights(tmp_path, "tied", tied=True, with_lm_head=True)
    assert tied == sum(sizes.values()) - sizes["lm_head.weight"]
    tied_without, _ = _weights(tmp_path, "tied-without", tied=True, with_lm_head=False)
    assert tied == tied_without  # the same model in memory, whether the file repeats the tensor or not
    untied, sizes = _weights(tmp_path, "untied", tied=False, with_lm_head=True)
    assert untied == sum(sizes.values())  # an untied lm_head is a tensor of its own
