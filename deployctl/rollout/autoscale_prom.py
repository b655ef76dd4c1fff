"""The autoscale window read from Prometheus (``autoscale.prometheus_url`` set) instead of the engines' metrics
routes: the same three figures over the serving hosts' series, selected by the ``job`` (slo.prometheus_job, default
the service name) and ``deployctl_host`` labels that `render`'s prometheus/scrape.yaml gives every target.

HTTP API: https://prometheus.io/docs/prometheus/latest/querying/api/ (``/api/v1/query_range``, ``/api/v1/query``).
"""
from __future__ import annotations

import re
import time

import httpx

from deployctl.config import DeployConfig
from deployctl.errors import RemoteError
from deployctl.rollout.autoscale import Window


def _get(url: str, path: str, params: dict) -> list:
    try:
        r = httpx.get(url.rstrip("/") + path, params=params, timeout=10)
        doc = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise RemoteError(f"autoscale: Prometheus at {url} did not answer {path}: {e}",
                          fix="check autoscale.prometheus_url, or unset it to read the engines directly") from None
    if doc.get("status") != "success":
        raise RemoteError(f"autoscale: Prometheus at {url} refused {params.get('query')!r}: {doc.get('error')}")
    return doc["data"]["result"]


def read_window_prometheus(cfg: DeployConfig, serving: list[str], *, now: float | None = None) -> Window:
    """``autoscale.samples`` points over the last ``autoscale.window_s`` of the serving hosts' mean KV usage and
    summed waiting requests (``query_range``), and P99 TTFT of the window (histogram_quantile over ``increase``).
    Raises RemoteError (exit 4) when Prometheus cannot be asked or holds no sample of the serving engines."""
    from deployctl.engines import metric

    auto, kind = cfg.autoscale, cfg.engine.kind
    url = auto.prometheus_url
    job = cfg.slo.prometheus_job or cfg.service.name
    sel = f'{{job="{job}",deployctl_host=~"{"|".join(re.escape(n) for n in serving)}"}}'
    end = time.time() if now is None else now
    start = end - auto.window_s
    step = max(1.0, auto.window_s / (auto.samples - 1))

    def series(q: str) -> list[float]:
        res = _get(url, "/api/v1/query_range", {"query": q, "start": start, "end": end, "step": step})
        return [float(v) for _, v in res[0]["values"]] if res else []

    kv = series(f"avg({metric(kind, 'kv_usage')}{sel})")
    waiting = series(f"sum({metric(kind, 'waiting')}{sel})")
    if not kv or not waiting:
        raise RemoteError(f"autoscale: Prometheus at {url} holds no {metric(kind, 'kv_usage')} or "
                          f"{metric(kind, 'waiting')} sample of {', '.join(serving)} (job {job}) in the last "
                          f"{auto.window_s:g} s",
                          fix="check that Prometheus scrapes the engines with render's prometheus/scrape.yaml")
    p99 = None
    ttft = metric(kind, "ttft")
    if ttft:
        w = f"{max(1, round(auto.window_s))}s"
        res = _get(url, "/api/v1/query", {"query": f"histogram_quantile(0.99, sum by (le) "
                                                   f"(increase({ttft}_bucket{sel}[{w}])))", "time": end})
        if res and res[0]["value"][1] not in ("NaN", "+Inf", "-Inf"):
            p99 = float(res[0]["value"][1])
    return Window(kv, waiting, p99, auto.window_s)
