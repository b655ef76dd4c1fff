"""`deployctl runbook list | show NAME | run NAME`: scripted on-call runbooks (deployctl/runbook/)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli.params import CONFIG, JSON
from deployctl.cli._app import app, err_console, fail, out_console, print_json

runbook_app = typer.Typer(
    help="Scripted on-call runbooks: check, decide, act, leave an audit trail.",
    no_args_is_help=True, rich_markup_mode=None,
    epilog="Example: deployctl runbook list",
)
app.add_typer(runbook_app, name="runbook")

# list/show read no deploy.yaml, but take -c like every other command so that a habit (or a script) works (C33)
CONFIG_ACCEPTED = typer.Option(None, "-c", "--config", help="Accepted like the other commands; the runbooks do not "
                               "depend on deploy.yaml.")

OUTCOME_STYLE = {"ok": "green", "healthy": "green", "fixed": "green", "done": "green", "failed": "red", "not fixed": "red",
                 "error": "red", "escalated": "yellow", "declined": "yellow", "would act": "yellow",
                 "cannot judge": "yellow"}


@runbook_app.command("list", epilog="Example: deployctl runbook list")
def list_(as_json: bool = JSON,
          config: Optional[Path] = CONFIG_ACCEPTED) -> None:
    """Every runbook with its title and symptoms. Exit 3 when a runbook file is invalid (the others still list)."""
    from deployctl.runbook.library import load_library

    lib = load_library()
    rows = [{"name": n, "title": rb.title, "when": rb.when, "steps": len(rb.steps), "path": rb.path}
            for n, rb in sorted(lib.runbooks.items())]
    if as_json:
        print_json({"runbooks": rows, "errors": [str(e) for e in lib.errors]})
    else:
        from rich.table import Table

        table = Table(title="runbooks")
        for col in ("name", "title", "steps", "when to use"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["name"], r["title"], str(r["steps"]), "; ".join(r["when"]))
        out_console.print(table)
    for err in lib.errors:
        fail(err)
    if lib.errors:
        raise typer.Exit(lib.errors[0].exit_code)


@runbook_app.command(epilog="Example: deployctl runbook show standby-expired")
def show(name: str = typer.Argument(..., help="Runbook name (see `deployctl runbook list`)."),
         config: Optional[Path] = CONFIG_ACCEPTED) -> None:
    """The runbook as readable text: when to use it, then each step's check, expectation and action."""
    from deployctl.runbook.library import load_library
    from deployctl.runbook.text import render_text

    out_console.print(render_text(load_library().get(name)), markup=False, highlight=False, soft_wrap=True)


@runbook_app.command(epilog="Example: deployctl runbook run standby-expired --dry-run")
def run(
    name: str = typer.Argument(..., help="Runbook name (see `deployctl runbook list`)."),
    host: Optional[list[str]] = typer.Option(None, "--host", help="Only this host (repeatable); default: all."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Run the checks; only show the actions."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do changing actions without asking."),
    config: Path = CONFIG,
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document on stdout."),
) -> None:
    """Run the runbook on the hosts; ask before each changing action unless --yes; audit on each host's state/.
    Exit 0: nothing wrong or fixed; 1: a finding remains (or --dry-run would act); 3: bad runbook or config;
    4: SSH failure."""
    from deployctl.config import load_config
    from deployctl.runbook.library import load_library
    from deployctl.errors import about
    from deployctl.runbook.runner import RunOptions, run_runbook

    rb = load_library().get(name)
    cfg = load_config(config)
    if host:
        hosts = [cfg.host(h) for h in dict.fromkeys(host)]  # a repeated --host runs once; a cordoned one too
    else:  # every serving host; a cordoned or not serving one is left out, said (issue 42)
        from deployctl.rollout.members import leave_out

        hosts = list(leave_out(cfg, lambda _kind, message, **_: err_console.print(message, markup=False)).hosts)

    def confirm(prompt: str) -> bool:
        try:
            return typer.confirm(prompt, default=False, err=True)
        except typer.Abort:  # end of input: no answer is a no
            err_console.print("no answer: taken as no")
            return False

    from rich.markup import escape

    def on_step(res) -> None:
        style = OUTCOME_STYLE.get(res.outcome, "white")
        line = f"[{style}]{res.outcome:>9}[/] {res.host} {res.step}: {escape(res.detail)}"
        err_console.print(line, markup=True, highlight=False, soft_wrap=True)
        if res.action:
            err_console.print(f"{'':>9}   action: {res.action} → {res.result}", markup=False, soft_wrap=True)

    if dry_run:
        err_console.print("dry-run: checks run, actions are only shown")
    report = run_runbook(rb, cfg, hosts, RunOptions(dry_run=dry_run, yes=yes, confirm=confirm, on_step=on_step,
                                                    config_path=str(config)))
    if as_json:
        print_json(_report_json(report))
    else:
        _print_summary(report)
    for h in report.hosts:
        if h.error is not None:
            err_console.print(f"[bold red]error:[/] {escape(about(h.host, h.error))}", markup=True, soft_wrap=True)
    raise typer.Exit(report.exit_code)


def _report_json(report) -> dict:
    from dataclasses import asdict

    return {"runbook": report.runbook, "run_id": report.run_id, "user": report.user, "dry_run": report.dry_run,
            "exit_code": report.exit_code,
            "hosts": [{"host": h.host, "outcome": h.outcome, "error": str(h.error) if h.error else None,
                       "steps": [asdict(s) for s in h.steps]} for h in report.hosts]}


def _print_summary(report) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"runbook {report.runbook} (run {report.run_id}{', dry-run' if report.dry_run else ''})")
    for col in ("host", "step", "observed", "expected", "result", "action"):
        table.add_column(col, overflow="fold")
    for h in report.hosts:
        for s in h.steps:
            style = OUTCOME_STYLE.get(s.outcome, "white")
            action = f"{s.action} → {s.result}" if s.action else ""
            table.add_row(h.host, s.step, escape(_short(s.observed)), escape(s.expected), f"[{style}]{s.outcome}[/]",
                          escape(action))
    out_console.print(table)
    for h in report.hosts:
        style = OUTCOME_STYLE.get(h.outcome, "white")
        out_console.print(f"{h.host}: [{style}]{h.outcome}[/]")


def _short(value) -> str:
    text = "none" if value is None else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
