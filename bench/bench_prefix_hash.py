"""Prefix-cache key cost: the SHA-256 block chain (block_pool.block_digest) against the old builtin-hash tuple chain
((hash(parent), token ids)), both over the same 4096-token prompt, in the same run.

    PYTHONPATH=runtime python bench/bench_prefix_hash.py [--tokens 4096] [--block-size 16] [--repeat 200]

Prints the time per prompt of each (best of --repeat) and the ratio. The key is computed once per full block when
a request is admitted or grows a block, so the absolute time per prompt is what matters against a prefill.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from deployctl_runtime.kv_cache_manager import KVCacheManager  # noqa: E402
from deployctl_runtime.request import Request  # noqa: E402
from deployctl_runtime.sampling_params import SamplingParams  # noqa: E402


def old_chain(tokens: list[int], bs: int) -> list:
    out, parent = [], None
    for i in range(len(tokens) // bs):
        key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
        out.append(key)
        parent = hash(key)
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=200)
    a = ap.parse_args()
    rng = random.Random(0)
    tokens = [rng.randrange(150_000) for _ in range(a.tokens)]
    kv = KVCacheManager(num_blocks=1, block_size=a.block_size, identity=b"bench")

    def sha_chain():
        kv._update_block_hashes(Request("r", tokens, SamplingParams()))

    new = best(sha_chain, a.repeat)
    old = best(lambda: old_chain(tokens, a.block_size), a.repeat)
    blocks = a.tokens // a.block_size
    print(f"{a.tokens} tokens, {blocks} blocks of {a.block_size}")
    print(f"sha256 chain:       {new * 1e6:8.1f} us per prompt ({new / blocks * 1e6:.2f} us per block)")
    print(f"builtin-hash chain: {old * 1e6:8.1f} us per prompt")
    print(f"ratio sha256 / builtin: {new / old:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
