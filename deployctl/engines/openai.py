"""``engine.kind: openai``: any OpenAI-compatible server, described in deploy.yaml's ``engine.server``
(deployctl.config.openai_server). ``from_spec`` turns that description into an Adapter, so render, deploy,
analysis and rollback drive it as they drive a known engine; ``ADAPTER`` is the description-less fallback used when
only the kind is known (the other side of a mixed fleet, read from release.json): no metrics, /health.

The command is a template: ``argv`` holds it whole and ``flags`` stays empty (deployctl spells no flag of a server
it does not know); ``uses`` lists the settings its placeholders name (``Adapter.has``).
"""
from __future__ import annotations

import string

from deployctl.engines.base import Adapter, ErrorShare, Metrics

ADAPTER = Adapter(
    kind="openai", distribution=None, module="", image=None, argv=(), flags={}, api_key_env=None,
    ready_route="/health", live_route="/health", metrics_route=None, metrics=Metrics(None, {}), ready_log="",
    drain="declared in deploy.yaml (engine.server)", keep_alive_fixed_s=5.0, sleep=None,
)


def placeholders(command) -> tuple[str, ...]:
    """The ``{names}`` the command template uses, in order, each once."""
    out: list[str] = []
    for word in command:
        for _, name, _, _ in string.Formatter().parse(word):
            if name and name not in out:
                out.append(name)
    return tuple(out)


def from_spec(spec) -> Adapter:
    """The Adapter of the server ``spec`` (an OpenAIServerConfig, duck-typed) describes. Metric roles it leaves out
    are None (the analysis names them as signals it cannot judge); its stop signal, drain and probe bounds are
    rendered like a known engine's."""
    uses = tuple(p for p in placeholders(spec.command) if p not in ("python", "bin"))
    prefix = None
    if spec.metrics:
        names = list(spec.metrics.values())
        prefix = next((n[:n.index(":") + 1] for n in names if ":" in n), None)
    share = spec.error_share
    return Adapter(
        kind="openai",
        distribution=spec.distribution,
        module=spec.module or (spec.distribution or "").replace("-", "_"),
        image=spec.image,
        argv=tuple(spec.command),
        flags={},
        uses=uses,
        api_key_env=spec.api_key_env,
        ready_route=spec.ready_route,
        live_route=spec.live_route or spec.ready_route,
        metrics_route=spec.metrics_route,
        metrics=Metrics(prefix, dict(spec.metrics)),
        ready_log=spec.ready_log,
        drain=spec.drain,
        sigterm_drains=spec.sigterm_drains,
        stop_signal=spec.stop_signal,
        stop_overhead_s=spec.stop_overhead_s,
        probe_timeout_s=spec.probe_timeout_s,
        error_share=ErrorShare(share.counter, share.errors, share.total) if share else None,
        sse_done=spec.sse_done,
        # the template sizes the cache itself: preflight compares that count with the plan (preflight.capacity)
        explicit_cache="num_gpu_blocks" in uses,
        model_name_is_path=spec.model_name_is_path,
        keep_alive_fixed_s=spec.keep_alive_s,
        sleep=None,
    )
