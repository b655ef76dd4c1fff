"""The server's own view of a level: its Prometheus latency histograms, scraped before and after, subtracted.

Metric names are ``<prefix><name>``; the default prefix is the runtime's (``deployctl_runtime_``, see
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


def window(before: list[promhist.Sample], after: list[promhist.Sample], prefix: str) -> dict:
    """Per histogram: {"count", "p50", "p90", "p99"} (ms) of the observations between the two scrapes."""
    out: dict = {}
    for key, name in HISTOGRAMS.items():
        h = promhist.histogram(after, prefix + name) - promhist.histogram(before, prefix + name)
        if not h.buckets:
            continue
        out[key] = {"count": int(h.count), **{f"p{round(q * 100)}": _ms(h.quantile(q)) for q in (0.5, 0.9, 0.99)}}
        out[key]["buckets_s"] = [le for le, _ in h.buckets]
    return out


async def scrape_after(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], before: list[promhist.Sample], prefix: str,
    expected: int, settle_s: float = 2.0,
) -> list[promhist.Sample]:
    """Scrape until the E2E histogram has counted ``expected`` more requests than ``before`` (the server may
    observe a request a moment after the client saw its last byte), or ``settle_s`` seconds passed."""
    name = prefix + HISTOGRAMS["e2e_ms"]
    base = promhist.histogram(before, name).count
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        after = await scrape(client, url, headers)
        if promhist.histogram(after, name).count - base >= expected or loop.time() >= deadline:
            return after
        await asyncio.sleep(0.05)
