"""What a canary cannot be judged on: the analysis rules (deployctl.rollout.analysis) whose signal the canary's
engine gives no way to read. A generic server (engine.kind openai) declares only the metrics it has; the rules it
leaves without a signal are named in every verdict ("cannot judge: ..."), never passed silently."""
from __future__ import annotations


def cannot_judge(cfg, a, *, both_metrics: bool) -> list[str]:
    """One phrase per rule the canary on adapter ``a`` (deployctl.engines.Adapter) cannot be judged on, naming the
    signal and why; [] for an engine that exports everything. ``both_metrics``: both sides export latency
    histograms (else the active probes judge latency, when they are on)."""
    probes = cfg.rollout.analysis.probes
    has_probes = probes.enabled and probes.requests > 0
    name = f"{a.kind} (engine.server)" if a.kind == "openai" else a.kind
    out = []
    if a.metrics_route is None:
        out.append(f"a restart or hang inside the window ({name} has no metrics route; readiness and the router's "
                   "errors stand in)")
    if a.metrics_route is None or a.metrics["kv_usage"] is None:
        out.append(f"KV cache usage against slo.max_kv_cache_usage ({name} exports no kv_usage metric)")
    if not both_metrics and not has_probes:
        out.append("P99 TTFT / TPOT (no latency histograms on both sides and rollout.analysis.probes is off)")
    elif both_metrics:
        for role, label in (("ttft", "P99 TTFT"), ("tpot", "P99 TPOT")):
            if a.metrics[role] is None:
                out.append(f"{label} ({name} exports no {role} metric)")
    if cfg.slo.e2e_p99_s is not None and (not both_metrics or a.metrics["e2e"] is None):
        out.append(f"P99 E2E against slo.e2e_p99_s ({name} exports no e2e histogram)")
    return out
