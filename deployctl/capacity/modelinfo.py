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
# (the safetensors format's dtype list, safetensors/src/tensor.rs ``Dtype``; AWQ/GPTQ pack 4-bit weights in I32)
_ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
                   "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
# engine.kv_cache_dtype -> bytes per KV element (None: the serving dtype); vLLM's --kv-cache-dtype choices
# (vllm/config/cache.py ``CacheDType``): fp8 is fp8_e4m3 on CUDA.
KV_CACHE_DTYPE_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


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
    num_experts_per_tok: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert, DeepSeek's n_shared_experts × moe width
    num_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: layers with a dense MLP of intermediate_size
    quant_method: Optional[str] = None  # quantization_config.quant_method: awq, gptq, fp8, ...
    quant_bits: int = 16  # bits of a quantized linear weight (AWQ/GPTQ bits; 8 for FP8)
    quant_group_size: int = 0  # AWQ/GPTQ group_size (-1 or 0: per output channel)
    kv_scales_in_config: bool = False  # quantization_config names calibrated KV scales (kv_cache_scheme, ...)

    def _linear_params(self) -> tuple[int, int]:
        """(parameters of the quantizable linear layers, of the rest: embeddings, lm_head, norms, routers)."""
        h, layers = self.hidden_size, self.num_hidden_layers
        attn = (2 * h * self.num_attention_heads * self.head_dim + 2 * h * self.num_key_value_heads * self.head_dim)
        dense_mlp = 3 * h * self.intermediate_size
        if self.num_experts:
            moe_mlp = self.num_experts * 3 * h * self.moe_intermediate_size + 3 * h * self.shared_expert_intermediate_size
            moe_layers = layers - self.num_dense_layers
            linear = layers * attn + moe_layers * moe_mlp + self.num_dense_layers * dense_mlp
            router = moe_layers * h * self.num_experts
        else:
            linear, router = layers * (attn + dense_mlp), 0
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else embed
        return linear, embed + lm_head + router + layers * 2 * h + h

    def estimated_num_params(self) -> int:
        """Parameter count from the shape: embeddings, attention, MLP or every expert (routed + shared, dense
        layers first for DeepSeek), routers, norms, lm_head (none when tie_word_embeddings)."""
        linear, rest = self._linear_params()
        return linear + rest

    def estimated_weights_bytes(self, dtype_bytes: int) -> int:
        """Weights bytes from the config. Unquantized: parameters × dtype bytes. AWQ/GPTQ (vLLM's awq.py /
        gptq.py layouts): each linear weight packed at ``quant_bits``, plus per group of ``quant_group_size``
        inputs an fp16 scale and a packed zero point per output channel; FP8 (fp8.py): 1 byte per linear weight
        plus an fp32 scale per output channel. Embeddings, lm_head and norms stay at ``dtype_bytes``."""
        linear, rest = self._linear_params()
        if self.quant_method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "compressed-tensors") and self.quant_bits < 16:
            h = self.hidden_size
            group = self.quant_group_size if self.quant_group_size > 0 else h
            packed = linear * self.quant_bits // 8
            groups = linear // group  # one (scale, zero) per group of inputs per output channel
            return packed + groups * 2 + groups * self.quant_bits // 8 + rest * dtype_bytes
        if self.quant_method in ("fp8", "fbgemm_fp8") or self.quant_bits == 8:
            return linear + (linear // self.hidden_size) * 4 + rest * dtype_bytes
        return (linear + rest) * dtype_bytes

    def mlp_width(self) -> int:
        """Per-token MLP intermediate width at the peak layer (for the activation estimate): intermediate_size,
        or num_experts_per_tok × moe_intermediate_size + the shared experts' width for MoE."""
        if self.num_experts:
            return max(self.intermediate_size if self.num_dense_layers else 0,
                       (self.num_experts_per_tok or 2) * self.moe_intermediate_size + self.shared_expert_intermediate_size)
        return self.intermediate_size


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
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    moe_width = int(cfg.get("moe_intermediate_size") or 0)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0) or int(cfg.get("n_shared_experts") or 0) * moe_width
    q = cfg.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise ConfigError(f"{source}: quantization_config must be an object, got {q!r}")
    method = str(q.get("quant_method") or "").lower()
    group_size = int(q.get("group_size") or q.get("q_group_size") or 0)
    # compressed-tensors (llm-compressor): the bits are per scheme, config_groups.<name>.weights.num_bits; the
    # narrowest one sizes the linear layers (its docs: compressed_tensors/quantization/quant_scheme.py)
    ct = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    ct_bits = [int(w["num_bits"]) for w in ct if isinstance(w, dict) and w.get("num_bits")]
    if ct_bits:
        group_size = group_size or int(next((w.get("group_size") for w in ct if w.get("group_size")), 0) or 0)
    bits = int(q.get("bits") or q.get("w_bit") or (min(ct_bits) if ct_bits else 0) or (8 if "fp8" in method else 16))
    if method and bits not in (2, 3, 4, 8, 16):
        raise ConfigError(f"{source}: quantization_config.bits {bits} is not 2, 3, 4 or 8")
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
        num_experts=experts,
        # Mixtral's experts are full-width MLPs (intermediate_size); Qwen-MoE and DeepSeek give moe_intermediate_size
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 4 * hidden) if experts else 0,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
        shared_expert_intermediate_size=shared,
        num_dense_layers=int(cfg.get("first_k_dense_replace") or 0) if experts else 0,
        quant_method=str(q["quant_method"]).lower() if q.get("quant_method") else None,
        quant_bits=bits,
        quant_group_size=group_size,
        # compressed-tensors' kv_cache_scheme, ModelOpt's kv_cache_quant_algo: the checkpoint carries KV scales
        kv_scales_in_config=bool(q.get("kv_cache_scheme") or q.get("kv_cache_quant_algo")),
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


def safetensors_data_bytes(path: Path, skip: frozenset[str] = frozenset()) -> int:
    """Sum of tensor bytes declared in one safetensors file's header (dtype size × element count), leaving out the
    tensors named in ``skip``."""
    return sum(safetensors_bytes_by_dtype(path, skip).values())


def safetensors_bytes_by_dtype(path: Path, skip: frozenset[str] = frozenset()) -> dict[str, int]:
    """``safetensors_data_bytes`` per safetensors dtype tag ({"BF16": n, "F8_E4M3": m, ...})."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ConfigError(f"{path}: too short to be a safetensors file ({len(raw)} bytes)")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > 100 * 2**20:
            raise ConfigError(f"{path}: safetensors header length {header_len} is implausible; the file is corrupt or not safetensors")
        header = json.loads(f.read(header_len))
    total: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or name in skip:
            continue
        count = 1
        for dim in info["shape"]:
            count *= dim
        if info["dtype"] not in _ST_DTYPE_BYTES:
            raise ConfigError(f"{path}: tensor {name!r} has dtype {info['dtype']!r}, not one deployctl can size",
                              fix=f"one of {', '.join(_ST_DTYPE_BYTES)}; or plan from config.json alone (--model-config FILE)")
        total[info["dtype"]] = total.get(info["dtype"], 0) + count * _ST_DTYPE_BYTES[info["dtype"]]
    return total


# the output projection's tensor names in an HF checkpoint: the embedding's copy when the weights are tied
TIED_OUTPUT_TENSORS = frozenset({"lm_head.weight"})


def weights_bytes(model_dir: Optional[Path], shape: ModelShape, dtype_bytes: int) -> tuple[int, str]:
    """Weights size in bytes and where it came from ("safetensors headers": exact data bytes of every tensor, any
    dtype, quantized ones included; or "config estimate": ModelShape.estimated_weights_bytes). A Mistral-style
    ``consolidated.safetensors`` beside the HF shards is the same weights again and is not counted. With
    ``tie_word_embeddings`` a stored ``lm_head.weight`` is not counted either: the engines build the output layer
    on the embedding's tensor (vllm 0.33.0 models/llama.py ``lm_head.tie_weights(self.model.embed_tokens)``; the
    bundled runtime's loader.py skips the tensor), so it is in memory once."""
    files = sorted(model_dir.glob("*.safetensors")) if model_dir and model_dir.is_dir() else []
    if len(files) > 1:
        files = [f for f in files if not f.name.startswith("consolidated")] or files
    if files:
        skip = TIED_OUTPUT_TENSORS if shape.tie_word_embeddings else frozenset()
        return sum(safetensors_data_bytes(f, skip) for f in files), "safetensors headers"
    how = f"config estimate ({shape.quant_method} {shape.quant_bits}-bit)" if shape.quant_method else "config estimate"
    return shape.estimated_weights_bytes(dtype_bytes), how


# the config estimate and the headers disagreeing by more than this gets a note in the plan (issue 44)
ESTIMATE_TOLERANCE = 0.05


def weights_by_dtype(model_dir: Optional[Path], shape: ModelShape, dtype_bytes: int) -> dict[str, int]:
    """Weights bytes per dtype: from the safetensors headers ({"BF16": n, "F8_E4M3": m, "I32": k}, the files and
    tied-tensor rule of ``weights_bytes``), else the config estimate split into the quantized linear layers
    ("<quant_method> <bits>-bit") and the rest at the serving dtype ("<torch_dtype>")."""
    files = sorted(model_dir.glob("*.safetensors")) if model_dir and model_dir.is_dir() else []
    if len(files) > 1:
        files = [f for f in files if not f.name.startswith("consolidated")] or files
    if files:
        skip = TIED_OUTPUT_TENSORS if shape.tie_word_embeddings else frozenset()
        out: dict[str, int] = {}
        for f in files:
            for k, v in safetensors_bytes_by_dtype(f, skip).items():
                out[k] = out.get(k, 0) + v
        return out
    total = shape.estimated_weights_bytes(dtype_bytes)
    if not shape.quant_method or shape.quant_bits >= 16:
        return {shape.torch_dtype: total}
    rest = shape._linear_params()[1] * dtype_bytes
    return {f"{shape.quant_method} {shape.quant_bits}-bit": total - rest, shape.torch_dtype: rest}


def estimate_note(header_bytes: int, shape: ModelShape, dtype_bytes: int) -> Optional[str]:
    """A note when the config estimate differs from the headers' exact sum by more than 5% (None otherwise)."""
    est = shape.estimated_weights_bytes(dtype_bytes)
    if not header_bytes or abs(est - header_bytes) <= ESTIMATE_TOLERANCE * header_bytes:
        return None
    q = f" ({shape.quant_method} {shape.quant_bits}-bit)" if shape.quant_method else ""
    return (f"weights: the safetensors headers hold {header_bytes:,} bytes, the config estimate{q} gives {est:,} "
            f"({100 * (est - header_bytes) / header_bytes:+.1f}%); the plan uses the headers")


# tensor names of calibrated KV scales in a checkpoint (vLLM's attention layers load k_scale / v_scale, or one
# kv_scale for both: vllm model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod)
KV_SCALE_SUFFIXES = ("k_scale", "v_scale", "kv_scale")


def kv_scales_source(model_dir: Optional[Path], shape: ModelShape) -> tuple[str, Optional[str]]:
    """Where an fp8 KV cache's scales come from: ("checkpoint", None) when config.json's quantization_config
    names them or a safetensors header holds ``*.k_scale`` / ``*.v_scale`` / ``*.kv_scale`` tensors; else
    ("1.0", warning): the engine scales K and V by 1.0, uncalibrated."""
    if shape.kv_scales_in_config:
        return "checkpoint", None
    files = sorted(model_dir.glob("*.safetensors")) if model_dir and model_dir.is_dir() else []
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            names = json.loads(fh.read(n)) if n <= 100 * 2**20 else {}
        if any(k.endswith(KV_SCALE_SUFFIXES) for k in names):
            return "checkpoint", None
    where = "the safetensors headers" if files else "config.json (no safetensors headers here)"
    return "1.0", (f"fp8 KV cache with scale 1.0: {where} carry no calibrated k_scale/v_scale, so K and V are cast "
                   "to fp8 unscaled (values past fp8's range clip and accuracy can drop); use a checkpoint with KV "
                   "scales (llm-compressor's kv_cache_scheme) or check the answers against the bf16 KV cache")


def kv_dtype_bytes(kv_cache_dtype: str, serving_dtype_bytes: int) -> int:
    """Bytes per K/V element for engine.kv_cache_dtype ("auto": the serving dtype's)."""
    return KV_CACHE_DTYPE_BYTES.get(kv_cache_dtype) or serving_dtype_bytes


def dtype_bytes(dtype: str, shape: ModelShape, device: str = "cuda") -> int:
    """Bytes per element for the serving dtype. "auto" is the config's torch_dtype on cuda and
    float32 on cpu, as the runtime resolves it."""
    name = dtype if dtype != "auto" else ("float32" if device == "cpu" else shape.torch_dtype)
    if name not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {name!r}", fix=f"use one of: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]
