"""`serve` settings: one frozen pydantic model fed from defaults, then the YAML `--config`, then command-line flags.

YAML keys are the flag names with dashes turned into underscores (`--max-model-len` -> `max_model_len`); unknown
keys and wrong types are errors naming the key. API keys are never a setting here (env or --api-key-file only).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: Any) -> int:
    """`536870912`, `512MiB`, `0.5GiB` -> bytes. Raises ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte count: {value!r}")
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte count: {value!r} (use e.g. 536870912 or 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    served_model_name: str | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    block_size: int = Field(16, ge=1)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_memory: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    seed: int = 0
    max_queued_requests: int = Field(256, ge=0)
    request_timeout_s: float = Field(600.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    api_key_file: str | None = None
    metrics_public: bool = False
    release_id: str | None = None
    skip_verify: bool = False
    log_requests: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> Any:
        return None if v is None else parse_bytes(v)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for EngineArgs (ENGINE_API.md)."""
        keys = ("model", "device", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                "num_gpu_blocks_override", "gpu_memory_utilization", "kv_cache_memory", "enable_prefix_caching",
                "enable_chunked_prefill", "enforce_eager", "seed")
        return {k: getattr(self, k) for k in keys}


def load_config(cli: dict[str, Any], config_path: str | None) -> ServeConfig:
    """Merge YAML file values under explicit CLI values. Raises ValueError with a one-line message."""
    values: dict[str, Any] = {}
    if config_path:
        import yaml

        try:
            loaded = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ValueError(f"--config {config_path}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"--config {config_path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                             f"{exc.start})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{config_path}:{mark.line + 1}:{mark.column + 1}" if mark else config_path
            raise ValueError(f"--config {where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {config_path}: must be a mapping of serve settings")
        for key in loaded:
            if key in ("api_key", "api_keys"):
                raise ValueError(f"--config {config_path}: '{key}' is not allowed here; "
                                 "use env DEPLOYCTL_RUNTIME_API_KEY or api_key_file")
        values.update(loaded)
    values.update({k: v for k, v in cli.items() if v is not None})
    if "model" not in values:
        raise ValueError("--model is required (or `model:` in --config)")
    try:
        return ServeConfig(**values)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in err["loc"])
        where = f" in {config_path}" if config_path and key in values and key not in cli else ""
        raise ValueError(f"serve setting '{key}'{where}: {err['msg']} (got {err.get('input')!r})") from None
