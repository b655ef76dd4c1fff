"""What watches a service besides the runtimes' own /metrics: the router's answers counted by mtail over nginx's
JSON access log, and the GPUs through NVIDIA's dcgm-exporter. Rendered files, scrape jobs and alert context.

- Router: ``router/<service>.mtail`` (an mtail program; Debian's ``mtail`` package) counts every answer nginx
  logged as ``deployctl_router_requests_total{status, release}``, and ``router/mtail.default`` (its
  /etc/default/mtail: the log, the port) starts it under Debian's mtail.service. Prometheus scrapes it on the
  router host, port MTAIL_PORT (mtail's default), job ``slo.prometheus_router_job``.
- GPUs (``engine.device: cuda``): dcgm-exporter on every host, port DCGM_PORT (its default ``:9400``), job
  ``slo.prometheus_gpu_job``. Metric names and units are dcgm-exporter's etc/default-counters.csv
  (NVIDIA/dcgm-exporter): DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE (MiB),
  DCGM_FI_DEV_XID_ERRORS (the last Xid, 0 when none); each series carries the
  exporter's ``gpu`` label (the NVML index, deploy.yaml's ``hosts[].gpu``/``gpus``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from deployctl.config import layout
from deployctl.render.release import RenderedFile, access_log_path, render_template

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

MTAIL_PORT = 3903  # mtail --port default
ROUTER_REQUESTS = "deployctl_router_requests_total"  # the mtail program's counter: labels status, release
DCGM_PORT = 9400  # dcgm-exporter -a default ":9400"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # gauge, percent
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"  # gauge, MiB
GPU_FB_FREE = "DCGM_FI_DEV_FB_FREE"  # gauge, MiB
GPU_XID = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last Xid error's number
GPU_IDLE_PCT = 5  # below this utilisation while requests wait, the engine is stuck rather than busy


def router_files(cfg: DeployConfig) -> list[RenderedFile]:
    """``router/<service>.mtail`` and ``router/mtail.default`` (none without ``router:``). Raises ConfigError
    for an access-log path nginx would misread."""
    if cfg.router is None:
        return []
    ctx = {"service": cfg.service, "access_log": access_log_path(cfg), "port": MTAIL_PORT,
           "job": cfg.slo.prometheus_router_job, "metric": ROUTER_REQUESTS}
    return [RenderedFile(f"router/{cfg.service.name}.mtail", render_template("router.mtail.j2", ctx)),
            RenderedFile("router/mtail.default", render_template("mtail.default.j2", ctx))]


def watches_gpus(cfg: DeployConfig) -> bool:
    return cfg.engine.device == "cuda"


def scrape_jobs(cfg: DeployConfig) -> list[dict]:
    """The scrape_configs entries for mtail on the router host (label ``deployctl_host``: the router's host name)
    and, on CUDA hosts, dcgm-exporter on every host (``deployctl_host: NAME``)."""
    jobs = []
    if cfg.router is not None:
        router = cfg.router_host()
        jobs.append({"job_name": cfg.slo.prometheus_router_job, "static_configs": [
            {"targets": [f"{layout.url_host(layout.network_address(router))}:{MTAIL_PORT}"],
             "labels": {"deployctl_host": router.name}}]})
    if watches_gpus(cfg):
        jobs.append({"job_name": cfg.slo.prometheus_gpu_job, "static_configs": [
            {"targets": [f"{layout.url_host(layout.network_address(h))}:{DCGM_PORT}"],
             "labels": {"deployctl_host": h.name}} for h in cfg.hosts]})
    return jobs


def gpu_selectors(cfg: DeployConfig, job_label: str = "job") -> list[dict]:
    """Per host: ``{"host", "num_gpus", "selector"}``: the number of GPUs it serves on and the PromQL label matchers
    of those GPUs (job, deployctl_host, gpu=~"0|1")."""
    out = []
    for h in cfg.hosts:
        ids = "|".join(str(i) for i in h.gpu_ids)
        out.append({"host": h.name, "num_gpus": len(h.gpu_ids),
                    "selector": f'{job_label}="{cfg.slo.prometheus_gpu_job}", deployctl_host="{h.name}", gpu=~"{ids}"'})
    return out


def alert_context(cfg: DeployConfig) -> dict:
    """The alert template's ``router`` (job, metric) and ``gpu`` (selectors, thresholds) sections, None where the
    service has no router or no CUDA GPUs."""
    router = None
    if cfg.router is not None:
        router = {"job": cfg.slo.prometheus_router_job, "metric": ROUTER_REQUESTS, "host": cfg.router_host().name}
    gpu = None
    if watches_gpus(cfg):
        gpu = {"job": cfg.slo.prometheus_gpu_job, "util": GPU_UTIL, "used": GPU_FB_USED, "free": GPU_FB_FREE,
               "xid": GPU_XID, "idle_pct": GPU_IDLE_PCT,
               # every series a GPU rule reads: one missing per GPU while the exporter answers is a silent rule
               "series": (GPU_UTIL, GPU_FB_USED, GPU_FB_FREE, GPU_XID),
               # the engine takes gpu_memory_utilization of the GPU; used beyond it by 5 points is someone else
               "max_used_share": round(min(0.99, cfg.engine.gpu_memory_utilization + 0.05), 4),
               "hosts": gpu_selectors(cfg)}
    return {"router": router, "gpu": gpu}


__all__ = ["DCGM_PORT", "GPU_FB_FREE", "GPU_FB_USED", "GPU_UTIL", "GPU_XID", "MTAIL_PORT", "ROUTER_REQUESTS", "alert_context", "gpu_selectors",
           "router_files", "scrape_jobs", "watches_gpus"]
