"""Active probes: small streaming requests deployctl itself sends to each canary and stable host during an
analysis window, timed on the client with deployctl.bench's client (same TTFT/ITL definitions as ``bench``).

Engine-agnostic: a probe target is a base URL, an API key, the model name and whether the model has a chat
template (``/v1/chat/completions`` then, else ``/v1/completions``). Probes carry the ``X-Deployctl-Probe`` header
and go to the hosts directly (not through the router), so they never appear in nginx's traffic split figures.

``ProbeRunner(targets, ...)`` sends ``requests`` rounds of one probe to every host at once (canary and stable see
the same moment of load), spread evenly over ``spread_s`` seconds, in a daemon thread; ``snapshot()`` returns the
results so far per host. TPOT of a probe:
(E2E − TTFT) / (output tokens − 1), as vLLM's benchmark defines it.
"""
from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from deployctl.bench.client import RequestResult, Target, make_client, send
from deployctl.bench.workload import BenchRequest
from deployctl.rollout.golden import PROBE_HEADER

PROBE_TEXT = "Count slowly from one to twenty, one number per line."


def host_url(cfg, h) -> str:
    """``http://address:port`` of host ``h``'s runtime as the router reaches it (127.0.0.1 for a local host)."""
    from deployctl.config.layout import network_address, service_port, url_host

    return f"http://{url_host(network_address(h))}:{service_port(cfg, h)}"


@dataclass(frozen=True)
class ProbeTarget(Target):
    """A bench Target whose requests carry the probe header."""

    def headers(self) -> dict[str, str]:
        return {**super().headers(), PROBE_HEADER: "probe"}


def target(base_url: str, model: str, *, chat: bool, api_key: Optional[str] = None) -> ProbeTarget:
    return ProbeTarget(base_url.rstrip("/"), "chat" if chat else "completions", model, api_key)


@dataclass
class ProbeStats:
    """One side's probes in a window. Seconds; None when no successful probe measured it."""

    hosts: list[str]
    sent: int = 0
    errors: int = 0
    ttft_s: Optional[float] = None  # median client-side TTFT
    tpot_s: Optional[float] = None  # median client-side TPOT
    samples: int = 0  # successful probes
    error_detail: str = ""
    failing: list[str] = field(default_factory=list)  # hosts whose every probe failed

    @property
    def error_rate(self) -> float:
        return self.errors / self.sent if self.sent else 0.0


def tpot(r: RequestResult) -> Optional[float]:
    if not r.ok or r.ttft is None or r.e2e is None or r.output_tokens < 2:
        return None
    return (r.e2e - r.ttft) / (r.output_tokens - 1)


def summarize(results: dict[str, list[RequestResult]], hosts: list[str]) -> ProbeStats:
    """Pool the probes of ``hosts`` (medians over successful probes)."""
    st = ProbeStats(list(hosts))
    ttfts, tpots = [], []
    for h in hosts:
        rs = results.get(h, [])
        st.sent += len(rs)
        bad = [r for r in rs if not r.ok]
        st.errors += len(bad)
        if bad and not st.error_detail:
            st.error_detail = f"{h}: {bad[-1].error} {bad[-1].detail}"[:200]
        if rs and len(bad) == len(rs):
            st.failing.append(h)
        for r in rs:
            if r.ok and r.ttft is not None:
                ttfts.append(r.ttft)
                t = tpot(r)
                if t is not None:
                    tpots.append(t)
    st.samples = len(ttfts)
    st.ttft_s = statistics.median(ttfts) if ttfts else None
    st.tpot_s = statistics.median(tpots) if tpots else None
    return st


class ProbeRunner:
    """Background probes for one window (module doc). ``targets``: host name -> ProbeTarget."""

    def __init__(self, targets: dict[str, ProbeTarget], *, requests: int, max_tokens: int, timeout: float,
                 spread_s: float):
        self.targets, self.requests, self.timeout = targets, requests, timeout
        self.spread_s = max(0.0, spread_s)
        self.req = BenchRequest(prompt=PROBE_TEXT, messages=None, max_tokens=max_tokens)
        self._results: dict[str, list[RequestResult]] = {h: [] for h in targets}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "ProbeRunner":
        if self.requests > 0 and self.targets:
            self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True, name="probes")
            self._thread.start()
        return self

    async def _one(self, client, name: str) -> None:
        r = await send(client, self.targets[name], self.req, self.timeout)
        with self._lock:
            self._results[name].append(r)

    async def _run(self) -> None:
        gap = self.spread_s / self.requests
        async with make_client(len(self.targets), self.timeout) as client:
            for i in range(self.requests):
                t0 = time.monotonic()
                # every host at once: canary and stable see the same moment of load
                await asyncio.gather(*(self._one(client, n) for n in self.targets))
                if self._stop.is_set():
                    return
                rest = gap - (time.monotonic() - t0)
                while rest > 0 and not self._stop.is_set():
                    await asyncio.sleep(min(0.2, rest))
                    rest = gap - (time.monotonic() - t0)

    def snapshot(self) -> dict[str, list[RequestResult]]:
        with self._lock:
            return {h: list(rs) for h, rs in self._results.items()}

    def stop(self, wait: float = 0.0) -> None:
        self._stop.set()
        if self._thread is not None and wait:
            self._thread.join(wait)
