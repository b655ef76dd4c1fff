"""The knee as settings: ``max_num_seqs`` for the engine and the router's limits, in JSON and as a deploy.yaml
fragment ready to paste.

Router limits: ``max_conns_per_host`` is the knee's concurrency (nginx's upstream ``max_conns``: requests over it
wait at the router instead of queueing inside the engine past the knee) and ``rate_limit_rps`` the knee's
rate-limit threshold (deployctl.bench.knee: headroom x the knee's requests/s). The router keys are what the
operations work applies; the engine key is deploy.yaml's ``engine.max_num_seqs``.
"""
from __future__ import annotations

from deployctl.bench.knee import Knee


def recommendation(knee: Knee, url: str = "") -> dict:
    """{"knee_concurrency", "max_num_seqs", "router": {"max_conns_per_host", "rate_limit_rps"}, "criterion",
    "deploy_yaml"}; the numbers are None when no level held."""
    return {
        "knee_concurrency": knee.concurrency,
        "max_num_seqs": knee.recommended_max_num_seqs,
        "router": {"max_conns_per_host": knee.concurrency, "rate_limit_rps": knee.rate_limit_rps},
        "criterion": knee.criterion,
        "deploy_yaml": deploy_fragment(knee, url),
    }


def deploy_fragment(knee: Knee, url: str = "") -> str:
    """YAML text (comments say where the numbers come from); only a comment when no level held."""
    where = f" of {url}" if url else ""
    if knee.concurrency is None:
        return f"# deployctl bench{where}: no level held ({knee.reason}); nothing to recommend\n"
    limits = []
    if knee.ttft_p99_limit_ms is not None:
        limits.append(f"P99 TTFT <= {knee.ttft_p99_limit_ms:g} ms")
    if knee.tpot_p99_limit_ms is not None:
        limits.append(f"P99 TPOT <= {knee.tpot_p99_limit_ms:g} ms")
    lines = [
        f"# deployctl bench{where}: knee at concurrency {knee.concurrency} ({', '.join(limits) or 'no latency limit'}, "
        f"{knee.criterion})",
        "engine:",
        f"  max_num_seqs: {knee.recommended_max_num_seqs}",
        "router:",
        f"  max_conns_per_host: {knee.concurrency}  # requests over this wait at the router",
    ]
    if knee.rate_limit_rps is not None:
        lines.append(f"  rate_limit_rps: {knee.rate_limit_rps:g}  # {knee.headroom:.0%} of the knee's requests/s")
    return "\n".join(lines) + "\n"
