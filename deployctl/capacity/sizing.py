"""Gather the capacity plan's inputs (deploy.yaml, the model's config.json and safetensors headers,
the GPU's memory) and run ``capacity.plan_capacity`` on them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from deployctl.capacity.formula import CapacityInputs, CapacityPlan, plan_capacity
from deployctl.config import EngineConfig
from deployctl.errors import ConfigError
from deployctl.capacity.modelinfo import (ModelShape, dtype_bytes, estimate_note, kv_dtype_bytes, kv_scales_source,
                                         load_model_config, weights_by_dtype, weights_bytes)
from deployctl.engines.capacity import kv_heads_per_gpu
from deployctl.engines.reserve import MEMORY, estimate_reserve, kv_budget, share_problem


@dataclass(frozen=True)
class SizedPlan:
    plan: CapacityPlan
    shape: ModelShape
    inputs: CapacityInputs
    weights_source: str
    gpu_memory_source: str
    notes: list[str] = field(default_factory=list)
    reserve: Optional[object] = None  # deployctl.engines.reserve.Reserve (vllm, sglang on cuda), per GPU
    tensor_parallel_size: int = 1
    kv_replicated: bool = False
    weights_problem: Optional[str] = None  # the weights (+ reserve) do not fit one GPU's share, whatever the KV
    smallest_tp: Optional[int] = None  # the smallest tensor_parallel_size whose share holds them
    standby_residue_bytes: int = 0  # per GPU, kept by the previous release's sleeping standby (taken off the budget)
    weights_by_dtype: dict = field(default_factory=dict)  # modelinfo.weights_by_dtype ({} when the bytes were given)


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
    weights: Optional[int] = None,
    weights_source: Optional[str] = None,
    standby_residue: int = 0,
    standby_source: str = "",
) -> SizedPlan:
    """Build the capacity plan for ``engine`` on the model at ``model_dir`` (or ``model_config``).

    gpu_memory: total device bytes; None reads NVML when engine.device is cuda and no CPU budget or
    block override makes it unnecessary. ``weights``: the checkpoint's bytes when known elsewhere (preflight reads
    the host's safetensors headers), else from ``model_dir``'s headers or the config. ``standby_residue``: bytes per
    GPU the previous release keeps there asleep (deployctl.engines.standby_residue_bytes; ``standby_source`` says
    where the figure comes from): on CUDA they come out of this release's KV budget, the service's share holding
    both. Raises ConfigError (exit 3) for bad inputs, including max_model_len above the model's
    max_position_embeddings.
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
    kv_nbytes = kv_dtype_bytes(engine.kv_cache_dtype, nbytes)
    by_dtype: dict = {}
    estimate = None
    if weights is None:
        weights, weights_source = weights_bytes(model_dir, shape, nbytes)
        by_dtype = weights_by_dtype(model_dir, shape, nbytes)
        if weights_source == "safetensors headers":
            estimate = estimate_note(weights, shape, nbytes)
    else:
        weights_source = weights_source or "given"
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
    elif engine.device == "cuda" and gpu_memory is not None:
        gpu_source = "--gpu-memory"  # with num_gpu_blocks_override: the weights must still fit
    reserve = budget = formula = None
    overhead = engine.runtime_overhead if engine.device == "cuda" and semantics == "vllm" else 0
    if engine.device == "cuda" and engine.kind in MEMORY and not MEMORY[engine.kind].measured_by_engine:
        reserve = _reserve(engine, shape, tp, nbytes)
        overhead = reserve.inside if MEMORY[engine.kind].reserve_inside else 0
    if engine.device == "cuda" and gpu_memory is not None:
        budget, formula = kv_budget(engine.kind, total=gpu_memory, utilization=engine.gpu_memory_utilization,
                                    weights_per_gpu=weights // tp, reserve=reserve, runtime_overhead=overhead)
        if standby_residue:
            budget, formula = budget - standby_residue, formula + " − the sleeping standby's GPU residue"
    else:
        standby_residue = 0
    inputs = CapacityInputs(
        # Per GPU under tensor parallelism (deployctl.engines.capacity): weights / TP, KV heads split across ranks.
        num_hidden_layers=shape.num_hidden_layers,
        num_key_value_heads=kv_heads_per_gpu(shape.num_key_value_heads, tp),
        head_dim=shape.head_dim,
        dtype_bytes=kv_nbytes,
        weights_bytes=weights // tp,
        block_size=engine.block_size,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        gpu_memory_bytes=gpu_memory,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        # vllm semantics reserve inside the share; sglang's fraction holds weights + KV only
        runtime_overhead_bytes=overhead,
        kv_cache_memory=kv_cache_memory,
        num_gpu_blocks_override=engine.num_gpu_blocks_override,
        max_position_embeddings=shape.max_position_embeddings,
        kv_budget_bytes=budget,
        kv_budget_formula=formula,
    )
    notes = [f"{engine.kind}: {semantics} memory semantics; every number is per GPU at tensor_parallel_size {tp} "
             f"({tp} GPUs per host)"] if tp > 1 or semantics != "vllm" else []
    if tp > 1:  # what verification waits for a multi-GPU start before it calls it hung (deployctl.engines.startup)
        from deployctl.engines.startup import describe

        notes.append(f"multi-GPU start: {describe(weights, float('inf'))}, at most server.startup_timeout_s")
    replicated = shape.num_key_value_heads < tp
    if replicated:
        notes.append(f"KV heads replicate: {shape.num_key_value_heads} KV heads < tensor_parallel_size {tp}, so each "
                     f"GPU keeps 1 head (a copy); KV bytes/token per GPU do not shrink past TP {shape.num_key_value_heads}")
    if estimate:
        notes.append(estimate)
    if engine.kv_cache_dtype != "auto":
        notes.append(f"kv_cache_dtype {engine.kv_cache_dtype}: {kv_nbytes} byte(s) per KV element instead of {nbytes}")
        scales, warning = kv_scales_source(model_dir, shape)
        notes.append(warning or f"KV scales: from the checkpoint ({engine.kv_cache_dtype} KV cache)")
    if standby_residue:
        from deployctl.config.units import format_bytes

        notes.append(f"a sleeping standby of the previous release keeps {format_bytes(standby_residue)} per GPU "
                     f"({standby_source or 'the engine adapter'}): counted inside this release's share, so its KV "
                     "budget is that much smaller than the engine's own rule gives")
    problem = smallest = None
    if engine.device == "cuda" and gpu_memory is not None:
        share_note = share_problem(engine.kind, total=gpu_memory, utilization=engine.gpu_memory_utilization,
                                   reserve=reserve)
        if share_note:
            notes.append(share_note)
        outside = reserve.outside if reserve else 0
        if standby_residue and -(-gpu_memory * engine.gpu_memory_utilization // 1) + standby_residue + outside > gpu_memory:
            room = (gpu_memory - standby_residue - outside) / gpu_memory
            notes.append(f"gpu_memory_utilization {engine.gpu_memory_utilization:g} leaves no room for the sleeping "
                         f"standby's {standby_residue} bytes (and {outside} of CUDA context and NCCL): the engine "
                         f"refuses to start or runs out of memory beside it; set it to at most "
                         f"{int(room * 100) / 100:.2f}")
        if not _weights_fit(engine, shape, weights, tp, nbytes, kv_nbytes, gpu_memory):
            smallest = next((t for t in _tp_choices(shape, tp) if _weights_fit(engine, shape, weights, t, nbytes,
                                                                                 kv_nbytes, gpu_memory)), None)
            problem = _weights_message(engine, weights, tp, gpu_memory, overhead, smallest)
    return SizedPlan(plan_capacity(inputs), shape, inputs, weights_source, gpu_source, notes, reserve, tp, replicated,
                     problem, smallest, standby_residue, by_dtype)


def _reserve(engine: EngineConfig, shape: ModelShape, tp: int, nbytes: int):
    return estimate_reserve(engine.kind, tp=tp, hidden_size=shape.hidden_size, mlp_width=shape.mlp_width(),
                            vocab_size=shape.vocab_size, dtype_bytes=nbytes,
                            max_num_batched_tokens=engine.max_num_batched_tokens, max_num_seqs=engine.max_num_seqs,
                            enforce_eager=engine.enforce_eager)


def _tp_choices(shape: ModelShape, tp: int) -> list[int]:
    """Tensor parallel sizes above ``tp`` that divide the attention heads (vLLM's rule), up to 64."""
    return [t for t in (2, 4, 8, 16, 32, 64) if t > tp and shape.num_attention_heads % t == 0]


def _weights_fit(engine: EngineConfig, shape: ModelShape, weights: int, tp: int, nbytes: int, kv_nbytes: int,
                 gpu_memory: int) -> bool:
    """Weights/TP + the reserve + one max_model_len request's KV (or the overridden pool) fit one GPU's share,
    as the engine computes it (deployctl.engines.reserve.kv_budget)."""
    kind = engine.kind if engine.kind in MEMORY else "deployctl-runtime"
    reserve = None
    overhead = engine.runtime_overhead
    if not MEMORY[kind].measured_by_engine:
        reserve = _reserve(engine, shape, tp, nbytes)
    budget, _ = kv_budget(kind, total=gpu_memory, utilization=engine.gpu_memory_utilization,
                          weights_per_gpu=weights // tp, reserve=reserve, runtime_overhead=overhead)
    per_token = 2 * shape.num_hidden_layers * kv_heads_per_gpu(shape.num_key_value_heads, tp) * shape.head_dim * kv_nbytes
    need = (engine.num_gpu_blocks_override * engine.block_size if engine.num_gpu_blocks_override
            else engine.max_model_len) * per_token
    return budget >= need


def _weights_message(engine: EngineConfig, weights: int, tp: int, gpu_memory: int, overhead: int,
                     smallest: Optional[int]) -> str:
    from deployctl.config.units import format_bytes

    head = (f"weights {format_bytes(weights)} ({format_bytes(weights // tp)} per GPU at tensor_parallel_size {tp}) + "
            f"reserve {format_bytes(overhead)} + the KV cache do not fit a {format_bytes(gpu_memory)} GPU at "
            f"gpu_memory_utilization {engine.gpu_memory_utilization:g}"
            + (f" (num_gpu_blocks_override {engine.num_gpu_blocks_override} does not shrink the weights)"
               if engine.num_gpu_blocks_override else ""))
    if smallest is None:
        return head + "; no tensor_parallel_size up to 64 fits: use larger GPUs or quantized weights (AWQ/GPTQ/FP8)"
    if engine.kind in ("vllm", "sglang"):
        return head + f"; raise engine.tensor_parallel_size to {smallest} (the smallest that fits), or quantize"
    return head + (f"; {engine.kind} has no tensor parallelism: use engine.kind vllm or sglang with "
                   f"tensor_parallel_size {smallest} (the smallest that fits), or quantized weights")


# Figures of the plan's JSON that are per GPU (one tensor-parallel rank); the rest are per request or per replica.
PER_GPU_KEYS = ("kv_bytes_per_token", "weights_bytes", "kv_budget_bytes", "num_blocks", "kv_pool_bytes",
                "kv_pool_tokens", "kv_bytes_per_request", "kv_bytes_all_requests", "peak_bytes", "reserve")


def plan_verdict(sized: SizedPlan) -> tuple[str, str]:
    """capacity.verdict, with the weights check first: weights that do not fit fail whatever the KV settings."""
    from deployctl.capacity.formula import verdict

    if sized.weights_problem:
        return "fail", sized.weights_problem
    return verdict(sized.plan)


def plan_json(sized: SizedPlan, status: str, message: str) -> dict:
    """`deployctl plan --json`: CapacityPlan's keys + status, message, notes, tensor_parallel_size, per_gpu (the
    keys whose figures are per GPU), reserve (its parts in bytes, or null for the runtime/CPU),
    kv_heads_replicated, smallest_tensor_parallel_size (when the weights do not fit, else null),
    standby_residue_bytes (per GPU, taken off kv_budget_bytes; 0 without a sleeping standby), weights_source
    ("safetensors headers", "config estimate (...)", or where given weights came from), weights_by_dtype (bytes per
    dtype of the whole checkpoint, modelinfo.weights_by_dtype), experts_total and experts_active (routed experts
    and experts per token from config.json; 0 for a dense model)."""
    return {**sized.plan.to_json(), "status": status, "message": message, "notes": sized.notes,
            "tensor_parallel_size": sized.tensor_parallel_size, "per_gpu": list(PER_GPU_KEYS),
            "reserve": sized.reserve.to_json() if sized.reserve else None,
            "kv_heads_replicated": sized.kv_replicated, "smallest_tensor_parallel_size": sized.smallest_tp,
            "standby_residue_bytes": sized.standby_residue_bytes, "weights_source": sized.weights_source,
            "weights_by_dtype": sized.weights_by_dtype, "experts_total": sized.shape.num_experts,
            "experts_active": sized.shape.num_experts_per_tok}


def override_engine(engine: EngineConfig, **changes) -> EngineConfig:
    """A copy of ``engine`` with the non-None ``changes`` applied and validated again, with deploy.yaml's rules for
    the engine's own settings (engines.validate.check_engine_settings). Raises ConfigError (exit 3)."""
    from deployctl.engines.validate import check_engine_settings

    data = engine.model_dump()
    data.update({k: v for k, v in changes.items() if v is not None})
    try:
        changed = EngineConfig.model_validate(data)
    except Exception as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("?",), "msg": str(exc)}
        raise ConfigError(f"engine.{'.'.join(map(str, first['loc']))}: {first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})") from None
    try:
        check_engine_settings(changed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return changed


__all__ = ["SizedPlan", "size_plan", "plan_verdict", "plan_json", "PER_GPU_KEYS", "override_engine", "gpu_memory_from_nvml"]
