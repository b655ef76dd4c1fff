"""One request to an OpenAI-compatible server for the functional layer: the whole answer, streamed or not.

Sync httpx (the functional layer sends one request at a time). A streamed answer is the concatenated text of its
SSE chunks, its last ``finish_reason``, the ``usage`` chunk (``stream_options.include_usage``) and the token ids
the chunks carry (``return_token_ids``, vLLM's extension). Never raises for HTTP or network failures: ``Reply``
carries the status (0: no HTTP answer) and the reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx

from deployctl.bench.client import error_fields

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Endpoint:
    """``base_url`` without /v1; ``max_model_len`` from GET /v1/models."""

    base_url: str
    model: Optional[str] = None
    max_model_len: Optional[int] = None
    api_key: Optional[str] = None
    # optional fields this server refuses (validate.accepts.refused_fields: field -> why), left out of every body
    refused: tuple[tuple[str, str], ...] = ()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class Reply:
    """``status`` 200 with the answer, another HTTP status with ``error_code``/``error`` from the OpenAI error
    body, or 0 with ``error`` (network). ``stream_error``: an error object inside a 200 stream."""

    status: int
    text: str = ""
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    token_ids: Optional[list[int]] = None
    error: str = ""
    error_code: Optional[str] = None
    stream_error: str = ""
    no_done: bool = False  # a 200 stream that ended without ``data: [DONE]`` (OpenAI's end marker)
    chunks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _error_fields(raw: bytes) -> tuple[Optional[str], str]:
    """bench's reading of an error body (deployctl.bench.client.error_fields), with the body's start when it is not
    JSON at all; the message cut at 300 characters."""
    code, msg = error_fields(raw)
    if code is None and not msg:
        try:
            json.loads(raw)
        except ValueError:
            return None, raw[:200].decode("utf-8", "replace")
    return code, msg[:300]


def _choice_text(ch: dict, route: str, stream: bool) -> str:
    if route == "chat":
        part = ch.get("delta" if stream else "message") or {}
        return part.get("content") or ""
    return ch.get("text") or ""


def _take(reply: Reply, obj: dict, route: str, stream: bool) -> None:
    choices = obj.get("choices") or []
    if choices and isinstance(choices[0], dict):
        ch = choices[0]
        reply.text += _choice_text(ch, route, stream)
        if ch.get("finish_reason"):
            reply.finish_reason = str(ch["finish_reason"])
        ids = ch.get("token_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            reply.token_ids = (reply.token_ids or []) + ids
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            reply.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            reply.completion_tokens = usage["completion_tokens"]


def post(client: httpx.Client, ep: Endpoint, route: str, body: dict[str, Any], stream: bool) -> Reply:
    """POST ``body`` (the model, ``stream`` and for streams ``stream_options`` are added) to the route."""
    body = {**{k: v for k, v in body.items() if k not in dict(ep.refused)}, "stream": stream}
    if ep.model:
        body.setdefault("model", ep.model)
    if stream:
        body["stream_options"] = {"include_usage": True}
    url = ep.base_url + ROUTES[route]
    try:
        if not stream:
            r = client.post(url, json=body, headers=ep.headers())
            if r.status_code != 200:
                code, msg = _error_fields(r.content)
                return Reply(r.status_code, error=msg, error_code=code)
            reply = Reply(200)
            _take(reply, r.json(), route, False)
            return reply
        with client.stream("POST", url, json=body, headers=ep.headers()) as r:
            if r.status_code != 200:
                code, msg = _error_fields(r.read())
                return Reply(r.status_code, error=msg, error_code=code)
            reply, done = Reply(200), False
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                obj = json.loads(data)
                if isinstance(obj, dict) and obj.get("error"):
                    reply.stream_error = json.dumps(obj["error"])[:300]
                    continue
                reply.chunks += 1
                _take(reply, obj, route, True)
            if not done:
                reply.no_done = True
                if reply.finish_reason is None:  # cut: neither a finish_reason nor the end marker came
                    reply.stream_error = reply.stream_error or "the stream ended without data: [DONE]"
            return reply
    except httpx.HTTPError as exc:
        return Reply(0, error=f"{type(exc).__name__}: {exc}"[:300])
    except ValueError as exc:
        return Reply(0, error=f"not a JSON answer: {exc}"[:300])


def detokenize(client: httpx.Client, ep: Endpoint, ids: list[int]) -> Optional[str]:
    """The text of ``ids`` decoded at once (POST /detokenize, vLLM's shape), or None when the server has no such
    route or cannot."""
    try:
        r = client.post(ep.base_url + "/detokenize", json={"model": ep.model, "tokens": ids}, headers=ep.headers())
        text = r.json().get("prompt") if r.status_code == 200 else None
        return text if isinstance(text, str) else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
