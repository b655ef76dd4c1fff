"""`deployctl autoscale`: read a window of the serving engines' metrics, decide (deployctl.rollout.autoscale.decide),
write the decision with its numbers to history, and act through an ``Actor`` unless it is a dry run.

Metrics come from Prometheus when ``autoscale.prometheus_url`` is set (deployctl.rollout.autoscale_prom), else
from each serving engine's metrics route (deployctl.rollout.analysis.scrape: the engine adapter's
names for ``kv_usage``, ``waiting`` and ``ttft``: vLLM's ``vllm:kv_cache_usage_perc`` /
``vllm:num_requests_waiting``, the bundled runtime's ``deployctl_runtime_*``). The serving and warm-pool hosts are
deployctl.rollout.scale's ``serving(cfg)`` / ``warm_pool(cfg)`` (membership and cordons as the hosts record them).
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.errors import RemoteError
from deployctl.rollout.autoscale import Actor, Decision, Window, decide

# history actions that count as a scale action for the cooldown (ours, and `deployctl scale out|in`'s)
SCALE_ACTIONS = ("scale-out", "scale-in")


class ScaleActor:
    """The default actor: deployctl.rollout.scale's scale_out / scale_in, imported when first used."""

    def __init__(self, cfg: DeployConfig, say: Callable[[str], None] = print):
        self.cfg, self.say = cfg, say

    def out(self, names: list[str]) -> object:
        from deployctl.rollout import scale  # the scale commands' module (issue 42)

        return scale.scale_out(self.cfg, names, say=self.say)

    def in_(self, names: list[str]) -> object:
        from deployctl.rollout import scale

        return scale.scale_in(self.cfg, names, say=self.say)


def pools(cfg: DeployConfig) -> tuple[list[str], list[str]]:
    """(serving, warm) host names, as deployctl.rollout.scale sees them (membership and cordons on the hosts)."""
    from deployctl.rollout import scale
    return list(scale.serving(cfg)), list(scale.warm_pool(cfg))


def since_last_scale(history: list[dict], now: Optional[float] = None) -> Optional[float]:
    """Seconds since the newest scale action in ``history`` (a scale-out/-in record, or an autoscale record that
    acted), None when there is none."""
    now = time.time() if now is None else now
    for rec in reversed(history):
        if rec.get("action") in SCALE_ACTIONS or (rec.get("action") == "autoscale" and rec.get("acted")):
            try:
                t = datetime.fromisoformat(str(rec["time"]).replace("Z", "+00:00")).timestamp()
            except (KeyError, ValueError):
                continue
            return max(0.0, now - t)
    return None


def read_window(fleet, cfg: DeployConfig, serving: list[str], *, sleep=time.sleep) -> Window:
    """``autoscale.samples`` scrapes of every serving engine spread over ``autoscale.window_s``. Raises RemoteError
    (exit 4) when a scrape reads no engine at all."""
    from deployctl.engines import metric
    from deployctl.promhist import histogram
    from deployctl.rollout.analysis import scrape

    auto, kind = cfg.autoscale, cfg.engine.kind
    kv_name, wait_name, ttft_name = metric(kind, "kv_usage"), metric(kind, "waiting"), metric(kind, "ttft")
    kvs, waits, first, last = [], [], {}, {}
    start = time.monotonic()
    for i in range(auto.samples):
        if i:
            sleep(auto.window_s / (auto.samples - 1))
        got = {n: scrape(fleet.hosts[n], cfg) for n in serving}
        read = {n: s for n, s in got.items() if s}
        if not read:
            raise RemoteError(f"autoscale: no serving engine's metrics could be read ({', '.join(serving)})",
                              fix="check the engines with `deployctl status`; autoscale decides nothing blind")
        kv = [max((x.value for x in s if x.name == kv_name), default=0.0) for s in read.values()]
        kvs.append(sum(kv) / len(kv))
        waits.append(sum(sum(x.value for x in s if x.name == wait_name) for s in read.values()))
        for n, s in read.items():
            first.setdefault(n, s)
            last[n] = s
    p99 = None
    if ttft_name:
        h = None
        for n in last:
            try:
                d = histogram(last[n], ttft_name) - histogram(first[n], ttft_name)
            except ValueError:  # the engine restarted in the window
                continue
            if h is None:
                h = d
            else:
                h.buckets = [(le, c + dict(d.buckets).get(le, 0.0)) for le, c in h.buckets]
                h.count += d.count
        if h is not None and h.count > 0:
            p99 = h.quantile(0.99)
    return Window(kvs, waits, p99, time.monotonic() - start)


def autoscale_once(cfg: DeployConfig, *, actor: Optional[Actor] = None, dry_run: bool = False,
                   say: Callable[[str, str], None] = lambda level, msg: None, sleep=time.sleep) -> Decision:
    """One window, one decision, one history record (action ``autoscale``, result out | in | none, the numbers,
    ``acted``); acts through ``actor`` (default ScaleActor) unless ``dry_run`` or the decision is none. While a
    deploy or rollback is in progress (state/rollout.json) it decides nothing. Raises RemoteError (exit 4) when no
    serving engine's metrics can be read or no host's state can be written."""
    from deployctl.rollout.fleet import Fleet

    serving, warm = pools(cfg)
    fleet = Fleet(cfg, say)
    try:
        fleet.connect()
        st = fleet.store.read_rollout()
        if st is not None and st.in_progress:  # a deploy or rollback moves weights and hosts: decide nothing
            d = Decision("none", f"a {st.action} of {st.release} is {st.status} (started by {st.owner}): no scaling "
                                 "until it ends", [], {"rollout_status": st.status})
        else:
            if cfg.autoscale.prometheus_url:
                from deployctl.rollout.autoscale_prom import read_window_prometheus

                win = read_window_prometheus(cfg, serving)
            else:
                win = read_window(fleet, cfg, serving, sleep=sleep)
            since = since_last_scale(fleet.store.read_history())
            d = decide(win, serving=serving, warm=warm, auto=cfg.autoscale, ttft_slo_s=cfg.slo.ttft_p99_s,
                       n_hosts=len(cfg.hosts), since_last_s=since)
        acted = False
        if d.action != "none" and not dry_run:
            actor = actor or ScaleActor(cfg, lambda m: say("info", m))
            (actor.out if d.action == "out" else actor.in_)(d.hosts)
            acted = True
        said = f"dry run, nothing done: {d.reason}" if dry_run and d.action != "none" else d.reason
        fleet.store.append_history("autoscale", release=None, result=d.action, reason=said, hosts=d.hosts,
                                   numbers=d.numbers, acted=acted, dry_run=dry_run)
        return d
    finally:
        fleet.close()
