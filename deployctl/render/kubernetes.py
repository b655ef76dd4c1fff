"""The k8s-rollout target's objects beyond the workload: the Argo Rollouts analysis (render.analysis), the canary
and stable Services it needs, the golden-output Job's config, and the Prometheus Operator objects
(render.monitoring). Called by render.targets with the workload's template context.

Files (under ``k8s/``): analysis-template.yaml (AnalysisTemplate), analysis-config.yaml (ConfigMap: the deploy.yaml
the Job reads), track-services.yaml (canary and stable Services), and render.gateway's inference-pool.yaml and
http-route.yaml; and on both k8s targets scaledobject.yaml (KEDA ScaledObject, deploy.yaml's autoscale:).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from deployctl.render.release import RenderedFile, render_template

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

# The Prometheus Operator's governing Service of a Prometheus named ``prometheus`` in namespace monitoring: the
# AnalysisTemplate's default prometheus-address argument (override it in the Rollout's analysis args).
PROMETHEUS_ADDRESS = "http://prometheus-operated.monitoring.svc:9090"
CONFIG_DIR = "/etc/deployctl"  # where the Job mounts analysis-config.yaml


def deployctl_image() -> str:
    """The image the golden-output Job runs: deployctl at this version (built by the operator; none is published)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"deployctl/deployctl:{version('deployctl')}"
    except PackageNotFoundError:
        return "deployctl/deployctl:latest"


def analysis_config(cfg: DeployConfig) -> dict[str, str]:
    """The ConfigMap data the Job's `deployctl compare-outputs` reads: ``deploy.yaml`` as the model holds it
    (defaults left out) and, when rollout.analysis.outputs.prompts names a file, that file as ``prompts.jsonl``
    (the copy's path in deploy.yaml is the mounted one). Raises ConfigError (exit 3) when it cannot be read."""
    import yaml

    from deployctl.errors import ConfigError

    doc = cfg.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    data = {}
    prompts = cfg.rollout.analysis.outputs.prompts
    if prompts:
        try:
            data["prompts.jsonl"] = Path(prompts).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"rollout.analysis.outputs.prompts {prompts}: {exc.strerror}; the k8s-rollout analysis "
                              "Job needs its content", fix="render where the prompt file is readable") from None
        doc["rollout"]["analysis"]["outputs"]["prompts"] = f"{CONFIG_DIR}/prompts.jsonl"
    return {"deploy.yaml": yaml.safe_dump(doc, sort_keys=False), **data}


def analysis_context(cfg: DeployConfig, client_reasons: str) -> dict:
    """Template values shared by the Rollout's analysis steps and the AnalysisTemplate."""
    from deployctl.render import analysis as an

    a = cfg.rollout.analysis
    return {"a": a, "template_name": f"{cfg.service.name}-canary", "arg_canary": an.ARG_CANARY,
            "arg_stable": an.ARG_STABLE, "analysis_count": an.measurements(cfg),
            "count_per_step": an.counts_per_step(cfg), "measurements": lambda w: an.measurements(cfg, w),
            "analysis_interval": an.window(cfg), "prom_metrics": an.prom_metrics(cfg, client_reasons)}


def rollout_files(cfg: DeployConfig, ctx: dict) -> list[RenderedFile]:
    """analysis-template.yaml, analysis-config.yaml and track-services.yaml for the workload context ``ctx``."""
    from deployctl.engines.command import KEYED_ENV
    from deployctl.render import analysis as an

    name, o = cfg.service.name, cfg.rollout.analysis.outputs
    port = cfg.server.port
    ns = cfg.container.namespace
    config_name = f"{name}-analysis-config"
    command = ["deployctl", "compare-outputs", "--config", f"{CONFIG_DIR}/deploy.yaml",
               "--canary-url", f"http://{name}-canary.{ns}.svc:{port}",
               "--stable-url", f"http://{name}-stable.{ns}.svc:{port}", "--mode", "{{args.outputs-mode}}"]
    count = "{{args.measurements}}" if an.counts_per_step(cfg) else an.measurements(cfg)
    actx = {**ctx, "interval": an.window(cfg), "count": count,
            "inconclusive_limit": an.inconclusive_limit(cfg), "prometheus_address": PROMETHEUS_ADDRESS,
            "deployctl_image": deployctl_image(), "job_command": command, "analysis_config_name": config_name,
            "secret_key": ctx["adapter"].api_key_env or KEYED_ENV,  # the key's name in the Secret (runtime.env)
            "outputs_deadline_s": math.ceil(o.timeout_s * 4) + 60}
    files = [RenderedFile("k8s/analysis-template.yaml", render_template("k8s-analysis.yaml.j2", actx)),
             RenderedFile("k8s/analysis-config.yaml", render_template("k8s-analysis-config.yaml.j2",
                                                                      {**actx, "data": analysis_config(cfg)})),
             RenderedFile("k8s/track-services.yaml", render_template("k8s-track-services.yaml.j2", ctx))]
    from deployctl.render.gateway import gateway_files

    return files + gateway_files(cfg)


__all__ = ["CONFIG_DIR", "PROMETHEUS_ADDRESS", "analysis_config", "analysis_context", "deployctl_image", "rollout_files"]


def scaledobject_file(cfg: DeployConfig, *, rollout: bool) -> Optional[RenderedFile]:
    """k8s/scaledobject.yaml: a KEDA ScaledObject (keda.sh/v1alpha1) on the Deployment or Rollout, min/max replicas
    from autoscale.min_hosts/max_hosts (defaults: deployctl.config.autoscale.AutoscaleConfig.bounds over the hosts),
    Prometheus triggers on the engine's waiting requests and KV cache usage (average value per replica; KEDA's
    prometheus scaler: desired replicas = ceil(query / threshold)); None when the engine exports neither metric."""
    from deployctl.engines import of

    m = of(cfg).metrics
    if not m["waiting"] and not m["kv_usage"]:
        return None
    auto = cfg.autoscale
    lo, hi = auto.bounds(len(cfg.hosts))
    ctx = {"service": cfg.service, "container": cfg.container,
           "target_api": "argoproj.io/v1alpha1" if rollout else "apps/v1",
           "target_kind": "Rollout" if rollout else "Deployment", "min_replicas": lo, "max_replicas": hi,
           "cooldown_s": math.ceil(auto.cooldown_s), "window_s": max(1, math.ceil(auto.window_s)),
           "waiting": m["waiting"], "kv_usage": m["kv_usage"], "job": cfg.slo.prometheus_job or cfg.service.name,
           "prometheus_url": auto.prometheus_url or PROMETHEUS_ADDRESS,
           # one waiting request per replica is the smallest target an AverageValue can hold (it must be above 0)
           "waiting_target": f"{max(1.0, auto.scale_out_waiting):g}", "kv_target": f"{auto.scale_out_kv_usage:g}"}
    return RenderedFile("k8s/scaledobject.yaml", render_template("k8s-scaledobject.yaml.j2", ctx))
