"""Prometheus Operator objects for the k8s targets, beside the plain rules file: a PrometheusRule carrying the
groups of prometheus/alerts.rules.yaml (render.targets.render_alerts) and a PodMonitor scraping every model-server
pod on the engine's metrics route.

The PodMonitor takes the job label from the pod label ``app.kubernetes.io/name`` (the alerts' default
``job="<service>"``) and copies two pod labels onto every series: ``app.kubernetes.io/name`` as
``deployctl_service`` and Argo's ``rollouts-pod-template-hash`` as ``rollouts_pod_template_hash`` (the
AnalysisTemplate's canary/stable selector, render.analysis). Its scrape interval is a quarter of
rollout.analysis.interval_s (5 s at least), so one analysis window holds several scrapes.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deployctl.render.release import RenderedFile

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

HEADER = "# {name} {kind}. Rendered by deployctl; do not edit.\n"


def object_meta(cfg: DeployConfig, name: str) -> dict:
    """metadata for a rendered Kubernetes object: name, the container target's namespace, deployctl's labels."""
    return {"name": name, "namespace": cfg.container.namespace,
            "labels": {"app.kubernetes.io/name": cfg.service.name, "app.kubernetes.io/managed-by": "deployctl"}}


def scrape_interval(cfg: DeployConfig) -> str:
    return f"{max(5, math.floor(cfg.rollout.analysis.interval_s / 4))}s"


def monitoring_files(cfg: DeployConfig, alerts_text: str) -> list[RenderedFile]:
    """k8s/prometheus-rule.yaml (from ``alerts_text``, the plain rules file) and k8s/pod-monitor.yaml (none for an
    engine without a metrics route)."""
    import yaml

    from deployctl.engines import of
    from deployctl.render.analysis import HASH_LABEL

    route = of(cfg).metrics_route
    if route is None:
        return []
    name = cfg.service.name
    groups = yaml.safe_load(alerts_text)["groups"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": object_meta(cfg, name),
            "spec": {"groups": groups}}
    pod_label = "__meta_kubernetes_pod_label_"
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": object_meta(cfg, name),
               "spec": {"jobLabel": "app.kubernetes.io/name",
                        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                        "namespaceSelector": {"matchNames": [cfg.container.namespace]},
                        "podMetricsEndpoints": [{
                            "port": "http", "path": route, "interval": scrape_interval(cfg),
                            "relabelings": [
                                {"sourceLabels": [pod_label + "app_kubernetes_io_name"],
                                 "targetLabel": "deployctl_service", "action": "replace"},
                                {"sourceLabels": [pod_label + "rollouts_pod_template_hash"],
                                 "targetLabel": HASH_LABEL, "action": "replace"}]}]}}

    def dump(kind: str, doc: dict) -> str:
        return HEADER.format(name=name, kind=kind) + yaml.safe_dump(doc, sort_keys=False, width=120)

    return [RenderedFile("k8s/prometheus-rule.yaml", dump("PrometheusRule (the groups of prometheus/alerts.rules.yaml)", rule)),
            RenderedFile("k8s/pod-monitor.yaml", dump("PodMonitor (scrapes the model-server pods)", monitor))]


__all__ = ["monitoring_files", "scrape_interval"]
