"""The transformers peers bench_engine.py measures the engine against, on the same requests in the same process.

Each run_* takes the loaded HF model, the requests [(prompt ids, output length)] and the bench args, and returns
(Timer, useful output tokens, generated token lists or None). Greedy, no EOS (every request runs its full length).
  * run_hf_single: `generate` one request at a time (what a naive server does).
  * run_hf_static: `generate` on left-padded static batches of max_num_seqs, each waiting for its longest request;
    only the tokens each request asked for count.
  * run_hf_cb: transformers' continuous-batching manager (`init_continuous_batching`, `add_request(ids,
    max_new_tokens=...)`, `get_result()`): paged cache sized explicitly (its CPU default takes 60% of RAM), at most
    max_num_seqs requests per batch, per-request max_new_tokens.
    It is the machinery behind `generate_batch`, which takes one max_new_tokens for all requests; the manager's
    per-request lengths keep the peer fair (generate_batch would run every request to the longest length).
"""
from __future__ import annotations

import sys
import time


class Timer:
    """Wall seconds and this process's CPU seconds, all threads (the steadier measure on a shared machine)."""

    def __init__(self, device: str):
        self.device, self.wall, self.cpu = device, 0.0, 0.0

    def __enter__(self):
        sync(self.device)
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def load_hf(model_dir, args):
    import torch
    import transformers

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    return transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                             attn_implementation="sdpa").to(args.device).eval()


def run_hf_single(model, requests, args):
    import torch

    t, n, tokens = Timer(args.device), 0, []
    for prompt, out in requests:
        ids = torch.tensor([prompt], device=args.device)
        with t, torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out, min_new_tokens=out,
                                 do_sample=False, pad_token_id=0)
        tokens.append(gen[0, len(prompt):].tolist())
        n += out
    return t, n, tokens


def run_hf_static(model, requests, args):
    import torch

    t, n, size = Timer(args.device), 0, args.max_num_seqs
    for i in range(0, len(requests), size):
        batch = requests[i:i + size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=args.device)
        longest = max(out for _, out in batch)
        with t, torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=0)
        n += sum(out for _, out in batch)  # only the tokens each request asked for are useful
    return t, n, None


def _cb_config(requests, args):
    import dataclasses

    from transformers import ContinuousBatchingConfig

    page = 256
    # enough pages for the max_num_seqs largest requests at once, plus one spare each
    pages = sorted((-(-(len(p) + out) // page) for p, out in requests), reverse=True)
    num_blocks = sum(pages[:args.max_num_seqs]) + args.max_num_seqs
    cpu = args.device == "cpu"
    wanted = dict(page_size=page, num_blocks=num_blocks, max_requests_per_batch=args.max_num_seqs,
                  max_batch_tokens=args.max_num_batched_tokens, allow_block_sharing=False,
                  use_async_batching=False if cpu else None)
    known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}  # older transformers lack some
    return ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in known})


def _gen_config(max_new_tokens: int):
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)


def run_hf_cb(model, requests, args):
    import torch

    gen, cb = _gen_config(max(o for _, o in requests)), _cb_config(requests, args)
    try:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    except TypeError:  # transformers before the continuous_batching_config argument (the GPU machine's 5.17)
        gen.continuous_batching_config = cb
        manager = model.init_continuous_batching(generation_config=gen)
    results: dict[str, list[int]] = {}
    if hasattr(manager, "warmup"):
        with torch.inference_mode():
            manager.warmup()  # its CUDA graphs are captured before the clock starts, as the engine's are
    t = Timer(args.device)
    with t, torch.inference_mode():
        manager.start()
        for i, (prompt, out) in enumerate(requests):
            manager.add_request(prompt, request_id=f"r{i}", max_new_tokens=out)
        while len(results) < len(requests):
            res = manager.get_result(timeout=60)
            if res is None:
                raise RuntimeError("transformers continuous batching stopped before every request finished")
            if res.is_finished():
                if res.error:
                    raise RuntimeError(f"transformers continuous batching: {res.error}")
                results[res.request_id] = list(res.generated_tokens)
        manager.stop(block=True)
    getattr(model, "destroy_cached_continuous_batching_manager", lambda: None)()
    tokens = [results[f"r{i}"] for i in range(len(requests))]
    n = sum(min(len(tk), out) for tk, (_, out) in zip(tokens, requests))
    return t, n, tokens
