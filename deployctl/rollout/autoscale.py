"""Autoscaling decided from the engines' metrics: a pure ``decide()`` from a window of samples to a ``Decision``.

The inputs (deployctl.rollout.autoscale_run reads them from each serving engine's /metrics):
- ``kv_usage``: the serving hosts' mean KV cache usage (0-1) at each scrape of the window;
- ``waiting``: the requests waiting to be scheduled, summed over the serving hosts, at each scrape;
- ``p99_ttft_s``: the window's P99 TTFT (the TTFT histograms' growth between the first and last scrape, summed
  over the hosts, estimated as Prometheus' histogram_quantile: deployctl.promhist), None with no request.

Rules (thresholds: deploy.yaml ``autoscale:``, deployctl.config.autoscale, whose descriptions give their sources):
- out when the KV usage stays above ``scale_out_kv_usage`` over the whole window, or the requests waiting stay
  above ``scale_out_waiting`` while P99 TTFT is over ``slo.ttft_p99_s``; onto the first warm-pool host;
- in when the KV usage stays below ``scale_in_kv_usage``, nothing waits, and the usage spread over one host fewer
  (usage × n/(n−1)) stays below it too; the last serving host (deploy.yaml's order) goes;
- nothing inside the cooldown, at ``max_hosts`` (out), at ``min_hosts`` (in), or with no warm host to wake.
Every Decision carries its numbers (``numbers``) and a reason that names them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional, Protocol, Sequence

from deployctl.config.autoscale import AutoscaleConfig


class Actor(Protocol):
    """What carries a decision out: ``out(names)`` adds those hosts to the serving fleet, ``in_(names)`` drains
    and removes them (deployctl.rollout.scale's scale_out / scale_in by default)."""

    def out(self, names: list[str]) -> object: ...

    def in_(self, names: list[str]) -> object: ...


@dataclass(frozen=True)
class Window:
    """One window of metrics: ``kv_usage`` and ``waiting`` per scrape (fleet mean / fleet sum), P99 TTFT in s."""

    kv_usage: Sequence[float]
    waiting: Sequence[float]
    p99_ttft_s: Optional[float] = None
    seconds: float = 0.0


@dataclass
class Decision:
    """``action``: "out" | "in" | "none"; ``hosts``: the hosts to add or remove; ``reason`` names the numbers."""

    action: str
    reason: str
    hosts: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def decide(win: Window, *, serving: Sequence[str], warm: Sequence[str], auto: AutoscaleConfig, ttft_slo_s: float,
           n_hosts: int, since_last_s: Optional[float] = None) -> Decision:
    """The decision for one window. ``serving``/``warm``: host names serving now / in the warm pool (deploy.yaml's
    order); ``n_hosts``: hosts in deploy.yaml (for the min/max defaults); ``since_last_s``: seconds since the last
    scale action (None: none in history). Pure: no I/O. Raises ValueError for a window without a scrape."""
    if not win.kv_usage or not win.waiting:
        raise ValueError("decide() needs at least one scrape in the window")
    lo, hi = auto.bounds(n_hosts)
    n = len(serving)
    kv_min, kv_max = min(win.kv_usage), max(win.kv_usage)
    wait_min, wait_max = min(win.waiting), max(win.waiting)
    p99 = win.p99_ttft_s
    nums = {"serving": n, "min_hosts": lo, "max_hosts": hi, "kv_usage_min": round(kv_min, 4),
            "kv_usage_max": round(kv_max, 4), "waiting_min": wait_min, "waiting_max": wait_max,
            "p99_ttft_s": None if p99 is None else round(p99, 4), "ttft_slo_s": ttft_slo_s,
            "window_s": round(win.seconds, 1), "scrapes": len(win.kv_usage),
            "since_last_s": None if since_last_s is None else round(since_last_s, 1)}
    ttft_txt = "no request" if p99 is None else f"{p99:.3f} s"

    def none(reason: str) -> Decision:
        return Decision("none", reason, [], nums)

    out_why = None
    if kv_min > auto.scale_out_kv_usage:
        out_why = (f"KV cache usage stayed above {_pct(auto.scale_out_kv_usage)} (lowest {_pct(kv_min)} over "
                   f"{len(win.kv_usage)} scrapes)")
    elif wait_min > auto.scale_out_waiting and p99 is not None and p99 > ttft_slo_s:
        out_why = (f"{wait_min:g}+ requests waiting all window (most {wait_max:g}) with P99 TTFT {ttft_txt} over "
                   f"slo.ttft_p99_s {ttft_slo_s:g} s")
    in_why = None
    if out_why is None and n > 0 and wait_max == 0 and kv_max < auto.scale_in_kv_usage:
        spread = kv_max * n / (n - 1) if n > 1 else float("inf")
        nums["kv_usage_after_in"] = None if n <= 1 else round(spread, 4)
        if spread < auto.scale_in_kv_usage:
            in_why = (f"KV cache usage stayed below {_pct(auto.scale_in_kv_usage)} (highest {_pct(kv_max)}), nothing "
                      f"waiting, {_pct(spread)} on {n - 1} host(s) after")
        else:
            return none(f"quiet (KV highest {_pct(kv_max)}, nothing waiting) but {n - 1} host(s) would reach "
                        f"{'100%+' if n <= 1 else _pct(spread)} KV, not below scale_in_kv_usage "
                        f"{_pct(auto.scale_in_kv_usage)}: keeping {n}")
    if out_why is None and in_why is None:
        return none(f"within the band: KV {_pct(kv_min)}-{_pct(kv_max)} (out above {_pct(auto.scale_out_kv_usage)}, "
                    f"in below {_pct(auto.scale_in_kv_usage)}), waiting {wait_min:g}-{wait_max:g}, P99 TTFT "
                    f"{ttft_txt} (slo {ttft_slo_s:g} s)")
    if since_last_s is not None and since_last_s < auto.cooldown_s:
        return none(f"would scale {'out' if out_why else 'in'} ({out_why or in_why}) but the last scale action was "
                    f"{since_last_s:.0f} s ago, inside autoscale.cooldown_s {auto.cooldown_s:g} s")
    if out_why is not None:
        if n >= hi:
            return none(f"scale out needed ({out_why}) but {n} host(s) serve, at autoscale.max_hosts {hi}: raise "
                        "max_hosts and add a warm host (hosts[].pool: warm)")
        if not warm:
            return none(f"scale out needed ({out_why}) but no warm host is left (hosts[].pool: warm): provision one")
        return Decision("out", f"{out_why}: {n} -> {n + 1} hosts, waking {warm[0]}", [warm[0]], nums)
    if n <= lo:
        return none(f"scale in possible ({in_why}) but {n} host(s) serve, at autoscale.min_hosts {lo}")
    return Decision("in", f"{in_why}: {n} -> {n - 1} hosts, draining {serving[-1]}", [serving[-1]], nums)
