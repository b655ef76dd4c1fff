"""deploy.yaml's ``autoscale:`` section: when `deployctl autoscale` (and the rendered KEDA ScaledObject) add or
remove a serving host (deployctl.rollout.autoscale decides; shape: docs/autoscaling.md)."""
from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BeforeValidator, Field, model_validator

from deployctl.config.fields import _Frozen
from deployctl.config.units import parse_duration


class AutoscaleConfig(_Frozen):
    """Scale out on a long queue or a full KV cache, in on a quiet fleet, within ``min_hosts``..``max_hosts``."""

    min_hosts: Optional[int] = Field(
        None, ge=1, le=1000,
        description="The fewest serving hosts (Kubernetes: minReplicaCount). Default: 2 when deploy.yaml lists 2 or "
                    "more hosts, else 1; the guides ask for at least two instances in production (one only for "
                    "validation), so autoscale never scales in below it.")
    max_hosts: Optional[int] = Field(
        None, ge=1, le=1000,
        description="The most serving hosts (Kubernetes: maxReplicaCount). Default: every host of deploy.yaml, the "
                    "warm pool included (bare hosts cannot grow past what is provisioned).")
    window_s: Annotated[float, BeforeValidator(parse_duration)] = Field(
        60, ge=0, le=3600,
        description="The window the metrics are read over, in seconds (\"60\" or \"1m\"). A condition is "
                    "'sustained' when every scrape of the window meets it. Default 60 s: KEDA's pollingInterval is "
                    "30 s, so two of its polls.")
    samples: int = Field(
        4, ge=2, le=100,
        description="Scrapes of each engine's /metrics spread evenly over window_s (the first and the last also "
                    "give the window's P99 TTFT).")
    cooldown_s: Annotated[float, BeforeValidator(parse_duration)] = Field(
        300, ge=0, le=86400,
        description="After a scale action, no other one for this many seconds (\"300\" or \"5m\"). Default 300 s: "
                    "KEDA's cooldownPeriod and the HPA's scale-down stabilization window default to 5 minutes.")
    scale_out_kv_usage: float = Field(
        0.85, gt=0, le=1,
        description="Scale out when the serving hosts' mean KV cache usage (0-1) stays above this over the window. "
                    "Default 0.85: the guides' 'KV cache usage above 85% sustained' (slo.max_kv_cache_usage's "
                    "default, the KVCacheUsageHigh alert).")
    scale_out_waiting: float = Field(
        0, ge=0,
        description="Scale out when the requests waiting, summed over the serving hosts, stay above this over the "
                    "window while the window's P99 TTFT is over slo.ttft_p99_s. Default 0: the guides' 'requests "
                    "queued while the latency objective is missed'.")
    scale_in_kv_usage: float = Field(
        0.3, ge=0, lt=1,
        description="Scale in when the mean KV cache usage stays below this over the window, nothing waits, and "
                    "the usage spread over one host fewer (usage × n/(n−1)) stays below this too. The band between "
                    "it and scale_out_kv_usage is the hysteresis that keeps one host from flapping. Default 0.3: "
                    "at most 0.3 × 2 = 0.6 on the hosts left after halving a pair, well under 0.85.")
    prometheus_url: Optional[str] = Field(
        None, pattern=r"^https?://[^\s\"]+$",
        description="A Prometheus that scrapes the engines (render's prometheus/scrape.yaml): `deployctl autoscale` "
                    "reads its window there (query_range) instead of from each engine, and the rendered KEDA "
                    "ScaledObject's triggers query it. Default: none, so autoscale reads the engines' metrics "
                    "routes, and KEDA asks http://prometheus-operated.monitoring.svc:9090 (the Prometheus "
                    "Operator's Service of a Prometheus in namespace monitoring).")

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscaleConfig":
        if self.min_hosts is not None and self.max_hosts is not None and self.min_hosts > self.max_hosts:
            raise ValueError(f"autoscale.min_hosts {self.min_hosts} is above autoscale.max_hosts {self.max_hosts}; "
                             "lower min_hosts or raise max_hosts")
        if self.scale_in_kv_usage >= self.scale_out_kv_usage:
            raise ValueError(f"autoscale.scale_in_kv_usage {self.scale_in_kv_usage} must be below scale_out_kv_usage "
                             f"{self.scale_out_kv_usage} (the band between them is the hysteresis)")
        return self

    def bounds(self, n_hosts: int) -> tuple[int, int]:
        """(min_hosts, max_hosts) with the defaults filled in for a deploy.yaml of ``n_hosts`` hosts."""
        lo = self.min_hosts if self.min_hosts is not None else (2 if n_hosts >= 2 else 1)
        hi = self.max_hosts if self.max_hosts is not None else n_hosts
        return lo, max(lo, hi)
