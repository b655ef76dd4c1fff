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


def test_cuda_graphs_replay_decode_steps_with_the_eager_tokens(tiny_model_factory):
    path = tiny_model_factory("llama")
    prompts = [list(range(5, 60)), [7, 8, 9], list(range(100, 400)), [3] * 17, list(range(40, 45))]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    common = dict(device="cuda", dtype="float32", max_model_len=512, gpu_memory_utilization=0.3, max_num_seqs=8)
    eager = LLM(str(path), enforce_eager=True, **common)
    assert eager.engine.runner.graphs is None
    want = [o.token_ids for o in eager.generate(prompts, params)]
    del eager
    logs = []
    graphed = LLM(str(path), log=logs.append, **common)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    assert [o.token_ids for o in graphed.generate(prompts, params)] == want
    assert graphs.num_replays > 0  # decode-only steps went through the graphs
    # their memory was measured and taken out of the KV budget
    (line,) = [m for m in logs if m.startswith("memory: total")]
    assert int(line.rsplit("cuda graphs ", 1)[1]) > 0
    assert any(m.startswith("cuda graphs: 4 decode batch sizes captured") for m in logs)


def test_bfloat16_is_the_default_on_cuda_and_generates(tiny_model_factory):
    path = tiny_model_factory("qwen3")
    llm = LLM(str(path), device="cuda", max_model_len=256, gpu_memory_utilization=0.3, max_num_seqs=4)
    assert llm.engine.dtype == "bfloat16" and llm.engine.runner.kv_cache.dtype == torch_dtype("bfloat16")
    outs = llm.generate([[5, 6, 7], list(range(10, 90))], SamplingParams(max_tokens=8, temperature=0,
                                                                           ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [8, 8]


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)
