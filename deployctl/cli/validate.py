"""`deployctl validate`: the go-live validation layers against the router or one host (deployctl.validate)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli._app import app, err_console, out_console, print_json
from deployctl.cli.params import duration
from deployctl.errors import CheckFailed, UsageError


def _layers(text: str) -> tuple[str, ...]:
    from deployctl.validate.run import LAYERS

    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in LAYERS]
    if bad or not names:
        raise UsageError(f"--layers {text!r}: unknown layer {', '.join(bad) or '(none)'}",
                         fix=f"choose from {','.join(LAYERS)}")
    return tuple(n for n in LAYERS if n in names)  # always in order: the knee feeds the stability load


def _targets(config: Optional[Path], url: Optional[str], host: Optional[str]):
    """(base URL, metrics URLs, api key, deploy config or None)."""
    from deployctl.cli.bench import _api_key, _check_url
    from deployctl.cli.bench_hosts import resolve_hosts

    if url is not None:
        if host is not None:
            raise UsageError("--url and --host both name the server", fix="pass one of them")
        _check_url(url)
        from deployctl.bench.client import normalize_base_url

        base = normalize_base_url(url)
        return base, (base + "/metrics",), _api_key(None), None
    path = config or Path("deploy.yaml")
    if not path.exists():
        raise UsageError(f"no server to validate: {path} does not exist",
                         fix="pass --url http://HOST:PORT, or -c deploy.yaml (the router, or --host NAME)")
    from deployctl.config import load_config

    cfg = load_config(path)
    hosts, key = resolve_hosts(path, ",".join(h.name for h in cfg.hosts))
    metrics = tuple(u + "/metrics" for _, u in hosts)
    if host is not None:
        base = dict(hosts).get(host) or resolve_hosts(path, host)[0][0][1]  # a name, or canary/stable
        return base, (base + "/metrics",), key, cfg
    if cfg.router is None:
        raise UsageError(f"{path} has no router: nothing to validate through", fix="pass --host NAME")
    r = cfg.router
    if r.tls is not None:  # the certificate covers server_name, not the router's address
        return f"https://{r.server_name}:{r.listen}", metrics, key, cfg
    from deployctl.config.layout import network_address, url_host

    return f"http://{url_host(network_address(cfg.router_host()))}:{r.listen}", metrics, key, cfg


@app.command("validate", epilog="Example: deployctl validate -c deploy.yaml --duration 10m --report report/")
def validate(
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="deploy.yaml: the router's URL (or --host), the SLOs, the hosts' /metrics."),
    url: Optional[str] = typer.Option(None, "--url", help="Validate this server instead (base URL, e.g. http://127.0.0.1:8000)."),
    host: Optional[str] = typer.Option(None, "--host", help="With -c: validate this host directly, not the router."),
    layers: str = typer.Option("functional,latency,stability", "--layers", help="Comma-separated: functional, latency, stability, failover (with -c: kills one runtime)."),
    failover_host: Optional[str] = typer.Option(None, "--failover-host", help="Failover: the host whose runtime is killed (default: the last one)."),
    duration_s: float = typer.Option("10m", "--duration", parser=duration("--duration"), help="Stability: how long to hold the load (90s, 10m, 1h)."),
    json_out: bool = typer.Option(False, "--json", help="Print the JSON document on stdout and nothing else."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write DIR/report.html (self-contained, with plots) and DIR/validate.json."),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="Latency: the ladder."),
    requests: int = typer.Option(16, "--requests", help="Latency: requests per level."),
    load_fraction: float = typer.Option(0.5, "--load-fraction", help="Stability: this share of the knee's concurrency."),
    load_concurrency: int = typer.Option(2, "--load-concurrency", help="Stability: the concurrency when no knee was measured."),
    burst: float = typer.Option(10.0, "--burst", help="Stability: seconds of load per burst (quiet gaps between)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds per request."),
) -> None:
    """Go-live validation: functional, latency and stability layers with a verdict per layer (exit 1 on a failed layer)."""
    from deployctl.bench.fit import server_info
    from deployctl.cli.bench import _concurrencies, _positive
    from deployctl.validate.client import Endpoint
    from deployctl.validate.latency import objectives_from_slo
    from deployctl.validate.run import Options, validate as run_validate

    names = _layers(layers)
    for flag, value in (("--timeout", timeout), ("--burst", burst)):
        _positive(flag, value)
    if not 0 < load_fraction <= 1:
        raise UsageError(f"--load-fraction {load_fraction} is not a share of the knee", fix="e.g. --load-fraction 0.5")
    if load_concurrency < 1 or requests < 1:
        raise UsageError("--load-concurrency and --requests must be at least 1", fix="e.g. --requests 16")
    if report is not None and report.exists() and not report.is_dir():
        raise UsageError(f"--report {report} is a file", fix="give a directory (created when missing)")
    base, metrics, key, cfg = _targets(config, url, host)
    if "failover" in names and cfg is None:
        raise UsageError("--layers failover needs -c deploy.yaml (its hosts, launcher and router)",
                         fix="pass -c deploy.yaml instead of --url")
    if failover_host is not None and cfg is not None and failover_host not in {h.name for h in cfg.hosts}:
        raise UsageError(f"--failover-host {failover_host!r} is not a host in deploy.yaml",
                         fix=f"one of: {', '.join(h.name for h in cfg.hosts)}")
    info = server_info(base, {"Authorization": f"Bearer {key}"} if key else {})
    if info.model is None:
        raise CheckFailed(f"{base}/v1/models did not answer with a model", fix="check that the service is up and the URL and API key are right")
    ep = Endpoint(base, info.model, info.max_model_len, key)
    opts = Options(layers=names, duration_s=duration_s, concurrencies=_concurrencies(concurrency), requests=requests,
                   load_fraction=load_fraction, load_concurrency=load_concurrency, burst_s=burst, timeout_s=timeout,
                   objectives=objectives_from_slo(cfg.slo if cfg else None),
                   max_error_rate=cfg.slo.max_error_rate if cfg else 0.01, metrics_urls=metrics,
                   engine_kind=cfg.engine.kind if cfg else "deployctl-runtime", failover_host=failover_host)

    def on_layer(name, res) -> None:
        if res is None:
            err_console.print(f"validate: {name} against {base} ...")
        elif not json_out:
            colour = "green" if res.verdict == "pass" else "red"
            out_console.print(f"[{colour}]{res.verdict.upper()}[/] {res.summary}", markup=True, soft_wrap=True)
            for p in res.problems[1:]:
                out_console.print(f"  {p}", markup=False, soft_wrap=True)

    run = run_validate(ep, opts, on_layer, cfg)
    if report is not None:
        from deployctl.validate.report import write_report

        written = write_report(run, report)
        err_console.print(f"report written to {', '.join(str(p) for p in written)}")
    if json_out:
        print_json(run.to_json())
    failed = [r.layer for r in run.layers if r.verdict == "fail"]
    if failed:
        raise CheckFailed(f"validate: {', '.join(failed)} failed against {base}",
                          fix="see the problems above (or --report DIR) for the check and the request")
