"""Output tokens/s of the deployctl-runtime engine vs transformers on the same model and requests, in one run.

Not a test: prints figures and ratios (and writes them to --json-out). Peers (bench/hf_peers.py), same requests,
same cap on running requests (max_num_seqs), greedy, no EOS:
  * hf_cb: transformers' continuous-batching manager (paged cache, per-request max_new_tokens). CPU target >= 3x;
    GPU target >= 2x. Greedy tokens are compared request by request.
  * hf_static: static batches of max_num_seqs, left-padded. CPU target >= 2x.
  * hf_single: one request at a time (a seeded sample stands in, compared per output token). CPU target >= 8x.
  * the GEMM floor (gemm_floor): the weight matrix products of the engine's own run, step by step, timed alone
    (same weights, dtype and threads; no attention, norms, sampling or Python). engine_over_gemm_floor = floor
    seconds / engine wall seconds (so also the weight products' share of the engine's time); CPU target >= 0.8.
    Engine runs and floor replays alternate over --rounds (default 3); each keeps its fastest round, and every
    round's own ratio is printed (round_ratios), so a machine whose speed drifts shows in the spread.
    share_* split the rest: the other work of forward and sampling, and scheduling/bookkeeping in Python.
Workloads: cpu (48 seeded requests, 16-128 in, 16-96 out, at most 16 running) and nano-vllm (256 requests, in and
out uniform 100-1024, nano-vllm's bench.py). --decode-steps B1,B2 also times one decode step at those batch sizes
and prints the HBM-bandwidth floor of the step: (weights bytes + KV bytes read) / --hbm-bandwidth.
--cotenant N runs N busy loops (coreutils `yes`) beside the engine and every peer, as a serving host's other work.

CPU:  PYTHONPATH=runtime python bench/bench_engine.py --threads 2
GPU:  PYTHONPATH=runtime python bench/bench_engine.py --device cuda --dtype bfloat16 --shape qwen3-0.6b \
        --workload nano-vllm --max-num-seqs 256 --decode-steps 1,256
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

# OpenMP threads sleep when idle instead of spinning (libgomp's default spin burns the cores a shared machine's
# other processes need, and is counted as CPU time); set before torch loads, the same for the engine and the peers,
# as the runtime itself sets it (deployctl_runtime/__init__.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_peers  # noqa: E402

SHAPES = {
    # 8 layers, hidden 512: large enough that compute matters on a CPU
    "llama-8x512": dict(cls="Llama", vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                        tie_word_embeddings=False),
    # Qwen3-0.6B's published shape, random weights
    "qwen3-0.6b": dict(cls="Qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0),
    # a few-second stand-in for the Qwen3 shape (gpu_check.sh --dry-run checks the script on a CPU with it)
    "qwen3-tiny": dict(cls="Qwen3", vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                       tie_word_embeddings=True),
}
# (requests, prompt lengths, output lengths, max_num_seqs)
WORKLOADS = {"cpu": (48, (16, 128), (16, 96), 16), "nano-vllm": (256, (100, 1024), (100, 1024), 256)}
TARGETS = {"cpu": {"hf_cb": 3.0, "hf_static": 2.0, "hf_single": 8.0}, "cuda": {"hf_cb": 2.0}}
FLOOR_TARGET = 0.8  # engine tok/s over the GEMM floor's, CPU (issue 27)


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


def make_requests(n: int, vocab: int, seed: int, in_len, out_len) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab) for _ in range(rng.randint(*in_len))], rng.randint(*out_len))
            for _ in range(n)]


def make_llm(model_dir: Path, args, max_model_len: int):
    from deployctl_runtime import LLM

    return LLM(str(model_dir), device=args.device, dtype=args.dtype, max_model_len=max_model_len,
               max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
               kv_cache_memory=args.kv_cache_memory, gpu_memory_utilization=args.gpu_memory_utilization,
               enforce_eager=args.enforce_eager, log=lambda m: print(f"  engine: {m}", file=sys.stderr))


def run_engine(llm, requests, args):
    """Returns (Timer, output tokens, token lists, (steps, spent)): steps [(tokens in the flat batch, rows sampled)]
    of the timed run, in order, for gemm_floor(); spent {"forward", "sample"} seconds of the model runner's stages."""
    from deployctl_runtime import SamplingParams

    params = [SamplingParams(max_tokens=out, temperature=0, ignore_eos=True) for _, out in requests]
    llm.generate([requests[0][0]], params[0])  # warm the code paths, as the server's warm-up does
    runner, steps = llm.engine.runner, []
    forward, sample = runner.forward, runner.sample
    spent = {"forward": 0.0, "sample": 0.0}

    def timed_forward(inputs):
        steps.append((inputs.num_tokens, len(inputs.sample_reqs)))
        t0 = time.perf_counter()
        hidden = forward(inputs)
        hf_peers.sync(args.device)
        spent["forward"] += time.perf_counter() - t0
        return hidden

    def timed_sample(hidden, inputs):
        t0 = time.perf_counter()
        out = sample(hidden, inputs)
        spent["sample"] += time.perf_counter() - t0
        return out

    runner.forward, runner.sample = timed_forward, timed_sample
    t = hf_peers.Timer(args.device)
    try:
        with t, _profiled(args.profile):
            outs = llm.generate([p for p, _ in requests], params)
    finally:
        del runner.forward, runner.sample
    tokens = [list(o.token_ids) for o in outs]
    return t, sum(len(tk) for tk in tokens), tokens, (steps, spent)


def gemm_floor(model, steps: list[tuple[int, int]], device: str, repeats: int = 3) -> float:
    """Seconds the engine run's weight matrix products take alone: for each recorded step (T tokens, N rows
    sampled), every nn.Linear of every decoder layer on a [T, in_features] input, then lm_head on [N, hidden]; the
    model's own weights, the same dtype and threads, no attention, norms, sampling or Python between steps. The
    floor the engine's time is measured against (issue 27); minimum of `repeats` replays."""
    import torch
    import torch.nn.functional as F

    layers = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    head = model.lm_head
    dtype = head.weight.dtype
    shapes = {(t, m.in_features) for t, _ in steps for m in layers} | {(n, head.in_features) for _, n in steps if n}
    inputs = {s: torch.randn(s, dtype=dtype, device=device) for s in shapes}  # built before the clock starts
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            hf_peers.sync(device)
            t0 = time.perf_counter()
            for t, n in steps:
                for m in layers:
                    F.linear(inputs[(t, m.in_features)], m.weight, m.bias)
                if n:
                    F.linear(inputs[(n, head.in_features)], head.weight)
            hf_peers.sync(device)
            best = min(best, time.perf_counter() - t0)
    return best


class _profiled:
    """--profile: torch profiler over the engine run; prints each op's share of self CPU time (top 12)."""

    def __init__(self, on: bool):
        self.prof = None
        if on:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU])

    def __enter__(self):
        if self.prof:
            self.prof.__enter__()

    def __exit__(self, *exc):
        if not self.prof:
            return
        self.prof.__exit__(*exc)
        ops = self.prof.key_averages()
        total = sum(e.self_cpu_time_total for e in ops)
        print("engine profile (share of self CPU time):", file=sys.stderr)
        for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:12]:
            print(f"  {e.key}: {100 * e.self_cpu_time_total / total:.1f}% ({e.count} calls)", file=sys.stderr)


def decode_step_times(llm, batches: list[int], context: int, args) -> dict:
    """Seconds of one decode-only engine step at each batch size (median of 8), every request at `context` tokens,
    and the HBM floor of that step: (weights bytes + batch * context * KV bytes per token) / bandwidth."""
    from deployctl_runtime import SamplingParams

    engine, out = llm.engine, {}
    per_token = engine.kv_plan.kv_bytes_per_token
    weights = engine.runner.weights_bytes()
    rng = random.Random(1)
    for b in batches:
        ids = [f"d{b}-{i}" for i in range(b)]
        for rid in ids:
            engine.add_request(rid, [rng.randrange(10, 1000) for _ in range(context)],  # none ends while timed
                               SamplingParams(max_tokens=engine.max_model_len - context, temperature=0,
                                              ignore_eos=True))
        while engine.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                                              for r in engine.scheduler.running):
            engine.step()  # prefill until every request decodes
        times = []
        for _ in range(8):
            hf_peers.sync(args.device)
            t0 = time.perf_counter()
            engine.step()
            hf_peers.sync(args.device)
            times.append(time.perf_counter() - t0)
        engine.abort_request(ids)
        engine.step()
        floor = (weights + b * context * per_token) / args.hbm_bandwidth
        out[b] = {"step_s": sorted(times)[len(times) // 2], "hbm_floor_s": floor}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--shape", default="llama-8x512", choices=sorted(SHAPES))
    ap.add_argument("--workload", default="cpu", choices=sorted(WORKLOADS))
    ap.add_argument("--requests", type=int, default=None, help="default: the workload's")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="cap on running requests, engine and peers")
    ap.add_argument("--peers", default="hf_cb,hf_static,hf_single", help="comma-separated; '' for the engine alone")
    ap.add_argument("--single-sample", type=int, default=8, help="requests HF runs one at a time (seeded sample)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-cache-memory", type=int, default=1024**3, help="bytes, CPU only")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="CUDA only; HF needs the rest")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--decode-steps", default="", help="batch sizes to time one decode step at, e.g. 1,256")
    ap.add_argument("--decode-context", type=int, default=512, help="tokens per request in --decode-steps")
    ap.add_argument("--hbm-bandwidth", type=float, default=4.8e12, help="bytes/s for the floor (H200: 4.8 TB/s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json-out", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--profile", action="store_true", help="print the engine run's op breakdown (torch profiler)")
    ap.add_argument("--cotenant", type=int, default=0,
                    help="busy loops (coreutils `yes`) running beside the engine and every peer, as a serving "
                         "host's other work (tokenizer, HTTP server, exporters) shares its cores")
    ap.add_argument("--rounds", type=int, default=3,
                    help="engine runs alternating with GEMM-floor replays; each side's best counts")
    args = ap.parse_args()
    n_req, in_len, out_len, seqs = WORKLOADS[args.workload]
    args.requests = args.requests or n_req
    args.max_num_seqs = args.max_num_seqs or seqs
    peers = [p for p in args.peers.split(",") if p]

    cotenants = start_cotenants(args.cotenant)
    try:
        return run_all(args, peers)
    finally:
        for p in cotenants:
            p.kill()
            p.wait()


def start_cotenants(n: int) -> list:
    """N processes spinning on a core each (coreutils `yes` into /dev/null, the peer a shell user would start)."""
    import subprocess

    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]


def run_all(args, peers: list[str]) -> int:
    import torch

    _, in_len, out_len, _ = WORKLOADS[args.workload]
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict = {"shape": args.shape, "device": args.device, "dtype": args.dtype, "workload": args.workload,
                    "requests": args.requests, "max_num_seqs": args.max_num_seqs,
                    "torch_threads": torch.get_num_threads(), "enforce_eager": args.enforce_eager,
                    "cotenant_busy_loops": args.cotenant}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_checkpoint(args.shape, Path(tmp), args.seed)
        requests = make_requests(args.requests, SHAPES[args.shape]["vocab_size"], args.seed, in_len, out_len)
        max_len = max(len(p) + o for p, o in requests)
        llm = make_llm(model_dir, args, max(max_len, args.decode_context + 128))
        # engine runs and floor replays alternate, so that a change in the machine's speed (other work, a VM's
        # neighbours) hits both; each side keeps its best (fastest) round, and every round's own ratio is printed
        rounds = []
        for _ in range(args.rounds):
            run = run_engine(llm, requests, args)
            rounds.append((run, gemm_floor(llm.engine.runner.model, rounds[0][0][3][0] if rounds else run[3][0],
                                           args.device, repeats=1)))
        runs = {"engine": min((r for r, _ in rounds), key=lambda r: r[0].wall)}
        floor_s = min(f for _, f in rounds)
        if args.decode_steps:
            steps = decode_step_times(llm, [int(b) for b in args.decode_steps.split(",")], args.decode_context, args)
            for b, fig in steps.items():
                result[f"decode_step_b{b}_s"] = fig["step_s"]
                result[f"decode_step_b{b}_hbm_floor_s"] = fig["hbm_floor_s"]
                result[f"decode_step_b{b}_over_floor"] = fig["step_s"] / fig["hbm_floor_s"]
        t, n, _, (steps, spent) = runs["engine"]
        runs["engine"] = runs["engine"][:3]
        result["engine_steps"] = len(steps)
        result["gemm_floor_s"] = floor_s
        result["gemm_floor_tok_s"] = n / floor_s
        result["engine_over_gemm_floor"] = floor_s / t.wall
        result["rounds"] = len(rounds)
        result["round_ratios"] = " ".join(f"{f / r[0].wall:.3f}" for r, f in rounds)
        # where the engine's wall time goes: the weight products (as timed alone), the rest of forward + sampling
        # (attention, norms, RoPE, activations, the sampler's reductions), and scheduling/bookkeeping in Python
        model_s = spent["forward"] + spent["sample"]
        result["share_other_forward_and_sampling"] = (model_s - floor_s) / t.wall
        result["share_scheduler_and_python"] = (t.wall - model_s) / t.wall
        if args.json_out:  # the engine's figures survive a peer that runs out of time
            Path(args.json_out).write_text(json.dumps(dict(result, engine_tok_s_wall=n / t.wall, partial=True)))
        del llm
        if args.device == "cuda":
            torch.cuda.empty_cache()  # give the KV pool back before HF runs in this process
        if peers:
            model = hf_peers.load_hf(model_dir, args)
            for name in peers:
                reqs = requests
                if name == "hf_single":
                    reqs = random.Random(args.seed + 1).sample(requests, min(args.single_sample, len(requests)))
                runs[name] = getattr(hf_peers, f"run_{name}")(model, reqs, args)
                if runs[name][2] is not None:
                    mine = runs["engine"][2] if name != "hf_single" else \
                        [runs["engine"][2][requests.index(r)] for r in reqs]
                    result[f"greedy_tokens_equal_{name}"] = f"{sum(a == b for a, b in zip(mine, runs[name][2]))}/" \
                                                            f"{len(reqs)}"
    for name, (t, n, _) in runs.items():
        print(f"{name}: {n} output tokens in {t.wall:.2f}s wall ({n / t.wall:.1f} tok/s), {t.cpu:.2f}s CPU "
              f"({n / t.cpu:.1f} tok/CPU-s)", file=sys.stderr)
        result[f"{name}_tok_s_wall"] = n / t.wall
        result[f"{name}_tok_s_cpu"] = n / t.cpu
    for name in peers:
        for kind in ("wall", "cpu"):
            result[f"ratio_vs_{name}_{kind}"] = result[f"engine_tok_s_{kind}"] / result[f"{name}_tok_s_{kind}"]
    if args.device == "cpu":
        met = result["engine_over_gemm_floor"] >= FLOOR_TARGET
        result["target_vs_gemm_floor"] = f">= {FLOOR_TARGET}x {'met' if met else 'NOT met'}"
    for name, target in TARGETS[args.device].items():
        if name in peers:
            met = min(result[f"ratio_vs_{name}_wall"], result[f"ratio_vs_{name}_cpu"]) >= target
            result[f"target_vs_{name}"] = f">= {target}x {'met' if met else 'NOT met'}"
    for k, v in result.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
