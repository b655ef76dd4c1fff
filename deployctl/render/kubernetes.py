"""The k8s-rollout target's objects beyond the workload: the Argo Rollouts analysis (render.analysis), the canary
and stable Services it needs, the golden-output Job's config, and the Prometheus Operator objects
(render.monitoring). Called by render.targets with the workload's template context.

Files (under ``k8s/``): analysis-template.yaml (AnalysisTemplate), analysis-config.yaml (ConfigMap: the deploy.yaml
the Job reads), track-services.yaml (canary and stable Services).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deployctl.render.release import RenderedFile, render_template

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

# The Prometheus Operator's governing Service of a Prometheus named ``prometheus`` in namespace monitoring: the
# AnalysisTemplate's default prometheus-address argument (override it in the Rollout's analysis args).
PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"


def deployctl_image() -> str:
    """The image the golden-output Job runs: deployctl at this version (built by the operator; none is published)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"deployctl/deployctl:{version('deployctl')}"
    except PackageNotFoundError:
        return "deployctl/deployctl:latest"


def deploy_yaml(cfg: DeployConfig) -> str:
    """deploy.yaml as the model holds it (defaults left out): what the Job's `deployctl compare-outputs` reads."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True, by_alias=True), sort_keys=False)


def analysis_context(cfg: DeployConfig, client_reasons: str) -> dict:
    """Template values shared by the Rollout's analysis steps and the AnalysisTemplate."""
    from deployctl.render import analysis as an

    a = cfg.rollout.analysis
    return {"a": a, "template_name": f"{cfg.service.name}-canary", "arg_canary": an.ARG_CANARY,
            "arg_stable": an.ARG_STABLE, "analysis_count": an.measurements(cfg),
            "analysis_interval": an.window(cfg), "prom_metrics": an.prom_metrics(cfg, client_reasons)}


def rollout_files(cfg: DeployConfig, ctx: dict) -> list[RenderedFile]:
    """analysis-template.yaml, analysis-config.yaml and track-services.yaml for the workload context ``ctx``."""
    from deployctl.engines.command import KEYED_ENV
    from deployctl.render import analysis as an

    name, o = cfg.service.name, cfg.rollout.analysis.outputs
    port = cfg.server.port
    ns = cfg.container.namespace
    config_name = f"{name}-analysis-config"
    command = ["deployctl", "compare-outputs", "--config", "/etc/deployctl/deploy.yaml",
               "--canary-url", f"http://{name}-canary.{ns}.svc:{port}",
               "--stable-url", f"http://{name}-stable.{ns}.svc:{port}", "--mode", "exact"]
    actx = {**ctx, "interval": an.window(cfg), "count": an.measurements(cfg),
            "inconclusive_limit": an.inconclusive_limit(cfg), "prometheus_address": PROMETHEUS_ADDRESS,
            "deployctl_image": deployctl_image(), "job_command": command, "analysis_config_name": config_name,
            "secret_key": ctx["adapter"].api_key_env or KEYED_ENV,  # the key's name in the Secret (runtime.env)
            "outputs_deadline_s": math.ceil(o.timeout_s * 4) + 60}
    files = [RenderedFile("k8s/analysis-template.yaml", render_template("k8s-analysis.yaml.j2", actx)),
             RenderedFile("k8s/analysis-config.yaml", render_template("k8s-analysis-config.yaml.j2",
                                                                      {**actx, "deploy_yaml": deploy_yaml(cfg)})),
             RenderedFile("k8s/track-services.yaml", render_template("k8s-track-services.yaml.j2", ctx))]
    return files


__all__ = ["PROMETHEUS_ADDRESS", "analysis_context", "deploy_yaml", "deployctl_image", "rollout_files"]
