"""Engine settings: one frozen dataclass, named as the `serve` flags are."""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CPU_KV_CACHE_MEMORY = 512 * 1024 * 1024


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
        """Raise ValueError naming the field, the value and the fix."""
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device: {self.device!r} is not supported; use cpu or cuda")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: {self.dtype!r} is not supported; use auto, float32, bfloat16 or float16")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {self.max_model_len}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 0:
            raise ValueError(f"num_gpu_blocks_override: must be >= 0, got {self.num_gpu_blocks_override}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 0:
            raise ValueError(f"kv_cache_memory: must be >= 0 bytes, got {self.kv_cache_memory}")
