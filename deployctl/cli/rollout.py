"""`deployctl deploy`, `promote`, `abort`, `rollback`, `status`, `history`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from deployctl.cli.params import CONFIG, JSON, YES, one_of
from deployctl.cli._app import app, err_console, out_console, print_json


_STYLE = {"abort": "bold red", "warn": "yellow", "done": "bold green", "step": "bold cyan", "analysis": "magenta",
          "router": "blue", "plan": "bold"}


def progress_printer(event) -> None:
    """Print one rollout progress event on stderr."""
    style = _STYLE.get(event.kind)
    text = event.message.replace("[", r"\[")
    err_console.print(f"[{style}]{text}[/]" if style else text, markup=True, soft_wrap=True)


def _confirm(yes: bool):
    if yes:
        return None

    def ask(plan) -> bool:
        from deployctl.errors import UsageError

        for line in plan.lines():
            err_console.print(f"  {line}", markup=False)
        if not sys.stdin.isatty():
            raise UsageError("deploy asks for confirmation but stdin is not a terminal", fix="pass --yes")
        return typer.confirm("deploy this release?", default=False, err=True)

    return ask


@app.command()
def deploy(
    config: Path = CONFIG,
    canary: Optional[int] = typer.Option(None, "--canary", help="First canary weight in percent (then rollout.steps above it)."),
    yes: bool = YES,
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove another deploy's lock first (stale or not)."),
    validate: Optional[str] = typer.Option(None, "--validate", help="functional: run deployctl validate's functional layer against each canary host before the first weight step (a failure aborts, exit 6)."),
) -> None:
    """Roll the configured release out: canary, analysis, promote or abort (exit 6)."""
    from deployctl.config import load_config
    from deployctl.rollout.deploy import Deployment

    from deployctl.rollout.plan import steps_for

    cfg = load_config(config)
    steps_for(cfg, canary)  # a bad --canary is a usage error before any host is probed
    check = None
    if validate is not None:
        from deployctl.errors import UsageError

        if validate != "functional":
            raise UsageError(f"--validate {validate!r}: only the functional layer runs on a canary",
                             fix="--validate functional")
        from functools import partial

        from deployctl.service.http import api_key
        from deployctl.validate.canary import check_hosts

        check = partial(check_hosts, cfg, api_key=api_key(cfg), say=lambda m: err_console.print(m, markup=False,
                                                                                                 soft_wrap=True))
    result = Deployment(cfg, canary_pct=canary, break_lock=break_lock, progress=progress_printer,
                        confirm=_confirm(yes), canary_check=check).run()
    out_console.print(f"deployed {result.release} ({result.mode}) in {result.duration_s:.1f} s")


@app.command()
def promote(config: Path = CONFIG) -> None:
    """Move a running rollout on to its next step now (ends the current analysis pause)."""
    from deployctl.config import load_config
    from deployctl.rollout.rollback import signal

    out_console.print(signal(load_config(config), "promote", progress=progress_printer))


@app.command()
def abort(config: Path = CONFIG) -> None:
    """Send all traffic back to stable and put the canary hosts back on the previous release."""
    from deployctl.config import load_config
    from deployctl.rollout.rollback import signal

    out_console.print(signal(load_config(config), "abort", progress=progress_printer))


@app.command()
def rollback(
    config: Path = CONFIG,
    to: Optional[str] = typer.Option(None, "--to", help="Release id to make current (default: the previous one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result with the seconds of each phase as JSON."),
) -> None:
    """Make the previous (or named) release current on every host; wins over a deploy in progress."""
    from dataclasses import asdict

    from deployctl.config import load_config
    from deployctl.rollout.rollback import rollback as do_rollback

    r = do_rollback(load_config(config), to=to, progress=progress_printer)
    if as_json:
        print_json({**asdict(r), "duration_s": round(r.duration_s, 2)})
    elif r.noop:
        out_console.print(f"already on {r.target}: nothing to roll back (use --to RELEASE_ID to go further back)")
    else:
        out_console.print(f"rolled back to {r.target} in {r.duration_s:.1f} s")


@app.command()
def status(config: Path = CONFIG, as_json: bool = JSON,
           check: bool = typer.Option(False, "--check", help="Exit 1 when a host is unhealthy or unsupervised, or "
                                      "when the hosts differ in release, engine, model manifest or config.")) -> None:
    """Per host: current release, health, supervision, traffic weight; the rollout in progress; which host
    differs from the rest. With --check: exit 1 on any problem (for cron and alerting)."""
    from rich.table import Table

    from deployctl.config import load_config
    from deployctl.rollout.status import status as get_status

    doc = get_status(load_config(config))
    if as_json:
        print_json(doc)
        _status_check(doc, check)
        return
    table = Table(title="hosts")
    for col in ("host", "release", "engine", "healthy", "weight", "detail"):
        table.add_column(col)
    for h in doc["hosts"]:
        w = "?" if h["weight"] is None else f"{h['weight']:g}%"
        engine = " ".join(x for x in (h.get("engine"), h.get("engine_version")) if x) or "-"
        table.add_row(h["host"], h["current_release"] or "-", engine, "yes" if h["healthy"] else "NO", w,
                      h.get("detail", ""))
    out_console.print(table)
    ro = doc["rollout"]
    if ro:
        step = f", step {ro['step_index'] + 1}/{len(ro['steps'])} at {ro['weight']}%" if ro.get("steps") else ""
        out_console.print(f"last rollout: {ro['action']} {ro['release']} from {ro['from_release']}: {ro['status']}"
                          f"{step} (by {ro['owner']}, {ro['updated']})" + (f"; {ro['reason']}" if ro.get("reason") else ""),
                          markup=False)
    if doc.get("lock"):
        lk = doc["lock"]
        out_console.print(f"lock: {lk['text']}" + (f" [stale: {lk['why_stale']}]" if lk["stale"] else ""), markup=False)
    for d in doc.get("differences", []):
        out_console.print(f"inconsistent: {d}", markup=False)
    _status_check(doc, check)


def _status_check(doc: dict, check: bool) -> None:
    """With --check: CheckFailed (exit 1) naming every unhealthy host and every difference."""
    if not check:
        return
    problems = [f"{h['host']} unhealthy ({h.get('detail') or 'no answer'})" for h in doc["hosts"] if not h["healthy"]]
    problems += doc.get("differences", [])
    if problems:
        from deployctl.errors import CheckFailed

        raise CheckFailed(f"status --check: {'; '.join(problems)}")


@app.command()
def history(config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Past deploys, promotions, aborts and rollbacks with who, when, result and reason."""
    from rich.table import Table

    from deployctl.config import load_config
    from deployctl.rollout.status import history as get_history

    records = get_history(load_config(config))
    if as_json:
        print_json({"history": records})
        return
    table = Table(title="history")
    for col in ("time", "user", "action", "release", "result", "reason"):
        table.add_column(col)
    for r in records:
        table.add_row(r.get("time", ""), r.get("user", ""), r.get("action", ""), r.get("release") or "-",
                      r.get("result", ""), (r.get("reason") or "")[:120])
    out_console.print(table)


@app.command("compare-outputs")
def compare_outputs(
    canary_url: str = typer.Option(..., "--canary-url", help="Base URL of the canary (http://host:port, no /v1)."),
    stable_url: str = typer.Option(..., "--stable-url", help="Base URL of stable (http://host:port, no /v1)."),
    config: Path = CONFIG,
    mode: str = typer.Option("exact", "--mode", parser=one_of("--mode", "exact", "prefix", "skip"),
                             help="exact (same engine and dtype), prefix (either changed) or skip (degenerate checks only)."),
    chat: bool = typer.Option(True, "--chat/--no-chat", help="The model has a chat template (/v1/chat/completions)."),
    as_json: bool = JSON,
) -> None:
    """Ask canary and stable the golden prompts and compare the answers (the analysis Job of --target k8s-rollout).
    Exit 1 unless they agree (a fail or an inconclusive comparison)."""
    from deployctl.config import load_config
    from deployctl.errors import CheckFailed
    from deployctl.rollout.goldencheck import compare_urls

    report = compare_urls(load_config(config), canary_url.rstrip("/"), stable_url.rstrip("/"), chat=chat, mode=mode)
    if as_json:
        print_json(report.to_json())
    else:
        out_console.print(report.summary(), markup=False, highlight=False)
    if report.result != "pass":
        raise CheckFailed(f"golden outputs {report.result}: {report.summary()}")
