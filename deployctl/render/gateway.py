"""Gateway API inference routing for the k8s-rollout target: two InferencePools (inference.networking.k8s.io/v1,
the Gateway API inference extension) holding the stable and the canary model-server pods, and an HTTPRoute whose
backend weights carry the canary split, for clusters that route through an inference gateway instead of Argo's
replica-count split.

Pool membership comes from Argo's ephemeral pod metadata: the Rollout's canaryMetadata/stableMetadata put
``deployctl/track: canary`` or ``stable`` on the pods of each side (render.targets' Rollout). The HTTPRoute is rendered
with everything on stable (``http_route(cfg, canary_weight)`` renders any split: set it per step, e.g. with
`kubectl apply` of a render at that weight, as the nginx router is rendered for SSH fleets).

The extension's endpoint picker (EPP) scores pods by three gauges of the model server protocol
(gateway-api-inference-extension docs/proposals/003-model-server-protocol): TotalQueuedRequests,
TotalRunningRequests and KVCacheUtilization (a 0–1 fraction), read under the names its flags
``--total-queued-requests-metric``, ``--total-running-requests-metric``, ``--kv-cache-usage-percentage-metric`` give
(vLLM's names by default). ``epp_metric_flags`` maps them to the engine adapter's ``waiting``, ``running`` and
``kv_usage`` metrics. The EPP itself (its Deployment and Service ``<service>-epp``) comes from the extension's own
install and is not rendered here.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deployctl.render.monitoring import object_meta
from deployctl.render.release import RenderedFile

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

POOL_API = "inference.networking.k8s.io/v1"
TRACK_LABEL = "deployctl/track"
EPP_PORT = 9002  # the EPP's ext-proc gRPC port in the extension's manifests
GATEWAY = "inference-gateway"  # the Gateway the HTTPRoute attaches to, in the service's namespace
EPP_FLAGS = {"waiting": "--total-queued-requests-metric", "running": "--total-running-requests-metric",
             "kv_usage": "--kv-cache-usage-percentage-metric"}


def epp_metric_flags(kind) -> dict[str, str]:
    """{EPP flag: the engine's metric name} for engine ``kind`` (a kind, or an Adapter such as
    ``engines.of(cfg)``; flags of metrics it lacks are left out)."""
    from deployctl.engines import adapter

    m = (adapter(kind) if isinstance(kind, str) else kind).metrics
    return {flag: m[role] for role, flag in EPP_FLAGS.items() if m[role]}


def inference_pools(cfg: DeployConfig) -> list[dict]:
    name = cfg.service.name
    return [{"apiVersion": POOL_API, "kind": "InferencePool", "metadata": object_meta(cfg, f"{name}-{track}"),
             "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": name, TRACK_LABEL: track}},
                      "targetPorts": [{"number": cfg.server.port}],
                      "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": EPP_PORT},
                                            "failureMode": "FailClose"}}}
            for track in ("stable", "canary")]


def http_route(cfg: DeployConfig, canary_weight: int = 0) -> dict:
    """The HTTPRoute sending ``canary_weight`` percent to the canary pool and the rest to stable."""
    name = cfg.service.name
    backends = [{"group": POOL_API.split("/")[0], "kind": "InferencePool", "name": f"{name}-{track}", "weight": w}
                for track, w in (("stable", 100 - canary_weight), ("canary", canary_weight))]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": object_meta(cfg, name),
            "spec": {"parentRefs": [{"name": GATEWAY}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                                "backendRefs": backends,
                                "timeouts": {"request": f"{math.ceil(cfg.server.request_timeout_s)}s"}}]}}


def gateway_files(cfg: DeployConfig) -> list[RenderedFile]:
    """k8s/inference-pool.yaml (both pools) and k8s/http-route.yaml (all on stable)."""
    import yaml

    from deployctl.engines import of

    flags = epp_metric_flags(of(cfg))
    head = (f"# {cfg.service.name} InferencePools (Gateway API inference extension). Rendered by deployctl; do not edit.\n"
            f"# The endpoint picker reads {cfg.engine.kind}'s gauges; start it with:\n"
            + "".join(f"#   {flag}={name}\n" for flag, name in flags.items())
            + ("" if flags else f"#   ({cfg.engine.kind} exports none of them: the picker cannot score its pods)\n"))
    pools = head + "".join("---\n" + yaml.safe_dump(p, sort_keys=False) for p in inference_pools(cfg))
    route = (f"# {cfg.service.name} HTTPRoute: the canary split as backend weights (0% canary here). Rendered by "
             "deployctl; do not edit.\n" + yaml.safe_dump(http_route(cfg), sort_keys=False))
    return [RenderedFile("k8s/inference-pool.yaml", pools), RenderedFile("k8s/http-route.yaml", route)]


__all__ = ["EPP_FLAGS", "GATEWAY", "POOL_API", "TRACK_LABEL", "epp_metric_flags", "gateway_files", "http_route",
           "inference_pools"]
