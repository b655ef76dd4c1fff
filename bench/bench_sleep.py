"""Sleep and wake of the bundled runtime's engine (LLMEngine.sleep / wake_up, what POST /sleep?level=1 and
POST /wake_up run): seconds of each, weights and KV bytes, whether greedy outputs match before and after, and on
CUDA the device memory the process holds awake and asleep (the sleeper's GPU residue, measured with
torch.cuda.mem_get_info against the baseline before the model loaded).

    PYTHONPATH=runtime python bench/bench_sleep.py                                   # tiny model + Qwen3-0.6B shape, CPU
    PYTHONPATH=runtime python bench/bench_sleep.py --shape qwen3-0.6b --device cuda --dtype bfloat16   # GPU

Shapes: ``tiny`` (deployctl-runtime tiny-model), and bench_engine.py's SHAPES (``qwen3-0.6b``: Qwen3-0.6B's
published shape with random weights, built here with transformers; no download). Prints one JSON line per shape;
``--json-out FILE`` writes them as a list.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _checkpoint(shape: str, out: Path) -> Path:
    if shape == "tiny":
        from deployctl_runtime.tiny_model import write_tiny_model

        write_tiny_model(out)
        return out
    from bench_engine import build_checkpoint

    return build_checkpoint(shape, out, seed=0)


def _gpu_used(device: str) -> int | None:
    if device != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def measure(shape: str, device: str, dtype: str, kv_cache_memory: int, gpu_memory_utilization: float,
            rounds: int) -> dict:
    from deployctl_runtime import LLM, SamplingParams

    baseline = _gpu_used(device)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        model = _checkpoint(shape, Path(tmp) / "model")
        build_s = time.monotonic() - t0
        t0 = time.monotonic()
        llm = LLM(str(model), device=device, dtype=dtype, max_model_len=512, max_num_seqs=8,
                  kv_cache_memory=kv_cache_memory if device == "cpu" else None,
                  gpu_memory_utilization=gpu_memory_utilization)
        load_s = time.monotonic() - t0
    engine = llm.engine
    prompts = [[11, 12, 13, 14, 15, 16], [40, 41, 42], [7] * 20]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    before = [list(o.token_ids) for o in llm.generate(prompts, params)]
    awake = _gpu_used(device)
    sleeps, wakes, asleep, equal = [], [], None, True
    for _ in range(rounds):
        t0 = time.monotonic()
        engine.sleep()
        sleeps.append(time.monotonic() - t0)
        asleep = _gpu_used(device)
        t0 = time.monotonic()
        engine.wake_up()
        wakes.append(time.monotonic() - t0)
        equal &= [list(o.token_ids) for o in llm.generate(prompts, params)] == before
    plan = engine.kv_plan
    out = {"shape": shape, "device": device, "dtype": engine.dtype, "weights_bytes": engine.runner.weights_bytes(),
           "kv_bytes": plan.num_blocks * plan.block_size * plan.kv_bytes_per_token, "build_s": round(build_s, 2),
           "load_s": round(load_s, 2), "sleep_s": [round(s, 4) for s in sleeps], "wake_s": [round(s, 4) for s in wakes],
           "greedy_equal_after_wake": equal}
    if device == "cuda":
        out |= {"gpu_used_awake_bytes": awake - baseline, "gpu_residue_asleep_bytes": asleep - baseline}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="tiny, qwen3-0.6b, qwen3-tiny, llama-8x512 (repeatable; "
                                                     "default tiny and qwen3-0.6b)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-memory", type=int, default=256 * 2**20, help="CPU KV pool, bytes")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    ap.add_argument("--rounds", type=int, default=3, help="sleep/wake cycles")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    results = []
    for shape in args.shape or ["tiny", "qwen3-0.6b"]:
        r = measure(shape, args.device, args.dtype, args.kv_cache_memory, args.gpu_memory_utilization, args.rounds)
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["greedy_equal_after_wake"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
