"""``grafana/<service>.json``: one Grafana dashboard per service (the JSON model Grafana imports: Dashboards →
New → Import, or a provisioning folder), over the series of prometheus/scrape.yaml's jobs.

Rows, top to bottom: latency P99 against the objectives of deploy.yaml ``slo:`` (TTFT, TPOT, E2E); error share
at the router (mtail's deployctl_router_requests_total, 5xx over all) and at the runtimes (the alert's terms:
rejections that are not the client's fault and requests that ended with an error, over all); KV cache usage and
the queue per host; GPU memory in use and utilisation per GPU (dcgm-exporter, CUDA hosts); each release's share
of the router's answers (the canary's real weight, from the runtimes' X-Deployctl-Release). A panel whose series
the engine or the set-up does not export is left out (as the alert rules are).

Built with Grafana's own model, grafana-foundation-sdk (``grafana_foundation_sdk``: the dashboard and panel
builders Grafana Labs generates from Grafana's schemas, kept in step with Grafana's releases; grafanalib, the other
candidate, is community-kept, last released 2024-01, and writes its own idea of the JSON). Its schemaVersion (36):
Grafana migrates it forward on import. ``timeseries`` panels on a 24-column grid.

Checked when `render` validates (render.validate): every expression by ``promtool check rules``
(check_dashboard; Grafana's own variables are not used in expressions, so they parse as they are), and the whole
file read back through the SDK's model (check_dashboard_model: a key the model does not know, which Grafana would
ignore, fails naming it; the SDK's Python model does not check the values' types).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from deployctl.render.release import RenderedFile

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH, HEIGHT = 12, 8  # half the grid's 24 columns; 8 rows of 30 px


def _p99(metric: str, job: str, by: str = "") -> str:
    group = f"le{', ' + by if by else ''}"
    return f'histogram_quantile(0.99, sum by ({group}) (rate({metric}_bucket{{job="{job}"}}[5m])))'


def _datasource():
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"])


def _panel(title: str, unit: str, targets: list[tuple[str, str]], *, description: str = "",
           max_value: float | None = None):
    """A timeseries panel builder (grafana_foundation_sdk); ``targets``: (PromQL, legend) pairs, refIds A, B, ...
    in order."""
    from grafana_foundation_sdk.builders import common, prometheus, timeseries
    from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, SortOrder, TooltipDisplayMode

    # options set, not left null: a legend under the graph, every series in the tooltip (Grafana's defaults)
    panel = (timeseries.Panel().title(title).description(description).datasource(_datasource()).unit(unit)
             .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)))
    if max_value is not None:
        panel = panel.min(0).max(max_value)
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(_datasource())
                                  .expr(expr).legend_format(legend))
    return panel


def panels(cfg: DeployConfig, error_terms: dict | None) -> list[dict]:
    """The dashboard's panel builders, without ids and positions (dashboard() lays them out). ``error_terms``: the error
    alert's ``failed`` and ``all`` PromQL terms (render.targets), None when the engine counts no errors."""
    from deployctl.engines import of
    from deployctl.render.watch import (GPU_FB_FREE, GPU_FB_USED, GPU_UTIL, ROUTER_REQUESTS, gpu_selectors,
                                        watches_gpus)

    a = of(cfg)
    m, slo = a.metrics, cfg.slo
    job = slo.prometheus_job or cfg.service.name
    out = []
    for role, name, objective in (("ttft", "Time to first token", slo.ttft_p99_s),
                                  ("tpot", "Time per output token", slo.tpot_p99_s),
                                  ("e2e", "End-to-end latency", slo.e2e_p99_s)):
        if not m[role]:
            continue
        targets = [(_p99(m[role], job), "P99"), (_p99(m[role], job, "deployctl_host"), "P99 {{deployctl_host}}")]
        if objective is not None:
            targets.append((f"vector({objective})", "objective (slo)"))
        out.append(_panel(f"{name} P99 vs objective", "s", targets))
    errors = []
    if cfg.router is not None:
        sel = f'job="{slo.prometheus_router_job}"'
        errors.append((f'sum(rate({ROUTER_REQUESTS}{{{sel}, status=~"5.."}}[5m])) '
                       f'/ sum(rate({ROUTER_REQUESTS}{{{sel}}}[5m]))', "router (5xx answered)"))
    if error_terms:
        errors.append((f'({" + ".join(error_terms["failed"])}) / ({" + ".join(error_terms["all"])})', "runtimes"))
    if errors:
        errors.append((f"vector({slo.max_error_rate})", "objective (slo.max_error_rate)"))
        out.append(_panel("Error share: router and runtimes", "percentunit", errors,
                          description="The router counts what clients got (its own 502/504 too); the runtimes "
                                      "count failures that are not the client's fault."))
    if m["kv_usage"]:
        out.append(_panel("KV cache usage", "percentunit",
                          [(f'max by (deployctl_host) ({m["kv_usage"]}{{job="{job}"}})', "{{deployctl_host}}"),
                           (f"vector({slo.max_kv_cache_usage})", "alert threshold")], max_value=1))
    queue = [(f'sum by (deployctl_host) ({m[r]}{{job="{job}"}})', f"{r} {{{{deployctl_host}}}}")
             for r in ("waiting", "running") if m[r]]
    if queue:
        out.append(_panel("Requests waiting and running", "short", queue))
    if watches_gpus(cfg):
        hosts = gpu_selectors(cfg)
        used = " or ".join(f"{GPU_FB_USED}{{{h['selector']}}} / ({GPU_FB_USED}{{{h['selector']}}} + "
                           f"{GPU_FB_FREE}{{{h['selector']}}})" for h in hosts)
        util = " or ".join(f"{GPU_UTIL}{{{h['selector']}}}" for h in hosts)
        out.append(_panel("GPU memory in use", "percentunit", [(used, "{{deployctl_host}} GPU {{gpu}}")],
                          max_value=1, description="dcgm-exporter's framebuffer used / (used + free)."))
        out.append(_panel("GPU utilisation", "percent", [(util, "{{deployctl_host}} GPU {{gpu}}")], max_value=100))
    if cfg.router is not None:
        sel = f'job="{slo.prometheus_router_job}", release!=""'
        out.append(_panel("Share of answers per release (canary weight)", "percentunit", [(
            f"sum by (release) (rate({ROUTER_REQUESTS}{{{sel}}}[5m])) "
            f"/ ignoring (release) group_left sum(rate({ROUTER_REQUESTS}{{{sel}}}[5m]))", "{{release}}")],
            max_value=1, description="Each release's share of the answers the runtimes gave through the router "
                                     "(X-Deployctl-Release): canary and stable side by side."))
    return out


def dashboard(cfg: DeployConfig, error_terms: dict | None) -> dict:
    """The dashboard JSON model, built by grafana_foundation_sdk: uid ``deployctl-<service>`` (40 characters at
    most), a Prometheus datasource variable, panels two to a row (ids 1, 2, ...)."""
    from grafana_foundation_sdk.builders import dashboard as builders
    from grafana_foundation_sdk.models.dashboard import GridPos

    board = (builders.Dashboard(f"{cfg.service.name} (deployctl)").uid(f"deployctl-{cfg.service.name}"[:40])
             .tags(["deployctl", cfg.engine.kind]).timezone("utc").editable().refresh("30s").time("now-6h", "now")
             .with_variable(builders.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for i, panel in enumerate(panels(cfg, error_terms)):
        board = board.with_panel(panel.grid_pos(GridPos(h=HEIGHT, w=WIDTH, x=(i % 2) * WIDTH, y=(i // 2) * HEIGHT)))
    model = board.build()
    for i, panel in enumerate(model.panels or []):
        panel.id_val = i + 1
    return to_json(model)


def to_json(model) -> dict:
    """A grafana_foundation_sdk model as the JSON Grafana reads (the SDK's own encoder)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(model, cls=JSONEncoder))


def dashboard_file(cfg: DeployConfig, error_terms: dict | None) -> RenderedFile:
    return RenderedFile(f"grafana/{cfg.service.name}.json",
                        json.dumps(dashboard(cfg, error_terms), indent=2, sort_keys=False) + "\n")


def model_differences(doc: dict) -> list[str]:
    """Where ``doc`` (a dashboard JSON model) and the same document read by grafana_foundation_sdk's model
    (``Dashboard.from_json``) and written back differ: ``panels[3].gridpos: not in the model`` (a key the model does
    not know, so Grafana ignores it), or a value it reads otherwise. Empty: the model holds the whole document.
    Values are not type-checked (the SDK's Python model reads them as they are)."""
    from grafana_foundation_sdk.models.dashboard import Dashboard

    try:
        back = to_json(Dashboard.from_json(doc))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return [f"the model cannot read it: {type(err).__name__}: {err}"]
    out: list[str] = []

    def walk(a, b, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key, value in a.items():
                here = f"{where}.{key}" if where else key
                if key not in b:
                    out.append(f"{here}: not in the model")
                else:
                    walk(value, b[key], here)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif a != b:
            out.append(f"{where}: {a!r} became {b!r}")

    walk(doc, back, "")
    return out


def expressions(doc: dict) -> list[tuple[str, str]]:
    """(``panel title / refId``, PromQL) of every target of a dashboard JSON model."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in doc.get("panels", []) for t in p.get("targets", [])]


__all__ = ["dashboard", "dashboard_file", "expressions", "model_differences", "panels", "to_json"]
