"""Capacity per engine and per GPU under tensor parallelism (pure arithmetic, bytes as integers).

Sharding (vLLM and SGLang alike, Megatron-style tensor parallelism):
- weights per GPU = weights / TP: attention and MLP projections are column/row-parallel, the embedding and
  lm_head vocab-parallel (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py); the replicated
  norms are below 0.01% of an 8B model and ignored.
- KV heads per GPU = max(1, kv_heads // TP): with fewer KV heads than ranks each rank keeps one replicated head
  (vllm 0.33.0 vllm/config/model.py ``get_num_kv_heads``: ``max(1, total_num_kv_heads // tensor_parallel_size)``).
- KV bytes per token per GPU = 2 (K and V) × layers × KV heads per GPU × head_dim × dtype bytes.

Memory budget per GPU (``semantics``):
- ``vllm``: gpu_memory_utilization is a fraction of the whole GPU that holds weights, the activation peak and
  CUDA graphs and the KV cache: KV = total × utilization − weights/TP − reserve
  (vllm 0.33.0 vllm/v1/worker/gpu_worker.py ``determine_available_memory``: requested memory minus the non-KV memory the
  profile run measured). ``plan_gpu`` takes the reserve as one line; ``deployctl plan`` computes it by part
  (activation peak, CUDA graphs, non-torch; CUDA context and NCCL outside the share) in deployctl.engines.reserve,
  and the bundled runtime's as engine.runtime_overhead (it measures its own at start).
- ``sglang``: mem_fraction_static covers weights and the KV pool only; activations and CUDA graphs live in the
  rest (sglang 0.5.23 sglang/srt/mem_cache/kv_cache_configurator.py ``_profile_available_bytes``: KV pool = free
  memory after the weights load − pre-load memory × (1 − mem_fraction_static)): KV = total × fraction − weights/TP,
  and the reserve is total × (1 − fraction).
- ``explicit``: the engine is told its block count (transformers serve ``--cb-num-blocks``).
- a generic server (engine.kind openai) is planned with ``vllm`` semantics and engine.runtime_overhead as its
  reserve (an assumption: deployctl cannot read how an unknown server sizes its cache; a ``{num_gpu_blocks}``
  placeholder in its command tells it the plan's count).
Blocks = floor(KV budget per GPU / (block_size × KV bytes per token per GPU)), the same on every rank;
max concurrency = blocks × block_size / max_model_len.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

SEMANTICS = {"deployctl-runtime": "vllm", "vllm": "vllm", "sglang": "sglang", "transformers": "explicit",
             "openai": "vllm"}


@dataclass(frozen=True)
class GpuPlan:
    """One GPU's share under TP. Bytes are integers; ``reserve_bytes`` is what the budget keeps off the KV pool
    inside the GPU (vllm: the runtime_overhead line) or outside the fraction (sglang: total × (1 − fraction))."""

    engine: str
    semantics: str
    tensor_parallel_size: int
    gpu_memory_bytes: int
    weights_per_gpu: int
    kv_heads_per_gpu: int
    kv_replicated: bool  # kv_heads < TP: every rank keeps one copy of a head
    kv_bytes_per_token_per_gpu: int
    reserve_bytes: int
    kv_budget_per_gpu: int
    num_blocks: int
    kv_pool_tokens: int
    max_concurrency: float  # requests of max_model_len tokens at once

    def to_json(self) -> dict:
        return asdict(self)


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads each rank holds: kv_heads // TP, at least 1 (replicated when kv_heads < TP)."""
    return max(1, num_kv_heads // tp)


def plan_gpu(*, engine: str, tp: int, gpu_memory_bytes: int, utilization: float, weights_bytes: int,
             num_hidden_layers: int, num_key_value_heads: int, head_dim: int, dtype_bytes: int, block_size: int,
             max_model_len: int, reserve_bytes: int = 0, num_blocks: Optional[int] = None) -> GpuPlan:
    """The per-GPU plan of ``engine`` (a deployctl.engines.KINDS value) at tensor parallel size ``tp``.
    ``reserve_bytes``: the vllm-semantics reserve line (engine.runtime_overhead); ignored for sglang, whose reserve
    is the memory outside the fraction. ``num_blocks``: the explicit block count (transformers, or an override)."""
    semantics = SEMANTICS[engine]
    weights = weights_bytes // tp
    heads = kv_heads_per_gpu(num_key_value_heads, tp)
    per_token = 2 * num_hidden_layers * heads * head_dim * dtype_bytes
    if semantics == "sglang":
        reserve = gpu_memory_bytes - int(gpu_memory_bytes * utilization)
        budget = int(gpu_memory_bytes * utilization) - weights
    else:
        reserve = reserve_bytes
        budget = int(gpu_memory_bytes * utilization) - weights - reserve
    if num_blocks is not None:
        blocks = num_blocks
        budget = blocks * block_size * per_token
    else:
        blocks = max(0, budget // (block_size * per_token))
    tokens = blocks * block_size
    return GpuPlan(engine, semantics, tp, gpu_memory_bytes, weights, heads, num_key_value_heads < tp, per_token,
                   reserve, budget, blocks, tokens, tokens / max_model_len)
