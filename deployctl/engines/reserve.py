"""What an engine keeps off the KV pool on each GPU, as parts (adapter data; pure arithmetic, bytes as integers).

deployctl cannot run the engine's profile, so each part is computed from the model's shape and the engine's
settings the way the pinned engine measures it, with the constants below (each names its source).

vLLM 0.33.0 (``budget_from = "total"``):
- requested = ceil(total × gpu_memory_utilization) (vllm/v1/worker/utils.py ``request_memory``).
- KV = requested − weights − activation peak − non-torch increase − CUDA-graph estimate
  (vllm/v1/worker/gpu_worker.py ``determine_available_memory``: ``requested_memory − non_kv_cache_memory −
  cudagraph_memory_estimate_applied``; vllm/utils/mem_utils.py ``memory_profiling``: non_kv_cache_memory =
  total_consumed (weights + non-torch increase) + transient peak headroom).
- The CUDA context and NCCL are set up before the init snapshot (gpu_worker.py ``init_device``: "take memory
  snapshot after NCCL is initialized"), so they sit outside the requested share: total − context − NCCL must be
  ≥ requested or vLLM refuses to start ("Free memory on device ... is less than desired GPU memory utilization").
SGLang 0.5.23 (``budget_from = "free"``):
- KV = free after weights − free before load × (1 − mem_fraction_static)
  (sglang/srt/mem_cache/kv_cache_configurator.py ``_profile_available_bytes``), i.e.
  (total − context − NCCL) × fraction − weights; activations and CUDA graphs live in the slack outside it.
deployctl-runtime: KV = floor(total × utilization) − weights − (its measured activation peak + CUDA graphs);
the plan's reserve line is engine.runtime_overhead (runtime/deployctl_runtime/kv_sizing.py ``cuda_budget_bytes``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

MiB = 2**20

# CUDA context + cuBLAS/cuBLASLt workspaces of one process on a Hopper GPU with CUDA 12 (what nvidia-smi shows for
# a process that ran one matmul before any model tensor: 500–600 MiB; vLLM's docs' "CUDA context ~0.5 GiB").
CUDA_CONTEXT_BYTES = 512 * MiB
# NCCL communicator buffers per rank with tensor parallelism (NCCL_BUFFSIZE 4 MiB × 2 directions × up to 32
# channels on NVLink: 256 MiB) plus vLLM's custom all-reduce IPC buffers (vllm/distributed/device_communicators/
# custom_all_reduce.py ``max_size`` 8 MiB × 2 + rank data): 288 MiB, rounded to 320 MiB.
NCCL_BYTES = 320 * MiB
# Memory the engine allocates outside torch during its profile run (cuBLAS handles per stream, the sampler's
# FlashInfer/Triton workspaces): vLLM's ``non_torch_increase`` (mem_utils.py) is 0.2–0.3 GiB on one GPU.
NON_TORCH_BYTES = 256 * MiB
# vLLM 0.33.0 gpu_model_runner.py ``profile_cudagraph_memory``: "Use at least 1 MiB per graph for driver overhead";
# each captured size beyond the first costs that much per mode, and the default mode FULL_AND_PIECEWISE
# (vllm/config/compilation.py) captures each size twice.
PER_GRAPH_BYTES = 1 * MiB
CUDAGRAPH_MODES = 2
# vllm/config/vllm.py ``_set_cudagraph_sizes``: the largest captured size is min(2 × max_num_seqs, 512).
MAX_CAPTURE_SIZE = 512
# Activation bytes per token of a decoder layer's forward, in hidden-size units: the residual, the normed input,
# the attention output and the QKV projection (≈ 4 × hidden), plus the MLP's gate_up (2 × intermediate/TP) and
# activation output (1 × intermediate/TP); vLLM frees each layer's temporaries before the next, so the peak is
# one layer's worth (vllm/model_executor/models/llama.py ``LlamaDecoderLayer.forward``).
HIDDEN_BUFFERS = 4
MLP_BUFFERS = 3
# The profile run's dummy sampler pass holds fp32 logits and their softmax for max_num_seqs rows
# (gpu_model_runner.py ``_dummy_sampler_run``: logits of shape (max_num_reqs, vocab_size), float32).
LOGITS_BUFFERS = 2
LOGITS_BYTES = 4


@dataclass(frozen=True)
class EngineMemory:
    """How an engine sizes its KV budget: ``budget_from`` "total" (vLLM, the runtime: a share of the GPU's
    total memory) or "free" (SGLang: a share of the free memory before the weights load), and whether the
    reserve parts count inside the share (vLLM) or must fit in the slack outside it (SGLang)."""

    budget_from: str
    reserve_inside: bool
    rounding: str  # "ceil" (vLLM request_memory) or "floor" (the runtime, SGLang's int())
    measured_by_engine: bool = False  # the runtime measures its own reserve: the plan uses engine.runtime_overhead


MEMORY = {
    "vllm": EngineMemory("total", True, "ceil"),
    "sglang": EngineMemory("free", False, "floor"),
    "deployctl-runtime": EngineMemory("total", True, "floor", measured_by_engine=True),
}


@dataclass(frozen=True)
class Reserve:
    """One GPU's reserve in bytes, by part. ``inside`` = activation + cudagraph + non_torch (taken off the KV
    budget for vLLM; for SGLang it must fit in the slack); ``outside`` = cuda_context + nccl (before the engine's
    share is measured)."""

    activation_peak: int
    cudagraph: int
    non_torch: int
    cuda_context: int
    nccl: int
    num_capture_sizes: int

    @property
    def inside(self) -> int:
        return self.activation_peak + self.cudagraph + self.non_torch

    @property
    def outside(self) -> int:
        return self.cuda_context + self.nccl

    def to_json(self) -> dict:
        return {**asdict(self), "inside": self.inside, "outside": self.outside}


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM 0.33.0's default CUDA-graph capture sizes (vllm/config/vllm.py ``_set_cudagraph_sizes``, decode query
    length 1): [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16) up to max = min(2 × max_num_seqs, 512), capped
    at max_num_batched_tokens."""
    top = min(max_num_seqs * 2, MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def activation_bytes_per_token(*, hidden_size: int, mlp_width: int, tp: int, dtype_bytes: int) -> int:
    """One token's activation bytes at the peak layer on one GPU (``HIDDEN_BUFFERS``/``MLP_BUFFERS``).
    ``mlp_width``: intermediate_size of a dense MLP, or top_k × moe_intermediate_size (+ the shared experts'
    width) for MoE (the fused-MoE kernel's per-token intermediate, vllm/model_executor/layers/fused_moe)."""
    return dtype_bytes * (HIDDEN_BUFFERS * hidden_size + MLP_BUFFERS * (mlp_width // tp))


def estimate_reserve(engine: str, *, tp: int, hidden_size: int, mlp_width: int, vocab_size: int, dtype_bytes: int,
                     max_num_batched_tokens: int, max_num_seqs: int, enforce_eager: bool = False) -> Reserve:
    """The per-GPU reserve of ``engine`` (vllm, sglang; the runtime measures its own and is planned with
    engine.runtime_overhead). activation peak = max_num_batched_tokens × activation bytes/token + the dummy
    sampler's logits; CUDA graphs = the largest capture size's activations (vLLM's first capture) + 1 MiB per
    further graph per mode, 0 with enforce_eager; CUDA context always; NCCL only with tp > 1."""
    per_token = activation_bytes_per_token(hidden_size=hidden_size, mlp_width=mlp_width, tp=tp, dtype_bytes=dtype_bytes)
    logits = max_num_seqs * vocab_size * LOGITS_BYTES * LOGITS_BUFFERS
    activation = max_num_batched_tokens * per_token + logits
    sizes = [] if enforce_eager else capture_sizes(max_num_seqs, max_num_batched_tokens)
    graphs = 0
    if sizes:
        graphs = max(sizes) * per_token + (len(sizes) - 1) * PER_GRAPH_BYTES * CUDAGRAPH_MODES
    return Reserve(activation_peak=activation, cudagraph=graphs, non_torch=NON_TORCH_BYTES,
                   cuda_context=CUDA_CONTEXT_BYTES, nccl=NCCL_BYTES if tp > 1 else 0, num_capture_sizes=len(sizes))


def kv_budget(engine: str, *, total: int, utilization: float, weights_per_gpu: int, reserve: Optional[Reserve],
              runtime_overhead: int = 0) -> tuple[int, str]:
    """The KV budget per GPU in bytes and the formula as words, as ``engine`` computes it (module docstring).
    ``reserve`` None (the runtime): the budget takes ``runtime_overhead`` off, as kv_sizing.cuda_budget_bytes."""
    mem = MEMORY.get(engine, MEMORY["deployctl-runtime"])
    if mem.measured_by_engine or reserve is None:
        return (math.floor(total * utilization) - weights_per_gpu - runtime_overhead,
                "floor(total × utilization) − weights − engine.runtime_overhead")
    if mem.budget_from == "free":
        free = total - reserve.outside
        return (math.floor(free * utilization) - weights_per_gpu,
                "floor((total − CUDA context − NCCL) × mem_fraction_static) − weights")
    requested = math.ceil(total * utilization)
    return (requested - weights_per_gpu - reserve.inside,
            "ceil(total × utilization) − weights − activation peak − CUDA graphs − non-torch")


def share_problem(engine: str, *, total: int, utilization: float, reserve: Optional[Reserve]) -> Optional[str]:
    """Why the engine's share cannot be had on an empty GPU, or None: vLLM needs total − context − NCCL ≥
    ceil(total × utilization); SGLang needs the slack (free × (1 − fraction)) to hold activations + CUDA graphs."""
    mem = MEMORY.get(engine)
    if reserve is None or mem is None or mem.measured_by_engine:
        return None
    outside_max = (total - reserve.outside) / total
    if mem.budget_from == "total" and math.ceil(total * utilization) > total - reserve.outside:
        return (f"gpu_memory_utilization {utilization:g} asks for {math.ceil(total * utilization)} bytes but the CUDA "
                f"context and NCCL leave {total - reserve.outside}: vLLM refuses to start; set it to at most "
                f"{math.floor(outside_max * 100) / 100:.2f}")
    if mem.budget_from == "free":
        slack = (total - reserve.outside) * (1 - utilization)
        need = reserve.activation_peak + reserve.cudagraph + reserve.non_torch
        if slack < need:
            return (f"mem_fraction_static {utilization:g} leaves {int(slack)} bytes outside the pool but activations + "
                    f"CUDA graphs + non-torch need {need}: lower engine.gpu_memory_utilization or "
                    "engine.max_num_batched_tokens")
    return None
