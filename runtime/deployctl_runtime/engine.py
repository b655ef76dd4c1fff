"""LLMEngine: the single-threaded core loop (schedule -> execute -> update) behind the server and the offline LLM."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from deployctl_runtime import kv_sizing
from deployctl_runtime.engine_args import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from deployctl_runtime.isolation import (DEFAULT_FATAL_MARKERS, DEFAULT_STEP_RETRIES_PER_MIN, STEP_RETRY_WINDOW_S,
                                         EngineFatalError, describe, execute_isolating)
from deployctl_runtime.kv_cache_manager import KVCacheManager, model_identity
from deployctl_runtime.model_config import ModelConfig
from deployctl_runtime.request import Request, RequestStatus
from deployctl_runtime.sampling_params import SamplingParams, context_length_error
from deployctl_runtime.scheduler import Scheduler
from deployctl_runtime.tokenizer import load_tokenizer


class RequestRejected(Exception):
    """add_request refuses a request that can never be served. reason: "context_length_exceeded" (prompt leaves no
    room for one output token within max_model_len) or "too_many_blocks" (more blocks than the pool has)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float] | None
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    new_top_logprobs: list[list[tuple[int, float]]] | None = None  # per new token: (id, logprob), best first
    error: str | None = None  # why finish_reason is "error"
    queue_time_s: float | None = None  # arrival (add_request) to first scheduling, once scheduled


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_gpu_blocks: int
    num_free_blocks: int
    kv_cache_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int  # in tokens, as vLLM counts
    prefix_cache_hits_total: int  # in tokens
    step_retries_total: int = 0  # extra forwards run to isolate failed steps (isolation.py)


def _resolve_dtype(args: EngineArgs, cfg: ModelConfig) -> str:
    """auto: float32 on CPU; on CUDA the checkpoint's half type (float16 when it says so), else bfloat16 (as vLLM
    runs float32 checkpoints in half precision on GPUs)."""
    if args.dtype != "auto":
        return args.dtype
    if args.device == "cuda":
        return "float16" if cfg.torch_dtype == "float16" else "bfloat16"
    return "float32"


class LLMEngine:
    """Owns the scheduler, the KV cache manager and the model runner. Not thread-safe: one thread calls
    add_request, abort_request and step."""

    def __init__(self, args: EngineArgs, log: Callable[[str], None] | None = None):
        args.validate()
        log = log or (lambda msg: None)
        self.args = args
        model_dir = Path(args.model)
        cfg = ModelConfig.from_dir(model_dir)
        self.model_config = cfg
        self.model_name = model_dir.resolve().name
        tok = load_tokenizer(model_dir, cfg.eos_token_ids)
        self.tokenizer = tok.tokenizer
        self.eos_token_ids = tok.eos_token_ids
        self.chat_template, self.bos_token, self.eos_token = tok.chat_template, tok.bos_token, tok.eos_token
        self.bos_token_id = tok.bos_token_id
        self.max_model_len = args.max_model_len or min(cfg.max_position_embeddings, 2048)
        if self.max_model_len > cfg.max_position_embeddings:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                             f"{cfg.max_position_embeddings}; lower --max-model-len")
        if not args.enable_chunked_prefill and args.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens {args.max_num_batched_tokens} is smaller than max_model_len "
                             f"{self.max_model_len} with chunked prefill off; raise it or enable chunked prefill")
        self.dtype = _resolve_dtype(args, cfg)
        from deployctl_runtime.model_runner import ModelRunner  # torch from here on

        self.runner = ModelRunner(cfg, str(model_dir), args.device, self.dtype, args.block_size, args.seed)
        self._use_cuda_graphs = args.device == "cuda" and not args.enforce_eager
        per_token = kv_sizing.kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                                 kv_sizing.DTYPE_BYTES[self.dtype])
        budget = self._kv_budget_bytes(log) if args.num_gpu_blocks_override is None else 0
        num_blocks = kv_sizing.num_blocks_for(budget, args.block_size, per_token, args.num_gpu_blocks_override)
        self.kv_plan = kv_sizing.KVPlan(num_blocks, args.block_size, per_token, self.max_model_len, args.max_num_seqs)
        self.kv_plan.check_fits()
        self.runner.allocate_kv_cache(num_blocks)
        log(self.kv_plan.summary())
        self.kv = KVCacheManager(num_blocks, args.block_size, args.enable_prefix_caching,
                                 model_identity(model_dir, self.dtype))
        self.scheduler = Scheduler(self.kv, args.max_num_seqs, args.max_num_batched_tokens, self.max_model_len,
                                   args.enable_chunked_prefill)
        from deployctl_runtime.structured import StructuredOutputs

        self.runner.sampler.structured = StructuredOutputs(self.tokenizer, cfg.vocab_size, self.eos_token_ids)
        self.runner.warmup()
        log("warm-up forward pass done")
        if self._use_cuda_graphs:
            used = self.runner.capture_cuda_graphs(args.max_num_seqs, self.max_model_len)
            log(f"cuda graphs: {len(self.runner.graphs.sizes)} decode batch sizes captured, {used} bytes")
        self._arrivals = 0
        self._pending_outputs: list[RequestOutput] = []
        self.fatal_markers: tuple[str, ...] = DEFAULT_FATAL_MARKERS  # isolation.is_fatal; the server adds its own
        # extra forwards failed steps may run per STEP_RETRY_WINDOW_S, all steps together (the server sets it from
        # --max-step-retries-per-min); beyond it a failed step's unresolved requests fail instead of being re-run
        self.max_step_retries_per_min = DEFAULT_STEP_RETRIES_PER_MIN
        self.num_step_retries_total = 0
        self._retry_times: deque[float] = deque()
        self.is_sleeping = False
        self._phase = "idle"  # where step() is: a cheap marker the server's progress watchdog reports (step_phase)

    # -- sleep ------------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Level 1 (vLLM's meaning): the KV cache is freed (CUDA graphs with it) and, on CUDA, the weights move to
        pinned host memory; on CPU the weights stay. Raises RuntimeError while requests are unfinished."""
        if self.has_unfinished_requests():
            raise RuntimeError("requests are in flight: sleep only an idle engine")
        if self.is_sleeping:
            return
        self.runner.release_kv_cache()
        self.runner.offload_weights()
        self.is_sleeping = True

    def wake_up(self) -> None:
        """The weights back on the device, a new KV cache of the same number of blocks (the prefix cache starts
        empty), CUDA graphs captured again. Outputs are the same as before the sleep (same weights, same seeds)."""
        if not self.is_sleeping:
            return
        self.runner.reload_weights()
        self.runner.allocate_kv_cache(self.kv_plan.num_blocks)
        self.kv.reset()
        if self._use_cuda_graphs:
            self.runner.capture_cuda_graphs(self.args.max_num_seqs, self.max_model_len)
        self.is_sleeping = False

    def device_bytes(self) -> int:
        """Weights + KV cache bytes this engine holds on its device while awake (the fake GPU ledger's figure)."""
        return self.runner.weights_bytes() + self.kv_plan.num_blocks * self.kv_plan.block_size * \
            self.kv_plan.kv_bytes_per_token

    @classmethod
    def from_engine_args(cls, args: EngineArgs, log: Callable[[str], None] | None = None) -> "LLMEngine":
        return cls(args, log)

    def _kv_budget_bytes(self, log) -> int:
        if self.args.device == "cpu":
            return self.args.kv_cache_memory if self.args.kv_cache_memory is not None else DEFAULT_CPU_KV_CACHE_MEMORY
        import torch

        total = torch.cuda.get_device_properties(self.runner.device).total_memory
        weights = self.runner.weights_bytes()
        peak = self.runner.profile_activation_peak(self.args.max_num_batched_tokens)
        graphs = 0
        if self._use_cuda_graphs:
            graphs = self.runner.profile_cuda_graph_bytes(self.args.max_num_seqs, self.max_model_len)
        log(f"memory: total {total} bytes x {self.args.gpu_memory_utilization} - weights {weights} - "
            f"activation peak {peak} - cuda graphs {graphs}")
        return kv_sizing.cuda_budget_bytes(total, self.args.gpu_memory_utilization, weights, peak + graphs)

    # -- requests ---------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request. Raises ValueError for bad params or a duplicate id, RequestRejected when it can never
        be served (C02: prompt_len + 1 > max_model_len, or more blocks than the pool)."""
        params.validate()
        if self.is_sleeping:
            raise RequestRejected("sleeping", "the engine is asleep (POST /wake_up first)")
        if request_id in self.scheduler.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt: must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_token_ids):
            raise ValueError(f"prompt: token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias: token ids must be in [0, {vocab})")
        too_long = context_length_error(n, params.max_tokens, self.max_model_len)
        if too_long is not None:
            raise RequestRejected("context_length_exceeded", too_long[1])
        if params.structured_outputs is not None:
            self.runner.sampler.structured.check(params.structured_outputs)
        pool = self.kv_plan.pool_tokens
        needed = min(n + params.max_tokens, self.max_model_len)
        if needed > pool:
            raise RequestRejected("too_many_blocks", f"the request needs {needed} tokens of KV cache but the pool "
                                  f"holds only {pool} tokens ({self.kv_plan.num_blocks} blocks)")
        self._arrivals += 1
        req = Request(request_id, prompt_token_ids, params, frozenset(self.eos_token_ids), self._arrivals)
        self.scheduler.add_request(req)

    def abort_request(self, request_ids: Iterable[str]) -> None:
        """Finish the requests with reason "abort" and free their blocks now; the next step() reports them."""
        for rid in request_ids:
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            self.scheduler.finish(req, "abort")
            self._pending_outputs.append(self._output(req, [], None))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending_outputs)

    # -- the loop ---------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward pass, sample, update. Returns one output per request that got a token or
        finished (aborted requests included once). A forward or sampling exception is bisected down to the
        requests that raise alone (isolation.py): they finish with "error", the rest of the batch goes on. Raises
        EngineFatalError when the exception poisons the device: the engine must not step again."""
        outputs, self._pending_outputs = self._pending_outputs, []
        self._phase = "schedule"
        sched = self.scheduler.schedule()
        if sched.is_empty:
            self._phase = "idle"
            return outputs
        self._phase = "execute"
        iso = execute_isolating(self.runner.execute, sched.scheduled, self.fatal_markers, self._retries_left())
        self._count_retries(iso.num_retries)
        self._phase = "update"
        result = iso.output
        if iso.failed or iso.deferred or iso.unresolved_by_budget:
            budget_spent = RuntimeError(f"the step raised and the step-retry budget ({self.max_step_retries_per_min} "
                                        f"extra forwards per {STEP_RETRY_WINDOW_S:g} s, --max-step-retries-per-min) "
                                        f"is spent, so its culprit was not isolated; the step's error: "
                                        f"{describe(iso.error) if iso.error else 'unknown'}")
            outputs.extend(self._fail_isolated(sched, iso.failed + [(i, budget_spent)
                                                                    for i in iso.unresolved_by_budget],
                                               iso.deferred))
        for req in self.scheduler.update_from_output(sched, result):
            if req.error is not None:  # nothing new was appended
                outputs.append(self._output(req, [], None))
                continue
            lp = [req.output_logprobs[-1]] if req.params.logprobs is not None else None
            top = [req.output_top_logprobs[-1]] if req.params.logprobs else None
            outputs.append(self._output(req, [req.output_token_ids[-1]], lp, top))
        self._phase = "idle"
        return outputs

    @property
    def step_phase(self) -> str:
        """Where the current step() is: "schedule", the model runner's "prepare_inputs" / "forward" / "sample",
        "update", or "idle" between steps. Plain attribute reads: safe to call from another thread."""
        return self.runner.phase if self._phase == "execute" else self._phase

    def _retries_left(self) -> int:
        """Extra forwards failed steps may still run in the current window (max_step_retries_per_min)."""
        now = time.monotonic()
        while self._retry_times and now - self._retry_times[0] > STEP_RETRY_WINDOW_S:
            self._retry_times.popleft()
        return max(0, self.max_step_retries_per_min - len(self._retry_times))

    def _count_retries(self, n: int) -> None:
        now = time.monotonic()
        self._retry_times.extend([now] * n)
        self.num_step_retries_total += n

    def _fail_isolated(self, sched, failed, deferred=()) -> list[RequestOutput]:
        """End each request whose step raised alone with finish_reason "error" (the exception as its error); send
        each `deferred` one (not run cleanly within the step's retry bound) back to recompute. The blocks they were
        filling in this step are taken out of the prefix cache (their KV may be unwritten), and any other request of
        this step that hit one of them is sent back to recompute (preempted), its sample dropped."""
        bs = self.args.block_size
        outputs, unfilled = [], set()
        for item in [i for i, _ in failed] + list(deferred):
            req = item.request
            blocks = self.kv.req_to_blocks.get(req.request_id, [])
            unfilled.update(id(b) for b in blocks[req.num_computed_tokens // bs:])
            self.kv.uncache(blocks[req.num_computed_tokens // bs:])
        for item, exc in failed:
            req = item.request
            req.error = f"the engine step raised for this request: {describe(exc)}"
            self.scheduler.finish(req, "error")
            outputs.append(self._output(req, [], None))
        for item in deferred:
            if item.request.status == RequestStatus.RUNNING:
                self.scheduler.recompute(item.request)
        for item in sched.scheduled:
            req = item.request
            if req.status == RequestStatus.RUNNING and any(
                    id(b) in unfilled for b in self.kv.req_to_blocks.get(req.request_id, [])):
                self.scheduler.recompute(req)
        return outputs

    @staticmethod
    def _output(req: Request, new_ids: list[int], new_logprobs, new_top=None) -> RequestOutput:
        queued = None if req.first_scheduled_time is None else req.first_scheduled_time - req.arrival_time
        return RequestOutput(req.request_id, new_ids, new_logprobs, req.status == RequestStatus.FINISHED,
                             req.finish_reason, req.num_prompt_tokens, req.num_cached_tokens, req.num_output_tokens,
                             new_top, req.error, queued)

    def stats(self) -> EngineStats:
        """The scheduler's and the KV pool's figures. While asleep the KV pool is released: its blocks (total and
        free) and usage are 0 until wake_up() allocates it again."""
        asleep = self.is_sleeping
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_gpu_blocks=0 if asleep else self.kv.pool.num_blocks,
            num_free_blocks=0 if asleep else self.kv.num_free_blocks,
            kv_cache_usage=0.0 if asleep else self.kv.usage, num_preemptions_total=self.scheduler.num_preemptions_total,
            prefix_cache_queries_total=self.kv.prefix_cache_queries, prefix_cache_hits_total=self.kv.prefix_cache_hits,
            step_retries_total=self.num_step_retries_total)
