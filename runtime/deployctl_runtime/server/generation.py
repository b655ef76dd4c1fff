"""Drive one HTTP request's engine requests and yield text events (see serving.py for the rules)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from .async_engine import EngineDead
from .detokenizer import IncrementalDetokenizer
from .errors import APIError, unavailable
from .serving import Choice, Event, Prepared, RequestRecord
from .state import RETRY_AFTER_DRAINING_S, ServerContext
from .stop_strings import StopStringMatcher

log = logging.getLogger("deployctl_runtime.server")
CUT_OFF = object()  # put on a Generation's queue to end it now with finish_reason "abort" (drain timeout)


class Generation:
    """Adds `prep`'s engine requests and yields lists of Events as outputs arrive.

    On exit for any reason (finished, stop string, timeout, cancellation when the client disconnects) the engine
    requests still running are aborted, which frees their blocks before the engine's next step.
    """

    def __init__(self, ctx: ServerContext, prep: Prepared, rec: RequestRecord):
        self.ctx, self.prep, self.rec = ctx, prep, rec
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices = [
            Choice(k, IncrementalDetokenizer(ctx.tokenizer, ids, skip_special_tokens=sp.skip_special_tokens),
                   StopStringMatcher(sp.stop, sp.include_stop_str_in_output))
            for k, (ids, sp) in enumerate(zip(prep.prompts, prep.params))
        ]
        self._params = dict(zip(prep.sub_ids, prep.params))
        self._by_id = dict(zip(prep.sub_ids, self.choices))
        self._open = set(prep.sub_ids)
        self._seen_first_output = False
        self._cached: dict[int, int] = {}
        self.timed_out = False
        self.engine_error: str | None = None
        self.engine_error_code: str | None = None  # "engine_stalled": the watchdog ended it (503, not 500)
        self.aborted_by_client = False
        self.cut_before_start = False  # the drain ended before any token of it: 503 draining (retryable)

    async def start(self) -> None:
        """Add the engine requests; raises APIError 400 when the engine can never serve them (RequestRejected)."""
        ctx = self.ctx
        n = len(self.prep.sub_ids)
        ctx.admit(n)
        ctx.inflight_seqs += n
        ctx.generations.add(self)
        try:
            await ctx.engine.add(self.prep.sub_ids, self.prep.prompts, self.prep.params, self.queue)
        except asyncio.CancelledError:
            ctx.engine.abort(self.prep.sub_ids)
            self._release(self._open)
            raise
        except Exception as exc:
            self._release(self._open)
            param = "messages" if self.prep.chat else "prompt"
            reason = getattr(exc, "reason", None)
            if reason == "sleeping":  # raced a POST /sleep: the engine refuses while asleep
                from .errors import unavailable

                ctx.metrics.request_rejected.labels(reason="sleeping").inc()
                raise unavailable(getattr(exc, "message", str(exc)), 5, code="sleeping") from None
            if reason is not None:  # RequestRejected: this request can never be served (e.g. too_many_blocks)
                ctx.metrics.request_rejected.labels(reason=reason).inc()
                raise APIError(400, getattr(exc, "message", str(exc)), "invalid_request_error", param,
                               reason) from None
            if ctx.engine.error is not None:  # the engine died (or was found stalled) meanwhile
                raise APIError(503, f"the server cannot serve: {ctx.engine.error}", "service_unavailable", None,
                               ctx.engine.error_code or "engine_dead") from None
            if isinstance(exc, ValueError):  # the engine's own validation: "<field>: <why>"
                field_name = str(exc).split(":", 1)[0]
                raise APIError(400, str(exc), "invalid_request_error",
                               field_name if field_name.isidentifier() else param, "invalid_value") from None
            raise
        self.rec.prompt_tokens = sum(len(p) for p in self.prep.prompts[:: self.prep.per_prompt])
        ctx.metrics.prompt_tokens.inc(self.rec.prompt_tokens)

    def _release(self, ids) -> None:
        ids = [i for i in ids if i in self._open]
        self._open.difference_update(ids)
        self.ctx.inflight_seqs -= len(ids)
        if not self._open:
            self.ctx.generations.discard(self)

    async def events(self) -> AsyncIterator[list[Event]]:
        deadline = self.rec.arrival + self.ctx.cfg.request_timeout_s
        try:
            while self._open:
                timeout = deadline - time.monotonic()
                try:
                    if timeout <= 0:
                        raise asyncio.TimeoutError
                    item = await asyncio.wait_for(self.queue.get(), timeout)
                except asyncio.TimeoutError:
                    self.timed_out = True
                    yield self._end_open("error")
                    return
                batch = [item]
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                events = self._apply(batch)
                if events:
                    yield events
        except (asyncio.CancelledError, GeneratorExit):
            if self._open:
                self.aborted_by_client = True
                log.info("request %s: client disconnected; aborting %d engine request(s)", self.rec.request_id,
                         len(self._open))
                self._end_open("abort")
            raise
        finally:
            if self._open:  # consumer stopped early for another reason
                self._end_open("abort")

    def _end_open(self, reason: str, counted: bool = True) -> list[Event]:
        ids = sorted(self._open)
        self.ctx.engine.abort(ids)
        events = []
        for rid in ids:
            ch = self._by_id[rid]
            delta = ""
            if reason != "abort" and ch.error is None:
                try:
                    delta = ch.feed([], finished=True)
                except Exception:  # noqa: BLE001 - the flush of a broken detokenizer: end without the rest
                    log.exception("request %s: flushing the detokenizer failed", self.rec.request_id)
            if counted:
                self._finish(ch, reason)
            else:
                ch.finish_reason = reason
            events.append(Event(ch.index, delta, reason, [], None))
        self._release(ids)
        return events

    def _finish(self, ch: Choice, reason: str) -> None:
        ch.finish_reason = reason
        self.rec.finish_reasons.append(reason)
        m = self.ctx.metrics
        m.request_success.labels(finish_reason=reason).inc()
        if ch.first_token_at is not None and ch.num_output_tokens > 1 and ch.last_token_at is not None:
            m.tpot.observe((ch.last_token_at - ch.first_token_at) / (ch.num_output_tokens - 1))

    def _apply(self, batch) -> list[Event]:
        now = time.monotonic()
        m = self.ctx.metrics
        events: list[Event] = []
        for out in batch:
            if out is CUT_OFF:
                if self.rec.first_token_at is None and not events:  # nothing of it was generated or sent
                    self.cut_before_start = True
                    log.info("request %s: not started when the drain ended; answered 503 draining",
                             self.rec.request_id)
                    self._end_open("abort", counted=False)
                    self.ctx.metrics.request_rejected.labels(reason="draining").inc()
                    return []
                log.info("request %s: cut off at the drain timeout", self.rec.request_id)
                events.extend(self._end_open("abort"))
                break
            if isinstance(out, EngineDead):
                self.engine_error, self.engine_error_code = out.message, out.code
                events.extend(self._end_open("error"))
                break
            ch = self._by_id.get(out.request_id)
            if ch is None or out.request_id not in self._open:
                continue
            if not self._seen_first_output and out.queue_time_s is not None:
                self._seen_first_output = True  # vLLM's queue time: engine arrival to first scheduling
                m.queue_time.observe(out.queue_time_s)
            new = self.ctx.faults.rewrite_tokens(list(out.new_token_ids))
            if new:
                if self.rec.first_token_at is None:
                    self.rec.first_token_at = now
                    m.ttft.observe(now - self.rec.arrival)
                if ch.first_token_at is None:
                    ch.first_token_at = now
                elif ch.last_token_at is not None:
                    m.itl.observe(now - ch.last_token_at)
                ch.last_token_at = now
                m.generation_tokens.inc(len(new))
                self.rec.completion_tokens += len(new)
            ch.num_output_tokens = out.num_output_tokens
            ch.token_ids.extend(new)
            if out.new_logprobs:
                ch.logprobs.extend(out.new_logprobs)
            if out.new_top_logprobs:
                ch.top_logprobs.extend(out.new_top_logprobs)
            if ch.index % self.prep.per_prompt == 0:  # the prompt's cached tokens, counted once per prompt
                self.rec.cached_tokens += out.num_cached_tokens - self._cached.get(ch.index, 0)
                self._cached[ch.index] = out.num_cached_tokens
            if out.finished and out.finish_reason == "error" and out.error:
                ch.error = out.error
                if self.engine_error is None:
                    self.engine_error = out.error
                    log.error("request %s: %s; the request ends with an error (finish_reason error)",
                              self.rec.request_id, out.error)
            shown = new
            if (out.finished and out.finish_reason == "stop" and new
                    and not self._params[out.request_id].include_stop_str_in_output):
                shown = new[:-1]  # the stop token (eos, stop_token_ids) is not text, as in vLLM
            try:
                delta = ch.feed(shown, out.finished)
            except Exception as exc:  # noqa: BLE001 - detokenizing or a stop string raised: this request alone
                log.exception("request %s: detokenizing failed", self.rec.request_id)
                ch.error = f"detokenizing the output raised: {type(exc).__name__}: {exc}"
                self.ctx.engine.report_isolated(ch.error)  # counted as the engine's own (metric, window rule)
                self.engine_error = self.engine_error or ch.error
                events.extend(self._end_open("error"))
                break
            if self.ctx.faults.garble_text and delta:  # test-only fault: streamed and whole text alike
                garbled = self.ctx.faults.rewrite_text(delta)
                ch.text, delta = ch.text[: len(ch.text) - len(delta)] + garbled, garbled
            reason = None
            if ch.stops.stopped:
                reason = "stop"
                if not out.finished:
                    self.ctx.engine.abort([out.request_id])
            elif out.finished:
                reason = out.finish_reason or "stop"
            if reason is not None:
                self._finish(ch, reason)
                self._release([out.request_id])
            if delta or reason is not None or new:
                events.append(Event(ch.index, delta, reason, new, list(out.new_logprobs or []) or None,
                                    list(out.new_top_logprobs or []) or None))
        return events

    def result(self) -> None:
        """Raise for the non-streaming response when the request could not complete normally (a stream sends the
        same error as its last event). Not started when the drain ended: 503 `draining` with Retry-After, so the
        router or the client sends it to another replica (it was never generated, so retrying is safe)."""
        if self.cut_before_start:
            raise unavailable("the server drained for shutdown before this request started; send it to another "
                              "replica", RETRY_AFTER_DRAINING_S, code="draining")
        if self.engine_error_code == "engine_stalled":  # the server's state, not this request's fault
            raise APIError(503, self.engine_error, "service_unavailable", None, "engine_stalled")
        if self.engine_error:
            code = "non_finite_logits" if "non-finite" in self.engine_error else "engine_error"
            raise APIError(500, f"generation failed: {self.engine_error}", "internal_error", None, code)
        if self.timed_out:
            raise APIError(504, f"the request did not finish within --request-timeout-s "
                           f"{self.ctx.cfg.request_timeout_s:g}; its generation was stopped", "timeout_error", None,
                           "request_timeout")
