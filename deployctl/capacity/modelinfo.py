"""What the capacity plan needs to know about a model: its shape (from config.json) and weights size.

Shapes follow the HF config keys of Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE. head_dim is the
config's ``head_dim`` when given, else hidden_size / num_attention_heads (as transformers does).
Weights bytes are the sum of tensor sizes in the safetensors headers when the files are present,
otherwise the parameter count estimated from the config × dtype bytes.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from deployctl.errors import ConfigError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "float8_e4m3fn": 1}
# safetensors dtype tags -> bytes per element
_ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                   "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class ModelShape:
    """The parts of an HF config.json that size the KV cache and the weights."""

    model_type: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: Optional[int]
    torch_dtype: str
    tie_word_embeddings: bool
    num_experts: int = 0
    moe_intermediate_size: int = 0

    def estimated_num_params(self) -> int:
        """Parameter count from the shape: embeddings, attention, MLP (or experts), norms, lm_head."""
        h, layers = self.hidden_size, self.num_hidden_layers
        q = h * self.num_attention_heads * self.head_dim
        kv = 2 * h * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        if self.num_experts:
            mlp = self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
        else:
            mlp = 3 * h * self.intermediate_size
        per_layer = q + kv + o + mlp + 2 * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else embed
        return embed + layers * per_layer + h + lm_head


def _require_int(cfg: dict, key: str, source: str, alt: Optional[str] = None) -> int:
    value = cfg.get(key, cfg.get(alt) if alt else None)
    if value is None:
        raise ConfigError(f"{source}: no {key!r} key", fix="is this an HF config.json of a decoder-only model (Llama, Mistral, Qwen)?")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{source}: {key} must be a positive integer, got {value!r}")
    return value


def parse_model_config(cfg: dict, source: str = "config.json") -> ModelShape:
    """Build a ModelShape from a config.json mapping. Raises ConfigError naming the key."""
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    layers = _require_int(cfg, "num_hidden_layers", source, alt="n_layer")
    heads = _require_int(cfg, "num_attention_heads", source)
    hidden = _require_int(cfg, "hidden_size", source)
    kv_heads = cfg.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ConfigError(f"{source}: num_key_value_heads must be a positive integer, got {kv_heads!r}")
    head_dim = cfg.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim <= 0:
        raise ConfigError(f"{source}: head_dim must be a positive integer, got {head_dim!r}")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    max_pos = cfg.get("max_position_embeddings")
    return ModelShape(
        model_type=str(cfg.get("model_type", "llama")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
        vocab_size=int(cfg.get("vocab_size") or 32000),
        max_position_embeddings=int(max_pos) if max_pos else None,
        torch_dtype=dtype,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
    )


def load_model_config(path: str | Path) -> ModelShape:
    """Read config.json (a file, or a model directory holding one). Raises ConfigError."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file", fix="point model.path (or --model-config) at an HF model directory with config.json") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p}: expected a JSON object")
    return parse_model_config(cfg, str(p))


def safetensors_data_bytes(path: Path) -> int:
    """Sum of tensor bytes declared in one safetensors file's header (dtype size × element count)."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ConfigError(f"{path}: too short to be a safetensors file ({len(raw)} bytes)")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > 100 * 2**20:
            raise ConfigError(f"{path}: safetensors header length {header_len} is implausible; the file is corrupt or not safetensors")
        header = json.loads(f.read(header_len))
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        total += count * _ST_DTYPE_BYTES.get(info["dtype"], 2)
    return total


def weights_bytes(model_dir: Optional[Path], shape: ModelShape, dtype_bytes: int) -> tuple[int, str]:
    """Weights size in bytes and where it came from ("safetensors headers" or "parameter estimate")."""
    files = sorted(model_dir.glob("*.safetensors")) if model_dir and model_dir.is_dir() else []
    if files:
        return sum(safetensors_data_bytes(f) for f in files), "safetensors headers"
    return shape.estimated_num_params() * dtype_bytes, "parameter estimate"


def dtype_bytes(dtype: str, shape: ModelShape, device: str = "cuda") -> int:
    """Bytes per element for the serving dtype. "auto" is the config's torch_dtype on cuda and
    float32 on cpu, as the runtime resolves it."""
    name = dtype if dtype != "auto" else ("float32" if device == "cpu" else shape.torch_dtype)
    if name not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {name!r}", fix=f"use one of: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]
