"""The load generator's own cost: run the same client against a trivial in-process streaming server that
answers at once, and measure what is left (HTTP over loopback, SSE parsing, asyncio scheduling).

The server is a raw asyncio HTTP/1.1 server on 127.0.0.1 (keep-alive, chunked SSE) on its own thread and event
loop, so the numbers are an upper bound on what the generator adds to TTFT and ITL at that concurrency, and
``chunks_per_s`` is the most text chunks per second it can take in.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import asdict, dataclass

from deployctl.bench.client import Target, make_client, send
from deployctl.bench.stats import percentile
from deployctl.bench.workload import BenchRequest

_CHUNK = json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}, "text": "x"}]})


def _http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            n = int(body.get("max_tokens", 16))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(n):
                writer.write(_http_chunk(f"data: {_CHUNK}\n\n".encode()))
                await writer.drain()
                await asyncio.sleep(0)
            usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
            writer.write(_http_chunk(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


class TrivialServer:
    """Context manager: a streaming server on 127.0.0.1:<free port> in a daemon thread; ``url`` when entered."""

    def __enter__(self) -> "TrivialServer":
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(_handle, "127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
            ready.set()
            self._loop.run_forever()
            self._server.close()
            self._loop.run_until_complete(self._server.wait_closed())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="bench-trivial-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@dataclass(frozen=True)
class Overhead:
    """What the generator adds (ms) at ``concurrency`` in flight, and its capacity (per second)."""

    concurrency: int
    num_requests: int
    tokens_per_request: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    requests_per_s: float
    chunks_per_s: float
    num_errors: int

    def to_json(self) -> dict:
        return asdict(self)


async def _measure(concurrency: int, num_requests: int, tokens: int) -> Overhead:
    with TrivialServer() as srv:
        target = Target(base_url=srv.url, route="chat", model="trivial")
        req = BenchRequest(prompt="x", messages=None, max_tokens=tokens)
        slots = asyncio.Semaphore(concurrency)
        async with make_client(concurrency + 4, 30.0) as client:

            async def one():
                async with slots:
                    return await send(client, target, req, 30.0)

            await asyncio.gather(*(one() for _ in range(min(concurrency, num_requests))))  # warm connections
            start = time.perf_counter()
            results = await asyncio.gather(*(one() for _ in range(num_requests)))
            wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [x for r in ok for x in r.itl]
    ms = lambda v: round(v * 1e3, 3) if v == v else float("nan")  # noqa: E731
    return Overhead(
        concurrency=concurrency,
        num_requests=num_requests,
        tokens_per_request=tokens,
        ttft_p50_ms=ms(percentile(ttfts, 0.5)),
        ttft_p99_ms=ms(percentile(ttfts, 0.99)),
        itl_p50_ms=ms(percentile(itls, 0.5)),
        itl_p99_ms=ms(percentile(itls, 0.99)),
        requests_per_s=round(len(ok) / wall, 1),
        chunks_per_s=round(sum(len(r.itl) + 1 for r in ok) / wall, 1),
        num_errors=len(results) - len(ok),
    )


def measure_overhead(concurrency: int, num_requests: int | None = None, tokens: int = 16) -> Overhead:
    """Run ``num_requests`` (default 4 x concurrency, at least 32) requests of ``tokens`` chunks each against
    the trivial server at ``concurrency`` in flight."""
    n = num_requests if num_requests is not None else max(32, 4 * concurrency)
    return asyncio.run(_measure(concurrency, n, tokens))
