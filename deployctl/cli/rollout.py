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


@app.command(epilog="Example: deployctl deploy --canary 5 --yes")
def deploy(
    config: Path = CONFIG,
    canary: Optional[int] = typer.Option(None, "--canary", help="First canary weight in percent (then rollout.steps above it)."),
    yes: bool = YES,
    break_lock: bool = typer.Option(False, "--break-lock", help="Remove another deploy's lock first (stale or not)."),
    validate: Optional[str] = typer.Option(None, "--validate", help="functional: run deployctl validate's functional layer against each canary host before the first weight step (a failure aborts, exit 6)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the last deploy from its journal (killed, or its terminal closed), or roll it back where it cannot be continued; says which."),
    detach: bool = typer.Option(False, "--detach", help="Run the rollout in the background on this machine (needs --yes), logging to the state dir; follow it with `deployctl rollout watch`."),
    allow_served_name_change: bool = typer.Option(False, "--allow-served-name-change", help="Deploy a release whose model.served_name differs from the serving release's (clients sending the old name get 404 from it); refused without this flag."),
    runner: Optional[str] = typer.Option(None, "--runner", hidden=True, help="(internal) the detached runner of this service: record the exit code."),
) -> None:
    """Roll the configured release out: canary, analysis, promote or abort (exit 6)."""
    from deployctl.config import load_config
    from deployctl.errors import UsageError
    from deployctl.rollout.plan import steps_for

    cfg = load_config(config)
    steps_for(cfg, canary)  # a bad --canary is a usage error before any host is probed
    if resume and canary is not None:
        raise UsageError("--resume continues the journaled plan; --canary cannot change it", fix="drop --canary")
    if detach:
        _detach(cfg, config, yes=yes, canary=canary, break_lock=break_lock, validate=validate, resume=resume,
                rename=allow_served_name_change)
        return
    if runner is not None:
        if runner != cfg.service.name:
            raise UsageError(f"--runner {runner!r} is not this deploy.yaml's service ({cfg.service.name})",
                             fix="--runner is internal: `deploy --detach` passes it")
        _as_runner(cfg, canary, yes, break_lock, validate, resume, rename=allow_served_name_change)
        return
    _deploy(cfg, canary, yes, break_lock, validate, resume, rename=allow_served_name_change)


def _detach(cfg, config: Path, *, yes: bool, canary, break_lock: bool, validate, resume: bool,
            rename: bool = False) -> None:
    """Start the deploy as a detached runner (deployctl.rollout.detach) and return at once."""
    from deployctl.errors import UsageError
    from deployctl.rollout import detach

    if not yes and not resume:
        raise UsageError("deploy --detach cannot ask for confirmation in the background", fix="add --yes")
    argv = ["deploy", "-c", str(Path(config).resolve()), "--yes", "--runner", cfg.service.name]
    argv += [*(["--canary", str(canary)] if canary is not None else []), *(["--break-lock"] if break_lock else []),
             *(["--validate", validate] if validate else []), *(["--resume"] if resume else []),
             *(["--allow-served-name-change"] if rename else [])]
    pid, log, how = detach.spawn(cfg.service.name, argv,
                                 note=lambda m: err_console.print(m, markup=False, highlight=False))
    where = f" ({how})" if how != "process" else ""
    out_console.print(f"detached: the rollout runs as pid {pid}{where}, log {log}; follow it with `deployctl rollout "
                      "watch`, steer it with `deployctl promote` / `abort` / `rollback`", markup=False)


def _as_runner(cfg, canary, yes: bool, break_lock: bool, validate, resume: bool, rename: bool = False) -> None:
    """Run the deploy as the detached runner (deployctl.rollout.runner): a restart of a killed runner resumes from
    the journal; the exit code goes to runner.exit whatever happens."""
    from deployctl.errors import DeployctlError
    from deployctl.rollout import runner as this

    start = this.started(cfg.service.name)
    if start.finish is not None:  # killed after its deploy finished, before runner.exit: nothing left to do
        code = int(start.finish.get("exit_code") or 0)
        err_console.print(f"the runner restarted after its deploy had finished ({start.finish.get('result')}, "
                          f"exit {code})", markup=False)
        this.record_exit(cfg.service.name, code)
        raise typer.Exit(code)
    if start.restart:
        err_console.print("the runner was restarted after it was killed: continuing the deploy from its journal",
                          markup=False)
    code = 1
    try:
        _deploy(cfg, canary, yes, break_lock, validate, resume or start.restart, runner=start, rename=rename)
        code = 0
    except DeployctlError as e:
        code = int(e.exit_code)
        raise
    except KeyboardInterrupt:
        code = 130
        raise
    finally:
        this.record_exit(cfg.service.name, code)


def _deploy(cfg, canary, yes: bool, break_lock: bool, validate, resume: bool, runner=None, rename: bool = False) -> None:
    from deployctl.rollout.deploy import Deployment
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
                        confirm=None if resume else _confirm(yes), canary_check=check, resume=resume,
                        runner=runner, allow_served_name_change=rename).run()
    out_console.print(f"deployed {result.release} ({result.mode}) in {result.duration_s:.1f} s")


rollout_app = typer.Typer(
    help="Detached rollouts (deploy --detach): follow one from any shell.", no_args_is_help=True,
    epilog="Example: deployctl rollout watch",
)
app.add_typer(rollout_app, name="rollout")


@rollout_app.command("watch", epilog="Example: deployctl rollout watch --timeout 3600")
def rollout_watch(
    config: Path = CONFIG,
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Give up after this many seconds (exit 1)."),
) -> None:
    """Follow the detached rollout's log until it ends; exit with the rollout's exit code (4 when its runner was
    killed before it finished: continue it with `deployctl deploy --resume`)."""
    from deployctl.config import load_config
    from deployctl.rollout import detach

    cfg = load_config(config)
    code = detach.watch(cfg.service.name, lambda line: err_console.print(line, markup=False, highlight=False,
                                                                         soft_wrap=True), timeout_s=timeout)
    if code:
        raise typer.Exit(code)


@app.command(epilog="Example: deployctl promote -c deploy.yaml")
def promote(config: Path = CONFIG) -> None:
    """Move a running rollout on to its next step now (ends the current analysis pause)."""
    from deployctl.config import load_config
    from deployctl.rollout.rollback import signal

    out_console.print(signal(load_config(config), "promote", progress=progress_printer))


@app.command(epilog="Example: deployctl abort -c deploy.yaml")
def abort(config: Path = CONFIG) -> None:
    """Send all traffic back to stable and put the canary hosts back on the previous release."""
    from deployctl.config import load_config
    from deployctl.rollout.rollback import signal

    out_console.print(signal(load_config(config), "abort", progress=progress_printer))


@app.command(epilog="Example: deployctl rollback --json")
def rollback(
    config: Path = CONFIG,
    to: Optional[str] = typer.Option(None, "--to", help="Release id to make current (default: the previous one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result with the seconds of each phase as JSON."),
    fetch: bool = typer.Option(False, "--fetch", help="With model.source: fetch the target release's model version "
                               "again on the hosts where it was pruned, before rolling back."),
) -> None:
    """Make the previous (or named) release current on every host; wins over a deploy in progress."""
    from dataclasses import asdict

    from deployctl.config import load_config
    from deployctl.rollout.rollback import rollback as do_rollback

    from deployctl.rollout.interrupt import Interruption

    # Ctrl-C does not cut a rollback half-way (it is the way back): the first is noted, a second exits at once
    intr = Interruption("the rollback goes on, it is the way back",
                        on_force=lambda: f"The rollback{f' to {to}' if to else ''} did not finish: run `deployctl status`, "
                                         "then `deployctl rollback` again.")
    with intr.installed():
        r = do_rollback(load_config(config), to=to, progress=progress_printer, fetch=fetch)
    if as_json:
        print_json({**asdict(r), "duration_s": round(r.duration_s, 2)})
    elif r.noop:
        out_console.print(f"already on {r.target}: nothing to roll back (use --to RELEASE_ID to go further back)")
    else:
        out_console.print(f"rolled back to {r.target} in {r.duration_s:.1f} s")


@app.command(epilog="Example: deployctl status --check")
def status(config: Path = CONFIG, as_json: bool = JSON,
           check: bool = typer.Option(False, "--check", help="Exit 1 when a host is unhealthy or unsupervised, or "
                                      "when the hosts differ in release, engine, model manifest or config.")) -> None:
    """Per host: current release, health, supervision, traffic weight; the engine's KV pool against the plan
    (flagged past ±10%); the rollout in progress; which host differs from the rest. With --check: exit 1 on any
    problem (for cron and alerting)."""
    from rich.table import Table

    from deployctl.config import load_config
    from deployctl.rollout.status import rollout_live
    from deployctl.rollout.status import status as get_status

    doc = get_status(load_config(config))
    if as_json:
        print_json(doc)
        _status_check(doc, check)
        return
    table = Table(title="hosts")
    for col in ("host", "release", "engine", "healthy", "weight", "disk free", "standby", "detail"):
        table.add_column(col)
    for h in doc["hosts"]:
        w = "?" if h["weight"] is None else f"{h['weight']:g}%"
        engine = " ".join(x for x in (h.get("engine"), h.get("engine_version")) if x) or "-"
        sb = h.get("standby")
        sbt = "-" if not sb else (f"{sb['release']} :{sb['port']} until {sb['expires']}"
                                  + (" EXPIRED" if sb["expired"] else "") + ("" if sb["asleep"] else " (not asleep)")
                                  + _residue_text(sb))
        if not sb and h.get("no_standby"):
            sbt = f"no standby: {h['no_standby']['why']}"
        table.add_row(h["host"], h["current_release"] or "-", engine, "yes" if h["healthy"] else "NO", w,
                      _disk_text(h.get("disk")), sbt, h.get("detail", ""))
    out_console.print(table)
    for h in doc["hosts"]:
        if (h.get("disk") or {}).get("low"):
            out_console.print(f"disk LOW: {h['disk']['line']}", markup=False, soft_wrap=True)
    from deployctl.capacity.enginelog import describe as kv_line

    for h in doc["hosts"]:
        if h.get("kv_plan_vs_actual"):
            out_console.print(kv_line(h["host"], h["kv_plan_vs_actual"]), markup=False)
    for h in doc["hosts"]:
        c = h.get("cordoned")
        if c:
            out_console.print(f"cordoned: {h['host']} by {c['by']} since {c['since']}: "
                              f"{c.get('reason') or 'no reason given'}" + (" (engine stopped)" if c.get("stopped") else ""),
                              markup=False, soft_wrap=True)
        elif h.get("serving") is False:
            out_console.print(f"not serving: {h['host']} (warm pool or scaled in)", markup=False)
    ro = doc["rollout"]
    if ro:
        step = f", step {ro['step_index'] + 1}/{len(ro['steps'])} at {ro['weight']}%" if ro.get("steps") else ""
        out_console.print(f"last rollout: {ro['action']} {ro['release']} from {ro['from_release']}: {ro['status']}"
                          f"{step} (by {ro['owner']}, {ro['updated']})" + (f"; {ro['reason']}" if ro.get("reason") else ""),
                          markup=False)
    jr = doc.get("journal")
    if jr and jr["resumable"]:
        out_console.print(f"the deploy of {jr['release']} is not running any more (pid {jr['pid']} gone) and did not "
                          f"finish: stopped {_where(jr)}; "
                          "`deployctl deploy --resume` continues it, `deployctl rollback` restores the previous "
                          "release", markup=False)
    if doc.get("lock"):
        lk = doc["lock"]
        out_console.print(f"lock: {lk['text']}" + (f" [stale: {lk['why_stale']}]" if lk["stale"] else ""), markup=False)
    live = rollout_live(doc)
    for d in doc.get("differences", []):
        out_console.print(f"{'differs (the rollout in progress)' if live else 'inconsistent'}: {d}", markup=False)
    _status_check(doc, check)


def _disk_text(disk) -> str:
    """'41.2 GiB' (deploy_root's free space, leftovers counted) or '58.0 MiB LOW' (under the next deploy's need)."""
    from deployctl.config.units import format_bytes

    if not disk:
        return "?"
    return format_bytes(disk["free_bytes"] + disk["leftover_bytes"]) + (" LOW" if disk["low"] else "")


def _residue_text(sb: dict) -> str:
    """', GPU residue 0: 1.0 GiB (nvml)' from a standby's measured residue, '' when none was measured."""
    from deployctl.config.units import format_bytes

    rb = sb.get("residue_bytes")
    if not rb:
        return ""
    how = (sb.get("measured") or {}).get("how") or "measured"
    return ", GPU residue " + ", ".join(f"{g}: {format_bytes(int(b))}" for g, b in sorted(rb.items())) + f" ({how})"


def _where(jr: dict) -> str:
    """Where a killed deploy stopped, from status's ``journal``."""
    if jr["open_step"]:
        return "in " + jr["open_step_label"]
    return "between steps" if jr["done"] else "at its start, before its first step"


def _status_check(doc: dict, check: bool) -> None:
    """With --check: CheckFailed (exit 1) naming every problem (deployctl.rollout.status.check_problems: a live
    canary's two releases are not one)."""
    if not check:
        return
    from deployctl.rollout.status import check_problems

    problems = check_problems(doc)
    if problems:
        from deployctl.errors import CheckFailed

        raise CheckFailed(f"status --check: {'; '.join(problems)}")


@app.command(epilog="Example: deployctl history --json")
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


@app.command("compare-outputs",
             epilog="Example: deployctl compare-outputs --canary-url http://gpu-a:8001 --stable-url http://gpu-b:8000")
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
