"""OpenAI response bodies for /v1/completions and /v1/chat/completions, whole and as stream chunks.

Logprobs: each token as text a client can show (UTF-8; a partial character as `\\xNN` escapes, never byte-level
markers like `Ġ`) plus its raw bytes (chat), with the requested number of most likely alternatives per position.
Completions' text_offset indexes into the returned text, whole and streamed alike (`_HeldLogprobs`).
usage.prompt_tokens_details.cached_tokens counts prompt tokens served from the prefix cache. best_of > n: the n
choices of each prompt with the highest cumulative logprob, re-indexed 0..n-1 per prompt (all generated tokens are
counted in usage, as OpenAI bills them). Streaming with tools: a tool call comes as one `tool_calls` delta once
its JSON is complete (finish_reason "tool_calls"); a text answer streams as usual. A forced call cut by max_tokens
(tools.ToolMode.parse_truncated) is `tool_calls` with the arguments so far and finish_reason "length", whole or
streamed; cut before its function was known, the answer has neither content nor tool_calls.
"""
from __future__ import annotations

import codecs
import json
import time
from dataclasses import replace
from typing import Any

from .serving import Choice, Event, Prepared, RequestRecord


def _usage(rec: RequestRecord) -> dict[str, Any]:
    return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": rec.completion_tokens,
            "total_tokens": rec.prompt_tokens + rec.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": rec.cached_tokens}}


def new_offset_state() -> list:
    """[UTF-8 incremental decoder, characters of text so far]: text_offset across a choice's tokens (and chunks)."""
    return [codecs.getincrementaldecoder("utf-8")(errors="replace"), 0]


def _token_spans(tb, ids: list[int], state: list) -> list[tuple[int, int]]:
    """Where each token's text starts and ends in the choice's text, in characters: its bytes are decoded as the
    text was (a token holding part of a character adds nothing until the character completes; special tokens,
    skipped in the text, add nothing), not the length of its displayed `\\xNN` escapes."""
    spans = []
    for t in ids:
        start = state[1]
        if not tb.is_special(t):
            state[1] += len(state[0].decode(tb.bytes(t)))
        spans.append((start, state[1]))
    return spans


def _completion_logprobs(tb, ids: list[int], lps, tops, offsets: list[int]) -> dict[str, Any]:
    top = [{tb.text(t): lp for t, lp in alts} for alts in tops] if tops else None
    return {"tokens": [tb.text(t) for t in ids], "token_logprobs": list(lps[: len(ids)]), "top_logprobs": top,
            "text_offset": offsets}


class _HeldLogprobs:
    """A streamed completion choice's tokens with their logprobs, each sent once the choice's text has reached its
    end, so that text_offset always indexes into the text streamed so far: text held back (a possible stop string,
    a partial character) holds its tokens, and when a stop string cuts it they go out with the finish, their
    offsets at the end of the text, as in the whole response."""

    def __init__(self) -> None:
        self.state = new_offset_state()
        self.pending: list[tuple[int, float, Any, int, int]] = []  # token id, logprob, top, start, end
        self.num_chars_sent = 0

    def take(self, tb, ev: Event) -> tuple[list[int], list[float], list, list[int]]:
        """(token ids, logprobs, top logprobs, text offsets) to send with `ev`'s text."""
        lps, tops = ev.logprobs or [], ev.top_logprobs or []
        for k, (t, (start, end)) in enumerate(zip(ev.token_ids, _token_spans(tb, ev.token_ids, self.state))):
            self.pending.append((t, lps[k] if k < len(lps) else None, tops[k] if k < len(tops) else None, start, end))
        self.num_chars_sent += len(ev.text)
        n = len(self.pending) if ev.finish_reason is not None else next(
            (k for k, p in enumerate(self.pending) if p[4] > self.num_chars_sent), len(self.pending))
        out, self.pending = self.pending[:n], self.pending[n:]
        return ([p[0] for p in out], [p[1] for p in out], [p[2] for p in out],
                [min(p[3], self.num_chars_sent) for p in out])


def _chat_logprobs(tb, ids: list[int], lps, tops) -> dict[str, Any] | None:
    if lps is None:
        return None
    content = []
    for i, (t, lp) in enumerate(zip(ids, lps)):
        alts = tops[i] if tops and i < len(tops) else []
        content.append({"token": tb.text(t), "logprob": lp, "bytes": list(tb.bytes(t)),
                        "top_logprobs": [{"token": tb.text(a), "logprob": alp, "bytes": list(tb.bytes(a))}
                                         for a, alp in alts]})
    return {"content": content}


def best_choices(choices: list[Choice], per_prompt: int, n: int) -> list[tuple[int, Choice]]:
    """(response index, choice): all of them when per_prompt == n, else the n with the highest cumulative logprob
    of each prompt's per_prompt choices (ties keep generation order)."""
    if per_prompt == n:
        return [(c.index, c) for c in choices]
    out = []
    for p in range(0, len(choices), per_prompt):
        group = sorted(choices[p:p + per_prompt], key=lambda c: -sum(c.logprobs))
        out += [(p // per_prompt * n + r, c) for r, c in enumerate(group[:n])]
    return out


class TokenIdNames:
    """vLLM's return_tokens_as_token_ids: a token of the logprobs is named "token_id:<id>" (a name that always
    maps back to its id, where a partial character's text does not); its bytes and offsets stay the token's."""

    def __init__(self, token_bytes):
        self._tb = token_bytes

    def text(self, token_id: int) -> str:
        return f"token_id:{token_id}"

    def bytes(self, token_id: int) -> bytes:
        return self._tb.bytes(token_id)

    def is_special(self, token_id: int) -> bool:
        return self._tb.is_special(token_id)


class ResponseBuilder:
    def __init__(self, prep: Prepared, request_id: str, model: str, token_bytes):
        if prep.request.return_tokens_as_token_ids:
            token_bytes = TokenIdNames(token_bytes)
        self.prep, self.id, self.model, self.tb = prep, request_id, model, token_bytes
        self.created = int(time.time())
        self.want_logprobs = prep.want_logprobs is not None
        self.want_top = bool(prep.want_logprobs)
        self.want_ids = prep.request.return_token_ids
        self._role_sent: set[int] = set()
        self._calls_possible = prep.tools is not None and prep.tools.kind != "none"
        self._held: dict[int, Any] = {}  # choice index -> chat: [text held while it may be a tool call, ...];
        # completions with logprobs: _HeldLogprobs

    def _lp(self, ids, lps, tops, text: str = "", offsets: list[int] | None = None):
        """The logprobs object of these tokens; completions: text_offset `offsets`, or (whole responses) each
        token's start in `text`, at most its length (a stop string cuts the text inside or before the last
        tokens)."""
        if not self.want_logprobs:
            return None
        tops = tops if self.want_top else None
        if self.prep.chat:
            return _chat_logprobs(self.tb, ids, lps or [], tops)
        if offsets is None:
            offsets = [min(start, len(text)) for start, _ in _token_spans(self.tb, ids, new_offset_state())]
        return _completion_logprobs(self.tb, ids, lps or [], tops, offsets)

    # ---- whole responses ----
    def full(self, choices: list[Choice], rec: RequestRecord) -> dict[str, Any]:
        out = []
        for index, ch in best_choices(choices, self.prep.per_prompt, self.prep.request.n):
            lp = self._lp(ch.token_ids, ch.logprobs, ch.top_logprobs, ch.text)
            if self.prep.chat:
                message: dict[str, Any] = {"role": "assistant", "content": ch.text}
                reason = ch.finish_reason
                calls = self.prep.tools.parse(ch.text) if self.prep.tools is not None else None
                if calls:  # finish_reason "length" stays (as streamed): the call came out whole, max_tokens cut it
                    message = {"role": "assistant", "content": None, "tool_calls": calls}
                    reason = "length" if reason == "length" else "tool_calls"
                elif reason == "length" and self.prep.tools is not None:
                    cut = self.prep.tools.parse_truncated(ch.text)  # a forced call cut by max_tokens
                    if cut is not None:  # never its JSON as text; no call when no function was known yet
                        message = {"role": "assistant", "content": None, **({"tool_calls": cut} if cut else {})}
                out.append({"index": index, "message": message, "logprobs": lp, "finish_reason": reason})
            else:
                out.append({"index": index, "text": ch.text, "logprobs": lp, "finish_reason": ch.finish_reason})
            if self.want_ids:
                out[-1]["token_ids"] = list(ch.token_ids)
        obj = "chat.completion" if self.prep.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": out,
                "usage": _usage(rec)}

    # ---- stream chunks ----
    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        obj = "chat.completion.chunk" if self.prep.chat else "text_completion"
        body: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return b"data: " + json.dumps(body, ensure_ascii=False, allow_nan=False).encode() + b"\n\n"

    def chunks(self, events: list[Event], rec: RequestRecord | None = None) -> list[bytes]:
        """Stream chunks for events; with `rec` (stream_options.continuous_usage_stats) each carries the usage
        so far."""
        out = []
        usage = _usage(rec) if rec is not None else None
        for ev in events:
            if self.prep.chat:
                if ev.index not in self._role_sent:
                    self._role_sent.add(ev.index)
                    out.append(self._chunk([{"index": ev.index, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}], usage))
                if self._calls_possible:
                    ev, calls = self._hold_for_tool_calls(ev)
                    if calls is not None:
                        reason = "length" if ev.finish_reason == "length" else "tool_calls"
                        out.append(self._chunk([self._ids({
                            "index": ev.index, "delta": {"tool_calls": calls} if calls else {},
                            "logprobs": self._lp(ev.token_ids, ev.logprobs, ev.top_logprobs),
                            "finish_reason": reason}, ev)], usage))
                        continue
                    if ev is None:
                        continue
                if not ev.text and ev.finish_reason is None and not (
                        (self.want_ids or self.want_logprobs) and ev.token_ids):
                    continue  # held-back text (partial character, stop-string prefix); its ids and logprobs still go
                delta = {"content": ev.text} if ev.text else {}
                out.append(self._chunk([self._ids({"index": ev.index, "delta": delta,
                                                   "logprobs": self._lp(ev.token_ids, ev.logprobs, ev.top_logprobs),
                                                   "finish_reason": ev.finish_reason}, ev)], usage))
            else:
                lp = None
                if self.want_logprobs:  # tokens go out once the text reaches them (_HeldLogprobs)
                    ids, lps, tops, offsets = self._held.setdefault(ev.index, _HeldLogprobs()).take(self.tb, ev)
                    ev = replace(ev, token_ids=ids)
                    lp = self._lp(ids, lps, tops, offsets=offsets)
                if not ev.text and ev.finish_reason is None and not (
                        (self.want_ids or self.want_logprobs) and ev.token_ids):
                    continue
                out.append(self._chunk([self._ids({"index": ev.index, "text": ev.text, "logprobs": lp,
                                                   "finish_reason": ev.finish_reason}, ev)], usage))
        return out

    def _hold_for_tool_calls(self, ev: Event) -> tuple[Event | None, list | None]:
        """Streaming with tools: text that may still become a tool call (it starts with "[") is held; at the end
        it is either the tool_calls delta (returned second, each call whole, with its "index") or streamed as text.
        Text that cannot be a call is streamed as it comes. The held tokens' ids and logprobs go out with what the
        held text becomes (the tool_calls delta, or the text), so a stream carries every token's, as a whole
        response does."""
        held = self._held.setdefault(ev.index, ["", [], [], []])  # text, token ids, logprobs, top logprobs
        if held[0] is None:  # decided: plain text
            return ev, None
        held[0] += ev.text
        held[1] += ev.token_ids
        held[2] += ev.logprobs or []
        held[3] += ev.top_logprobs or []
        text = held[0]
        ev = replace(ev, token_ids=list(held[1]), logprobs=list(held[2]) or None, top_logprobs=list(held[3]) or None)
        if text.lstrip() and not text.lstrip().startswith("["):
            held[0] = None
            return replace(ev, text=text), None
        if ev.finish_reason is None:
            return None, None
        calls = self.prep.tools.parse(text)
        if not calls and ev.finish_reason == "length":
            calls = self.prep.tools.parse_truncated(text)  # a forced call cut: [] before a function was known
        if calls is not None:
            return ev, [{"index": k, **call} for k, call in enumerate(calls)]
        return replace(ev, text=text), None

    def _ids(self, choice: dict[str, Any], ev: Event) -> dict[str, Any]:
        if self.want_ids:
            choice["token_ids"] = list(ev.token_ids)
        return choice

    def usage_chunk(self, rec: RequestRecord) -> bytes:
        return self._chunk([], _usage(rec))

    def start(self) -> list[bytes]:
        """What a stream sends before the first event: nothing (chat and completions)."""
        return []

    def end(self, error, rec: RequestRecord, choices: list[Choice]) -> list[bytes]:
        """A stream's tail: the error (an APIError that ended it) as an event, the usage chunk when asked for, then
        [DONE]."""
        out = [error_event(error.body())] if error is not None else []
        if self.prep.request.include_usage:
            out.append(self.usage_chunk(rec))
        return out + [DONE]


def error_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
