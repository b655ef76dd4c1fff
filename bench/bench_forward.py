"""Where one CPU decode forward's time goes beyond the weight products (issue 27), in one run.

Not a test: prints milliseconds. One decode step of 16 requests at 135-150 tokens of context on the llama-8x512
checkpoint (bench_engine.py's shape and seeded weights), timed as the real model's forward with one part at a time
replaced by a no-op: a part's cost is the full forward's median minus that variant's (so it is the part's cost
inside the forward, caches as cold as there, not alone in a loop). The weight products alone are every decoder
layer's nn.Linear on [16, in_features] with the model's weights, as bench_engine.gemm_floor times them. Variants
alternate within each of --repeats rounds, so the machine's drift spreads over all of them.

    PYTHONPATH=runtime python bench/bench_forward.py [--threads 2] [--repeats 25]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench_engine.py: set before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parent))

NUM_REQUESTS, CONTEXT = 16, 150


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    import bench_engine
    import deployctl_runtime.attention as attention
    import deployctl_runtime.models.llama as llama
    from deployctl_runtime import LLM
    from deployctl_runtime.attention import AttentionMetadata, decode_group
    from deployctl_runtime.layers import RMSNorm, RotaryEmbedding

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = bench_engine.build_checkpoint("llama-8x512", Path(tmp), 0)
        llm = LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=256, max_num_seqs=NUM_REQUESTS,
                  max_num_batched_tokens=2048, kv_cache_memory=1 << 30)
    model = llm.engine.runner.model
    bs = llm.engine.runner.block_size
    lens = [CONTEXT - i for i in range(NUM_REQUESTS)]
    width = -(-CONTEXT // bs)
    tables = torch.arange(NUM_REQUESTS * width).view(NUM_REQUESTS, width) + 1  # block 0 is the padding block
    slots = torch.tensor([int(tables[i, (n - 1) // bs]) * bs + (n - 1) % bs for i, n in enumerate(lens)])
    ids = torch.randint(0, model.config.vocab_size, (NUM_REQUESTS,), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor(lens) - 1

    def step_meta() -> AttentionMetadata:  # built per forward, as prepare_inputs does
        return AttentionMetadata(slot_mapping=slots, num_decodes=NUM_REQUESTS, block_size=bs,
                                 decode_groups=[decode_group(0, tables, lens, bs)])

    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(NUM_REQUESTS, m.in_features) for m in linears}
    real = {"attention": llama.paged_attention, "decode": attention.decode_torch, "norm": RMSNorm.forward,
            "rope": RotaryEmbedding.rotate}

    def gather_only(q, k_cache, v_cache, g, scale):  # decode_torch's gathers, no SDPA
        rows = g.cache_rows(k_cache.shape[0], k_cache.shape[1])
        k_cache.view(-1, k_cache.shape[2]).index_select(0, rows)
        v_cache.view(-1, v_cache.shape[2]).index_select(0, rows)
        return q

    variants = {
        "full forward": {},
        "no attention": {"attention": lambda q, k, v, kc, vc, meta, scale: q},
        "attention: cache writes only": {"decode": lambda q, kc, vc, g, scale: q},
        "attention: writes + gathers": {"decode": gather_only},
        "no RMSNorm": {"norm": lambda self, x: x},
        "no RoPE": {"rope": lambda self, tables_, x: x},
    }

    def install(parts: dict) -> None:
        llama.paged_attention = parts.get("attention", real["attention"])
        attention.decode_torch = parts.get("decode", real["decode"])
        RMSNorm.forward = parts.get("norm", real["norm"])
        RotaryEmbedding.rotate = parts.get("rope", real["rope"])

    times: dict[str, list[float]] = {k: [] for k in [*variants, "weight products alone"]}
    with torch.inference_mode():
        for _ in range(3):  # warm-up
            model(ids, positions, step_meta())
        for _ in range(args.repeats):
            for name, parts in variants.items():
                install(parts)
                meta = step_meta()
                t0 = time.perf_counter()
                model(ids, positions, meta)
                times[name].append(time.perf_counter() - t0)
            install({})
            t0 = time.perf_counter()
            for m in linears:
                F.linear(inputs[m.in_features], m.weight, m.bias)
            times["weight products alone"].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
    full = med["full forward"]
    parts = {
        "weight products (alone)": med["weight products alone"],
        "decode attention": full - med["no attention"],
        "  of which cache writes": med["attention: cache writes only"] - med["no attention"],
        "  of which K/V gathers": med["attention: writes + gathers"] - med["attention: cache writes only"],
        "  of which SDPA": full - med["attention: writes + gathers"],
        "RMSNorm (17 calls)": full - med["no RMSNorm"],
        "RoPE": full - med["no RoPE"],
    }
    top = [k for k in parts if not k.startswith("  ")]
    rest = full - sum(parts[k] for k in top)
    print(f"one decode forward, {NUM_REQUESTS} requests at {lens[-1]}-{lens[0]} tokens of context, llama-8x512 "
          f"float32, {args.threads} threads, median of {args.repeats}:")
    print(f"  {'whole forward':28s} {full:6.2f} ms")
    for k, v in parts.items():
        print(f"  {k:28s} {v:6.2f} ms")
    print(f"  {'the rest':28s} {rest:6.2f} ms  (residual adds, SiLU, embedding, module calls, and the weight "
          "products' own slowdown inside the forward)")
    print(f"weight products / whole forward: {med['weight products alone'] / full:.3f}")
    _cold_costs(model, step_meta(), args.repeats * 8)


def _cold_costs(model, meta, rounds: int) -> None:
    """Two figures behind the breakdown: one layer's K/V gather against a plain copy of the same bytes, and one
    RMSNorm of [16, hidden], each timed right after the largest weight product (as in the forward) and alone in a
    hot loop. Medians in microseconds."""
    import torch
    import torch.nn.functional as F

    attn = model.model.layers[0].self_attn
    k_cache, group = attn.k_cache, meta.decode_groups[0]
    rows = group.cache_rows(k_cache.shape[0], k_cache.shape[1])
    flat = k_cache.view(-1, k_cache.shape[2])
    same_bytes = flat[:rows.numel()]
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(NUM_REQUESTS, norm.weight.shape[0])
    big = model.model.layers[0].mlp.gate_up_proj.weight
    cases = {"K gather (one layer)": lambda: flat.index_select(0, rows), "copy of the same bytes": same_bytes.clone,
             "RMSNorm": lambda: norm(x)}
    after, hot = {k: [] for k in cases}, {k: [] for k in cases}
    with torch.inference_mode():
        for _ in range(rounds):
            for k, fn in cases.items():
                F.linear(x, big)  # streams the weights through the caches, as the forward does between small ops
                t0 = time.perf_counter()
                fn()
                after[k].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                fn()
                hot[k].append(time.perf_counter() - t0)
    mb = rows.numel() * k_cache.shape[2] * k_cache.element_size() / 1e6
    print(f"after a weight product / again at once (us, median of {rounds}); the gather moves {mb:.2f} MB:")
    for k in cases:
        a, h = sorted(after[k])[rounds // 2] * 1e6, sorted(hot[k])[rounds // 2] * 1e6
        print(f"  {k:24s} {a:7.1f} / {h:7.1f}" + (f"   ({mb / a * 1e3:.1f} GB/s cold)" if k != "RMSNorm" else ""))


if __name__ == "__main__":
    main()
