"""OpenAI response bodies for /v1/completions and /v1/chat/completions, whole and as stream chunks."""
from __future__ import annotations

import json
import time
from typing import Any

from .serving import Choice, Event, Prepared, RequestRecord


def _usage(rec: RequestRecord) -> dict[str, int]:
    return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": rec.completion_tokens,
            "total_tokens": rec.prompt_tokens + rec.completion_tokens}


def _token_str(tokenizer, tid: int) -> str:
    return tokenizer.decode([tid], skip_special_tokens=False)


def _completion_logprobs(tokenizer, ids: list[int], lps: list[float] | None, offset: int) -> dict[str, Any] | None:
    if lps is None:
        return None
    tokens = [_token_str(tokenizer, t) for t in ids]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": list(lps[: len(ids)]), "top_logprobs": None, "text_offset": offsets}


def _chat_logprobs(tokenizer, ids: list[int], lps: list[float] | None) -> dict[str, Any] | None:
    if lps is None:
        return None
    content = []
    for t, lp in zip(ids, lps):
        s = _token_str(tokenizer, t)
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []})
    return {"content": content}


class ResponseBuilder:
    def __init__(self, prep: Prepared, request_id: str, model: str, tokenizer):
        self.prep, self.id, self.model, self.tok = prep, request_id, model, tokenizer
        self.created = int(time.time())
        self.want_logprobs = prep.params[0].logprobs is not None
        self.want_ids = prep.request.return_token_ids
        self._role_sent: set[int] = set()
        self._text_len: dict[int, int] = {}

    # ---- whole responses ----
    def full(self, choices: list[Choice], rec: RequestRecord) -> dict[str, Any]:
        out = []
        for ch in choices:
            lps = ch.logprobs if self.want_logprobs else None
            if self.prep.chat:
                out.append({"index": ch.index, "message": {"role": "assistant", "content": ch.text},
                            "logprobs": _chat_logprobs(self.tok, ch.token_ids, lps),
                            "finish_reason": ch.finish_reason})
            else:
                out.append({"index": ch.index, "text": ch.text,
                            "logprobs": _completion_logprobs(self.tok, ch.token_ids, lps, 0),
                            "finish_reason": ch.finish_reason})
            if self.want_ids:
                out[-1]["token_ids"] = list(ch.token_ids)
        obj = "chat.completion" if self.prep.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": out,
                "usage": _usage(rec)}

    # ---- stream chunks ----
    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        obj = "chat.completion.chunk" if self.prep.chat else "text_completion"
        body: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    def chunks(self, events: list[Event]) -> list[bytes]:
        out = []
        for ev in events:
            lps = ev.logprobs if self.want_logprobs else None
            if self.prep.chat:
                if ev.index not in self._role_sent:
                    self._role_sent.add(ev.index)
                    out.append(self._chunk([{"index": ev.index, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]))
                if not ev.text and ev.finish_reason is None:
                    continue
                delta = {"content": ev.text} if ev.text else {}
                out.append(self._chunk([self._ids({"index": ev.index, "delta": delta,
                                                   "logprobs": _chat_logprobs(self.tok, ev.token_ids, lps),
                                                   "finish_reason": ev.finish_reason}, ev)]))
            else:
                if not ev.text and ev.finish_reason is None and not (self.want_ids and ev.token_ids):
                    continue
                start = self._text_len.get(ev.index, 0)
                self._text_len[ev.index] = start + len(ev.text)
                out.append(self._chunk([self._ids({"index": ev.index, "text": ev.text,
                                                   "logprobs": _completion_logprobs(self.tok, ev.token_ids, lps, start),
                                                   "finish_reason": ev.finish_reason}, ev)]))
        return out

    def _ids(self, choice: dict[str, Any], ev: Event) -> dict[str, Any]:
        if self.want_ids:
            choice["token_ids"] = list(ev.token_ids)
        return choice

    def usage_chunk(self, rec: RequestRecord) -> bytes:
        return self._chunk([], _usage(rec))


def error_event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
