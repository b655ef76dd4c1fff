"""The server's own view of a level: its Prometheus latency histograms, scraped before and after, subtracted;
and its GPU memory peak, sampled through the level (``VramSampler``).

Metric names are ``<prefix><name>``; the default prefix is the bundled runtime's (deployctl.engines.runtime, see
CONTRACTS.md); ``vllm:`` gives vLLM's. Quantiles as Prometheus' histogram_quantile (deployctl.promhist).
"""
from __future__ import annotations

import asyncio
import math

import httpx

from deployctl import promhist

HISTOGRAMS = {
    "ttft_ms": "time_to_first_token_seconds",
    "tpot_ms": "time_per_output_token_seconds",
    "itl_ms": "inter_token_latency_seconds",
    "e2e_ms": "e2e_request_latency_seconds",
    "queue_ms": "request_queue_time_seconds",
}


async def scrape(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[promhist.Sample]:
    """GET ``url`` and parse it; raises httpx.HTTPError or promhist.PromParseError."""
    resp = await client.get(url, headers=headers, timeout=10.0)
    resp.raise_for_status()
    return promhist.parse_text(resp.text)


def _ms(x: float) -> float | None:
    return None if math.isnan(x) else round(x * 1e3, 3)


def bucketed(values_s: list[float], bounds: list[float]) -> promhist.Histogram:
    """The client's values as a cumulative histogram with the server's bucket ``bounds`` (seconds)."""
    buckets = [(le, float(sum(1 for v in values_s if v <= le))) for le in bounds]
    return promhist.Histogram(buckets, float(len(values_s)), float(sum(values_s)))


def window(
    before: list[promhist.Sample], after: list[promhist.Sample], prefix: str,
    client_s: dict[str, list[float]] | None = None,
) -> dict:
    """Per histogram: {"count", "p50", "p90", "p99"} (ms) of the observations between the two scrapes, and
    ``buckets_s``. For keys in ``client_s`` (the client's own values, seconds), also "client_count" and
    "client_p50"/"client_p90"/"client_p99": the client's values put through the same buckets and the same
    estimator, so that the two views compare like for like."""
    out: dict = {}
    qs = (0.5, 0.9, 0.99)
    for key, name in HISTOGRAMS.items():
        h = promhist.histogram(after, prefix + name) - promhist.histogram(before, prefix + name)
        if not h.buckets:
            continue
        out[key] = {"count": int(h.count), **{f"p{round(q * 100)}": _ms(h.quantile(q)) for q in qs}}
        out[key]["buckets_s"] = [le for le, _ in h.buckets]
        if client_s and key in client_s:
            mine = bucketed(client_s[key], out[key]["buckets_s"])
            out[key]["client_count"] = len(client_s[key])
            out[key].update({f"client_p{round(q * 100)}": _ms(mine.quantile(q)) for q in qs})
    return out


async def scrape_after(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], before: list[promhist.Sample], prefix: str,
    expected: int, settle_s: float = 2.0,
) -> list[promhist.Sample]:
    """Scrape until the E2E histogram has counted ``expected`` more requests than ``before`` (the server may
    observe a request a moment after the client saw its last byte), or ``settle_s`` seconds passed, or at once
    when the server has no such histogram."""
    name = prefix + HISTOGRAMS["e2e_ms"]
    base = promhist.histogram(before, name).count
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        after = await scrape(client, url, headers)
        h = promhist.histogram(after, name)
        if not h.buckets or h.count - base >= expected or loop.time() >= deadline:
            return after
        await asyncio.sleep(0.05)


# The bundled runtime's NVML gauge (runtime/deployctl_runtime/server/gpu_metrics.py): bytes in use on the device,
# every process, per ``gpu`` label. Engines without it (vLLM, SGLang export no GPU memory series) get "not measured".
VRAM_GAUGE = "gpu_memory_used_bytes"
VRAM_EVERY_S = 0.5  # a sample every half second: the KV pool is allocated at start, activations peak per step


def vram_by_gpu(samples: list[promhist.Sample], prefix: str) -> dict[str, float]:
    """``{gpu label: bytes}`` of ``<prefix>gpu_memory_used_bytes`` in one scrape (empty when not exported)."""
    return {s.label("gpu", ""): s.value for s in samples if s.name == prefix + VRAM_GAUGE}


class VramSampler:
    """The highest ``gpu_memory_used_bytes`` per GPU seen in the scrapes given to ``add`` and in its own scrapes
    every ``every_s`` while ``run`` is awaited (cancel it at the level's end). ``result()``: {"peak_bytes": {gpu:
    bytes}, "samples": n} or {"not_measured": why}. Sampled, so a spike between two scrapes is missed: a lower
    bound of the true peak."""

    def __init__(self, prefix: str, every_s: float = VRAM_EVERY_S):
        self.prefix, self.every_s = prefix, every_s
        self.peak: dict[str, float] = {}
        self.samples = 0

    def add(self, samples: list[promhist.Sample] | None) -> None:
        if not isinstance(samples, list):
            return
        seen = vram_by_gpu(samples, self.prefix)
        if seen:
            self.samples += 1
        for gpu, used in seen.items():
            self.peak[gpu] = max(used, self.peak.get(gpu, 0.0))

    async def run(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                self.add(await scrape(client, url, headers))
            except (httpx.HTTPError, ValueError):
                pass  # the level's scrapes before and after say whether the server can be scraped

    def result(self) -> dict:
        if not self.peak:
            return {"not_measured": f"the server exports no {self.prefix}{VRAM_GAUGE} (the bundled runtime's NVML "
                                    "gauge; none on cpu or without NVML)"}
        return {"peak_bytes": {gpu: int(v) for gpu, v in sorted(self.peak.items())}, "samples": self.samples}
