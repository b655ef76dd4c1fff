"""Rendering from templates/ (the only jinja2 import): release files, the router, alerts, containers, k8s.

- ``release``  the template environment, one host's release files, the nginx router config.
- ``targets``  ``deployctl render``: every file of a target (systemd, container, k8s) under one directory.
- ``validate`` checks of rendered files with the real tools (systemd-analyze, nginx -t, promtool, k8s schemas).
- ``kubernetes`` the k8s-rollout objects beside the workload: ``analysis`` (the AnalysisTemplate's PromQL from
  rollout.analysis), ``monitoring`` (PrometheusRule, PodMonitor), ``gateway`` (InferencePools, HTTPRoute).
- ``crdvalidate`` (+ crdcheck.mjs) and ``poolschema``: custom resources against their projects' schemas.

Import from this package (``from deployctl.render import render_release``); jinja2 loads on first render.
"""
from deployctl.render.release import (RenderedFile, config_text, new_release_id, release_context, release_manifest,
                                      render_nginx, render_nginx_main, render_release, render_template, runtime_args,
                                      split_weights)
from deployctl.render.targets import render_all

__all__ = ["RenderedFile", "config_text", "new_release_id", "release_context", "release_manifest", "render_all",
           "render_nginx", "render_nginx_main", "render_release", "render_template", "runtime_args", "split_weights"]
