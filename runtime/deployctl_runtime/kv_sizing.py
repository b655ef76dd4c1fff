"""KV cache sizing: bytes per token, blocks from a memory budget, and the C01 check. No torch.

The same arithmetic as `deployctl plan` (deployctl/capacity.py); tests/data/capacity_vectors.json pins both.
Formula (vLLM's KV cache spec; shared/models/known-shapes.md):
    kv_bytes_per_token = 2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x dtype_bytes
    num_blocks = num_gpu_blocks_override, else floor(budget_bytes / (block_size x kv_bytes_per_token)), min 0
    CUDA budget_bytes = floor(total_memory x gpu_memory_utilization) - weights_bytes - activation_peak_bytes
                        (the runtime's peak includes its CUDA graphs' measured memory unless --enforce-eager)
    CPU budget_bytes = kv_cache_memory
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def head_dim_of(config: dict) -> int:
    """`head_dim` from the HF config when given, else hidden_size // num_attention_heads."""
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def kv_bytes_per_token(num_hidden_layers: int, num_key_value_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V one token occupies across all layers."""
    return 2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes


def num_blocks_for(budget_bytes: int, block_size: int, bytes_per_token: int,
                   num_gpu_blocks_override: int | None = None) -> int:
    """Blocks in the pool: the override when given, else floor(budget / (block_size x bytes/token)), at least 0."""
    if num_gpu_blocks_override is not None:
        return int(num_gpu_blocks_override)
    return max(0, int(budget_bytes) // (block_size * bytes_per_token))


def cuda_budget_bytes(total_memory: int, gpu_memory_utilization: float, weights_bytes: int,
                      activation_peak_bytes: int) -> int:
    return math.floor(total_memory * gpu_memory_utilization) - weights_bytes - activation_peak_bytes


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int
    block_size: int
    kv_bytes_per_token: int
    max_model_len: int
    max_num_seqs: int

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len tokens the pool holds at once (pool tokens / max_model_len)."""
        return self.pool_tokens / self.max_model_len

    def summary(self) -> str:
        return (f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens = {self.pool_tokens} tokens "
                f"({self.kv_bytes_per_token} bytes/token, {self.num_blocks * self.block_size * self.kv_bytes_per_token}"
                f" bytes); max concurrency at max_model_len {self.max_model_len}: {self.max_concurrency:.2f}x")

    def check_fits(self) -> None:
        """C01: refuse when one max_model_len request cannot fit in the pool."""
        if self.pool_tokens < self.max_model_len:
            raise ValueError(
                f"KV cache too small: max_model_len {self.max_model_len} needs {self.max_model_len} tokens but the pool "
                f"holds {self.pool_tokens} tokens ({self.num_blocks} blocks x block_size {self.block_size}, "
                f"{self.kv_bytes_per_token} bytes/token); the largest feasible max_model_len is {self.pool_tokens}. "
                f"Lower --max-model-len to {self.pool_tokens} or give the KV cache more memory "
                f"(--gpu-memory-utilization, --num-gpu-blocks-override, kv_cache_memory)")
