"""`deployctl-runtime tiny-model` writes a loadable, reproducible HF-format checkpoint."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys


def test_cli_writes_checkpoint_with_verifiable_manifest(tmp_path, runtime_env):
    out = tmp_path / "tiny"
    proc = subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(out), "--arch", "qwen3",
                           "--seed", "3"], capture_output=True, text=True, env=runtime_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "manifest.sha256"} <= names
    lines = (out / "manifest.sha256").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, rel = line.split("  ", 1)
        listed[rel] = digest
    assert set(listed) == names - {"manifest.sha256"}
    for rel, digest in listed.items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["max_position_embeddings"] >= 4096
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert cfg["eos_token_id"] in gen["eos_token_id"]


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    from deployctl_runtime.tiny_model import write_tiny_model

    a = write_tiny_model(tmp_path / "a", seed=1)
    b = write_tiny_model(tmp_path / "b", seed=1)
    c = write_tiny_model(tmp_path / "c", seed=2)
    assert (a / "manifest.sha256").read_text() == (b / "manifest.sha256").read_text()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_byte_level_tokenizer_splits_multibyte_characters(tiny_llama):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_llama / "tokenizer.json"))
    text = "聪明 😊 ďábel"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "expected at least one token holding part of a UTF-8 character"


def test_cli_without_command_prints_help_and_exits_2(runtime_env):
    proc = subprocess.run([sys.executable, "-m", "deployctl_runtime"], capture_output=True, text=True,
                          env=runtime_env, timeout=60)
    assert proc.returncode == 2 and "tiny-model" in proc.stderr


def test_import_is_lazy(runtime_env):
    code = "import sys, deployctl_runtime; assert 'torch' not in sys.modules; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=runtime_env, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
