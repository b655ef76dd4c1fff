"""The capacity plan: will these weights plus this KV cache fit, and how many requests can it serve?

Pure arithmetic, no I/O. The runtime reproduces ``kv_bytes_per_token`` and ``num_kv_blocks`` in
runtime/deployctl_runtime/kv_sizing.py (it cannot import deployctl); tests/data/capacity_vectors.json
pins both to the same numbers.

Formulas (vLLM's KV cache sizing; ../shared/models/known-shapes.md):
- KV bytes per token = 2 (K and V) × num_hidden_layers × num_key_value_heads × head_dim × dtype bytes.
- KV budget on CUDA = floor(GPU memory × gpu_memory_utilization) − weights − runtime overhead;
  on CPU the configured kv_cache_memory; num_gpu_blocks_override wins over both.
- blocks = floor(budget / (block_size × KV bytes per token)); pool tokens = blocks × block_size.
- max concurrency at max_model_len = pool tokens / max_model_len.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional


def kv_bytes_per_token(num_hidden_layers: int, num_key_value_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V cache one token occupies across all layers."""
    return 2 * num_hidden_layers * num_key_value_heads * head_dim * dtype_bytes


def num_kv_blocks(kv_bytes_per_token: int, block_size: int, budget_bytes: int, num_gpu_blocks_override: Optional[int] = None) -> int:
    """Whole KV blocks that fit in ``budget_bytes`` (never negative); the override wins when given."""
    if num_gpu_blocks_override is not None:
        return num_gpu_blocks_override
    return max(0, budget_bytes // (block_size * kv_bytes_per_token))


@dataclass(frozen=True)
class CapacityInputs:
    """Everything the plan depends on. Bytes are integers."""

    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    dtype_bytes: int
    weights_bytes: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    gpu_memory_bytes: Optional[int] = None  # CUDA: total device memory
    gpu_memory_utilization: float = 0.9
    runtime_overhead_bytes: int = 0
    kv_cache_memory: Optional[int] = None  # CPU: the KV pool budget
    num_gpu_blocks_override: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    # the engine's own KV budget rule (deployctl.engines.reserve.kv_budget), when it is not this module's
    kv_budget_bytes: Optional[int] = None
    kv_budget_formula: Optional[str] = None


@dataclass(frozen=True)
class CapacityPlan:
    """The plan's answer. ``fits``: max_num_seqs requests of max_model_len tokens fit at once.
    ``fits_one``: at least one max_model_len request fits (otherwise the runtime refuses to start)."""

    kv_bytes_per_token: int
    weights_bytes: int
    kv_budget_bytes: int
    num_blocks: int
    block_size: int
    kv_pool_bytes: int
    kv_pool_tokens: int
    max_model_len: int
    max_num_seqs: int
    max_concurrency: float
    fits: bool
    fits_one: bool
    max_feasible_model_len: int
    max_feasible_num_seqs: int
    kv_bytes_per_request: int
    kv_bytes_all_requests: int
    peak_bytes: int  # weights + overhead + KV for max_num_seqs full requests
    budget_source: str

    def to_json(self) -> dict:
        return asdict(self)


def plan_capacity(inp: CapacityInputs) -> CapacityPlan:
    """Compute the capacity plan. Raises ValueError when neither a GPU size, a CPU KV budget nor a
    block override is given."""
    per_token = kv_bytes_per_token(inp.num_hidden_layers, inp.num_key_value_heads, inp.head_dim, inp.dtype_bytes)
    if inp.num_gpu_blocks_override is not None:
        budget, source = inp.num_gpu_blocks_override * inp.block_size * per_token, "num_gpu_blocks_override"
    elif inp.kv_cache_memory is not None:
        budget, source = inp.kv_cache_memory, "kv_cache_memory"
    elif inp.gpu_memory_bytes is not None and inp.kv_budget_bytes is not None:
        budget, source = inp.kv_budget_bytes, inp.kv_budget_formula or "the engine's rule"
    elif inp.gpu_memory_bytes is not None:
        budget = int(inp.gpu_memory_bytes * inp.gpu_memory_utilization) - inp.weights_bytes - inp.runtime_overhead_bytes
        source = "gpu_memory × utilization − weights − overhead"
    else:
        raise ValueError("no memory budget: give the GPU memory size, a CPU kv_cache_memory, or num_gpu_blocks_override")
    blocks = num_kv_blocks(per_token, inp.block_size, budget, inp.num_gpu_blocks_override)
    pool_tokens = blocks * inp.block_size
    feasible_len = pool_tokens
    if inp.max_position_embeddings:
        feasible_len = min(feasible_len, inp.max_position_embeddings)
    per_request = per_token * inp.max_model_len
    return CapacityPlan(
        kv_bytes_per_token=per_token,
        weights_bytes=inp.weights_bytes,
        kv_budget_bytes=budget,
        num_blocks=blocks,
        block_size=inp.block_size,
        kv_pool_bytes=blocks * inp.block_size * per_token,
        kv_pool_tokens=pool_tokens,
        max_model_len=inp.max_model_len,
        max_num_seqs=inp.max_num_seqs,
        max_concurrency=pool_tokens / inp.max_model_len,
        fits=pool_tokens >= inp.max_model_len * inp.max_num_seqs,
        fits_one=pool_tokens >= inp.max_model_len,
        max_feasible_model_len=feasible_len,
        # the largest max_num_seqs whose full-length requests all fit, whatever is configured (C33: it reported the
        # configured 64 where 36,095 fit)
        max_feasible_num_seqs=pool_tokens // inp.max_model_len if inp.max_model_len else 0,
        kv_bytes_per_request=per_request,
        kv_bytes_all_requests=per_request * inp.max_num_seqs,
        peak_bytes=inp.weights_bytes + inp.runtime_overhead_bytes + per_request * inp.max_num_seqs,
        budget_source=source,
    )


def verdict(plan: CapacityPlan) -> tuple[str, str]:
    """("pass"|"warn"|"fail", message) for the plan, naming the numbers and the fix (case C01)."""
    if not plan.fits_one:
        return "fail", (
            f"max_model_len {plan.max_model_len} does not fit: the KV cache holds {plan.kv_pool_tokens} tokens "
            f"({plan.num_blocks} blocks × {plan.block_size} tokens, {plan.kv_bytes_per_token} bytes/token); "
            f"the largest feasible max_model_len is {plan.max_feasible_model_len}; lower max_model_len or give the KV cache more memory"
        )
    if not plan.fits:
        need = plan.max_model_len * plan.max_num_seqs
        return "warn", (
            f"max concurrency {plan.max_concurrency / plan.max_num_seqs:.2f}× at max_model_len: the KV cache holds "
            f"{plan.kv_pool_tokens} tokens, {plan.max_num_seqs} × {plan.max_model_len} = {need} are needed; "
            f"at most {plan.max_feasible_num_seqs} full-length requests run at once (others wait or are preempted); "
            f"lower max_num_seqs to {plan.max_feasible_num_seqs} or max_model_len, or add memory"
        )
    return "pass", (
        f"{plan.num_blocks} blocks = {plan.kv_pool_tokens} tokens; {plan.max_concurrency:.2f} requests of "
        f"{plan.max_model_len} tokens fit at once (max_num_seqs {plan.max_num_seqs})"
    )
