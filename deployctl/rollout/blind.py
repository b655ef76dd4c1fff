"""What a canary cannot be judged on: the analysis rules (deployctl.rollout.analysis) whose signal the canary's
engine gives no way to read. A generic server (engine.kind openai) declares only the metrics it has; the rules it
leaves without a signal are named in every verdict ("cannot judge: ..."), never passed silently.

The SLO rule (deployctl.rollout.canaryrules) reads the canary's own histograms only, so it is named whenever the
canary exports no histogram for an objective, whatever stable runs; the canary/stable ratio rule needs histograms on
both sides, or the active probes stand in for it."""
from __future__ import annotations

OBJECTIVES = (("ttft", "TTFT", "slo.ttft_p99_s"), ("tpot", "TPOT", "slo.tpot_p99_s"), ("e2e", "E2E", "slo.e2e_p99_s"))


def cannot_judge(cfg, a, *, both_metrics: bool) -> list[str]:
    """One phrase per rule the canary on adapter ``a`` (deployctl.engines.Adapter) cannot be judged on, naming the
    signal and why; [] for an engine that exports everything. ``both_metrics``: both sides export latency
    histograms (else the active probes judge the canary/stable latency ratio, when they are on)."""
    probes = cfg.rollout.analysis.probes
    has_probes = probes.enabled and probes.requests > 0
    name = f"{a.kind} (engine.server)" if a.kind == "openai" else a.kind
    out = []
    if a.metrics_route is None:
        out.append(f"a restart or hang inside the window ({name} has no metrics route; readiness and the router's "
                   "errors stand in)")
    if a.metrics_route is None or a.metrics["kv_usage"] is None:
        out.append(f"KV cache usage against slo.max_kv_cache_usage ({name} exports no kv_usage metric)")
    ratio_blind = not both_metrics and not has_probes
    if ratio_blind:
        out.append("P99 TTFT / TPOT against stable (no latency histograms on both sides and rollout.analysis.probes "
                   "is off)")
    slo = {"ttft": cfg.slo.ttft_p99_s, "tpot": cfg.slo.tpot_p99_s, "e2e": cfg.slo.e2e_p99_s}
    for role, label, key in OBJECTIVES:
        if a.metrics_route is not None and a.metrics[role] is not None:
            continue
        ratio = " and against stable" if both_metrics and role != "e2e" else ""
        if slo[role] is not None:
            out.append(f"P99 {label} against {key}{ratio} ({name} exports no {role} histogram)")
        elif ratio:
            out.append(f"P99 {label} against stable ({name} exports no {role} histogram)")
    return out
