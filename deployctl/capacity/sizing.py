"""Gather the capacity plan's inputs (deploy.yaml, the model's config.json and safetensors headers,
the GPU's memory) and run ``capacity.plan_capacity`` on them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from deployctl.capacity.formula import CapacityInputs, CapacityPlan, plan_capacity
from deployctl.config import EngineConfig
from deployctl.errors import ConfigError
from deployctl.capacity.modelinfo import ModelShape, dtype_bytes, load_model_config, weights_bytes


@dataclass(frozen=True)
class SizedPlan:
    plan: CapacityPlan
    shape: ModelShape
    inputs: CapacityInputs
    weights_source: str
    gpu_memory_source: str
    notes: list[str] = field(default_factory=list)


def gpu_memory_from_nvml(index: int = 0) -> int:
    """Total memory of GPU ``index`` in bytes, from NVML. Raises ConfigError when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError has many subclasses; ImportError when nvidia-ml-py is absent
        raise ConfigError(f"no GPU memory size: NVML is not available here ({exc})", fix="pass --gpu-memory, e.g. --gpu-memory 80GiB") from None


def size_plan(
    engine: EngineConfig,
    model_dir: Optional[Path],
    *,
    model_config: Optional[Path] = None,
    dtype: str = "auto",
    gpu_memory: Optional[int] = None,
    gpu_index: int = 0,
) -> SizedPlan:
    """Build the capacity plan for ``engine`` on the model at ``model_dir`` (or ``model_config``).

    gpu_memory: total device bytes; None reads NVML when engine.device is cuda and no CPU budget or
    block override makes it unnecessary. Raises ConfigError (exit 3) for bad inputs, including
    max_model_len above the model's max_position_embeddings.
    """
    shape = load_model_config(model_config or model_dir)
    if shape.max_position_embeddings and engine.max_model_len > shape.max_position_embeddings:
        raise ConfigError(
            f"max_model_len {engine.max_model_len} is above the model's max_position_embeddings {shape.max_position_embeddings}",
            fix=f"set engine.max_model_len to at most {shape.max_position_embeddings}",
        )
    from deployctl.engines.capacity import SEMANTICS, kv_heads_per_gpu
    from deployctl.engines.validate import check_tp_heads

    tp = engine.tensor_parallel_size
    check_tp_heads(tp, shape.num_attention_heads)
    nbytes = dtype_bytes(dtype, shape, engine.device)
    weights, weights_source = weights_bytes(model_dir, shape, nbytes)
    semantics = SEMANTICS[engine.kind]
    gpu_source = "not needed"
    kv_cache_memory = engine.kv_cache_memory
    if engine.device == "cpu" and kv_cache_memory is None and engine.num_gpu_blocks_override is None:
        kv_cache_memory = 512 * 2**20  # the runtime's default CPU KV budget
    if engine.device == "cuda" and engine.num_gpu_blocks_override is None:
        if gpu_memory is None:
            gpu_memory = gpu_memory_from_nvml(gpu_index)
            gpu_source = "NVML"
        else:
            gpu_source = "--gpu-memory"
        kv_cache_memory = None
    inputs = CapacityInputs(
        # Per GPU under tensor parallelism (deployctl.engines.capacity): weights / TP, KV heads split across ranks.
        num_hidden_layers=shape.num_hidden_layers,
        num_key_value_heads=kv_heads_per_gpu(shape.num_key_value_heads, tp),
        head_dim=shape.head_dim,
        dtype_bytes=nbytes,
        weights_bytes=weights // tp,
        block_size=engine.block_size,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        gpu_memory_bytes=gpu_memory,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        # vllm semantics reserve runtime_overhead inside the fraction; sglang's fraction holds weights + KV only
        runtime_overhead_bytes=engine.runtime_overhead if engine.device == "cuda" and semantics == "vllm" else 0,
        kv_cache_memory=kv_cache_memory,
        num_gpu_blocks_override=engine.num_gpu_blocks_override,
        max_position_embeddings=shape.max_position_embeddings,
    )
    notes = [f"{engine.kind}: {semantics} memory semantics; every number is per GPU at tensor_parallel_size {tp} "
             f"({tp} GPUs per host)"] if tp > 1 or semantics != "vllm" else []
    if tp > 1:  # what verification waits for a multi-GPU start before it calls it hung (deployctl.engines.startup)
        from deployctl.engines.startup import describe

        notes.append(f"multi-GPU start: {describe(weights, float('inf'))}, at most server.startup_timeout_s")
    return SizedPlan(plan_capacity(inputs), shape, inputs, weights_source, gpu_source, notes)


def override_engine(engine: EngineConfig, **changes) -> EngineConfig:
    """A copy of ``engine`` with the non-None ``changes`` applied and validated again."""
    data = engine.model_dump()
    data.update({k: v for k, v in changes.items() if v is not None})
    try:
        return EngineConfig.model_validate(data)
    except Exception as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("?",), "msg": str(exc)}
        raise ConfigError(f"engine.{'.'.join(map(str, first['loc']))}: {first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})") from None


__all__ = ["SizedPlan", "size_plan", "override_engine", "gpu_memory_from_nvml"]
