"""Sampling: exact where possible (top_k=1 == greedy, seeds, penalties against HF's logits processors),
distributional otherwise (temperature, top_k, top_p frequencies over many draws)."""
from __future__ import annotations

import pytest
import torch

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.request import Request
from deployctl_runtime.sampler import Sampler

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -9.0])


def _draw(params: SamplingParams, n: int = 20000, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    """Token frequencies over n independent draws (one batch of n identical rows)."""
    reqs = [Request(f"r{i}", [0], params) for i in range(n)]
    tokens = [s.token_id for s in Sampler(torch.device("cpu"), seed=1)(logits.repeat(n, 1), reqs)]
    return torch.bincount(torch.tensor(tokens), minlength=logits.numel()).float() / n


def test_temperature_frequencies_follow_softmax_of_scaled_logits():
    for t in (0.5, 1.0, 2.0):
        freq = _draw(SamplingParams(temperature=t))
        assert torch.allclose(freq, torch.softmax(LOGITS / t, -1), atol=0.015), t


def test_top_k_keeps_only_the_k_most_likely_renormalized():
    freq = _draw(SamplingParams(temperature=1.0, top_k=3))
    expect = torch.zeros_like(LOGITS)
    expect[:3] = torch.softmax(LOGITS[:3], -1)
    assert freq[3:].sum() == 0 and torch.allclose(freq, expect, atol=0.015)


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.softmax(LOGITS, -1)  # cumulative: .39 .63 .77 .86 ...
    freq = _draw(SamplingParams(temperature=1.0, top_p=0.7))
    keep = 3  # first index where the cumulative mass reaches 0.7
    assert probs[:2].sum() < 0.7 <= probs[:3].sum()
    expect = torch.zeros_like(LOGITS)
    expect[:keep] = probs[:keep] / probs[:keep].sum()
    assert freq[keep:].sum() == 0 and torch.allclose(freq, expect, atol=0.015)


def test_min_p_keeps_tokens_at_least_min_p_times_the_most_likely():
    probs = torch.softmax(LOGITS / 0.5, -1)  # vLLM's min_p: on the temperature-scaled distribution
    freq = _draw(SamplingParams(temperature=0.5, min_p=0.2))
    keep = probs >= 0.2 * probs.max()
    assert keep.tolist() == [True, True, False, False, False, False, False, False]
    expect = torch.where(keep, probs, torch.zeros_like(probs))
    assert freq[~keep].sum() == 0 and torch.allclose(freq, expect / expect.sum(), atol=0.015)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5).validate()


def test_top_k_one_is_greedy_and_greedy_is_argmax():
    assert _draw(SamplingParams(temperature=1.3, top_k=1), n=500)[0] == 1.0
    assert _draw(SamplingParams(temperature=0), n=10)[0] == 1.0


def test_min_tokens_masks_stop_and_eos_ids_until_reached():
    logits = torch.tensor([0.0, 5.0, 9.0, 1.0])  # eos 2 is the argmax, stop id 1 next
    req = Request("r", [0], SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), frozenset({2}))
    sampler = Sampler(torch.device("cpu"))
    assert [s.token_id for s in sampler(logits.unsqueeze(0), [req])] == [3]
    req.append_output(3, None)
    req.append_output(3, None)
    assert [s.token_id for s in sampler(logits.unsqueeze(0), [req])] == [2]
    ignore = Request("i", [0], SamplingParams(min_tokens=1, ignore_eos=True), frozenset({2}))
    assert 2 not in ignore.stop_ids


def test_repetition_penalty_matches_hf_logits_processor():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    req = Request("r", [3, 7, 7, 11], SamplingParams(repetition_penalty=1.7))
    req.append_output(20, None)
    ours = Sampler(torch.device("cpu"))._apply_constraints(logits.clone(), [req])
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([req.all_token_ids]), logits.clone())
    assert torch.allclose(ours, theirs)
    assert not torch.allclose(ours, logits)


def test_presence_and_frequency_penalties_follow_openai_formula():
    logits = torch.zeros(1, 10)
    req = Request("r", [1, 1, 1], SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    for t in (4, 4, 4, 6):
        req.append_output(t, None)
    out = Sampler(torch.device("cpu"))._apply_constraints(logits.clone(), [req])[0]
    expect = torch.zeros(10)
    expect[4] = -(0.25 * 3 + 0.5)
    expect[6] = -(0.25 * 1 + 0.5)
    assert torch.allclose(out, expect)  # prompt tokens (1) are not penalized


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_model_len=512, num_gpu_blocks_override=256)


PROMPTS = ["Hello world", "The quick brown fox", "Le café est chaud", "聪明的狐狸", "Q: What is the capital"]


def test_same_seed_same_tokens_in_any_batch(llm):
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=n, temperature=0.9, ignore_eos=True) for n in (3, 20, 7, 11)]
    batch = llm.generate(PROMPTS, [seeded] + others)
    assert batch[0].token_ids == alone
    mixed = llm.generate(PROMPTS[1:3] + PROMPTS[:1], others[:2] + [seeded])
    assert mixed[2].token_ids == alone
    other_seed = llm.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True))
    assert other_seed[0].token_ids != alone


def test_top_k_one_equals_greedy_through_the_engine(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    topk1 = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=1.5, top_k=1, ignore_eos=True))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in topk1]


def test_stop_token_ids_min_tokens_and_eos(llm):
    base = llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0].token_ids
    first, later = base[0], base[5]
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[later]))[0]
    cut = base.index(later) + 1
    assert out.token_ids == base[:cut] and out.finish_reason == "stop"
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[first],
                                                  min_tokens=3))[0]
    assert len(out.token_ids) >= 3 and out.finish_reason in ("stop", "length")
    assert first not in out.token_ids[:3]
    engine = llm.engine
    saved = set(engine.eos_token_ids)
    try:
        engine.eos_token_ids = {first}
        assert llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0))[0].finish_reason == "stop"
        out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
        assert out.token_ids == base and out.finish_reason == "length"
    finally:
        engine.eos_token_ids = saved


def test_logprobs_are_log_softmax_of_the_temperature_scaled_logits_of_the_chosen_tokens(llm, tiny_llama):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()
    prompt = llm.tokenizer.encode(PROMPTS[1]).ids
    out = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.8, seed=5, logprobs=0,
                                                ignore_eos=True))[0]
    assert len(out.logprobs) == 6
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(prompt) - 1:-1] / 0.8, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)
    assert llm.generate([prompt], SamplingParams(max_tokens=2))[0].logprobs is None


def test_a_non_finite_row_ends_only_its_request_and_the_others_sample_as_alone():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))
    reqs = [Request(f"r{i}", [0], SamplingParams(temperature=0.7, seed=i, logprobs=2)) for i in range(3)]
    alone = [Sampler(torch.device("cpu"))(logits[i:i + 1], [Request(f"a{i}", [0], reqs[i].params)])[0]
             for i in (0, 2)]
    bad = logits.clone()
    bad[1, 7] = float("nan")
    out = Sampler(torch.device("cpu"))(bad, reqs)
    assert out[1].error and "non-finite" in out[1].error
    assert [out[0], out[2]] == alone and all(s.error is None for s in alone)


def test_top_logprobs_are_the_n_most_likely_of_the_sampled_distribution():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(4))
    req = Request("r", [0], SamplingParams(temperature=0.5, logprobs=3, logit_bias={9: 5.0}))
    out = Sampler(torch.device("cpu"))(logits, [req])[0]
    biased = logits[0].clone()
    biased[9] += 5.0
    ref = torch.log_softmax(biased / 0.5, -1)
    ids = ref.topk(3).indices.tolist()
    assert [t for t, _ in out.top_logprobs] == ids and ids[0] == 9  # logit_bias is honoured
    assert all(abs(lp - ref[t].item()) < 1e-5 for t, lp in out.top_logprobs)
    assert abs(out.logprob - ref[out.token_id].item()) < 1e-5


def test_min_tokens_yields_when_only_a_stop_token_is_allowed():
    logits = torch.full((1, 4), float("-inf"))
    logits[0, 2] = 1.0  # what a complete grammar's bitmask leaves: only eos 2
    req = Request("r", [0], SamplingParams(temperature=0, min_tokens=3), frozenset({2}))
    assert Sampler(torch.device("cpu"))._apply_constraints(logits.clone(), [req])[0].argmax().item() == 2
    logits[0, 1] = 0.0  # another token allowed: min_tokens masks the stop as usual
    assert Sampler(torch.device("cpu"))._apply_constraints(logits.clone(), [req])[0].argmax().item() == 1


@pytest.mark.parametrize("vocab", [32000, 151936, 2048, 1000, 16, 7])
def test_row_argmax_and_row_finite_equal_torch_on_ties_infinities_and_nan(vocab):
    """The blocked argmax and the sum-first finite check (the CPU fast paths) give torch's own answers: ties take
    the first index, -inf rows and +inf values count, NaN is the maximum (torch.argmax's rule), and a row whose
    finite values overflow the sum is still finite."""
    from deployctl_runtime.sampler import row_argmax, row_finite

    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=g)
    top = x.max()
    x[1, vocab // 3] = x[1, vocab - 1] = top + 1  # a tie across blocks: the first wins
    x[2, :] = top + 2  # all equal
    x[3, :] = float("-inf")
    x[4, vocab // 2] = float("inf")
    x[5, vocab - 1] = float("nan")
    x[6, vocab // 2] = float("nan")
    x[6, 0] = float("inf")
    x[7, :] = 3e38  # finite, but the sum overflows to inf
    x[8, vocab // 4] = float("-inf")
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    assert torch.equal(row_finite(x), torch.isfinite(x).all(dim=-1))
    assert row_finite(x).tolist()[:9] == [True, True, True, False, False, False, False, True, False]
