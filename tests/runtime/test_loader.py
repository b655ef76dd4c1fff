"""Checkpoint loading: a checkpoint that does not match its config fails naming the tensor and both shapes."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deployctl_runtime import LLM
from deployctl_runtime.engine import LLMEngine
from deployctl_runtime.engine_args import EngineArgs


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_shape_mismatch_names_tensor_and_both_shapes(tiny_llama, tmp_path):
    bad = _copy(tiny_llama, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 200
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        LLMEngine.from_engine_args(EngineArgs(model=str(bad), max_model_len=256))
    msg = str(err.value)
    assert "model.layers.0.mlp.down_proj.weight" in msg or "gate_proj" in msg or "up_proj" in msg
    assert "(64, 192)" in msg or "(192, 64)" in msg
    assert "(64, 200)" in msg or "(200, 64)" in msg


def test_missing_tensor_is_named(tiny_llama, tmp_path):
    bad = _copy(tiny_llama, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks tensor model\.layers\.1\.self_attn\.v_proj\.weight"):
        LLMEngine.from_engine_args(EngineArgs(model=str(bad), max_model_len=256))


def test_unknown_model_type_and_missing_dir_are_clear(tiny_llama, tmp_path):
    bad = _copy(tiny_llama, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        LLMEngine.from_engine_args(EngineArgs(model=str(bad)))
    with pytest.raises(ValueError, match="config.json not found"):
        LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path / "nowhere")))


def test_bfloat16_engine_runs_and_mostly_agrees_with_float32(tiny_llama):
    prompt = list(range(40, 80))
    from deployctl_runtime import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    f32 = LLM(str(tiny_llama), max_model_len=256, num_gpu_blocks_override=32).generate([prompt], params)[0]
    bf16 = LLM(str(tiny_llama), max_model_len=256, num_gpu_blocks_override=32, dtype="bfloat16")
    assert bf16.engine.runner.kv_cache.dtype == torch.bfloat16
    out = bf16.generate([prompt], params)[0]
    assert len(out.token_ids) == 4 and out.token_ids[0] == f32.token_ids[0]
