"""CUDA path (skipped without an NVIDIA GPU): same greedy tokens as the CPU path; KV pool sized from memory."""
from __future__ import annotations

import pytest

from deployctl_runtime import LLM, SamplingParams

pytestmark = pytest.mark.gpu


def test_cuda_gives_the_same_greedy_tokens_as_cpu(tiny_model_factory):
    path = tiny_model_factory("qwen3")
    prompts = [list(range(5, 60)), [7, 8, 9], list(range(100, 400))]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    cpu = LLM(str(path), max_model_len=512, num_gpu_blocks_override=128).generate(prompts, params)
    logs = []
    gpu = LLM(str(path), device="cuda", dtype="float32", max_model_len=512, gpu_memory_utilization=0.3,
              log=logs.append)
    assert [o.token_ids for o in gpu.generate(prompts, params)] == [o.token_ids for o in cpu]
    assert any(line.startswith("memory: total") for line in logs)
    import torch

    stats = gpu.engine.stats()
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < stats.num_gpu_blocks * 16 * gpu.engine.kv_plan.kv_bytes_per_token <= total * 0.3
