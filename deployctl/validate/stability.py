"""The stability layer: sustained load in bursts at a share of the knee, the runtime's metrics sampled over time.

Load: closed loop at ``concurrency`` (the CLI uses ``--load-fraction`` x the latency layer's knee) in bursts of
``burst_s`` with ``gap_s`` of quiet between them, for ``duration_s`` in all. Every ``interval_s`` each metrics URL
is scraped (the engine adapter's names: KV usage, waiting, running, preemptions; the client library's standard
``process_resident_memory_bytes`` and ``process_start_time_seconds``), and GPU memory in use through NVML when this
machine has it; at the end of each gap one more sample is taken (the KV baseline check).

Verdicts (each failure names the signal, where and the slope; slopes are least squares, deployctl.validate.series):
- ``restarts``: the process start time changed, or /metrics stopped answering (``metrics``: it never did);
- ``kv_usage``: at the end of each quiet gap KV usage is back within ``kv_tolerance`` of its value before the load
  (blocks held after their requests finished are a leak);
- ``rss`` / ``gpu_memory``: the slope after the first burst (warm-up allocations excluded) is within
  ``max_memory_mib_per_h``, unless the whole growth stays under ``memory_noise_mib``;
- ``queue_depth``: the waiting requests of the last third of the load samples are not above the first third's by
  more than max(1, concurrency / 4);
- ``preemptions``: per burst, the last third's mean is not above 2x the first third's + 5 (amplifying);
- ``errors``: the load's error share is within ``max_error_rate``; failing load backs off (Backoff: a burst of
  nothing but errors stops early, the gaps after such bursts double, three in a row stop the load and fail).
A metrics URL that answers 404 at every scrape (a server that exports none) is "cannot judge" in the summary and
``signals[url]["cannot_judge"]``, not a failure: only the load's errors are judged then.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import httpx

from deployctl import promhist
from deployctl.bench.ladder import LadderConfig, run_level
from deployctl.bench.workload import BenchRequest
from deployctl.engines import adapter
from deployctl.validate.series import slope_per_h, thirds
from deployctl.validate.result import LayerResult

RSS = "process_resident_memory_bytes"
START = "process_start_time_seconds"
MIB = 1024 * 1024


# a burst's requests still unanswered max(burst_s, DRAIN_MIN_S) after the burst ended are cancelled and count as
# errors ("unfinished"): a server that never finishes them is unstable, and waiting out each one's whole request
# timeout would stretch --duration by minutes
DRAIN_MIN_S = 10.0


@dataclass(frozen=True)
class StabilityConfig:
    duration_s: float
    concurrency: int
    burst_s: float = 10.0
    gap_s: float = 2.0
    interval_s: float = 1.0
    kv_tolerance: float = 0.05
    max_memory_mib_per_h: float = 1024.0
    memory_noise_mib: float = 64.0
    max_error_rate: float = 0.01
    engine_kind: str = "deployctl-runtime"


@dataclass
class Sample:
    t: float
    source: str
    phase: str  # idle | load | gap_end
    burst: int
    values: dict[str, Optional[float]] = field(default_factory=dict)
    error: str = ""
    http_status: int = 0  # the status of a scrape answered with an error status (404: no /metrics route)


def gpu_memory_used() -> Optional[float]:
    """Bytes in use over every GPU of this machine (NVML), or None without NVML or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return float(sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                             for i in range(pynvml.nvmlDeviceGetCount())))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: the signal is absent
        return None


def _pick(samples: list[promhist.Sample], name: Optional[str]) -> Optional[float]:
    if not name:
        return None
    vals = [s.value for s in samples if s.name == name]
    return sum(vals) if vals else None


class _Sampler:
    def __init__(self, client: httpx.AsyncClient, urls: Sequence[str], headers: dict[str, str], kind: str,
                 t0: float, gpu: Callable[[], Optional[float]]):
        self.client, self.urls, self.headers, self.t0, self.gpu = client, list(urls), headers, t0, gpu
        m = adapter(kind).metrics
        self.names = {"kv_usage": m["kv_usage"], "waiting": m["waiting"], "running": m["running"],
                      "preemptions": m["preemptions"], "rss_bytes": RSS, "start_time": START}
        self.samples: list[Sample] = []
        self.phase, self.burst = "idle", 0

    async def sample(self, phase: Optional[str] = None) -> None:
        t = time.monotonic() - self.t0
        gpu = await asyncio.to_thread(self.gpu)
        for url in self.urls:
            s = Sample(round(t, 3), url, phase or self.phase, self.burst)
            try:
                r = await self.client.get(url, headers=self.headers, timeout=5.0)
                r.raise_for_status()
                parsed = promhist.parse_text(r.text)
                s.values = {k: _pick(parsed, n) for k, n in self.names.items()}
            except (httpx.HTTPError, promhist.PromParseError) as exc:
                s.error = f"{type(exc).__name__}: {exc}"[:200]
                if isinstance(exc, httpx.HTTPStatusError):
                    s.http_status = exc.response.status_code
            s.values["gpu_memory_bytes"] = gpu
            self.samples.append(s)

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass


async def _load(cfg: StabilityConfig, ladder: LadderConfig, requests: Sequence[BenchRequest],
                metrics_urls: Sequence[str], gpu) -> tuple[list[Sample], list[Any], list[tuple[float, float]], "Backoff"]:
    limits = httpx.Limits(max_connections=cfg.concurrency + 8, max_keepalive_connections=cfg.concurrency + 8)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(ladder.timeout), trust_env=False) as client:
        t0 = time.monotonic()
        sampler = _Sampler(client, metrics_urls, ladder.target.headers(), cfg.engine_kind, t0, gpu)
        await sampler.sample("idle")  # the baseline, before any load
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(cfg.interval_s, stop))
        results, bursts = [], []
        burst_cfg = replace(ladder, max_level_s=cfg.burst_s)
        pool = itertools.cycle(requests)
        backoff = Backoff(cfg)
        while time.monotonic() - t0 < cfg.duration_s and not backoff.stopped:
            sampler.burst += 1
            sampler.phase = "load"
            start = time.monotonic() - t0
            backoff.start_burst()
            res, _ = await run_level(client, burst_cfg, pool, cfg.concurrency, count=10 ** 9,
                                     on_done=backoff.done, stop_when=backoff.failing_fast,
                                     drain_s=max(cfg.burst_s, DRAIN_MIN_S))
            results.extend(res)
            bursts.append((start, time.monotonic() - t0))
            sampler.phase = "idle"
            await asyncio.sleep(backoff.gap_after_burst())
            await sampler.sample("gap_end")
        stop.set()
        await task
        return sampler.samples, results, bursts, backoff


class Backoff:
    """Failing load backs off instead of hammering a server that refuses it (a closed loop of instant errors
    sends hundreds of requests a second). A burst stops sending once its first FAIL_FAST requests all failed;
    after a burst with no success the next gap doubles (gap_s × 2^n, at most MAX_GAP_S); STOP_AFTER such bursts
    in a row stop the load (``stopped``, ``why``). One success resets it."""

    FAIL_FAST, MAX_GAP_S, STOP_AFTER = 8, 30.0, 3

    def __init__(self, cfg: StabilityConfig):
        self.cfg, self.streak, self.backed_off, self.stopped, self.why = cfg, 0, 0, False, ""
        self.ok = self.failed = 0
        self.first_error = ""

    def start_burst(self) -> None:
        self.ok = self.failed = 0

    def done(self, res) -> None:
        if res.ok:
            self.ok += 1
        else:
            self.failed += 1
            self.first_error = self.first_error or str(res.error)

    def failing_fast(self) -> bool:
        return self.ok == 0 and self.failed >= max(self.FAIL_FAST, self.cfg.concurrency)

    def gap_after_burst(self) -> float:
        """Seconds to wait after the burst that just ended (module doc)."""
        if self.ok or not self.failed:
            self.streak, self.first_error = 0, ""
            return self.cfg.gap_s
        self.streak += 1
        if self.streak >= self.STOP_AFTER:
            self.stopped = True
            self.why = (f"load stopped after {self.streak} bursts in a row in which every request failed (first: "
                        f"{self.first_error}); the rest of --duration was not sent")
            return self.cfg.gap_s
        self.backed_off += 1
        return max(self.cfg.gap_s, min(self.MAX_GAP_S, self.cfg.gap_s * 2 ** self.streak))


def _series(samples: list[Sample], source: str, key: str, phases=None) -> list[tuple[float, float]]:
    return [(s.t, s.values[key]) for s in samples if s.source == source and s.values.get(key) is not None
            and (phases is None or s.phase in phases)]


def _judge(cfg: StabilityConfig, samples: list[Sample], results: list, bursts) -> tuple[list[str], dict]:
    problems, signals = [], {}
    for src in sorted({s.source for s in samples}):
        mine = [s for s in samples if s.source == src]
        failed = [s for s in mine if s.error]
        starts = sorted({s.values["start_time"] for s in mine if s.values.get("start_time") is not None})
        sig: dict[str, Any] = {"scrape_failures": len(failed), "start_times": starts}
        if failed and len(failed) == len(mine):
            if all(s.http_status == 404 for s in failed):  # a server that exports no metrics (not ours)
                sig["cannot_judge"] = (f"cannot judge restarts, KV usage, memory, queue or preemptions: {src} "
                                       f"answers 404 (the server exports no metrics there); pass --metrics-url")
            else:
                problems.append(f"metrics on {src}: never answered from here ({failed[0].error}); nothing to judge")
            signals[src] = sig
            continue
        if len(starts) > 1 or failed:
            why = (f"process start time changed {len(starts) - 1} time(s)" if len(starts) > 1 else
                   f"/metrics did not answer {len(failed)} time(s) (first at t={failed[0].t:g} s: {failed[0].error})")
            problems.append(f"restarts on {src}: {why}")
        kv = _series(mine, src, "kv_usage")
        base = kv[0][1] if kv else None
        ends = _series(mine, src, "kv_usage", {"gap_end"})
        if base is not None and ends:
            slope = slope_per_h([(t, v) for t, v in ([(kv[0][0], base)] + ends)])
            sig["kv_usage"] = {"baseline": base, "after_bursts": [v for _, v in ends], "slope_per_h": slope}
            worst = max(ends, key=lambda p: p[1])
            if worst[1] - base > cfg.kv_tolerance:
                problems.append(f"kv_usage on {src}: not back to its baseline {base:.3f} after the bursts: "
                                f"{', '.join(f'{v:.3f}' for _, v in ends)} (slope {slope or 0:+.3f}/h, "
                                f"+{(slope or 0) / 60:.4f}/min; tolerance {cfg.kv_tolerance:g})")
        after_warmup = bursts[0][1] if bursts else 0.0
        for key, label in (("rss_bytes", "rss"), ("gpu_memory_bytes", "gpu_memory")):
            pts = [(t, v / MIB) for t, v in _series(mine, src, key) if t >= after_warmup]
            slope = slope_per_h(pts)
            if slope is None:
                continue
            growth = pts[-1][1] - pts[0][1]
            sig[label] = {"first_mib": round(pts[0][1], 1), "last_mib": round(pts[-1][1], 1),
                          "slope_mib_per_h": round(slope, 1)}
            if slope > cfg.max_memory_mib_per_h and growth > cfg.memory_noise_mib:
                problems.append(f"{label} on {src}: slope {slope:+.0f} MiB/h > {cfg.max_memory_mib_per_h:g} MiB/h "
                                f"({pts[0][1]:.0f} -> {pts[-1][1]:.0f} MiB)")
        waiting = [v for _, v in _series(mine, src, "waiting", {"load"})]
        first, last = thirds(waiting)
        q_slope = slope_per_h(_series(mine, src, "waiting", {"load"}))
        sig["queue_depth"] = {"first_third": round(first, 2), "last_third": round(last, 2), "slope_per_h": q_slope}
        if waiting and last - first > max(1.0, cfg.concurrency / 4) and (q_slope or 0) > 0:
            problems.append(f"queue_depth on {src}: waiting requests trend up, {first:.1f} -> {last:.1f} "
                            f"(slope {q_slope:+.0f}/h)")
        pre = _series(mine, src, "preemptions", {"gap_end"})
        per_burst = [b - a for (_, a), (_, b) in zip([(0, pre[0][1])] + pre[:-1], pre)] if pre else []
        p_first, p_last = thirds(per_burst)
        sig["preemptions"] = {"per_burst": per_burst}
        if per_burst and p_last > 2 * p_first + 5:
            problems.append(f"preemptions on {src}: amplifying, {p_first:.0f} -> {p_last:.0f} per burst")
        signals[src] = sig
    n_err = sum(1 for r in results if not r.ok)
    share = n_err / len(results) if results else 1.0
    if share > cfg.max_error_rate:
        reasons: dict[str, int] = {}
        for r in results:
            if not r.ok:
                reasons[r.error] = reasons.get(r.error, 0) + 1
        problems.append(f"errors: {n_err}/{len(results)} load requests failed ({share:.1%} > "
                        f"{cfg.max_error_rate:.1%}; {', '.join(f'{k}: {v}' for k, v in reasons.items()) or 'none sent'})")
    signals["load"] = {"requests": len(results), "errors": n_err, "bursts": len(bursts)}
    return problems, signals


def run_stability(cfg: StabilityConfig, ladder: LadderConfig, requests: Sequence[BenchRequest],
                  metrics_urls: Sequence[str], gpu: Callable[[], Optional[float]] = gpu_memory_used) -> LayerResult:
    """Run the load and judge it (module doc). ``details``: {"config", "signals", "bursts", "samples"}."""
    samples, results, bursts, backoff = asyncio.run(_load(cfg, ladder, requests, metrics_urls, gpu))
    problems, signals = _judge(cfg, samples, results, bursts)
    load = signals["load"]
    load.update(backed_off=backoff.backed_off, stopped=backoff.why or None)
    if backoff.why:
        problems.append(backoff.why)
    cannot = [sig["cannot_judge"] for sig in signals.values() if isinstance(sig, dict) and sig.get("cannot_judge")]
    head = (f"stability: {load['requests']} requests in {load['bursts']} burst(s) at concurrency {cfg.concurrency} "
            f"over {samples[-1].t if samples else 0:.0f} s")
    if backoff.backed_off:
        head += f"; backed off {backoff.backed_off} time(s) after bursts that failed every request"
    ok_text = ("; only the load's errors judged, " + "; ".join(cannot) if cannot else
               "; KV usage back to baseline, memory, queue and preemptions flat, no restart")
    summary = head + (f"; FAIL: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
                      if problems else ok_text)
    return LayerResult("stability", "fail" if problems else "pass", summary, problems, {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "signals": signals, "bursts": [list(b) for b in bursts],
        "samples": [{"t": s.t, "source": s.source, "phase": s.phase, "burst": s.burst, **s.values,
                     **({"error": s.error} if s.error else {})} for s in samples]})
