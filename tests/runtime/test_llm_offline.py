"""The offline API end to end on the tiny model."""
from __future__ import annotations

from deployctl_runtime import LLM, SamplingParams


def test_generate_greedy_is_deterministic_and_batch_independent(tiny_llama):
    logs = []
    llm = LLM(str(tiny_llama), log=logs.append, num_gpu_blocks_override=256)
    assert any("256 blocks" in line and "4096 tokens" in line for line in logs)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = ["Hello world", "The quick brown fox jumps over the lazy dog", "Où est la bibliothèque ?"]
    together = llm.generate(prompts, params)
    alone = [llm.generate(p, params)[0] for p in prompts]
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 8
        assert a.finish_reason == "length"
        assert a.text == llm.tokenizer.decode(a.token_ids)
    assert llm.engine.stats().num_free_blocks == 256


def test_stop_strings_cut_text(tiny_llama):
    llm = LLM(str(tiny_llama), num_gpu_blocks_override=64, max_model_len=1024)
    full = llm.generate("Hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop = full.text[3:6]
    cut = llm.generate("Hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.find(stop)]
    # the token ids end at the token that completed the stop string (they used to run on to max_tokens), as the
    # server's do; logprobs are cut with them
    k = next(k for k in range(1, 13) if stop in llm.tokenizer.decode(full.token_ids[:k]))
    assert cut.token_ids == full.token_ids[:k] and k < 12
    with_lp = llm.generate("Hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop],
                                                   logprobs=1))[0]
    assert len(with_lp.logprobs) == len(with_lp.top_logprobs) == k
    stopped = llm.generate("Hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop],
                                                   include_stop_str_in_output=True))[0]
    assert stopped.text == full.text[:full.text.find(stop) + len(stop)]


def test_special_tokens_and_the_stop_token_in_the_text_as_over_http(tiny_llama):
    llm = LLM(str(tiny_llama), num_gpu_blocks_override=64, max_model_len=256)
    eos = next(iter(llm.engine.eos_token_ids))
    eos_text = llm.tokenizer.decode([eos], skip_special_tokens=False)
    forced = dict(max_tokens=3, temperature=0, logit_bias={eos: 100})
    assert llm.generate("Hi", SamplingParams(**forced, ignore_eos=True))[0].text == ""
    assert llm.generate("Hi", SamplingParams(**forced, ignore_eos=True, skip_special_tokens=False))[0].text == \
        eos_text * 3
    shown = SamplingParams(**forced, skip_special_tokens=False)  # eos is the stop token: not text unless asked
    assert llm.generate("Hi", shown)[0].text == ""
    shown.include_stop_str_in_output = True
    assert llm.generate("Hi", shown)[0].text == eos_text
