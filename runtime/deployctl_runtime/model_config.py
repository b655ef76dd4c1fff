"""The model facts the engine needs, read once from an HF config.json. No torch."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deployctl_runtime.kv_sizing import head_dim_of

FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class ModelConfig:
    family: str  # llama | qwen2 | qwen3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # {"rope_type": "llama3", "factor", "low_freq_factor", ...} or None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"model: {path} not found; point --model at an HF checkpoint directory with config.json")
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, got {type(data).__name__}")
            return cls.from_dict(data)
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"model: {path} is not a usable HF config ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def from_dict(cls, c: dict) -> "ModelConfig":
        model_type = c.get("model_type")
        family = FAMILIES.get(model_type)
        if family is None:
            raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(FAMILIES))}")
        rope = dict(c.get("rope_parameters") or {})  # transformers >= 5
        legacy = c.get("rope_scaling") or {}
        theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
        scaling = {**legacy, **{k: v for k, v in rope.items() if k != "rope_theta"}}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        scaling = None if rope_type == "default" else {**scaling, "rope_type": rope_type}
        eos = c.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        n_heads = int(c["num_attention_heads"])
        return cls(
            family=family,
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(c.get("num_key_value_heads") or n_heads),
            head_dim=head_dim_of(c),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            attention_bias=bool(c.get("attention_bias", family == "qwen2")) or family == "qwen2",
            torch_dtype=c.get("torch_dtype") or c.get("dtype"),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
