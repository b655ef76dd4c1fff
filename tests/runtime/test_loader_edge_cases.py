"""Broken model directories fail to load with a message naming the file (found by starting `serve` on them: the
log said only "'list' object has no attribute 'get'", "Model missing. at line 1 column 2", or "Error while
deserializing header: incomplete metadata, file not fully covered")."""
from __future__ import annotations

import shutil

import pytest

from deployctl_runtime.engine import LLMEngine
from deployctl_runtime.engine_args import EngineArgs


def _broken(tiny_llama, tmp_path, name: str, mutate):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    (bad / "manifest.sha256").unlink()  # a model without a manifest: nothing verifies it before loading
    mutate(bad / name)
    return bad


@pytest.mark.parametrize("name,mutate", [
    ("config.json", lambda p: p.write_text("[1, 2]")),
    ("tokenizer.json", lambda p: p.write_text("{}")),
    ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
], ids=["config-not-an-object", "tokenizer-json-empty-object", "safetensors-truncated"])
def test_broken_file_is_named(tiny_llama, tmp_path, name, mutate):
    bad = _broken(tiny_llama, tmp_path, name, mutate)
    with pytest.raises(ValueError) as err:
        LLMEngine.from_engine_args(EngineArgs(model=str(bad), max_model_len=128, num_gpu_blocks_override=16))
    assert name in str(err.value), str(err.value)
