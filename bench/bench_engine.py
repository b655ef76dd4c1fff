"""Output tokens/s of the deployctl-runtime engine vs HF transformers `generate` on the same model and requests.

Not a test: prints figures and ratios. Baselines, measured in the same run:
  * HF one request at a time (what a naive server does); a seeded sample of the requests stands in, compared per
    output token. Target: engine >= 8x.
  * HF static batches of max_num_seqs (64) requests, left-padded, each batch waiting for its longest request; the
    useful output tokens are counted. Target: engine >= 1.5x.
Requests: 256, seeded, prompt lengths 16-512, output lengths 16-256, greedy, ignore_eos.

CPU:  PYTHONPATH=runtime python bench/bench_engine.py
GPU:  PYTHONPATH=runtime python bench/bench_engine.py --device cuda --dtype bfloat16 --shape qwen3-0.6b
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # 8 layers, hidden 512: large enough that compute matters on a CPU
    "llama-8x512": dict(cls="Llama", vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                        tie_word_embeddings=False),
    # Qwen3-0.6B's published shape, random weights
    "qwen3-0.6b": dict(cls="Qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0),
}


def build_checkpoint(shape: str, out: Path, seed: int) -> Path:
    import torch
    import transformers

    spec = dict(SHAPES[shape])
    cls = spec.pop("cls")
    cfg = getattr(transformers, f"{cls}Config")(**spec, initializer_range=0.02)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{cls}ForCausalLM")(cfg)
    model.save_pretrained(out)
    from deployctl_runtime.tiny_model import train_tokenizer

    train_tokenizer(vocab_size=512).save(str(out / "tokenizer.json"))
    return out


def make_requests(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(n)]


def run_engine(model_dir: Path, requests, args) -> tuple[float, int]:
    from deployctl_runtime import LLM, SamplingParams

    llm = LLM(str(model_dir), device=args.device, dtype=args.dtype, max_model_len=1024, max_num_seqs=64,
              max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
              gpu_memory_utilization=args.gpu_memory_utilization, log=lambda m: print(f"  engine: {m}", file=sys.stderr))
    params = [SamplingParams(max_tokens=out, temperature=0, ignore_eos=True) for _, out in requests]
    llm.generate([requests[0][0]], params[0])  # warm the code paths, as the server's warm-up does
    with Timer(args.device) as t:
        outs = llm.generate([p for p, _ in requests], params)
    n = sum(len(o.token_ids) for o in outs)
    assert n == sum(out for _, out in requests)
    del llm, outs
    if args.device == "cuda":
        import torch

        torch.cuda.empty_cache()  # give the KV pool back before HF runs in this process
    return t, n


class Timer:
    """Wall seconds and this process's CPU seconds (CPU time is the steadier measure on a shared machine)."""

    def __init__(self, device: str):
        self.device, self.wall, self.cpu = device, 0.0, 0.0

    def __enter__(self):
        _sync(self.device)
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        _sync(self.device)
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def load_hf(model_dir: Path, args):
    import torch
    import transformers

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
             "auto": torch.float32}[args.dtype]
    return transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(args.device).eval()


def run_hf_single(model, requests, args) -> tuple[float, int]:
    import torch

    t, n = Timer(args.device), 0
    for prompt, out in requests:
        ids = torch.tensor([prompt], device=args.device)
        with t, torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out, min_new_tokens=out,
                           do_sample=False, pad_token_id=0)
        n += out
    return t, n


def run_hf_static(model, requests, args) -> tuple[float, int]:
    import torch

    t, n = Timer(args.device), 0
    for i in range(0, len(requests), 64):
        batch = requests[i:i + 64]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=args.device)
        longest = max(out for _, out in batch)
        with t, torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=0)
        n += sum(out for _, out in batch)  # only the tokens each request asked for are useful
        print(f"  hf static batch {i // 64 + 1}: {t.wall:.1f}s wall so far", file=sys.stderr)
    return t, n


def _report(name: str, t: Timer, n: int) -> None:
    print(f"{name}: {n} output tokens in {t.wall:.1f}s wall ({n / t.wall:.1f} tok/s), {t.cpu:.1f}s CPU "
          f"({n / t.cpu:.1f} tok/CPU-s)", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--shape", default="llama-8x512", choices=sorted(SHAPES))
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--single-sample", type=int, default=8, help="requests HF runs one at a time (seeded sample)")
    ap.add_argument("--static-batches", type=int, default=None,
                    help="HF static batches of 64 to run (default: all); fewer extrapolates per output token")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-cache-memory", type=int, default=2 * 1024**3, help="bytes, CPU only")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="CUDA only; HF needs the rest")
    ap.add_argument("--skip-hf", action="store_true", help="engine only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(args.shape, Path(tmp), args.seed)
        vocab = SHAPES[args.shape]["vocab_size"]
        requests = make_requests(args.requests, vocab, args.seed)
        result = {"shape": args.shape, "device": args.device, "dtype": args.dtype, "requests": len(requests),
                  "torch_threads": torch.get_num_threads()}
        runs = {"engine": run_engine(model_dir, requests, args)}
        _report("engine", *runs["engine"])
        if not args.skip_hf:
            model = load_hf(model_dir, args)
            sample = random.Random(args.seed + 1).sample(requests, min(args.single_sample, len(requests)))
            runs["hf_single"] = run_hf_single(model, sample, args)
            _report(f"hf one at a time ({len(sample)} sampled requests)", *runs["hf_single"])
            nb = args.static_batches
            static_reqs = requests if nb is None else requests[:64 * nb]
            runs["hf_static64"] = run_hf_static(model, static_reqs, args)
            _report(f"hf static batches of 64 ({len(static_reqs)} requests)", *runs["hf_static64"])
        for name, (t, n) in runs.items():
            result[f"{name}_tok_s_wall"] = n / t.wall
            result[f"{name}_tok_s_cpu"] = n / t.cpu
        for base in ("hf_single", "hf_static64"):
            if base in runs:
                for kind in ("wall", "cpu"):
                    result[f"ratio_vs_{base}_{kind}"] = result[f"engine_tok_s_{kind}"] / result[f"{base}_tok_s_{kind}"]
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
        for base, target in (("hf_single", 8.0), ("hf_static64", 1.5)):
            if f"ratio_vs_{base}_wall" in result:
                ok = result[f"ratio_vs_{base}_wall"] >= target and result[f"ratio_vs_{base}_cpu"] >= target
                print(f"target vs {base} >= {target}x: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
