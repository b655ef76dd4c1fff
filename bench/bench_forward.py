"""Where one CPU decode forward's time goes beyond the weight products (issue 27), in one run, on both CPU paths.

Not a test: prints milliseconds. One decode step of 16 requests at 135-150 tokens of context on the llama-8x512
checkpoint (bench_engine.py's shape and seeded weights). The forward is timed on the runtime's C operators
(kernels/cpu_ops.c, the default where the host has a C compiler) and on torch's ops (the fallback), and on the C
path once more with one part at a time replaced by a no-op: a part's cost is the full forward's median minus that
variant's (so it is the part's cost inside the forward, caches as cold as there, not alone in a loop). The weight
products alone are every decoder layer's nn.Linear on [16, in_features] with the model's weights, as
bench_engine.gemm_floor times them. Variants alternate within each of --repeats rounds, so the machine's drift
spreads over all of them.

    PYTHONPATH=runtime python bench/bench_forward.py [--threads 2] [--repeats 25]
"""
from __future__ import annotations

import argparse
import contextlib
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
    import deployctl_runtime.models.llama as llama
    from deployctl_runtime import LLM
    from deployctl_runtime.attention import AttentionMetadata, decode_group
    from deployctl_runtime.kernels import cpu_kernels
    from deployctl_runtime.layers import GatedMLP, RMSNorm, RotaryEmbedding

    ops = cpu_kernels.load()
    if ops is None:
        sys.exit("the CPU operators are not built here (no C compiler?): nothing to break down")
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

    def step_meta(native: bool) -> AttentionMetadata:  # built per forward, as prepare_inputs does
        if native:
            return AttentionMetadata(slot_mapping=slots, num_decodes=NUM_REQUESTS, block_size=bs,
                                     decode_kernel=ops.paged_decode, block_tables=tables.to(torch.int32),
                                     context_lens=torch.tensor(lens, dtype=torch.int32))
        return AttentionMetadata(slot_mapping=slots, num_decodes=NUM_REQUESTS, block_size=bs,
                                 decode_groups=[decode_group(0, tables, lens, bs)])

    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(NUM_REQUESTS, m.in_features) for m in linears}
    real = {"attention": llama.paged_attention, "norm": RMSNorm.forward, "qkv": RotaryEmbedding.qkv,
            "mlp": GatedMLP.forward}

    def no_rope(self, tables_, qkv, h, kvh, q_norm=None, k_norm=None, cache=None):  # views only: no pass at all
        t, d = qkv.shape[0], self.head_dim
        return (qkv[:, :h * d].view(t, h, d), qkv[:, h * d:(h + kvh) * d].view(t, kvh, d),
                qkv[:, (h + kvh) * d:].view(t, kvh, d), True)

    def no_silu(self, x):  # both products, no activation
        gate_up = self.gate_up_proj(x)
        return self.down_proj(gate_up[:, :gate_up.shape[1] // 2])

    variants = {  # name -> (C operators on?, parts replaced)
        "whole forward, C operators": (True, {}),
        "whole forward, torch ops": (False, {}),
        "no attention": (True, {"attention": lambda q, k, v, kc, vc, meta, scale, stored=False: q}),
        "no RMSNorm (nor residual adds)": (True, {"norm": lambda self, x, residual=None: x if residual is None
                                                  else (x, residual)}),
        "no RoPE + cache store": (True, {"qkv": no_rope}),
        "no SiLU-and-multiply": (True, {"mlp": no_silu}),
    }

    def install(parts: dict) -> None:
        llama.paged_attention = parts.get("attention", real["attention"])
        RMSNorm.forward = parts.get("norm", real["norm"])
        RotaryEmbedding.qkv = parts.get("qkv", real["qkv"])
        GatedMLP.forward = parts.get("mlp", real["mlp"])

    times: dict[str, list[float]] = {k: [] for k in [*variants, "weight products alone"]}
    with torch.inference_mode():
        for native in (True, False):  # warm-up
            with contextlib.nullcontext() if native else cpu_kernels.disabled():
                for _ in range(3):
                    model(ids, positions, step_meta(native))
        for _ in range(args.repeats):
            for name, (native, parts) in variants.items():
                install(parts)
                with contextlib.nullcontext() if native else cpu_kernels.disabled():
                    meta = step_meta(native)
                    t0 = time.perf_counter()
                    model(ids, positions, meta)
                    times[name].append(time.perf_counter() - t0)
            install({})
            t0 = time.perf_counter()
            for m in linears:
                F.linear(inputs[m.in_features], m.weight, m.bias)
            times["weight products alone"].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
    full, torch_full = med["whole forward, C operators"], med["whole forward, torch ops"]
    parts = {name.removeprefix("no "): full - med[name] for name in variants if name.startswith("no ")}
    rest = full - med["weight products alone"] - sum(parts.values())
    print(f"one decode forward, {NUM_REQUESTS} requests at {lens[-1]}-{lens[0]} tokens of context, llama-8x512 "
          f"float32, {args.threads} threads, median of {args.repeats}:")
    print(f"  {'whole forward, torch ops':32s} {torch_full:6.2f} ms")
    print(f"  {'whole forward, C operators':32s} {full:6.2f} ms   ({torch_full / full:.2f}x faster)")
    print(f"  {'weight products (alone)':32s} {med['weight products alone']:6.2f} ms")
    for k, v in parts.items():
        print(f"  {k:32s} {v:6.2f} ms")
    print(f"  {'the rest':32s} {rest:6.2f} ms  (embedding, module calls, and the weight products' own slowdown "
          "inside the forward)")
    print(f"weight products / whole forward: C operators {med['weight products alone'] / full:.3f}, torch ops "
          f"{med['weight products alone'] / torch_full:.3f}")


if __name__ == "__main__":
    main()
