"""`deployctl models fetch | list | prune`: model versions in each host's store (deployctl.weights; issue 43)."""
from __future__ import annotations

from pathlib import Path

import typer

from deployctl.cli._app import app, err_console, out_console, print_json
from deployctl.cli.params import CONFIG, JSON

models_app = typer.Typer(help="Model versions on the hosts: fetch model.version from model.source, list, prune.",
                         no_args_is_help=True, epilog="Example: deployctl models list")
app.add_typer(models_app, name="models")


def _hosts(cfg):
    from deployctl.errors import ConfigError
    from deployctl.hosts import Host

    if not cfg.model.source:
        raise ConfigError("model.source is not set: deployctl does not manage this model's versions",
                          fix="set model.source and model.version in deploy.yaml")
    return [Host.from_config(h) for h in cfg.hosts]


def _in_use(host) -> dict:
    """{model version: [release ids using it]} on ``host``."""
    from deployctl.weights.inuse import release_model_versions

    used: dict = {}
    for rid, version in release_model_versions(host).items():
        if version:
            used.setdefault(version, []).append(rid)
    return used


@models_app.command("fetch", epilog="Example: deployctl models fetch -c deploy.yaml")
def fetch(config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Fetch model.version from model.source onto every host (model.fetch_parallel_hosts at a time): each host
    GETs the files itself into <store>/<name>/.<version>.partial/, resumes a partial file by Range, checks each
    sha256 against the manifest and publishes the version with one rename. Progress per host (bytes, rate, ETA)
    on stderr. Exit 0 when every host has the version, 4 naming each host that failed and why.

    Credentials: the variables model.s3 names (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY by default)."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    from deployctl.config import load_config
    from deployctl.weights.fetch import fetch_to_hosts
    from deployctl.weights.sources import plan as make_plan

    cfg = load_config(config)
    hosts = _hosts(cfg)
    plan = make_plan(cfg.model)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err_console, disable=as_json) as bar:
        tasks = {h.name: bar.add_task(h.name, total=plan.total_bytes) for h in hosts}
        done = fetch_to_hosts(hosts, cfg.model, plan, kept_versions=tuple(
            v for h in hosts for v in _in_use(h)), on_progress=lambda h, b, t: bar.update(tasks[h], completed=b))
    total = sum(d.bytes_fetched for d in done)
    slowest = max((d.seconds for d in done), default=0.0)
    summary = (f"model {plan.version} from {plan.source}: {len(done)} hosts, {total} bytes fetched "
               f"({plan.total_bytes} each) in {slowest:.1f} s, manifest {plan.manifest_sha256[:12]}")
    if as_json:
        print_json({"version": plan.version, "source": plan.source, "manifest_sha256": plan.manifest_sha256,
                    "hosts": [d.__dict__ | {"resumed": list(d.resumed), "refetched": list(d.refetched)} for d in done]})
        return
    out_console.print(summary, markup=False)


@models_app.command("list", epilog="Example: deployctl models list -c deploy.yaml --json")
def list_(config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Per host: the model versions in its store, their size, the releases that use them and when each was
    verified (published after every file's sha256 matched). Exit 0; 4 when a host cannot be reached."""
    from deployctl.config import load_config
    from deployctl.weights.fetch import list_versions

    cfg = load_config(config)
    rows = {}
    for h in _hosts(cfg):
        used = _in_use(h)
        rows[h.name] = [dict(v, releases=sorted(used.get(v["version"], []))) for v in list_versions(h, cfg.model)]
    if as_json:
        print_json({"hosts": rows})
        return
    for host, versions in rows.items():
        for v in versions:
            out_console.print(f"{host}  {v['version']:<20} {v['bytes']:>14} B  verified {v['verified_at'] or '-':<20}"
                              f"  releases: {', '.join(v['releases']) or '-'}" + ("  (partial)" if v["partial"] else ""),
                              markup=False)


@models_app.command("prune", epilog="Example: deployctl models prune -c deploy.yaml --dry-run")
def prune(config: Path = CONFIG, dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; delete nothing."),
          as_json: bool = JSON) -> None:
    """Delete the model versions no kept release uses, beyond the model.keep_versions newest (model.version counts
    as one). Exit 0; 4 when a host cannot be reached."""
    from deployctl.config import load_config
    from deployctl.weights.fetch import list_versions, prune_versions
    from deployctl.weights.keep import versions_to_prune

    cfg = load_config(config)
    gone = {}
    for h in _hosts(cfg):
        doomed = versions_to_prune(list_versions(h, cfg.model), cfg.model.version, tuple(_in_use(h)),
                                   cfg.model.keep_versions)
        gone[h.name] = doomed if dry_run else prune_versions(h, cfg.model, doomed)
    if as_json:
        print_json({"pruned": gone, "dry_run": dry_run})
        return
    for host, versions in gone.items():
        out_console.print(f"{host}: {'would prune' if dry_run else 'pruned'} {', '.join(versions) or 'nothing'}",
                          markup=False)
