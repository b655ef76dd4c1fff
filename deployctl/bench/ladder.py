"""The concurrency ladder: for each level, keep ``concurrency`` requests in flight (closed loop) until the
level's request count is sent, or send them as Poisson arrivals at ``rate`` requests/s capped at
``concurrency`` in flight (as vLLM's benchmark_serving with --request-rate and --max-concurrency).

Each level is bounded by its request count and, optionally, ``max_level_s`` (no new request after that) and each
request by ``timeout``. Failures are counted per reason, never raised.
"""
from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import httpx

from deployctl.bench import server_metrics
from deployctl.bench.fromlog import arrival_times
from deployctl.bench.client import RequestResult, Target, make_client, send
from deployctl.bench.stats import LevelStats, Objectives, level_stats
from deployctl.bench.workload import BenchRequest
from deployctl.engines import adapter

RUNTIME_PREFIX = adapter("deployctl-runtime").metrics.prefix  # the bundled runtime's metric prefix


# Distinct requests built up front; a longer level cycles through them (10**9 requests must not build 10**9 prompts).
POOL_MAX = 4096


@dataclass(frozen=True)
class LadderConfig:
    """How to run the ladder. ``requests_per_level`` is raised to the level's concurrency when lower
    (every slot gets a request); times in seconds; ``rate`` in requests/s (None: closed loop); with
    ``arrival_gaps`` (a log's inter-arrival gaps, s) the open loop resamples those gaps, scaled to ``rate``,
    instead of Poisson gaps; with ``metrics_url``, /metrics is also scraped every ``vram_every_s`` during a level
    for the GPU memory peak (server_metrics.VramSampler). ``warmup``: requests sent one at a time before level 1
    and counted in no level (``warm_up``), so that a cold server's first request (kernels compiled, memory
    allocated: 6.9 s on transformers serve here) does not set level 1's P99 and with it the knee's limits."""

    target: Target
    concurrencies: tuple[int, ...] = (1, 4, 8, 16, 32)
    requests_per_level: int = 64
    timeout: float = 60.0
    rate: float | None = None
    seed: int = 0
    max_level_s: float | None = None
    objectives: Objectives = field(default_factory=Objectives)
    metrics_url: str | None = None
    metrics_prefix: str = RUNTIME_PREFIX
    arrival_gaps: tuple[float, ...] | None = None
    vram_every_s: float = server_metrics.VRAM_EVERY_S
    warmup: int = 0

    def level_requests(self, concurrency: int) -> int:
        return max(self.requests_per_level, concurrency)


@dataclass(frozen=True)
class Progress:
    """A progress event: ``done``/``ok``/``errors`` of ``total`` at level ``index`` (0-based) of
    ``num_levels`` on ``side`` (0-based, side by side runs); ``stats`` is set once the level has finished."""

    index: int
    num_levels: int
    concurrency: int
    total: int
    done: int
    ok: int
    errors: int
    stats: LevelStats | None = None
    side: int = 0


ProgressFn = Callable[[Progress], None]


def poisson_arrivals(rate: float, num: int, seed: int) -> list[float]:
    """Send times (seconds from the level's start) of ``num`` requests arriving as a Poisson process of
    ``rate`` requests/s: exponential gaps with mean 1/rate, seeded. The first request goes at 0."""
    return list(_poisson_times(rate, num, seed))


def _poisson_times(rate: float, num: int, seed: int) -> Iterator[float]:
    rng = random.Random(seed)
    t = 0.0
    for i in range(num):
        if i:
            t += rng.expovariate(rate)
        yield t


async def run_level(
    client: httpx.AsyncClient,
    cfg: LadderConfig,
    requests: Sequence[BenchRequest] | Iterable[BenchRequest],
    concurrency: int,
    on_done: Callable[[RequestResult], None] | None = None,
    count: int | None = None,
    stop_when: Callable[[], bool] | None = None,
    drain_s: float | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` (``count`` of them when it is an iterator) at this level; returns the results and the
    level's wall time in seconds. ``stop_when`` (checked before each send): true stops sending, as the level's
    deadline does; what was sent is awaited, each up to the request timeout, or, with ``drain_s`` and a level
    deadline (cfg.max_level_s), up to ``drain_s`` past the deadline: requests still unanswered then are cancelled and
    count as errors ``unfinished`` (a server that never finishes them, such as one whose KV cache leaked full, must
    not stretch every level by a whole request timeout)."""
    slots = asyncio.Semaphore(concurrency)
    num = len(requests) if count is None else count  # type: ignore[arg-type]
    arrivals = None
    if cfg.rate and cfg.arrival_gaps:
        arrivals = arrival_times(list(cfg.arrival_gaps), cfg.rate, num, cfg.seed + concurrency)
    elif cfg.rate:
        arrivals = _poisson_times(cfg.rate, num, cfg.seed + concurrency)
    results: list[RequestResult] = []
    tasks: list[asyncio.Task] = []

    async def one(req: BenchRequest, scheduled: float | None, waited: float) -> None:
        sent = time.perf_counter()
        try:
            res = await send(client, cfg.target, req, cfg.timeout)
        except asyncio.CancelledError:  # only run_level cancels it: past its drain_s
            res = RequestResult(start=sent, error="unfinished", e2e=time.perf_counter() - sent,
                                detail=f"no answer {drain_s:g} s after the level's {cfg.max_level_s:g} s ended")
        finally:
            slots.release()
        if scheduled is not None:
            res.schedule_lag, res.slot_wait = max(0.0, res.start - scheduled), waited
        results.append(res)
        if on_done is not None:
            on_done(res)

    start = time.perf_counter()
    deadline = start + cfg.max_level_s if cfg.max_level_s else None
    for req in itertools.islice(requests, num):
        scheduled = None
        if arrivals is not None:
            scheduled = start + next(arrivals)
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        before = time.perf_counter()
        if deadline is None:
            await slots.acquire()
        else:  # every slot held by requests that never end must not hold the level past its deadline
            try:
                await asyncio.wait_for(slots.acquire(), max(0.0, deadline - before))
            except asyncio.TimeoutError:
                break
        waited = time.perf_counter() - before
        if deadline is not None and time.perf_counter() >= deadline or stop_when is not None and stop_when():
            slots.release()
            break
        tasks.append(asyncio.create_task(one(req, scheduled, waited)))
    if tasks and deadline is not None and drain_s is not None:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline + drain_s - time.perf_counter()))
        for task in pending:
            task.cancel()
    if tasks:
        await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


async def _run(cfgs: Sequence[LadderConfig], requests: Sequence[BenchRequest],
               on_progress: ProgressFn | None) -> list[list[LevelStats]]:
    """Every side's ladder, interleaved level by level: level 1 on side 0, on side 1, ..., then level 2."""
    sides: list[list[LevelStats]] = [[] for _ in cfgs]
    concurrencies = cfgs[0].concurrencies
    clients = [make_client(max(cfg.concurrencies) + 4, cfg.timeout) for cfg in cfgs]
    try:
        for index, conc in enumerate(concurrencies):
            for side, (cfg, client) in enumerate(zip(cfgs, clients)):
                sides[side].append(await _run_one_level(client, cfg, requests, index, conc, side, on_progress))
    finally:
        for client in clients:
            await client.aclose()
    return sides


async def _run_one_level(client: httpx.AsyncClient, cfg: LadderConfig, requests: Sequence[BenchRequest], index: int,
                         conc: int, side: int, on_progress: ProgressFn | None) -> LevelStats:
    total = cfg.level_requests(conc)
    counts = {"done": 0, "ok": 0}
    metrics_headers = cfg.target.headers()

    def emit(stats: LevelStats | None = None) -> None:
        if on_progress is not None:
            on_progress(Progress(index, len(cfg.concurrencies), conc, total, counts["done"],
                                 counts["ok"], counts["done"] - counts["ok"], stats, side))

    def on_done(res: RequestResult) -> None:
        counts["done"] += 1
        counts["ok"] += res.ok
        emit()

    emit()
    await warm_connections(client, cfg.target, conc, timeout=min(5.0, cfg.timeout))
    before = await _try_scrape(client, cfg, metrics_headers)
    vram = server_metrics.VramSampler(cfg.metrics_prefix, cfg.vram_every_s)
    vram.add(before)
    sampler = (asyncio.create_task(vram.run(client, cfg.metrics_url, metrics_headers))
               if cfg.metrics_url and not isinstance(before, str) else None)
    try:
        results, duration = await run_level(client, cfg, itertools.cycle(requests), conc, on_done, count=total)
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    stats = level_stats(conc, cfg.rate, results, duration, cfg.objectives)
    if cfg.metrics_url:
        stats.server = await _server_window(client, cfg, metrics_headers, before, stats, vram)
    emit(stats)
    return stats


def warm_up_request(req: BenchRequest, i: int) -> BenchRequest:
    """``req`` with ``warm-up <i>:`` in front of its text (its first message's, for chat): as long as the measured
    request to within a few tokens, but sharing no prefix with any of them, so that the warm-up fills no
    prefix-cache block that level 1's first request would then hit."""
    import dataclasses

    mark = f"warm-up {i}: "
    if req.messages is None:
        return dataclasses.replace(req, prompt=mark + (req.prompt or ""))
    msgs = [dict(m) for m in req.messages]
    if msgs and isinstance(msgs[0].get("content"), str):
        msgs[0]["content"] = mark + msgs[0]["content"]
    else:
        msgs.insert(0, {"role": "system", "content": mark})
    return dataclasses.replace(req, messages=msgs)


def warm_up(cfg: LadderConfig, requests: Sequence[BenchRequest]) -> dict:
    """Send ``cfg.warmup`` of ``requests`` (in order, cycling; each made distinct by warm_up_request) one after
    another to ``cfg.target`` before the ladder. Returns {"requests": N, "ok": N ok, "e2e_s": [seconds each, None for a failure], "errors": [reasons]};
    {"requests": 0, ...} when ``cfg.warmup`` is 0. Failures are reported, never raised: the levels will show
    whether the server answers at all."""
    out: dict = {"requests": 0, "ok": 0, "e2e_s": [], "errors": []}
    if cfg.warmup <= 0 or not requests:
        return out

    async def go() -> list[RequestResult]:
        client = make_client(2, cfg.timeout)
        try:
            return [await send(client, cfg.target, warm_up_request(req, i), cfg.timeout)
                    for i, req in enumerate(itertools.islice(itertools.cycle(requests), cfg.warmup))]
        finally:
            await client.aclose()

    results = asyncio.run(go())
    out.update(requests=len(results), ok=sum(r.ok for r in results),
               e2e_s=[round(r.e2e, 3) if r.ok and r.e2e is not None else None for r in results],
               errors=[f"{r.error}: {r.detail}" if r.detail else str(r.error) for r in results if not r.ok])
    return out


async def warm_connections(client: httpx.AsyncClient, target: Target, num: int, timeout: float = 5.0) -> None:
    """Open up to ``num`` keep-alive connections (concurrent GET /v1/models) so that a level measures the server,
    not TCP handshakes when the ladder steps up. Failures are ignored: the level's requests will count them."""

    async def get() -> None:
        try:
            await client.get(target.base_url + "/v1/models", headers=target.headers(), timeout=timeout)
        except httpx.HTTPError:
            pass

    await asyncio.gather(*(get() for _ in range(num)))


async def _try_scrape(client: httpx.AsyncClient, cfg: LadderConfig, headers: dict[str, str]):
    if not cfg.metrics_url:
        return None
    try:
        return await server_metrics.scrape(client, cfg.metrics_url, headers)
    except (httpx.HTTPError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


async def _server_window(client, cfg: LadderConfig, headers, before, stats: LevelStats,
                         vram: server_metrics.VramSampler) -> dict:
    """The level's server histograms (server_metrics.window) and ``vram``: the GPU memory peak of the level
    (VramSampler.result), or {"error": why} when /metrics cannot be read."""
    if before is None or isinstance(before, str):
        return {"error": f"cannot scrape {cfg.metrics_url}: {before}"}
    try:
        after = await server_metrics.scrape_after(client, cfg.metrics_url, headers, before, cfg.metrics_prefix,
                                                  stats.num_ok)
        vram.add(after)
        mine = {"ttft_ms": stats.raw_ttft_s, "tpot_ms": stats.raw_tpot_s, "e2e_ms": stats.raw_e2e_s}
        window = server_metrics.window(before, after, cfg.metrics_prefix, mine)
        if not window:
            return {"error": f"no {cfg.metrics_prefix}* latency histograms at {cfg.metrics_url}; check --metrics-prefix"}
        return {**window, "vram": vram.result()}
    except (httpx.HTTPError, ValueError) as err:
        return {"error": f"cannot scrape {cfg.metrics_url}: {type(err).__name__}: {err}"}


def run_ladder(cfg: LadderConfig, requests: Sequence[BenchRequest], on_progress: ProgressFn | None = None) -> list[LevelStats]:
    """Run every level in order; each level sends ``LadderConfig.level_requests`` of ``requests`` in order,
    cycling when it needs more than there are (at least one). Returns one LevelStats per level."""
    return run_ladders([cfg], requests, on_progress)[0]


def run_ladders(cfgs: Sequence[LadderConfig], requests: Sequence[BenchRequest],
                on_progress: ProgressFn | None = None) -> list[list[LevelStats]]:
    """Side by side: the same ``requests`` (same order, same Poisson schedule) against every config's target,
    interleaved level by level so that machine noise hits every side alike. ``cfgs`` share the concurrencies.
    Returns one list of LevelStats per config."""
    if not requests:
        raise ValueError("run_ladder needs at least one request")
    if len({cfg.concurrencies for cfg in cfgs}) != 1:
        raise ValueError("every side must run the same concurrencies")
    return asyncio.run(_run(cfgs, requests, on_progress))
