"""Continuous batching: waiting and running queues, a token budget per step, chunked prefill, prefix-cache hits,
preemption by recompute. No torch: deals in requests, token counts and block ids."""
from __future__ import annotations

import time
from collections import deque

from deployctl_runtime.kv_cache_manager import KVCacheManager
from deployctl_runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput  # noqa: F401 (re-export)
from deployctl_runtime.request import Request, RequestStatus


class Scheduler:
    """Decides, each step, which requests compute how many tokens.

    Running requests first (in admission order), then waiting ones (FIFO) while the token budget, max_num_seqs and
    free blocks allow. When a running request cannot get a block, the newest running request is preempted: its blocks
    are freed and it goes back to the head of the waiting queue with num_computed_tokens = 0 (recompute).
    """

    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 enable_chunked_prefill: bool = True):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions_total = 0

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[str] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while True:
                if self.kv.allocate_slots(req, num_new) is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted_ids.append(victim.request_id)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                break
            out.scheduled.append(ScheduledRequest(req, num_new, self.kv.get_block_ids(req.request_id)))
            scheduled_ids.add(req.request_id)
            budget -= num_new
            i += 1

        if not out.preempted_ids:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                hits, num_hit_tokens = ([], 0)
                if req.num_computed_tokens == 0:
                    hits, num_hit_tokens = self.kv.get_computed_blocks(req)
                num_new = req.num_tokens - req.num_computed_tokens - num_hit_tokens
                if num_new > budget:
                    if not self.enable_chunked_prefill:
                        break
                    num_new = budget
                if self.kv.allocate_slots(req, num_new, hits) is None:
                    break
                self.waiting.popleft()
                if req.num_computed_tokens == 0:
                    self.kv.record_prefix_query(req.num_tokens, num_hit_tokens)
                if req.num_preemptions == 0 and req.num_computed_tokens == 0:
                    req.num_cached_tokens = num_hit_tokens
                req.num_computed_tokens += num_hit_tokens
                req.status = RequestStatus.RUNNING
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = time.monotonic()
                self.running.append(req)
                out.scheduled.append(ScheduledRequest(req, num_new, self.kv.get_block_ids(req.request_id)))
                budget -= num_new
        out.num_batched_tokens = self.max_num_batched_tokens - budget
        return out

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(req)

    def recompute(self, req: Request) -> None:
        """Send a running request back to the head of the waiting queue with its blocks freed (a preemption)."""
        self.running.remove(req)
        self._preempt(req)

    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Advance num_computed_tokens, append sampled tokens, finish requests that stop. Returns the requests that
        got a token or finished in this step."""
        progressed = []
        for item in sched.scheduled:
            req = item.request
            if req.status != RequestStatus.RUNNING:  # aborted between schedule and update
                continue
            req.num_computed_tokens += item.num_scheduled_tokens
            sampled = result.sampled.get(req.request_id)
            if sampled is None:
                continue
            if sampled.error is not None:  # e.g. non-finite logits: this request ends, the batch goes on
                req.error = sampled.error
                self.finish(req, "error")
                progressed.append(req)
                continue
            try:
                req.append_output(sampled.token_id, sampled.logprob, sampled.top_logprobs)
                reason = req.check_stop(self.max_model_len)
            except Exception as exc:  # noqa: BLE001 - a stop check that raises fails this request alone
                req.error, reason = f"the stop check raised for this request: {type(exc).__name__}: {exc}", "error"
            if reason is not None:
                self.finish(req, reason)
            progressed.append(req)
        return progressed

    def finish(self, req: Request, reason: str) -> None:
        """End a request (stop, length, abort, error) and free its blocks at once."""
        if req.status == RequestStatus.FINISHED:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.requests.pop(req.request_id, None)
