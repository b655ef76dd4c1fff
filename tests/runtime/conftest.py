"""Runtime fixtures: tiny checkpoints written once per session by the runtime's own tiny-model code."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "runtime"
# Without a GPU the Triton kernels run interpreted on CPU tensors. Triton reads this when it is first imported (its
# own library functions are decorated then), so it is set here, before any test module imports triton.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if str(RUNTIME_DIR) not in sys.path:  # CI installs it editable; locally PYTHONPATH may lack it
    sys.path.insert(0, str(RUNTIME_DIR))


@pytest.fixture(scope="session")
def runtime_env() -> dict:
    """Environment for `python -m deployctl_runtime` subprocesses: our runtime/ first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNTIME_DIR), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory(arch="llama", seed=0) -> Path of a tiny checkpoint (cached per arch/seed)."""
    from deployctl_runtime.tiny_model import write_tiny_model

    cache: dict = {}

    def make(arch: str = "llama", seed: int = 0) -> Path:
        key = (arch, seed)
        if key not in cache:
            cache[key] = write_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}-{seed}"), arch=arch, seed=seed)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


HF_SHAPES = {
    # family -> (transformers config class name, extra config)
    "llama": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2": ("Qwen2Config", dict()),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True)),
}


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """hf_checkpoint(kind, sharded=False) -> (dir, HF model): a checkpoint written by transformers' own
    save_pretrained, with seeded random weights scaled so greedy choices are well separated (norm weights and
    biases randomized too, so q/k norm and qkv bias matter)."""
    import torch
    import transformers

    cache: dict = {}

    def make(kind: str, sharded: bool = False):
        key = (kind, sharded)
        if key in cache:
            return cache[key]
        cls_name, extra = HF_SHAPES[kind]
        base = dict(vocab_size=320, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=False)
        cfg = getattr(transformers, cls_name)(**{**base, **extra})
        torch.manual_seed(1234)
        model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(cfg).eval()
        g = torch.Generator().manual_seed(sum(map(ord, kind)))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                elif name.endswith("bias"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
                elif p.dim() == 2 and "embed_tokens" in name:
                    p.copy_(torch.randn(p.shape, generator=g))
                elif p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        out = tmp_path_factory.mktemp(f"hf-{kind}{'-sharded' if sharded else ''}")
        model.save_pretrained(out, max_shard_size="100KB" if sharded else "1GB")
        _write_bytelevel_tokenizer(out)
        cache[key] = (out, model)
        return cache[key]

    return make


def _write_bytelevel_tokenizer(out: Path) -> None:
    """The engine needs tokenizer.json; parity tests feed token ids, so any byte-level tokenizer will do."""
    from deployctl_runtime.tiny_model import train_tokenizer

    train_tokenizer(vocab_size=300).save(str(out / "tokenizer.json"))
