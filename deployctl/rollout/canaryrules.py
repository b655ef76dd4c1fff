"""The rules that judge the canary on its own figures, whatever the client traffic and whatever stable does
(deployctl.rollout.analysis.judge applies them first): a low-traffic window can fail on them, it only cannot pass.

- a canary runtime down (no answer on its metrics route) or restarted within the window: fail, naming the hosts and
  how many restarts were seen (restarts allowed: 0);
- its KV cache usage (the engine's ``kv_usage`` gauge, the highest canary host at the window's end) over
  ``slo.max_kv_cache_usage``, the rendered KVCacheUsageHigh alert's threshold: fail;
- with at least ``rollout.analysis.min_latency_samples`` observations in its own TTFT histogram (client requests
  and deployctl's probes alike), its P99 TTFT / TPOT / E2E over ``slo.ttft_p99_s`` / ``slo.tpot_p99_s`` /
  ``slo.e2e_p99_s`` × ``rollout.analysis.max_slo_factor``: fail (100% against an old baseline still breaks its
  objective). These need the canary's histograms only, never stable's; except that when stable, serving client
  traffic in the same window with as many latency samples, is over the same objective, the window is
  ``inconclusive`` ("SLO breached on stable and canary", ``shared_breach``): the fleet suffers as a whole (a peak,
  a slow network), the canary is not to blame, and the step is held (deployctl.rollout.weightstep), never promoted;
  while stable has too few samples to say, the window stays open (inconclusive) until it has.

Each reason names the number and the limit.
"""
from __future__ import annotations

from typing import Optional

from deployctl.config import DeployConfig


SLO_BOTH = "SLO breached on stable and canary"


def slo_breaches(cfg: DeployConfig, g, side: str = "canary") -> dict[str, str]:
    """{"TTFT" | "TPOT" | "E2E": reason} for each of ``g``'s P99s over its objective × max_slo_factor, each reason
    naming the number and the limit; empty when all are within (or unmeasured, or without an objective)."""
    f = cfg.rollout.analysis.max_slo_factor
    out = {}
    for label, got, slo in (("TTFT", g.p99_ttft_s, cfg.slo.ttft_p99_s), ("TPOT", g.p99_tpot_s, cfg.slo.tpot_p99_s),
                            ("E2E", g.p99_e2e_s, cfg.slo.e2e_p99_s)):
        if got is None or slo is None or got <= slo * f:
            continue
        key = f"slo.{label.lower()}_p99_s"
        out[label] = (f"{side} P99 {label} {got * 1000:.1f} ms > {key} {slo * 1000:g} ms × max_slo_factor {f:g} = "
                      f"{slo * f * 1000:g} ms (SLO)")
    return out


def slo_breach(cfg: DeployConfig, g) -> Optional[str]:
    """The first of the canary's P99 TTFT / TPOT / E2E over its objective × max_slo_factor (slo_breaches), or None."""
    return next(iter(slo_breaches(cfg, g).values()), None)


def shared_breach(cfg: DeployConfig, canary, stable) -> Optional[str]:
    """The inconclusive reason for a canary over its SLO, or None when the breach is its own (a fail).
    ``SLO breached on stable and canary: canary P99 TPOT … ; stable P99 TPOT …`` when stable, with client requests
    and at least ``min_latency_samples`` latency samples of its own in the window, is over an objective the canary
    is over too; ``… stable has N latency samples < min_latency_samples M …`` while stable serves client traffic
    with 1 to M − 1 samples (the window stays open and widens); None when stable serves no client traffic or has no
    latency samples at all (100%, or an engine without histograms: the canary is judged alone)."""
    need = cfg.rollout.analysis.min_latency_samples
    if not stable.requests or not stable.ttft_count:
        return None
    mine = slo_breaches(cfg, canary)
    if stable.ttft_count < need and mine:  # the window widens until stable holds enough to say
        return (f"{next(iter(mine.values()))}; stable has {stable.ttft_count} latency samples < min_latency_samples "
                f"{need}: cannot tell a slow fleet from a slow canary yet")
    theirs = slo_breaches(cfg, stable, "stable")
    both = [k for k in mine if k in theirs]
    if not both:
        return None
    return f"{SLO_BOTH}: {mine[both[0]]}; {theirs[both[0]]}"


def restart_reason(g) -> str:
    """``canary a: the runtime restarted 1 time during the window > restarts allowed 0 (crashed)``; several hosts
    are listed with their counts (``g.restarts``: host -> restarts seen; a host in ``g.restarted`` counts 1 at
    least)."""
    counts = {h: max(1, int(g.restarts.get(h, 1))) for h in g.restarted}
    total = sum(counts.values())
    times = f"{total} time{'s' if total != 1 else ''}"
    per_host = f" ({', '.join(f'{h} {n}' for h, n in counts.items())})" if len(counts) > 1 else ""
    return (f"canary {', '.join(counts)}: the runtime restarted {times} during the window{per_host} > restarts "
            "allowed 0 (crashed)")


def canary_failure(cfg: DeployConfig, g) -> Optional[str]:
    """The reason the canary GroupStats ``g`` fails on its own figures (module doc), or None."""
    broken = canary_broken(cfg, g)
    if broken:
        return broken
    if g.ttft_count >= cfg.rollout.analysis.min_latency_samples:
        return slo_breach(cfg, g)
    return None


def canary_broken(cfg: DeployConfig, g) -> Optional[str]:
    """Down, restarted or over the KV usage threshold: the reason, or None (never excused by stable's figures)."""
    if g.down:
        return f"canary {', '.join(g.down)}: the runtime does not answer /metrics (down or hung)"
    if g.restarted:
        return restart_reason(g)
    limit = cfg.slo.max_kv_cache_usage
    if g.kv_usage is not None and g.kv_usage > limit:
        return (f"canary KV cache usage {g.kv_usage:.1%} > slo.max_kv_cache_usage {limit:.1%} (the KVCacheUsageHigh "
                "alert's threshold)")
    return None
