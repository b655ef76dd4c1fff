"""`deployctl preflight` and `deployctl manifest`."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from deployctl.cli.params import CONFIG, JSON
from deployctl.cli._app import app, err_console, escape, out_console, print_json

_COLORS = {"pass": "green", "warn": "yellow", "fail": "red"}


@app.command(epilog="Example: deployctl preflight --host gpu-a")
def preflight(
    config: Path = CONFIG,
    host: Optional[List[str]] = typer.Option(None, "--host", help="Only this host (repeatable)."),
    as_json: bool = JSON,
    skip_weights: bool = typer.Option(False, "--skip-weights", help="Do not verify the weights against the manifest."),
) -> None:
    """Facts from each host (in parallel), then checks with fixes. Exit 1 when any check fails, 4 when
    a host cannot be reached (the other hosts are still checked and reported)."""
    from deployctl.config import load_config
    from deployctl.errors import ExitCode
    from deployctl.preflight import run_preflight

    cfg = load_config(config)
    names = list(dict.fromkeys(host)) if host else None  # a repeated --host is probed once
    if names:
        for n in names:
            cfg.host(n)  # ConfigError naming the known hosts
    with _HostProgress(enabled=not as_json and err_console.is_terminal) as progress:
        report = run_preflight(cfg, names, verify_weights=not skip_weights, on_progress=progress.update)
    if as_json:
        print_json(report.to_json())
    else:
        _print_report(report)
    if any(c.name == "reach" for h in report.hosts for c in h.checks):
        raise typer.Exit(ExitCode.REMOTE)  # a host could not be probed at all
    if not report.ok:
        raise typer.Exit(ExitCode.CHECK_FAILED)


class _HostProgress:
    """A rich progress bar per host: the probe, then weight bytes hashed (remote hosts jump at the end)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tasks: dict[str, int] = {}
        self.progress = None

    def __enter__(self) -> "_HostProgress":
        if self.enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                     console=err_console, transient=True)
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.stop()

    def update(self, host: str, phase: str, advance: int, total: Optional[int]) -> None:
        if not self.progress:
            return
        if host not in self.tasks:
            self.tasks[host] = self.progress.add_task(f"{host}: probe", total=None)
        task = self.tasks[host]
        if phase == "weights" and total is not None and advance == 0:
            self.progress.update(task, description=f"{host}: weights", total=total, completed=0)
        elif phase == "weights":
            self.progress.advance(task, advance)
        elif phase == "done":
            self.progress.update(task, description=f"{host}: done")


def _print_report(report) -> None:
    from rich.table import Table

    for h in report.hosts:
        table = Table(title=f"preflight: {h.host}", show_lines=False, expand=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("message", overflow="fold")
        table.add_column("fix", overflow="fold")
        for c in h.checks:
            color = _COLORS[c.status]
            table.add_row(c.name, f"[{color}]{c.status}[/]", escape(c.message), escape(c.fix or ""))
        out_console.print(table)
    n = report.counts()
    bad = [h.host for h in report.hosts if not h.ok]
    verdict = "[green]ok[/]" if report.ok else f"[red]FAILED[/] on {', '.join(bad)}"
    out_console.print(f"preflight {verdict}: {len(report.hosts)} host(s), {n['pass']} pass, {n['warn']} warn, {n['fail']} fail")


@app.command(epilog="Example: deployctl manifest /models/llama-3-8b")
def manifest(
    model_dir: Path = typer.Argument(..., help="Model directory to hash."),
    name: str = typer.Option("manifest.sha256", "--name", help="Manifest file name inside MODEL_DIR."),
) -> None:
    """Write MODEL_DIR/manifest.sha256 (sha256sum format, relative paths). Exit 1 when a file is broken."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from deployctl.errors import CheckFailed, ConfigError
    from deployctl.hostscripts.weights import HashCache, default_cache_path, model_files, write_manifest

    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such directory", fix="pass the model directory (with config.json and *.safetensors)")
    total = sum((model_dir / r).stat().st_size for r in model_files(model_dir, name) if (model_dir / r).is_file())
    with Progress(TextColumn("hashing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err_console,
                  transient=True, disable=not err_console.is_terminal) as progress:
        task = progress.add_task("hash", total=total)
        out, issues = write_manifest(model_dir, manifest=name, cache=HashCache(default_cache_path()),
                                     progress=lambda n: progress.advance(task, n))
    if issues:
        for i in issues[1:]:
            err_console.print(f"[red]{i.kind}[/]: {escape(i.message)}")
        raise CheckFailed(f"not writing {model_dir / name}: {issues[0].message}",
                          fix="re-download the named files, then run `deployctl manifest` again")
    err_console.print(f"wrote {out} ({len(model_files(model_dir, name))} files)")
