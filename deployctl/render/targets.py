"""`deployctl render`: every file of a target for every host, written under one output directory.

Layout under ``out_dir`` (paths are stable; tests keep golden copies):
- systemd:     ``hosts/<host>/`` release files (see render.render_release), ``router/<service>.conf``
               (plus ``control/`` deployctl-<service>-autoscale.service and .timer: render.autoscale),
               (all hosts stable; with the key in the environment ``router/<service>.conf.keys``, 0600, the keys
               file it includes: copy it beside the conf as ``<router.upstream_conf>.keys``) with ``router/<service>.mtail`` and ``router/mtail.default`` (render.watch),
               ``prometheus/alerts.rules.yaml``, ``prometheus/scrape.yaml`` (render_scrape),
               ``grafana/<service>.json`` (render.dashboard)
- container:   ``hosts/<host>/`` Dockerfile, compose.yaml, runtime.yaml, runtime.env, plus the router, alerts and
               scrape config
- k8s, k8s-rollout: ``k8s/`` configmap.yaml, deployment.yaml or rollout.yaml, service.yaml, runtime.env,
               prometheus-rule.yaml, pod-monitor.yaml (render.monitoring), and alerts; k8s-rollout adds the analysis,
               track Services and gateway objects of render.kubernetes

The same inputs (deploy.yaml, API key, release id, templates) give the same bytes. The default release id is
render.new_release_id's (as `deployctl deploy` names releases), at SOURCE_DATE_EPOCH when set.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from deployctl.errors import ConfigError, UsageError
from deployctl import settings
from deployctl.config import layout
from deployctl.render.release import (RenderedFile, _check_api_key, new_release_id, release_context, render_nginx, render_release,
                                      render_template, runtime_args)

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

TARGETS = ("systemd", "container", "k8s", "k8s-rollout")
# request_rejected_total{reason} values that are the client's fault, and those that mean "prompt too long".
LENGTH_REASONS = "context_length_exceeded|length|too_long"
CLIENT_REASONS = LENGTH_REASONS + "|invalid_request|invalid_request_error|bad_request"
ENDPOINTS_DROP_S = 5  # a pod's preStop wait for its endpoints (Service, InferencePool) to stop sending it requests


def runtime_version() -> str:
    """The installed deployctl-runtime distribution's version (metadata only: never imports it), or 'unknown'."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deployctl-runtime")
    except PackageNotFoundError:
        return "unknown"


# Rendered files holding API keys (0600; RENDER.json records no hash of them)
SECRET_FILES = ("runtime.env", ".conf.keys")


def api_key_from_env(cfg: DeployConfig, env: Mapping[str, str]) -> str | None:
    """The API keys the runtime accepts, as runtime.env holds them: the key named by server.api_key_env and,
    during a rotation, the one named by server.next_api_key_env after a comma (the bundled runtime splits
    DEPLOYCTL_RUNTIME_API_KEY on commas and accepts each). Raises ConfigError (exit 3) when a variable is unset or
    a key holds a comma."""
    names = [n for n in (cfg.server.api_key_env, cfg.server.next_api_key_env) if n]
    values = []
    for name in names:
        which = "server.api_key_env" if name == cfg.server.api_key_env else "server.next_api_key_env"
        value = env.get(name)
        if not value:
            raise ConfigError(f"{which} is {name} but {name} is not set in this environment",
                              fix=f"export {name}=<key> (it is written only to the 0600 runtime.env)")
        if "," in value:
            raise ConfigError(f"the key in {name} holds a comma, which separates keys in runtime.env",
                              fix="generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        values.append(value)
    return ",".join(values) or None


def _pct(share: float) -> str:
    return f"{share * 100:g}%"


def _error_terms(a, job: str) -> dict | None:
    """The error-share alert's terms: ``failed`` (rejections that are not the client's fault, requests that
    ended with an error mid-generation where the engine counts them: Adapter.error_finish) over ``all`` (finished
    plus rejected); each ``or vector(0)`` so a counter without series yet does not empty the sum. None when the
    engine has neither counter."""
    m, sel = a.metrics, f'job="{job}"'
    failed = []
    if m["rejected"]:
        failed.append(f'(sum(rate({m["rejected"]}{{{sel}, reason!~"{CLIENT_REASONS}"}}[5m])) or vector(0))')
    if m["success"] and a.error_finish:
        failed.append(f'(sum(rate({m["success"]}{{{sel}, {a.error_finish}}}[5m])) or vector(0))')
    if not failed or not m["success"]:
        return None
    everything = [f'sum(rate({m["success"]}{{{sel}}}[5m]))']
    if m["rejected"]:
        everything.append(f'(sum(rate({m["rejected"]}{{{sel}}}[5m])) or vector(0))')
    return {"failed": failed, "all": everything}


# DeployctlEngineStalled: requests running or waiting through this whole window and no token generated in it
# (runbooks/engine-stalled.yaml); a Prometheus duration
STALL_WINDOW = "2m"
# DeployctlRuntimeFlapping: a target up for under max_up_share of its scrapes in window (avg_over_time of up) that
# went down and came back at least twice in it (changes >= min_changes), for "for"; a target down throughout is
# DeployctlRuntimeDown's, one outage and recovery is neither
FLAP = {"window": "10m", "max_up_share": 0.9, "min_changes": 4, "for": "5m"}


def render_alerts(cfg: DeployConfig, *, per_host: bool = True) -> RenderedFile:
    """Prometheus alert rules from deploy.yaml ``slo:`` (prometheus/alerts.rules.yaml). ``per_host``: the rules
    that name deploy.yaml's hosts by the ``deployctl_host`` label of prometheus/scrape.yaml (a host's target gone,
    disk from node_exporter); False for the k8s targets, whose pods are found by their PodMonitor."""
    from deployctl.config.models import DISK_FAIL_BYTES, DISK_WARN_BYTES
    from deployctl.config.units import format_bytes
    from deployctl.engines import METRIC_ROLES, of

    a = of(cfg)
    ctx = {"service": cfg.service, "slo": cfg.slo, "engine": cfg.engine, "pct": _pct, "adapter": a,
           "m": {role: a.metrics[role] for role in METRIC_ROLES},
           "job": cfg.slo.prometheus_job or cfg.service.name,
           "length_reasons": LENGTH_REASONS, "client_reasons": CLIENT_REASONS, "tls": None,
           "hosts": [h.name for h in cfg.hosts] if per_host else [], "node_job": cfg.slo.prometheus_node_job,
           "pseudo_fs": PSEUDO_FILESYSTEMS, "disk_fail": DISK_FAIL_BYTES, "disk_warn": DISK_WARN_BYTES,
           "disk_fail_text": format_bytes(DISK_FAIL_BYTES), "disk_warn_text": format_bytes(DISK_WARN_BYTES),
           "stall_window": STALL_WINDOW, "flap": FLAP, "autoscale": cfg.autoscale,
           "autoscale_max": cfg.autoscale.bounds(len(cfg.hosts))[1]}
    ctx["errors"] = _error_terms(a, ctx["job"])
    from deployctl.render.watch import alert_context

    ctx |= alert_context(cfg) if per_host else {"router": None, "gpu": None}  # k8s: no nginx, GPUs via the operator
    if cfg.router is not None and cfg.router.tls is not None:  # certificate expiry from blackbox_exporter's probe
        from deployctl.config.router import CERT_FAIL_DAYS, CERT_WARN_DAYS
        from deployctl.render.edge import probe_instance_regex

        ctx["tls"] = {"job": cfg.router.tls.probe_job, "instance": probe_instance_regex(cfg),
                      "server_name": cfg.router.server_name, "warn_days": CERT_WARN_DAYS, "fail_days": CERT_FAIL_DAYS}
    return RenderedFile("prometheus/alerts.rules.yaml", render_template("alerts.rules.yaml.j2", ctx))


NODE_EXPORTER_PORT = 9100  # prometheus-node-exporter's default (--web.listen-address)
# node_exporter filesystems that hold no release, log or upload (memory, images, namespaces)
PSEUDO_FILESYSTEMS = "tmpfs|ramfs|devtmpfs|squashfs|overlay|nsfs|fuse.lxcfs"


def render_scrape(cfg: DeployConfig) -> RenderedFile:
    """prometheus/scrape.yaml: the ``scrape_configs`` for the runtimes of every host (job ``slo.prometheus_job`` or
    the service name, at ``address:port`` on the engine's metrics route) and node_exporter (job
    ``slo.prometheus_node_job`` at ``address:9100``), each target labelled ``deployctl_host: NAME``, the label the
    per-host alerts select on. ``address: local`` hosts are 127.0.0.1. The runtime's metrics are reachable from
    another machine only where server.bind is not loopback; else run Prometheus (or an agent) on each host."""
    import yaml

    from deployctl.engines import of
    from deployctl.render.monitoring import scrape_interval

    a = of(cfg)

    def where(h) -> str:
        return layout.url_host("127.0.0.1" if h.address == "local" else h.address)

    def targets(port) -> list[dict]:
        return [{"targets": [f"{where(h)}:{port(h)}"], "labels": {"deployctl_host": h.name}} for h in cfg.hosts]

    jobs = []
    if a.metrics_route:
        jobs.append({"job_name": cfg.slo.prometheus_job or cfg.service.name, "metrics_path": a.metrics_route,
                     "scrape_interval": scrape_interval(cfg),
                     "static_configs": targets(lambda h: layout.configured_port(cfg, h))})
    jobs.append({"job_name": cfg.slo.prometheus_node_job,
                 "static_configs": targets(lambda h: NODE_EXPORTER_PORT)})
    from deployctl.render.watch import scrape_jobs

    jobs += scrape_jobs(cfg)  # mtail on the router host, dcgm-exporter on CUDA hosts
    head = (f"# Prometheus scrape_configs for {cfg.service.name}: the runtimes and node_exporter on every host, mtail\n"
            "# over the router's access log, dcgm-exporter on CUDA hosts.\n"
            "# Rendered by deployctl; do not edit. Add these jobs to prometheus.yml's scrape_configs (or load the\n"
            "# file with scrape_config_files, Prometheus >= 2.43) and alerts.rules.yaml under rule_files.\n")
    return RenderedFile("prometheus/scrape.yaml", head + yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False))


def _probe_url(cfg: DeployConfig, port: int) -> str:
    from deployctl.engines import of

    return f"http://{layout.url_host(layout.runtime_address(cfg))}:{port}{of(cfg).ready_route}"


def _container_ctx(cfg: DeployConfig, release_id: str) -> dict:
    from deployctl.engines import of
    from deployctl.engines.command import image as engine_image

    c = cfg.container
    if not of(cfg).config_file:  # a foreign engine runs from its official image
        return {"container": c, "image": c.image or engine_image(cfg), "base_image": None,
                "startup_s": math.ceil(cfg.server.startup_timeout_s), "rollout_cfg": cfg.rollout}
    base = c.base_image or ("nvidia/cuda:12.4.1-runtime-ubuntu22.04" if cfg.engine.device == "cuda"
                            else "python:3.11-slim")
    return {"container": c, "image": c.image or f"deployctl/{cfg.service.name}:{release_id}", "base_image": base,
            "startup_s": math.ceil(cfg.server.startup_timeout_s), "rollout_cfg": cfg.rollout}


def _container_files(cfg: DeployConfig, release_id: str, api_key: str | None) -> list[RenderedFile]:
    out: list[RenderedFile] = []
    for host in cfg.hosts:
        release = {f.path: f for f in render_release(cfg, host, release_id, api_key=api_key, standby=False)}
        ctx = {**release_context(cfg, host, release_id, api_key, standby=False), **_container_ctx(cfg, release_id)}
        url = _probe_url(cfg, ctx["port"])
        ctx["healthcheck"] = ["CMD", "python3", "-c", "import sys, urllib.request; "
                              f"sys.exit(0 if urllib.request.urlopen('{url}', timeout={ctx['adapter'].probe_timeout_s - 1}).status == 200 else 1)"]
        d = f"hosts/{host.name}/"
        if ctx["adapter"].config_file:
            out += [RenderedFile(d + "Dockerfile", render_template("Dockerfile.j2", ctx)),
                    RenderedFile(d + "runtime.yaml", release["runtime.yaml"].content)]
        else:
            from deployctl.engines.command import container_argv

            ctx["pod_command"] = container_argv(cfg, host, port=ctx["port"])
        out += [RenderedFile(d + "compose.yaml", render_template("compose.yaml.j2", ctx)),
                RenderedFile(d + "runtime.env", release["runtime.env"].content, 0o600)]
    return out


def _k8s_files(cfg: DeployConfig, release_id: str, api_key: str | None, *, rollout: bool) -> list[RenderedFile]:
    if cfg.server.is_loopback or not cfg.server.api_key_env:
        raise ConfigError(f"server.bind is {cfg.server.bind}: pods must listen on the pod IP for probes and the Service",
                          fix="set server.bind: 0.0.0.0 and server.api_key_env for the k8s targets")
    from deployctl.engines.command import container_argv

    host = cfg.hosts[0]  # pods share one runtime.yaml; the per-host port does not apply
    args = runtime_args(cfg, host, release_id)
    args["port"] = cfg.server.port
    pod_command = container_argv(cfg, host, port=cfg.server.port)
    yaml_text = render_template("runtime.yaml.j2", {"service": cfg.service, "where": "every pod",
                                                    "release_id": release_id, "runtime_args": args})
    if not release_context(cfg, host, release_id)["adapter"].config_file:
        yaml_text = json.dumps(pod_command)  # what the pods run: its hash rolls them
    sha = hashlib.sha256(yaml_text.encode()).hexdigest()
    name = cfg.service.name
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "deployctl",
              "deployctl/release": release_id}
    ctx = {**release_context(cfg, host, release_id, api_key, standby=False), **_container_ctx(cfg, release_id), "port": cfg.server.port,
           "labels": labels, "pod_labels": labels, "config_sha256": sha, "runtime_yaml": yaml_text,
           "configmap_name": f"{name}-runtime-{sha[:10]}", "secret_name": f"{name}-api-key",
           "replicas": len(cfg.hosts), "rollout": rollout, "pod_command": pod_command, "pause_s": math.ceil(cfg.rollout.pause_s),
           "startup_failure_threshold": max(1, math.ceil(cfg.server.startup_timeout_s / 10))}
    ctx["prestop_s"] = ENDPOINTS_DROP_S + (0 if ctx["adapter"].sigterm_drains else math.ceil(cfg.server.drain_timeout_s))
    ctx["grace_s"] = ctx["prestop_s"] + ctx["timeout_stop_s"]
    if rollout:
        from deployctl.render.kubernetes import analysis_context

        ctx.update(analysis_context(cfg, CLIENT_REASONS))
    _check_api_key(api_key)
    secret_env = render_template("runtime.env.j2", {**ctx, "secret_only": True})  # the Secret: keys only
    configmap = [RenderedFile("k8s/configmap.yaml", render_template("k8s-configmap.yaml.j2", ctx))]
    extra = []
    if rollout:
        from deployctl.render.kubernetes import rollout_files

        extra = rollout_files(cfg, ctx)
    from deployctl.render.kubernetes import scaledobject_file

    scaled = scaledobject_file(cfg, rollout=rollout)
    return [*(configmap if ctx["adapter"].config_file else []), *extra,
            RenderedFile("k8s/rollout.yaml" if rollout else "k8s/deployment.yaml",
                         render_template("k8s-workload.yaml.j2", ctx)),
            RenderedFile("k8s/service.yaml", render_template("k8s-service.yaml.j2", ctx)),
            *([scaled] if scaled else []), RenderedFile("k8s/runtime.env", secret_env, 0o600)]


def render_files(cfg: DeployConfig, *, target: str, release_id: str, api_key: str | None) -> list[RenderedFile]:
    """Every file of ``target`` (paths relative to the output directory). Raises UsageError, ConfigError."""
    if target not in TARGETS:
        raise UsageError(f"--target {target!r} is not one of {', '.join(TARGETS)}")
    if target == "systemd":
        from deployctl.render.autoscale import autoscale_units

        files = [RenderedFile(f"hosts/{h.name}/{f.path}", f.content, f.mode)
                 for h in cfg.hosts for f in render_release(cfg, h, release_id, api_key=api_key)]
        files += autoscale_units(cfg)
    elif target == "container":
        files = _container_files(cfg, release_id, api_key)
    else:
        files = _k8s_files(cfg, release_id, api_key, rollout=target == "k8s-rollout")
    if cfg.router and target in ("systemd", "container"):
        from deployctl.render.watch import router_files

        conf = render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0)
        files.append(RenderedFile(f"router/{cfg.service.name}.conf", conf))
        if api_key and cfg.server.api_key_env:  # the keys file the conf includes (0600; a deploy writes its own)
            from deployctl.render import keys

            env_keys = api_key.split(",")  # api_key_from_env: the current key, then the next one
            files.append(RenderedFile(f"router/{cfg.service.name}.conf.keys",
                                      keys.render(cfg.service.name.replace("-", "_"),
                                                  keys.synced(None, env_keys, "render")), 0o600))
        files += router_files(cfg)  # mtail's program and /etc/default/mtail
    k8s = target in ("k8s", "k8s-rollout")
    alerts = render_alerts(cfg, per_host=not k8s)
    if k8s:
        from deployctl.render.monitoring import monitoring_files

        files += monitoring_files(cfg, alerts.content)
    else:
        from deployctl.engines import of
        from deployctl.render.dashboard import dashboard_file

        files.append(render_scrape(cfg))
        job = cfg.slo.prometheus_job or cfg.service.name
        files.append(dashboard_file(cfg, _error_terms(of(cfg), job)))
    files.append(alerts)
    return files


def default_release_id(cfg: DeployConfig, *, env: Mapping[str, str]) -> str:
    """render.release_id at SOURCE_DATE_EPOCH (when set) or now, with the installed runtime's version and the model
    manifest's text when it is readable here (else its path)."""
    manifest = Path(cfg.model.path) / cfg.model.manifest
    try:
        text = manifest.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = str(manifest)
    epoch = env.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch and epoch.isdigit() else None
    return new_release_id(cfg, runtime_version=runtime_version(), manifest=text, when=when)


def write_files(files: list[RenderedFile], out_dir: Path) -> list[Path]:
    """Write ``files`` under ``out_dir`` (atomic per file, exact modes; 0600 files never exist with wider modes)."""
    paths = []
    for f in files:
        path = out_dir / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(f.content)
        os.chmod(tmp, f.mode)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def render_all(cfg: DeployConfig, out_dir: Path, *, target: str, release_id: str | None = None,
               env: Mapping[str, str] | None = None, missing_key_ok: bool = False) -> list[Path]:
    """Render ``target`` for every host into ``out_dir`` and return the written paths (RENDER.json last).
    ``env`` (default: deployctl's environment) holds the API key variable. With ``missing_key_ok`` an unset
    variable is not an error: each runtime.env gets a comment naming the variable instead of the key (a runtime
    bound beyond loopback refuses to start without one, so nothing serves with a made-up key).
    Raises UsageError (exit 2), ConfigError (exit 3)."""
    env = settings.environ() if env is None else env
    missing = None
    try:
        api_key = api_key_from_env(cfg, env)
    except ConfigError:
        if not missing_key_ok:
            raise
        api_key, missing = None, cfg.server.api_key_env
    if target not in TARGETS:
        raise UsageError(f"--target {target!r} is not one of {', '.join(TARGETS)}")
    rid = release_id or default_release_id(cfg, env=env)
    files = render_files(cfg, target=target, release_id=rid, api_key=api_key)
    if missing:
        ref = (f"# DEPLOYCTL_RUNTIME_API_KEY is not rendered: ${missing} was not set. Add the line\n"
               f"# DEPLOYCTL_RUNTIME_API_KEY=<the value of ${missing}> here, or export {missing} and render again.\n")
        files = [RenderedFile(f.path, f.content + ref, f.mode) if f.path.endswith("runtime.env") else f
                 for f in files]
    index = {"release_id": rid, "target": target, "service": cfg.service.name,
             "files": {f.path: {"sha256": f.sha256 if not f.path.endswith(SECRET_FILES) else None,
                                "mode": oct(f.mode)} for f in files}}
    files.append(RenderedFile("RENDER.json", json.dumps(index, indent=2, sort_keys=True) + "\n"))
    return write_files(files, Path(out_dir))


__all__ = ["TARGETS", "api_key_from_env", "default_release_id", "render_all", "render_alerts", "render_scrape",
           "render_files", "runtime_version", "write_files"]
