"""One streaming request to an OpenAI-compatible server, timed on the client.

TTFT: from just before the request is sent to the first chunk carrying output text. ITL: the gap between
successive chunks carrying output text (one value per chunk; a chunk may carry several tokens). E2E: from
send to the end of the stream. Token counts come from the server's ``usage`` (requested with
``stream_options.include_usage``), not from the text. Failures never raise: they come back as a result with a
reason (``connect_error``, ``timeout``, ``http_429``, ``http_500``, ``connection_lost``, ``stream_error``,
``bad_response``, ``incomplete_stream``, ...) and, for an HTTP error with an OpenAI error body, its ``code`` (or
``type``) in ``error_code`` and its message in ``detail``.

Lenient where the field's tools are (vllm bench serve): an answer with no text (``data: [DONE]`` after no
content) is a success with 0 output tokens unless usage says otherwise (``empty``); a stream that ends without
``data: [DONE]`` after a chunk carrying ``finish_reason`` is a success (``no_done``), as HF ``transformers serve``
streams end.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx

from deployctl.bench.workload import BenchRequest

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Target:
    """Where and how to send: ``base_url`` without the /v1 suffix, ``route`` chat|completions."""

    base_url: str
    route: str = "chat"
    model: str | None = None
    api_key: str | None = None
    ignore_eos: bool = False

    @property
    def endpoint(self) -> str:
        return self.base_url + ROUTES[self.route]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, req: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_tokens": req.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model is not None:
            body["model"] = self.model
        if self.route == "chat":
            body["messages"] = req.as_messages()
        else:
            body["prompt"] = req.as_prompt()
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


def normalize_base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all become ``http://h:p``."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


@dataclass
class RequestResult:
    """The outcome of one request. Times in seconds (time.perf_counter based); ``start`` is absolute.

    ``error`` is None on success, else the reason; ``output_tokens``/``prompt_tokens`` come from the server's
    usage when ``usage_reported`` is true, else output_tokens is the number of text chunks.
    """

    start: float
    error: str | None = None
    detail: str = ""
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    usage_reported: bool = False
    error_code: str | None = None
    no_done: bool = False
    finish_reason: str | None = None
    schedule_lag: float | None = None
    slot_wait: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def empty(self) -> bool:
        """A success that carried no output text (TTFT and TPOT are not defined for it)."""
        return self.error is None and self.ttft is None


def _chunk_text(obj: dict[str, Any], route: str) -> str:
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    if route == "chat":
        delta = choices[0].get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choices[0].get("text") or ""


async def _sse_data(resp: httpx.Response) -> AsyncIterator[tuple[bytes, float]]:
    """The ``data:`` payloads of an SSE body, each with the perf_counter time its bytes arrived."""
    buf = b""
    async for data in resp.aiter_bytes():
        now = time.perf_counter()
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip(), now
    if buf.startswith(b"data:"):
        yield buf[5:].strip(), time.perf_counter()


async def _stream(client: httpx.AsyncClient, target: Target, req: BenchRequest, res: RequestResult) -> None:
    chunks = 0
    last = None
    done = False
    end = 0.0
    async with client.stream("POST", target.endpoint, json=target.body(req), headers=target.headers()) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            res.error, res.detail = f"http_{resp.status_code}", raw[:300].decode("utf-8", "replace")
            res.error_code, message = error_fields(raw)
            if message:
                res.detail = message[:300]
            return
        async for payload, now in _sse_data(resp):
            if done:
                continue  # read to the end of the body after [DONE]: an unread body costs the keep-alive connection
            if payload == b"[DONE]":
                done, end = True, now
                continue
            try:
                obj = json.loads(payload)
            except (json.JSONDecodeError, UnicodeDecodeError):
                obj = None
            if not isinstance(obj, dict):
                res.error, res.detail = "bad_response", payload[:200].decode("utf-8", "replace")
                return
            if obj.get("error"):
                res.error, res.detail = "stream_error", json.dumps(obj["error"])[:300]
                return
            choices = obj.get("choices") or []
            if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
                res.finish_reason = str(choices[0]["finish_reason"])
            if _chunk_text(obj, target.route):
                chunks += 1
                if last is None:
                    res.ttft = now - res.start
                else:
                    res.itl.append(now - last)
                last = now
            usage = obj.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                res.usage_reported = True
                res.output_tokens = usage["completion_tokens"]
                res.prompt_tokens = usage.get("prompt_tokens")
    res.e2e = (end if done else time.perf_counter()) - res.start
    if not done and res.finish_reason is None:
        res.error, res.detail = "incomplete_stream", "stream ended without data: [DONE]"
        return
    res.no_done = not done
    if not res.usage_reported:
        res.output_tokens = chunks


def error_fields(raw: bytes) -> tuple[str | None, str]:
    """(code or type, message) of an OpenAI error body ``{"error": {...}}`` (FastAPI's ``{"detail": ...}`` too)."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, ""
    if not isinstance(obj, dict):
        return None, ""
    err = obj.get("error")
    if isinstance(err, dict):
        code = err.get("code") or err.get("type")
        return (str(code) if code else None), str(err.get("message") or "")
    if isinstance(err, str):
        return None, err
    if "detail" in obj:  # FastAPI/pydantic validation errors (HF transformers serve answers 422 so)
        return None, json.dumps(obj["detail"])
    return None, ""


async def send(client: httpx.AsyncClient, target: Target, req: BenchRequest, timeout: float) -> RequestResult:
    """Send ``req`` and time it; the whole request is bounded by ``timeout`` seconds. Never raises for
    network or server failures (cancellation still propagates)."""
    res = RequestResult(start=time.perf_counter())
    try:
        await asyncio.wait_for(_stream(client, target, req, res), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        res.error, res.detail = "timeout", f"no complete response within {timeout:g} s"
    except httpx.ConnectError as err:
        res.error, res.detail = "connect_error", str(err) or type(err).__name__
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as err:
        res.error, res.detail = "connection_lost", str(err) or type(err).__name__
    except httpx.HTTPError as err:
        res.error, res.detail = f"http_error:{type(err).__name__}", str(err)
    except OSError as err:
        res.error, res.detail = f"os_error:{type(err).__name__}", str(err)
    if res.error is not None:
        res.e2e = time.perf_counter() - res.start
    return res


def make_client(max_connections: int, timeout: float) -> httpx.AsyncClient:
    """An AsyncClient whose pool never queues requests below ``max_connections`` in flight."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout), trust_env=False)
