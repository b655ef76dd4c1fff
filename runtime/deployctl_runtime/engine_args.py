"""Engine settings: one frozen dataclass, named as the `serve` flags are, and the only validator of their values
(``serve``'s config delegates to it). deployctl's deploy.yaml checks the same limits; tests/data/engine_vectors.json
pins both sides.

Byte sizes (``parse_bytes``): an integer is bytes; ``K``, ``M``, ``G``, ``T`` and ``KiB``, ``MiB``, ``GiB``, ``TiB`` are
powers of 1024 (``512m`` = ``512MiB`` = 536870912, as docker, nginx and the JVM read them); ``KB``, ``MB``, ``GB``, ``TB``
are powers of 1000 (GPU vendors' "40GB"); ``B`` is bytes; case does not matter; a decimal number needs a digit
before the point (``0.5GiB``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

DEFAULT_CPU_KV_CACHE_MEMORY = 512 * 1024 * 1024
MAX_BLOCK_SIZE = 1024
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt](?:ib|b)?|b)?\s*", re.IGNORECASE)


def parse_bytes(value: Any) -> int:
    """``value`` in bytes (grammar in the module doc). Raises ValueError naming the value and the accepted forms."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected a size like 512MiB, 40GB or 536870912, got {value!r}")
    number, unit = match.group(1), (match.group(2) or "b").lower()
    scale = 1
    if unit != "b":  # k, kb, kib, m, ...: decimal only for the two-letter "kb", "mb", "gb", "tb"
        base = 1000 if len(unit) == 2 else 1024
        scale = base ** ("kmgt".index(unit[0]) + 1)
    return int(float(number) * scale)


@dataclass(frozen=True)
class EngineArgs:
    """Everything the engine needs to start. Sizes in tokens, blocks or bytes as named.

    dtype "auto": the config's torch_dtype on cuda, float32 on cpu. max_model_len None: min(max_position_embeddings,
    2048). kv_cache_memory: the KV pool budget in bytes on cpu (default 512 MiB); ignored on cuda, where the budget
    is total memory x gpu_memory_utilization minus weights, the profiled activation peak and the CUDA graphs' memory.
    enforce_eager: no CUDA graphs (vLLM's flag); CUDA only, the CPU path always runs eagerly.
    """

    model: str
    device: str = "cpu"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError ``"<field>: <problem>, got <value>"``: the field, the value and what is allowed."""
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device: {self.device!r} is not supported; use cpu or cuda")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: {self.dtype!r} is not supported; use auto, float32, bfloat16 or float16")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.block_size > MAX_BLOCK_SIZE or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size: must be a power of two up to {MAX_BLOCK_SIZE} (8, 16, 32, ...), "
                             f"got {self.block_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {self.max_model_len}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(f"num_gpu_blocks_override: must be >= 1, got {self.num_gpu_blocks_override}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(f"kv_cache_memory: must be >= 1 byte, got {self.kv_cache_memory}")
