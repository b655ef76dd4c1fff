"""A small real OpenAI-compatible streaming server for the bench tests (FastAPI + uvicorn on 127.0.0.1).

Known behaviour: at most ``max_concurrency`` requests generate at once (the rest wait in a FIFO queue, and the
wait counts in their TTFT); a request's first token comes ``ttft_s`` after it is admitted and each further token
``tpot_s`` after the previous one (scheduled on absolute times, so delays do not drift); it streams exactly
``max_tokens`` tokens and reports them in ``usage``. ``pattern`` makes the n-th request (0-based, in arrival
order) answer ``pattern[n % len(pattern)]``: 200, 429, 500, "hang" (headers, then nothing), "drop" (two
tokens, then the connection breaks), "empty" (200, no text, usage with 0 completion tokens, [DONE]) or "nodone"
(a normal answer whose stream ends after the finish_reason chunk and usage, without [DONE], as HF transformers
serve). ``cold_s``: the first request that generates waits that much longer for its first token (a cold server:
kernels compiled and memory allocated on first use). ``strict`` answers 422 naming any field outside the OpenAI API (as pydantic extra="forbid" servers do).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest


OPENAI_FIELDS = {"model", "messages", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p",
                 "stop", "n", "seed"}


@dataclass
class FakeConfig:
    ttft_s: float = 0.1
    tpot_s: float = 0.02
    max_concurrency: int = 4
    pattern: tuple = (200,)
    model: str = "fake-model"
    max_model_len: int | None = None
    strict: bool = False
    cold_s: float = 0.0
    num_arrived: int = 0
    max_in_flight_seen: int = 0
    statuses: list = field(default_factory=list)
    auth_seen: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)
    bodies: list = field(default_factory=list)
    client_ports: list = field(default_factory=list)
    # a GPU memory gauge like the bundled runtime's (fake_gpu_memory_used_bytes{gpu="0"}): base bytes plus this
    # much per request in flight; None: no such gauge
    vram_base: int | None = None
    vram_per_request: int = 0


def _error(status: int, message: str, type_: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 429 else None
    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": None}}, status, headers=headers)


def build_app(cfg: FakeConfig) -> FastAPI:
    app = FastAPI()
    state = {"sem": None, "in_flight": 0}
    registry = CollectorRegistry()  # vLLM-style names under the prefix "fake_"
    ttft_hist = Histogram("fake_time_to_first_token_seconds", "TTFT", buckets=(0.05, 0.1, 0.2, 0.4, 0.8, 1.6),
                          registry=registry)
    e2e_hist = Histogram("fake_e2e_request_latency_seconds", "E2E", buckets=(0.1, 0.2, 0.4, 0.8, 1.6, 3.2),
                         registry=registry)

    if cfg.vram_base is not None:
        Gauge("fake_gpu_memory_used_bytes", "GPU memory in use", ["gpu"], registry=registry).labels(gpu="0") \
            .set_function(lambda: cfg.vram_base + cfg.vram_per_request * state["in_flight"])

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        entry = {"id": cfg.model, "object": "model"}
        if cfg.max_model_len is not None:
            entry["max_model_len"] = cfg.max_model_len
        return {"object": "list", "data": [entry]}

    async def generate(body: dict, chat: bool, arrival: float, done: bool = True, empty: bool = False):
        n = 0 if empty else int(body.get("max_tokens", 16))
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        if state["sem"] is None:
            state["sem"] = asyncio.Semaphore(cfg.max_concurrency)
        async with state["sem"]:
            state["in_flight"] += 1
            cfg.max_in_flight_seen = max(cfg.max_in_flight_seen, state["in_flight"])
            try:
                t0 = time.perf_counter()
                if not state.get("warm"):
                    state["warm"] = True
                    t0 += cfg.cold_s
                if chat:  # a role-only first chunk carries no token: TTFT must not count it
                    yield f"data: {json.dumps({'object': obj, 'created': created, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}}]})}\n\n"
                for i in range(n):
                    await asyncio.sleep(max(0.0, t0 + cfg.ttft_s + i * cfg.tpot_s - time.perf_counter()))
                    choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
                    choice["finish_reason"] = "length" if i == n - 1 else None
                    if i == 0:
                        ttft_hist.observe(time.perf_counter() - arrival)
                    yield f"data: {json.dumps({'object': obj, 'created': created, 'choices': [choice]})}\n\n"
                if n == 0:  # an empty answer still ends with a finish_reason chunk
                    await asyncio.sleep(cfg.ttft_s)
                    choice = {"index": 0, "delta": {"content": ""}} if chat else {"index": 0, "text": ""}
                    yield f"data: {json.dumps({'object': obj, 'created': created, 'choices': [{**choice, 'finish_reason': 'stop'}]})}\n\n"
                prompt = body.get("prompt") or " ".join(m.get("content", "") for m in body.get("messages", []))
                usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n, "total_tokens": len(prompt.split()) + n}
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'object': obj, 'created': created, 'choices': [], 'usage': usage})}\n\n"
                e2e_hist.observe(time.perf_counter() - arrival)
                if done:
                    yield "data: [DONE]\n\n"
            finally:
                state["in_flight"] -= 1

    async def drop():  # two tokens, then the connection breaks mid-stream
        for i in range(2):
            yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': f' t{i}'}, 'text': f' t{i}'}]})}\n\n"
        raise ConnectionResetError("injected: backend died mid-stream")

    async def hang():  # headers, then nothing: cancelled when the client goes away
        await asyncio.sleep(3600)
        yield "data: [DONE]\n\n"

    async def handle(request: Request, chat: bool):
        cfg.auth_seen.append(request.headers.get("authorization"))
        cfg.arrivals.append(time.perf_counter())
        body = await request.json()
        cfg.bodies.append(body)
        cfg.client_ports.append(request.client.port if request.client else None)
        status = cfg.pattern[cfg.num_arrived % len(cfg.pattern)]
        cfg.num_arrived += 1
        cfg.statuses.append(status)
        unknown = sorted(set(body) - OPENAI_FIELDS)
        if cfg.strict and unknown:
            return JSONResponse({"detail": [{"type": "extra_forbidden", "loc": ["body", unknown[0]],
                                             "msg": "Extra inputs are not permitted"}]}, 422)
        if status == "empty":
            return StreamingResponse(generate(body, chat, cfg.arrivals[-1], empty=True), media_type="text/event-stream")
        if status == "nodone":
            return StreamingResponse(generate(body, chat, cfg.arrivals[-1], done=False), media_type="text/event-stream")
        if status == 429:
            return _error(429, "queue full", "rate_limit_exceeded")
        if status == 500:
            return _error(500, "injected failure", "server_error")
        if status == "drop":
            return StreamingResponse(drop(), media_type="text/event-stream")
        if status == "hang":
            return StreamingResponse(hang(), media_type="text/event-stream")
        return StreamingResponse(generate(body, chat, cfg.arrivals[-1]), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, False)

    return app


class FakeServer:
    """Context manager: the app served by uvicorn in a thread; ``url`` is http://127.0.0.1:PORT."""

    def __init__(self, cfg: FakeConfig):
        self.cfg = cfg

    def __enter__(self) -> "FakeServer":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.cfg), log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        self._sock = sock
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
