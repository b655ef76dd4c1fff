"""Canary analysis over a window (../shared/notes/canary-analysis.md).

Client traffic: from the router's JSON access log lines of the window, split by upstream (canary vs stable)
(deployctl.rollout.accesslog: every route's requests and 5xx errors, and the generation requests among them).
Latency: P99 TTFT, TPOT and E2E from the runtimes' Prometheus histograms (the engine adapter's ``ttft``, ``tpot``
and ``e2e`` metrics, deployctl.engines) scraped at the window's start and end; bucket deltas summed over a group's
hosts; quantile as Prometheus' histogram_quantile (deployctl.promhist). The canary's own histograms are read
whenever its engine exports them (its SLO rule needs nothing of stable); stable's only when both sides' engines do.

Verdict from the metrics (``judge``), in this order: ``fail`` on the canary's own figures whatever the traffic
(deployctl.rollout.canaryrules: down, restarted, KV usage over the alert threshold, P99 over slo × max_slo_factor
with ``min_latency_samples``; ``inconclusive`` "SLO breached on stable and canary" when stable is over the same
objective); ``inconclusive`` when the canary served fewer than ``min_requests`` client requests
(every route) or fewer than ``min_client_requests`` generation requests: a quiet window cannot pass, it can only
fail; ``inconclusive`` when a histogram holds NaN, a counter went down without a restart (reset), or stable served
nothing and no earlier window gives a baseline; ``fail`` when its error rate (5xx) is over ``max_error_rate``, when
its 4xx share (400, 404, 422: a model name or body the release refuses; not 401/429, the client's or the limiter's)
exceeds stable's by more than ``max_error_rate``, or a P99
ratio canary/stable is over its limit and the difference exceeds ``min_p99_delta_s`` (with 1 to
``min_latency_samples`` − 1 canary latency samples the window is ``inconclusive`` and stays open: a P99 of a handful
is noise); else ``pass``. The active probes (deployctl.rollout.probes) are judged beside it and combined by
deployctl.rollout.verdicts. Every verdict carries the numbers, the sample sizes and the source.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.service.engine import Engine
from deployctl.rollout.accesslog import count_access_log, upstream_map
from deployctl.rollout.canaryrules import canary_failure, shared_breach
from deployctl.rollout.verdicts import CANNOT_JUDGE, combine, low_traffic


@dataclass
class GroupStats:
    """One side of the comparison over a window. Latencies in seconds (None: no observations)."""

    hosts: list[str]
    requests: int = 0  # client requests via the router, every route (deployctl.rollout.accesslog)
    errors: int = 0
    generations: int = 0  # the generation requests among them (what min_client_requests counts)
    client_errors: int = 0  # 400, 404, 422 among them (deployctl.rollout.accesslog.CLIENT_ERRORS)
    p99_ttft_s: Optional[float] = None
    p99_tpot_s: Optional[float] = None
    p99_e2e_s: Optional[float] = None
    ttft_count: int = 0
    kv_usage: Optional[float] = None  # the highest KV cache usage (0-1) over the hosts at the window's end
    down: list[str] = field(default_factory=list)  # hosts whose runtime did not answer /metrics at window end
    restarted: list[str] = field(default_factory=list)  # hosts whose runtime process changed within the window
    restarts: dict = field(default_factory=dict)  # host -> restarts seen in the window (runtime pids in turn)
    nan: list[str] = field(default_factory=list)  # hosts whose latency histogram holds NaN
    reset: list[str] = field(default_factory=list)  # hosts whose histogram went down with the same process

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def client_error_rate(self) -> float:
        """Share (0-1) of the side's client requests answered 400, 404 or 422."""
        return self.client_errors / self.requests if self.requests else 0.0


@dataclass
class Verdict:
    result: str  # pass | fail | inconclusive
    reason: str
    canary: GroupStats
    stable: GroupStats
    window_s: float
    weight: int = 0
    source: str = "metrics"  # metrics | probes | metrics+probes: what the result rests on
    probes: Optional[dict] = None  # {"canary": ProbeStats, "stable": ProbeStats, "result", "reason"} as JSON
    # signals the canary's engine gives no way to read (Analyzer.cannot_judge): named, never passed silently
    cannot_judge: list[str] = field(default_factory=list)
    baseline: Optional[GroupStats] = None  # the earlier stable figures judge compared with (journal only)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("baseline")
        d["canary"]["error_rate"] = self.canary.error_rate
        d["stable"]["error_rate"] = self.stable.error_rate
        d["canary"]["client_error_rate"] = self.canary.client_error_rate
        d["stable"]["client_error_rate"] = self.stable.client_error_rate
        return d

    def summary(self) -> str:
        """The verdict line. Each side's counts come from different sources and differ on purpose:
        ``req via router`` counts the window's access-log lines for that side (every route: /v1/models too;
        deployctl's probes not) and the generation requests among them (what min_client_requests counts);
        ``TTFT samples`` counts the TTFT histogram observations on that side's runtimes (generation requests only,
        the probes included): ``canary 53 req via router (all routes; 40 generations), … over 2 TTFT samples
        (generations, probes incl.)``."""
        from deployctl.rollout.verdicts import probe_summary

        return (f"{self.result} [{self.source}]: {_side('canary', self.canary)} | {_side('stable', self.stable)}"
                + probe_summary(self.probes)
                + f" | {self.window_s:.1f} s window" + (f" | {self.reason}" if self.reason else "")
                + (f" | cannot judge: {'; '.join(self.cannot_judge)}" if self.cannot_judge else ""))


def _side(label: str, g: "GroupStats") -> str:
    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.1f} ms"

    return (f"{label} {g.requests} req via router (all routes; {g.generations} generations), "
            f"{g.errors} errors ({g.error_rate:.1%}), "
            + (f"{g.client_errors} 4xx ({g.client_error_rate:.1%}), " if g.client_errors else "")
            + f"P99 TTFT {ms(g.p99_ttft_s)}, P99 TPOT {ms(g.p99_tpot_s)}"
            + ("" if g.p99_e2e_s is None else f", P99 E2E {ms(g.p99_e2e_s)}")
            + ("" if g.kv_usage is None else f", KV {g.kv_usage:.0%}")
            + f" over {g.ttft_count} TTFT samples (generations, probes incl.)")


def kv_usage(samples: Optional[list], name: Optional[str]) -> Optional[float]:
    """The highest value of gauge ``name`` in ``samples`` (one host's scrape), None when absent."""
    if not samples or not name:
        return None
    vals = [x.value for x in samples if x.name == name and not math.isnan(x.value)]
    return max(vals) if vals else None


def scrape(host, cfg: DeployConfig, kind: Optional[str] = None) -> Optional[list]:
    """Samples of the metrics route of engine ``kind`` (default engine.kind) on ``host`` (deployctl.promhist), None
    when it cannot be read or the engine exports none."""
    from deployctl.engines import adapter_for
    from deployctl.promhist import PromParseError, parse_text

    route = adapter_for(cfg, kind).metrics_route
    if route is None:  # an engine without metrics (Analyzer(metrics=False) never asks)
        return None
    try:
        r = Engine(host, cfg).http("GET", route, timeout=5)
    except Exception:
        return None
    if r.status != 200:
        return None
    try:
        return parse_text(r.body)
    except PromParseError:
        return None


def _p99(before: dict, after: dict, hosts: list[str], name: str, g: Optional[GroupStats] = None
         ) -> tuple[Optional[float], int]:
    """P99 of histogram ``name`` over the window, pooled over ``hosts``, and the observation count. Hosts whose
    histogram went down (counter reset) or holds NaN are left out and named in ``g.reset`` / ``g.nan``."""
    from deployctl.promhist import histogram

    total = None
    for h in hosts:
        if after.get(h) is None or before.get(h) is None:
            continue
        try:
            d = histogram(after[h], name) - histogram(before[h], name)
        except ValueError:  # counter reset: the runtime restarted inside the window
            if g is not None and h not in g.reset:
                g.reset.append(h)
            continue
        if math.isnan(d.count) or math.isnan(d.sum) or any(math.isnan(n) for _, n in d.buckets):
            if g is not None and h not in g.nan:
                g.nan.append(h)
            continue
        if total is None:
            total = d
        else:
            prev = dict(total.buckets)
            total.buckets = [(le, n + prev.get(le, 0.0)) for le, n in d.buckets]
            total.count += d.count
            total.sum += d.sum
    if total is None or total.count <= 0:
        return None, 0
    q = total.quantile(0.99)
    return (None if math.isnan(q) else q), int(total.count)


def _judge(cfg: DeployConfig, canary: GroupStats, stable: GroupStats, window_s: float, weight: int,
           baseline: Optional[GroupStats]) -> Verdict:
    a = cfg.rollout.analysis
    failure = canary_failure(cfg, canary)  # the canary's own figures: judged whatever the traffic
    shared = shared_breach(cfg, canary, stable) if failure and failure.endswith("(SLO)") else None
    if shared:  # the fleet suffers as a whole: hold the step, neither pass nor blame the canary
        return Verdict("inconclusive", shared, canary, stable, window_s, weight)
    if failure:
        return Verdict("fail", failure, canary, stable, window_s, weight)
    if canary.requests < a.min_requests:
        return Verdict("inconclusive", f"{CANNOT_JUDGE}{canary.requests} canary requests < min_requests "
                                       f"{a.min_requests}", canary, stable, window_s, weight)
    if canary.generations < a.min_client_requests:
        return Verdict("inconclusive", f"{CANNOT_JUDGE}{canary.generations} canary client requests < "
                                       f"min_client_requests {a.min_client_requests} (generation requests via the "
                                       f"router)",
                       canary, stable, window_s, weight)
    for label, hosts in (("NaN in the latency histogram of", canary.nan + stable.nan),
                         ("counter reset (histogram went down) on", canary.reset + stable.reset)):
        if hosts:
            return Verdict("inconclusive", f"{label} {', '.join(hosts)}: latency not comparable this window",
                           canary, stable, window_s, weight)
    # stable's latency counts only while it serves user traffic: with none (e.g. at 100%) its histograms hold
    # the probes' requests on an idle server, no match for a loaded canary; an earlier window's baseline stands in
    # (an engine without metrics: a window where stable served traffic; its latency comes from the probes)
    if stable.requests == 0 and not (baseline and (baseline.ttft_count or baseline.requests)):
        return Verdict("inconclusive", "stable served 0 requests in the window and no earlier window gives a "
                                       "baseline: nothing to compare the canary with", canary, stable, window_s, weight)
    if canary.error_rate > a.max_error_rate:
        return Verdict("fail", f"canary error rate {canary.error_rate:.1%} ({canary.errors}/{canary.requests}) > "
                               f"max_error_rate {a.max_error_rate:.1%} (stable {stable.error_rate:.1%})",
                       canary, stable, window_s, weight)
    extra = canary.client_error_rate - stable.client_error_rate
    if canary.client_errors and extra > a.max_error_rate:
        return Verdict("fail", f"canary 4xx share {canary.client_error_rate:.1%} ({canary.client_errors}/"
                               f"{canary.requests} answered 400/404/422) is {extra:.1%} over stable's "
                               f"{stable.client_error_rate:.1%} ({stable.client_errors}/{stable.requests}) > "
                               f"max_error_rate {a.max_error_rate:.1%}", canary, stable, window_s, weight)
    ref = stable if stable.ttft_count and stable.requests else (baseline or stable)
    if 0 < canary.ttft_count < a.min_latency_samples:
        # a P99 of a handful of samples is noise: keep the window open until it holds enough
        return Verdict("inconclusive", f"{CANNOT_JUDGE}{canary.ttft_count} canary latency samples < "
                                       f"min_latency_samples {a.min_latency_samples}", canary, stable, window_s,
                       weight)
    for label, c, s, limit in (("TTFT", canary.p99_ttft_s, ref.p99_ttft_s, a.max_p99_ttft_ratio),
                               ("TPOT", canary.p99_tpot_s, ref.p99_tpot_s, a.max_p99_tpot_ratio)):
        if c is None or s is None or s <= 0:
            continue
        if c / s > limit and c - s > a.min_p99_delta_s:
            return Verdict("fail", f"canary P99 {label} {c * 1000:.1f} ms is {c / s:.1f}× stable "
                                   f"{s * 1000:.1f} ms > max_p99_{label.lower()}_ratio {limit}",
                           canary, stable, window_s, weight)
    return Verdict("pass", "", canary, stable, window_s, weight)


def judge(cfg: DeployConfig, canary: GroupStats, stable: GroupStats, window_s: float, weight: int = 0,
          baseline: Optional[GroupStats] = None) -> Verdict:
    """The verdict for one window (rules in the module doc). ``baseline`` supplies stable latencies when the
    stable side had none in this window (e.g. at 100%); the Verdict keeps it (for the journal's replay)."""
    v = _judge(cfg, canary, stable, window_s, weight, baseline)
    v.baseline = baseline
    return v


@dataclass
class Window:
    """An analysis window opened with ``open_window`` and judged with ``close``/``evaluate``."""

    started: float
    log_offset: int
    scrapes: dict = field(default_factory=dict)
    pids: dict = field(default_factory=dict)
    probes: Optional[object] = None  # deployctl.rollout.probes.ProbeRunner
    seen: dict = field(default_factory=dict)  # canary host -> the runtime pids seen in turn (restarts counted)

    def note_pids(self, pids: dict) -> dict[str, int]:
        """Add this scrape's pids; return host -> restarts seen since the window opened (pid changes)."""
        for host, pid in pids.items():
            run = self.seen.setdefault(host, [self.pids.get(host)])
            if pid != run[-1]:
                run.append(pid)
        return {h: len([p for p in run[1:] if p is not None]) for h, run in self.seen.items()}


class Analyzer:
    """Measures windows for a split. ``hosts`` maps host name -> deployctl.hosts.Host. Each side is read with its
    own engine's adapter (a mixed fleet: stable on one engine, canary on another): the canary runs engine.kind,
    the stable hosts ``stable_kind`` (default engine.kind). Latency canary/stable comes from the Prometheus
    histograms when both engines export them (``metrics``), else from the active probes on both sides (histograms
    of one engine are not compared with probe timings of another); the canary's own P99 against the SLO, its KV
    usage and liveness from its metrics route whenever it has one (``canary_metrics``).
    ``chat``: the model has a chat template (probes use /v1/chat/completions). ``baseline``: stable's figures from
    an earlier step (used when stable serves nothing, e.g. at 100%)."""

    def __init__(self, cfg: DeployConfig, router, hosts: dict, canary: list[str], stable: list[str], *,
                 stable_kind: Optional[str] = None, chat: bool = True, baseline: Optional[GroupStats] = None):
        from deployctl.engines import adapter_for

        self.cfg, self.router, self.hosts = cfg, router, hosts
        self.canary, self.stable = list(canary), list(stable)
        self.addr = upstream_map(cfg)
        self.baseline = baseline
        self.kinds = {"canary": cfg.engine.kind, "stable": stable_kind or cfg.engine.kind}
        self.adapters = {side: adapter_for(cfg, k) for side, k in self.kinds.items()}
        exports = {side: a.metrics_route is not None for side, a in self.adapters.items()}
        self.canary_metrics = exports["canary"]
        self.metrics = exports["canary"] and exports["stable"]  # latency from the histograms of both sides
        self.chat = chat
        self._runners: list = []

    def cannot_judge(self) -> list[str]:
        """The verdict rules this canary cannot be judged on (deployctl.rollout.blind)."""
        from deployctl.rollout.blind import cannot_judge

        return cannot_judge(self.cfg, self.adapters["canary"], both_metrics=self.metrics)

    def _kind(self, name: str) -> str:
        return self.kinds["canary" if name in self.canary else "stable"]

    def _scrape_all(self) -> tuple[dict, dict]:
        """({host: samples or None}, {host: runtime pid or None}); pids for the canary hosts only. Every host when
        both sides export metrics, the canary hosts alone when only the canary does (its liveness), else none."""
        from deployctl.hosts import run_on_hosts
        from deployctl.service.launcher import runtime_pid

        names = [*self.canary, *self.stable] if self.metrics else (self.canary if self.canary_metrics else [])
        if not names:
            return {}, {}

        def one(h):
            pid = runtime_pid(h, self.cfg) if h.name in self.canary else None
            return scrape(h, self.cfg, self._kind(h.name)), pid

        outs = run_on_hosts([self.hosts[n] for n in names], one, max_workers=self.cfg.rollout.parallel_hosts,
                            deadline_s=90, what="metrics scrape")
        samples = {o.host: (o.value[0] if o.value else None) for o in outs}
        pids = {o.host: (o.value[1] if o.value else None) for o in outs}
        return samples, pids

    def _start_probes(self):
        from deployctl.service.http import api_key
        from deployctl.rollout.probes import ProbeRunner, host_url, target

        p = self.cfg.rollout.analysis.probes
        if not p.enabled or not p.requests:
            return None
        by = {h.name: h for h in self.cfg.hosts}
        targets = {n: target(host_url(self.cfg, by[n]), self.cfg.model.name, chat=self.chat, api_key=api_key(self.cfg))
                   for n in [*self.canary, *self.stable]}
        r = ProbeRunner(targets, requests=p.requests, max_tokens=p.max_tokens, timeout=p.timeout_s,
                        spread_s=self.cfg.rollout.analysis.interval_s).start()
        self._runners.append(r)
        return r

    def open_window(self) -> Window:
        samples, pids = self._scrape_all()
        log_size = self.router.access_log_size() if self.router is not None else 0
        return Window(time.monotonic(), log_size, samples, pids, self._start_probes())

    def close(self) -> None:
        """Stop the probes of every window opened."""
        for r in self._runners:
            r.stop()
        self._runners.clear()

    def evaluate(self, w: Window, weight: int = 0) -> Verdict:
        """Judge the window from its start to now (the window stays open: call again later to widen it)."""
        text, _ = self.router.access_log_since(w.log_offset) if self.router is not None else ("", 0)
        counts = count_access_log(text, self.addr)
        after, pids = self._scrape_all()
        restarts = w.note_pids(pids)

        def metric(side, role):
            return self.adapters[side].metrics[role]

        groups = []
        for side, names in (("canary", self.canary), ("stable", self.stable)):
            g = GroupStats(hosts=names)
            for n in names:
                c = counts.get(n)
                if c is not None:
                    g.requests, g.errors, g.generations = (g.requests + c.requests, g.errors + c.errors,
                                                           g.generations + c.generations)
                    g.client_errors += c.client_errors
            # the canary's histograms judge its SLO alone; stable's are read only to compare both sides
            histograms = self.canary_metrics if side == "canary" else self.metrics
            ttft, tpot, e2e = (metric(side, r) if histograms else None for r in ("ttft", "tpot", "e2e"))
            if ttft:
                g.p99_ttft_s, g.ttft_count = _p99(w.scrapes, after, names, ttft, g)
            if tpot:
                g.p99_tpot_s, _ = _p99(w.scrapes, after, names, tpot, g)
            if e2e:
                g.p99_e2e_s, _ = _p99(w.scrapes, after, names, e2e, g)
            kv = [u for u in (kv_usage(after.get(n), metric(side, "kv_usage")) for n in names)
                  if u is not None]
            g.kv_usage = max(kv) if kv else None
            groups.append(g)
        if self.canary_metrics:
            groups[0].down = [n for n in self.canary if after.get(n) is None]
            groups[0].restarted = [n for n in self.canary if n not in groups[0].down and w.pids.get(n) != pids.get(n)]
            groups[0].restarts = {n: restarts.get(n, 0) for n in groups[0].restarted}
        canary, stable = groups
        v = judge(self.cfg, canary, stable, time.monotonic() - w.started, weight, self.baseline)
        if stable.requests and (stable.ttft_count or not self.metrics):
            self.baseline = stable
        # without histograms on both sides the probes judge latency in every window, not only in quiet ones
        v = combine(v, self._probe_verdict(w, latency=low_traffic(v) or not self.metrics),
                    self.cfg.rollout.analysis.min_client_requests)
        v.cannot_judge = self.cannot_judge()
        return v

    def _probe_verdict(self, w: Window, latency: bool):
        from deployctl.rollout.probes import summarize
        from deployctl.rollout.verdicts import judge_probes, probe_json

        if w.probes is None:
            return None
        res = w.probes.snapshot()
        c, s = summarize(res, self.canary), summarize(res, self.stable)
        result, reason = judge_probes(self.cfg.rollout.analysis, c, s, latency=latency)
        return result, reason, probe_json(c, s, result, reason)
