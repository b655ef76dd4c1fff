"""The load generator's own cost, measured against a trivial streaming server (deployctl.bench.trivial_server,
started as a local child process on 127.0.0.1) that answers at once: what is left is HTTP over loopback, SSE
parsing and asyncio scheduling in the generator.

Two runs with the same client code as the ladder: at concurrency 1, the latency the generator adds to each
request (``unloaded_*``: TTFT and ITL against a server that takes no time); at the ladder's top concurrency,
its capacity (``capacity_chunks_per_s``: the most text chunks per second it takes in; ``per_chunk_ms`` its
inverse, the CPU cost of one chunk). A level whose token rate nears that capacity is limited by the generator.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from deployctl.bench.client import RequestResult, Target, make_client, send
from deployctl.bench.stats import percentile
from deployctl.bench.workload import BenchRequest
from deployctl.errors import CheckFailed


@dataclass(frozen=True)
class Overhead:
    """The generator's own numbers: latencies in ms, capacities per second."""

    concurrency: int
    tokens_per_request: int
    unloaded_ttft_p50_ms: float
    unloaded_ttft_p99_ms: float
    unloaded_itl_p50_ms: float
    unloaded_itl_p99_ms: float
    capacity_requests_per_s: float
    capacity_chunks_per_s: float
    per_chunk_ms: float
    num_errors: int

    def to_json(self) -> dict:
        return asdict(self)


class TrivialServer:
    """Context manager: the trivial server as a child process; ``url`` once entered."""

    def __enter__(self) -> "TrivialServer":
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "deployctl.bench.trivial_server"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        port = self._proc.stdout.readline().strip() if self._proc.stdout else ""
        if not port.isdigit():
            self.__exit__()
            raise CheckFailed("the bench's trivial local server did not start", fix="run with --no-loadgen-check")
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)


async def _burst(url: str, concurrency: int, num: int, tokens: int) -> tuple[list[RequestResult], float]:
    target = Target(base_url=url, route="chat", model="trivial")
    req = BenchRequest(prompt="x", messages=None, max_tokens=tokens)
    slots = asyncio.Semaphore(concurrency)
    async with make_client(concurrency + 4, 30.0) as client:

        async def one() -> RequestResult:
            async with slots:
                return await send(client, target, req, 30.0)

        await asyncio.gather(*(one() for _ in range(min(concurrency, num))))  # open the connections first
        start = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(num)))
        return list(results), time.perf_counter() - start


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1e3, 3) if values else float("nan")


def measure_overhead(concurrency: int, tokens: int = 16) -> Overhead:
    """Measure at concurrency 1 (32 requests) and at ``concurrency`` (max(32, 4 x concurrency) requests),
    ``tokens`` chunks per request. Raises CheckFailed when the trivial server cannot start."""
    with TrivialServer() as srv:
        unloaded, _ = asyncio.run(_burst(srv.url, 1, 32, tokens))
        loaded, wall = asyncio.run(_burst(srv.url, concurrency, max(32, 4 * concurrency), tokens))
    ok1 = [r for r in unloaded if r.ok]
    ok = [r for r in loaded if r.ok]
    chunks_per_s = sum(len(r.itl) + 1 for r in ok) / wall
    return Overhead(
        concurrency=concurrency,
        tokens_per_request=tokens,
        unloaded_ttft_p50_ms=_ms([r.ttft for r in ok1 if r.ttft is not None], 0.5),
        unloaded_ttft_p99_ms=_ms([r.ttft for r in ok1 if r.ttft is not None], 0.99),
        unloaded_itl_p50_ms=_ms([x for r in ok1 for x in r.itl], 0.5),
        unloaded_itl_p99_ms=_ms([x for r in ok1 for x in r.itl], 0.99),
        capacity_requests_per_s=round(len(ok) / wall, 1),
        capacity_chunks_per_s=round(chunks_per_s, 1),
        per_chunk_ms=round(1e3 / chunks_per_s, 4) if chunks_per_s else float("nan"),
        num_errors=len(unloaded) - len(ok1) + len(loaded) - len(ok),
    )
