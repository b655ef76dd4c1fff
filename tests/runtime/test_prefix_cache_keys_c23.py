"""C23: prefix-cache keys are a seeded SHA-256 chain, and a hit is verified against the whole chain, so even a forced
digest collision never serves another prompt's KV (vllm#12621, #15297, GHSA-rm76-4mrf-v9r8)."""
from __future__ import annotations

import hashlib
from array import array

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime import block_pool, kv_cache_manager
from deployctl_runtime.kv_cache_manager import KVCacheManager
from deployctl_runtime.request import Request


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def test_block_keys_are_a_sha256_chain_seeded_per_manager_root():
    kv = KVCacheManager(num_blocks=8, block_size=4, identity=b"model-a")
    r = _req("r", list(range(10)))
    kv.get_computed_blocks(r)
    k0, k1 = r.block_hashes
    assert k0 == hashlib.sha256(kv.root_key + array("q", [0, 1, 2, 3]).tobytes()).digest()
    assert k1 == hashlib.sha256(k0 + array("q", [4, 5, 6, 7]).tobytes()).digest()
    other = KVCacheManager(num_blocks=8, block_size=4, identity=b"model-b")
    r2 = _req("r2", list(range(10)))
    other.get_computed_blocks(r2)
    assert r2.block_hashes[0] != k0  # another model (weights identity) never shares keys
    assert kv.root_key != hashlib.sha256(b"model-a").digest()  # the process seed is mixed in


def test_forced_digest_collision_never_serves_another_prompts_kv(tiny_llama, monkeypatch):
    a, q, c, z, b = ([t] * 4 for t in (11, 12, 13, 14, 15))
    x_prompt, z_prompt, y_prompt = a + q + c, z + b + c, a + b + c + [16, 17]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    ref = LLM(str(tiny_llama), num_gpu_blocks_override=64, block_size=4, max_model_len=256,
              enable_prefix_caching=False)
    expected = ref.generate([y_prompt], params)[0].token_ids

    # every block key collides: the builtin hash (before) and the SHA-256 digest (now)
    monkeypatch.setattr(kv_cache_manager, "hash", lambda _obj: 0, raising=False)
    monkeypatch.setattr(block_pool, "block_digest", lambda parent, tokens: b"\0" * 32, raising=False)
    llm = LLM(str(tiny_llama), num_gpu_blocks_override=64, block_size=4, max_model_len=256)
    llm.generate([x_prompt], params)
    llm.generate([z_prompt], params)
    y = llm.generate([y_prompt], params)[0]
    assert y.token_ids == expected
    assert y.num_cached_tokens == 4  # block a is X's and verified; b, c were never computed after a+b
