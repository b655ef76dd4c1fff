"""The engine step's stages on CPU: prepare inputs (flat batch order, sample rows, per-step metadata), the Triton
decode path wired through the model (interpreted), dtype defaults and CUDA-graph buckets."""
from __future__ import annotations

import pytest
import torch

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.cuda_graphs import capture_sizes
from deployctl_runtime.engine import _resolve_dtype
from deployctl_runtime.engine_args import EngineArgs
from deployctl_runtime.input_batch import prepare_inputs
from deployctl_runtime.outputs import ScheduledRequest, SchedulerOutput
from deployctl_runtime.request import Request


def _req(rid: str, n_tokens: int, n_computed: int) -> Request:
    r = Request(rid, list(range(100, 100 + n_tokens)), SamplingParams(max_tokens=4))
    r.num_computed_tokens = n_computed
    return r


def test_prepare_inputs_puts_decodes_first_and_samples_only_finished_chunks():
    long_decode = ScheduledRequest(_req("a", 40, 39), 1, [7, 3, 9])
    short_decode = ScheduledRequest(_req("b", 5, 4), 1, [2])
    chunk = ScheduledRequest(_req("c", 30, 0), 20, [4, 5])  # first chunk of a longer prompt: no sample
    last_chunk = ScheduledRequest(_req("d", 20, 16), 4, [6, 8])  # reaches its end: samples
    inputs = prepare_inputs(SchedulerOutput([chunk, long_decode, last_chunk, short_decode]), 16,
                            torch.device("cpu"))
    meta = inputs.meta
    assert meta.num_decodes == 2 and inputs.num_tokens == 2 + 20 + 4 and not inputs.decode_only
    # shortest context first: b (position 4 in block 2) then a (position 39 = block index 2 -> block 9, offset 7)
    assert inputs.positions[:2].tolist() == [4, 39]
    assert meta.slot_mapping[:2].tolist() == [2 * 16 + 4, 9 * 16 + 7]
    assert inputs.input_ids[:2].tolist() == [104, 139]
    assert meta.slot_mapping[2:22].tolist() == list(range(64, 80)) + list(range(80, 84))
    assert [(p.start, p.end, p.context_len) for p in meta.prefills] == [(2, 22, 20), (22, 26, 20)]
    assert meta.prefills[0].slots is None and meta.prefills[1].slots.tolist() == \
        list(range(96, 112)) + list(range(128, 132))
    assert [r.request_id for r in inputs.sample_reqs] == ["b", "a", "d"]
    assert inputs.sample_rows.tolist() == [0, 1, 25]
    (group,) = meta.decode_groups  # one group, padded to the longest context's 3 blocks
    assert group.context_len == 48 and group.mask[0, :, 0].sum(-1).tolist() == [5, 40]


def test_prepare_inputs_for_the_kernel_builds_int32_block_tables():
    inputs = prepare_inputs(SchedulerOutput([ScheduledRequest(_req("a", 40, 39), 1, [7, 3, 9]),
                                             ScheduledRequest(_req("b", 5, 4), 1, [2])]), 16,
                            torch.device("cpu"), decode_kernel=object())
    meta = inputs.meta
    assert inputs.decode_only and not meta.decode_groups
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.tolist() == [[2, 0, 0], [7, 3, 9]]
    assert meta.context_lens.tolist() == [5, 40]


def test_triton_decode_path_gives_the_torch_paths_greedy_tokens(tiny_model_factory):
    """The runner's kernel branch (decodes through the Triton kernel, prefills through SDPA, mixed steps) on CPU
    under TRITON_INTERPRET=1 yields the same tokens as the torch path."""
    pytest.importorskip("triton")
    from deployctl_runtime.kernels.paged_attention import paged_decode

    path = tiny_model_factory("qwen3")  # head_dim 24 (padded in the kernel), GQA
    prompts = [list(range(5, 60)), [7, 8, 9], list(range(100, 140))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=64, max_num_batched_tokens=32)
    llm.engine.runner.decode_kernel = None
    torch_path = [o.token_ids for o in llm.generate(prompts, params)]
    llm.engine.runner.decode_kernel = paged_decode
    assert [o.token_ids for o in llm.generate(prompts, params)] == torch_path


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_on_cuda(tiny_llama):
    class Cfg:
        torch_dtype = "float32"

    assert _resolve_dtype(EngineArgs(model="m"), Cfg) == "float32"
    assert _resolve_dtype(EngineArgs(model="m", device="cuda"), Cfg) == "bfloat16"
    Cfg.torch_dtype = "float16"
    assert _resolve_dtype(EngineArgs(model="m", device="cuda"), Cfg) == "float16"
    assert _resolve_dtype(EngineArgs(model="m", device="cuda", dtype="float32"), Cfg) == "float32"


def test_cuda_graph_buckets_cover_every_batch_up_to_max_num_seqs():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]


def test_decode_graph_buffers_and_padding_rows_leave_the_tokens_unchanged(tiny_model_factory):
    """The CUDA-graph runner's static buffers on CPU (replay reruns the forward instead of a graph): decode-only
    steps of 3 requests run in the bucket of 4, whose padding row writes only the scratch slot past the pool."""
    pytest.importorskip("triton")
    from deployctl_runtime.kernels.paged_attention import paged_decode

    path = tiny_model_factory("llama")
    prompts = [list(range(5, 40)), [7, 8, 9], list(range(100, 117))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    llm = LLM(str(path), max_model_len=128, num_gpu_blocks_override=8, max_num_seqs=4)
    want = [o.token_ids for o in llm.generate(prompts, params)]
    runner = llm.engine.runner
    runner.decode_kernel = paged_decode
    assert runner.capture_cuda_graphs(4, 128) == 0 and runner.graphs.sizes == [1, 2, 4]
    scratch = runner.kv_cache[:, :, :, 8 * 16:]  # the block past the pool's 8
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert runner.graphs.num_replays >= 5 and scratch.abs().sum() > 0  # padding rows wrote there
