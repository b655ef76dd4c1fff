"""Prometheus metrics, prefix `deployctl_runtime_`, names exactly as in docs/CONTRACTS.md.

Engine gauges and cumulative engine counters are read from the latest `EngineStats` snapshot at scrape time
(a custom collector); per-request counters and histograms are updated live by the serving layer.
Histogram buckets are dense where the objectives are, so `histogram_quantile` interpolates inside narrow buckets
instead of collapsing P99 onto a wide bucket's edge: TTFT 5 ms .. 10 min, TPOT/ITL 1 ms .. 2 s.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "deployctl_runtime_"

TTFT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3,
                0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0,
                60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
TPOT_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025,
                0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0,
                1.5, 2.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
               90.0, 120.0, 180.0, 300.0, 600.0, 1200.0)
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
                 30.0, 60.0, 120.0, 300.0, 600.0)


class _EngineStatsCollector:
    def __init__(self, get_stats: Callable[[], object | None]):
        self._get_stats = get_stats

    def collect(self):
        s = self._get_stats()
        gauges = {
            "num_requests_running": ("Requests in the running set.", "num_running"),
            "num_requests_waiting": ("Requests waiting to be scheduled.", "num_waiting"),
            "kv_cache_usage_ratio": ("KV cache usage: used blocks / total blocks (0-1).", "kv_cache_usage"),
            "num_gpu_blocks": ("KV cache blocks in the pool.", "num_gpu_blocks"),
            "num_free_blocks": ("KV cache blocks free (including cached, evictable blocks).", "num_free_blocks"),
        }
        for name, (doc, attr) in gauges.items():
            yield GaugeMetricFamily(PREFIX + name, doc, value=float(getattr(s, attr, 0) if s else 0))
        counters = {
            "num_preemptions": ("Preemptions since start.", "num_preemptions_total"),
            "prefix_cache_queries": ("Prefix cache queries since start (tokens).", "prefix_cache_queries_total"),
            "prefix_cache_hits": ("Prefix cache hits since start (tokens).", "prefix_cache_hits_total"),
            "step_retries": ("Extra forward passes run to isolate the request a failed engine step owes its error to "
                             "(at most ceil(log2 n) + 1 per failed step of n requests; --max-step-retries-per-min).",
                             "step_retries_total"),
        }
        for name, (doc, attr) in counters.items():
            yield CounterMetricFamily(PREFIX + name, doc, value=float(getattr(s, attr, 0) if s else 0))


class Metrics:
    """One registry per server. `get_stats` returns the latest EngineStats (or None before the engine exists)."""

    def __init__(self, get_stats: Callable[[], object | None]):
        disable_created_metrics()  # no *_created series: scrapers and quantile math do not need them
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_EngineStatsCollector(get_stats))
        # the client library's standard process_* series (Linux): process_resident_memory_bytes,
        # process_start_time_seconds (a restart shows as a new start time), as vLLM's default registry has them
        ProcessCollector(registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", registry=r)
        self.request_success = Counter(PREFIX + "request_success", "Finished requests by finish_reason.",
                                       ["finish_reason"], registry=r)
        self.request_rejected = Counter(PREFIX + "request_rejected", "Requests refused before generation, by reason.",
                                        ["reason"], registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token (arrival to first token).",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds",
                              "Per request: (e2e - TTFT) / (output tokens - 1).", buckets=TPOT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Time between consecutive output tokens.",
                             buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds",
                                    "Engine arrival to first scheduling (recorded by the scheduler), as vLLM.",
                                    buckets=QUEUE_BUCKETS, registry=r)
        self.engine_errors = Counter(PREFIX + "engine_errors", "Engine step errors: isolated (one request failed "
                                     "alone) or fatal (the engine died, the process exits 3; or it stalled: exits 4).", ["kind"],
                                     registry=r)
        self.is_sleeping = Gauge(PREFIX + "is_sleeping", "1 while asleep (POST /sleep: KV cache freed, weights kept "
                                 "in host memory), else 0.", registry=r)
        # make the labelled series visible at 0 from the start
        for kind in ("isolated", "fatal"):
            self.engine_errors.labels(kind=kind)
        for reason in ("stop", "length", "abort", "error"):
            self.request_success.labels(finish_reason=reason)
        for reason in ("invalid_request", "context_length_exceeded", "queue_full", "not_ready", "draining", "sleeping"):
            self.request_rejected.labels(reason=reason)

    def add_collector(self, collector) -> None:
        """Register another scrape-time collector (gpu_metrics.NvmlCollector: the GPU gauges)."""
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
