"""The knee as settings: ``max_num_seqs`` for the engine and the router's limits, in JSON and as a deploy.yaml
fragment ready to paste (or written by ``deployctl bench --apply``, deployctl.bench.apply).

Router limits: ``max_conns_per_host`` (nginx's upstream ``max_conns``; requests beyond it get 429 at the router
instead of queueing inside the engine past the knee) is ``router_limit(knee)``: the knee times the headroom
(0.8), rounded down, at least 1 and below the knee from a knee of 2 up, so that deployctl's own direct requests
(canary probes and golden outputs, which bypass nginx) do not push a host past the knee. ``rate_limit_rps`` is the
knee's rate-limit threshold (deployctl.bench.knee: headroom x the knee's requests/s), a fleet-wide figure: the
fragment shows it as a comment, as ``router.limits.requests_per_s`` is per client. The engine key is deploy.yaml's
``engine.max_num_seqs``.
"""
from __future__ import annotations

import math

from deployctl.bench.knee import Knee


def router_limit(knee: Knee) -> int | None:
    """router.max_conns_per_host for ``knee`` (see the module doc); None when no level held."""
    if knee.concurrency is None:
        return None
    return max(1, min(knee.concurrency - 1, math.floor(knee.concurrency * knee.headroom))) if knee.concurrency > 1 else 1


def recommendation(knee: Knee, url: str = "") -> dict:
    """{"knee_concurrency", "max_num_seqs", "router": {"max_conns_per_host", "rate_limit_rps"}, "criterion",
    "deploy_yaml"}; the numbers are None when no level held."""
    return {
        "knee_concurrency": knee.concurrency,
        "max_num_seqs": knee.recommended_max_num_seqs,
        "router": {"max_conns_per_host": router_limit(knee), "rate_limit_rps": knee.rate_limit_rps},
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
        f"  max_conns_per_host: {router_limit(knee)}  # below the knee: requests beyond get 429 at the router",
    ]
    if knee.rate_limit_rps is not None:
        lines.append(f"  # fleet-wide: {knee.rate_limit_rps:g} requests/s is {knee.headroom:.0%} of the knee's; "
                     "router.limits.requests_per_s is per client")
    return "\n".join(lines) + "\n"
