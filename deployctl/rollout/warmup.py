"""Warm-up before weight (issue 42): a host that joins is slow at first (cold weights, caches, compiled kernels), so
``scale out`` sends it requests directly (not through the router) until the median TTFT of its last ``window``
streamed requests is within ``factor`` of the fleet's (the same request's median TTFT on the serving peers), plus
``slack_s`` for timer jitter. Only then does the router give it any weight.

Defaults: ``window`` 8 requests, ``factor`` 1.5, ``slack_s`` 0.02 s, at most ``max_requests`` 200: deployctl's own
choices (the issue asks for "the TTFT of the last N within a factor of the fleet's"; none of the guides gives a
figure). A host that does not get there within ``max_requests`` is said and goes on to the slow-start ramp, which
still starts it at a small share.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import httpx

from deployctl.config import DeployConfig, layout
from deployctl.engines import of

WINDOW = 8
FACTOR = 1.5
SLACK_S = 0.02
MAX_REQUESTS = 200


@dataclass
class WarmUp:
    requests: int
    ttft_s: float  # the median TTFT of the host's last ``window`` requests
    fleet_ttft_s: float  # the same on the serving peers
    seconds: float
    converged: bool

    def to_json(self) -> dict:
        return {"requests": self.requests, "ttft_s": round(self.ttft_s, 4), "fleet_ttft_s": round(self.fleet_ttft_s, 4),
                "seconds": round(self.seconds, 2), "converged": self.converged}


def ttft(client: httpx.Client, url: str, body: dict, headers: dict) -> Optional[float]:
    """Seconds to the first streamed chunk of ``body`` at ``url``/v1/chat/completions; None when it failed."""
    t0 = time.monotonic()
    try:
        with client.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as r:
            if r.status_code != 200:
                return None
            first = None
            for line in r.iter_lines():  # read it all: the engine counts a request until its end
                if first is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                    first = time.monotonic() - t0
            return first
    except httpx.HTTPError:
        return None
    return None


def warm_up(cfg: DeployConfig, host_cfg, peers: list, *, window: int = WINDOW, factor: float = FACTOR,
            slack_s: float = SLACK_S, max_requests: int = MAX_REQUESTS,
            say: Callable[[str], None] = print) -> WarmUp:
    """Warm the engine of ``host_cfg`` (HostConfig) up against ``peers`` (HostConfigs serving now; module doc).
    Returns the WarmUp figures. Never raises for a slow host (``converged`` False); RemoteError-free (HTTP only)."""
    from deployctl.rollout.goldenrecord import engine_url
    from deployctl.service.http import api_key

    key = api_key(cfg)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = of(cfg).sample_body(cfg.model.name)
    url = engine_url(cfg, host_cfg, layout.service_port(cfg, host_cfg))
    t0 = time.monotonic()
    with httpx.Client(timeout=cfg.server.request_timeout_s) as c:
        fleet = [x for p in peers for x in [ttft(c, engine_url(cfg, p, layout.service_port(cfg, p)), body, headers)
                                            for _ in range(max(1, window // max(1, len(peers))))] if x is not None]
        ref = statistics.median(fleet) if fleet else 0.0
        last: list[float] = []
        n = 0
        while n < max_requests:
            n += 1
            x = ttft(c, url, body, headers)
            if x is None:
                continue
            last = (last + [x])[-window:]
            if len(last) == window and statistics.median(last) <= factor * ref + slack_s:
                w = WarmUp(n, statistics.median(last), ref, time.monotonic() - t0, True)
                say(f"{host_cfg.name}: warmed up after {n} requests: median TTFT {w.ttft_s * 1000:.1f} ms "
                    f"(fleet {ref * 1000:.1f} ms)")
                return w
    med = statistics.median(last) if last else float("nan")
    say(f"warning: {host_cfg.name}: TTFT still {med * 1000:.1f} ms after {n} warm-up requests (fleet "
        f"{ref * 1000:.1f} ms, factor {factor:g}): ramping its weight slowly anyway")
    return WarmUp(n, med, ref, time.monotonic() - t0, False)
