"""Greedy token ids and logits equal HF transformers on checkpoints written by transformers' save_pretrained.

Tolerance (float32, CPU): the logprob of every generated token within 1e-4 of HF's (log_softmax of HF's logits at
the same step); full prompt logits within 2e-4 absolute. Token ids must be identical."""
from __future__ import annotations

import contextlib

import pytest
import torch

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.kernels import cpu_kernels

MAX_NEW = 12
LOGPROB_ATOL = 1e-4
LOGITS_ATOL = 2e-4


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(3, vocab, (37,), generator=g).tolist()
    return [
        torch.randint(3, vocab, (5,), generator=g).tolist(),
        shared + torch.randint(3, vocab, (9,), generator=g).tolist(),
        torch.randint(3, vocab, (61,), generator=g).tolist(),
        shared + torch.randint(3, vocab, (2,), generator=g).tolist(),  # shares 2 full blocks of 16 with prompt 1
        [11],
    ]


def _hf_greedy(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    ids = out.sequences[0, len(prompt):].tolist()
    lps = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, ids)]
    return ids, lps


def _check(llm: LLM, model, prompts) -> None:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        ids, lps = _hf_greedy(model, prompt)
        assert out.token_ids == ids, f"prompt of {len(prompt)} tokens"
        assert max(abs(a - b) for a, b in zip(out.logprobs, lps)) < LOGPROB_ATOL
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_gpu_blocks


@pytest.mark.parametrize("ops", ["cpu-ops", "torch-ops"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "llama_tied"])
def test_batch_matches_hf_generate(hf_checkpoint, kind, ops):
    """Both CPU paths: the C operators (kernels/cpu_ops.c, the default where a compiler is) and torch's ops (the
    path CUDA shares, and hosts without a compiler)."""
    path, model = hf_checkpoint(kind)
    with contextlib.nullcontext() if ops == "cpu-ops" else cpu_kernels.disabled():
        llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=128)
        assert (llm.engine.runner.decode_kernel is not None) == (ops == "cpu-ops" and cpu_kernels.load() is not None)
        _check(llm, model, _prompts(model.config.vocab_size))


def test_sharded_checkpoint_matches(hf_checkpoint):
    path, model = hf_checkpoint("qwen3", sharded=True)
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 2
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=128)
    _check(llm, model, _prompts(model.config.vocab_size)[:3])


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_on_and_off(hf_checkpoint, prefix_caching):
    path, model = hf_checkpoint("llama")
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=128, enable_prefix_caching=prefix_caching)
    prompts = _prompts(model.config.vocab_size)
    _check(llm, model, prompts[1:2])  # run the shared prefix first so the later batch can hit it
    _check(llm, model, prompts)
    stats = llm.engine.stats()
    if prefix_caching:
        assert stats.prefix_cache_hits_total >= 2 * 32
    else:
        assert stats.prefix_cache_hits_total == 0


def test_chunked_prefill_forced_by_small_token_budget(hf_checkpoint):
    path, model = hf_checkpoint("qwen2")
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=128, max_num_batched_tokens=7)
    llm.engine.runner.decode_kernel = None  # the torch path (the CPU kernel has no groups)
    llm.engine.runner.decode_group_size = 2  # several decode groups mixed with prefill chunks in one step
    prepare, groups = llm.engine.runner.prepare_inputs, []

    def counted(sched):
        inputs = prepare(sched)
        groups.append(len(inputs.meta.decode_groups))
        return inputs

    llm.engine.runner.prepare_inputs = counted
    _check(llm, model, _prompts(model.config.vocab_size))
    assert max(groups) >= 2, groups


def test_preemption_forced_by_small_block_pool(hf_checkpoint):
    path, model = hf_checkpoint("llama")
    # block_size 4, 24 blocks: three 30-token prompts are admitted together (8 blocks each), then each grows
    # past 32 tokens and needs a 9th block: the newest is preempted and recomputed later
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, model.config.vocab_size, (30,), generator=g).tolist() for _ in range(3)]
    llm = LLM(str(path), max_model_len=96, block_size=4, num_gpu_blocks_override=24)
    _check(llm, model, prompts + _prompts(model.config.vocab_size)[:1])
    assert llm.engine.stats().num_preemptions_total > 0


def test_prompt_logits_match_hf_forward(hf_checkpoint):
    from deployctl_runtime.attention import AttentionMetadata, PrefillChunk

    path, model = hf_checkpoint("qwen3")
    llm = LLM(str(path), max_model_len=256, num_gpu_blocks_override=16)
    prompt = _prompts(model.config.vocab_size)[2]
    n = len(prompt)
    runner = llm.engine.runner
    pos = torch.arange(n)
    meta = AttentionMetadata(slot_mapping=pos.clone(), prefills=[PrefillChunk(0, n, n, None)])
    with torch.inference_mode():
        ours = runner.model.compute_logits(runner.model(torch.tensor(prompt), pos, meta))
        theirs = model(torch.tensor([prompt])).logits[0].float()
    assert (ours - theirs).abs().max().item() < LOGITS_ATOL


def test_llama3_rope_scaling_matches_hf():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from deployctl_runtime.layers import rope_inv_freq

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0, rope_scaling=scaling,
                      max_position_embeddings=131072)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = rope_inv_freq(128, 500000.0, scaling)
    assert torch.allclose(ours, theirs.float(), rtol=1e-6, atol=0)
    assert not torch.allclose(ours, rope_inv_freq(128, 500000.0, None))
