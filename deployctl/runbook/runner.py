"""Run a runbook on hosts, step by step: check → expected → on a pass ``on_pass``; on a failure a branch or an
action (confirmation unless ``yes``; a "no" changes nothing and ends the run on that host). Dry-run executes every
check once (no polling: nothing it would wait for is being done) and only describes actions. After a changing action the step's check runs again (polling up to the action's
timeout_s) and the step is "fixed" or "not fixed".

A host's run succeeds when no step escalated and its last executed step passed or was fixed; its outcome is then
"healthy" (no check failed), "fixed" (an action fixed something) or "ok". Otherwise the outcome is "escalated" (a
finding for a person) or the last step's: "failed", "declined", "would act" (dry-run), "not fixed" or "error".
A step whose statistic had too few observations (MetricCheck.samples_needed) neither passes nor acts: its outcome
is "cannot judge", no action runs, the run goes on as after a pass (on_pass's flow), and the host's outcome is "cannot judge" (exit 1) unless
something escalated or failed.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig, HostConfig
from deployctl.errors import DeployctlError, ExitCode
from deployctl.runbook import actions, audit
from deployctl.runbook.checks import Observation, Target, observe
from deployctl.runbook.context import host_variables
from deployctl.service import launcher
from deployctl.runbook.model import Action, Runbook, Step

MAX_STEPS_PER_HOST = 100  # a branch loop ends here


@dataclass
class StepResult:
    """One executed step on one host (also the audit record's body)."""

    host: str
    step: str
    title: str
    check: str
    observed: Any
    expected: str
    ok: bool
    detail: str
    recorded: dict[str, Any] = field(default_factory=dict)
    action: Optional[str] = None
    result: Optional[str] = None
    outcome: str = "ok"  # ok | failed | fixed | done | not fixed | declined | would act | escalated | cannot judge | error
    duration_s: float = 0.0


@dataclass
class HostReport:
    host: str
    steps: list[StepResult] = field(default_factory=list)
    outcome: str = "healthy"
    error: Optional[DeployctlError] = None

    @property
    def succeeded(self) -> bool:
        return self.outcome in ("healthy", "fixed", "ok")


@dataclass
class RunReport:
    runbook: str
    run_id: str
    user: str
    dry_run: bool
    hosts: list[HostReport] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 when every host succeeded; an error's own code (4 for SSH); else 1."""
        errors = [h.error for h in self.hosts if h.error is not None]
        if errors:
            return errors[0].exit_code
        return ExitCode.OK if all(h.succeeded for h in self.hosts) else ExitCode.CHECK_FAILED


@dataclass
class RunOptions:
    dry_run: bool = False
    yes: bool = False
    confirm: Callable[[str], bool] = lambda prompt: False  # asked before a changing action unless yes
    on_step: Callable[[StepResult], None] = lambda result: None
    config_path: Optional[str] = None
    poll_s: float = 0.5


def run_runbook(rb: Runbook, cfg: DeployConfig, hosts: list[HostConfig], opts: RunOptions) -> RunReport:
    """Run ``rb`` on each of ``hosts`` in turn (Host layer connections opened and closed here)."""
    from deployctl.hosts import Host

    report = RunReport(rb.name, uuid.uuid4().hex[:12], settings.operator(), opts.dry_run)
    for hc in hosts:
        hr = HostReport(hc.name)
        report.hosts.append(hr)
        host = Host.from_config(hc)
        try:  # the port the runtime serves on now (spare_port after a rollback there): {port} in the steps
            launcher.load_port(host, cfg)
        except DeployctlError:
            pass  # unreachable: the first step says so
        t = Target(cfg, hc, host, host_variables(cfg, hc), config_path=opts.config_path)
        try:
            _run_host(rb, t, hr, report, opts)
        except DeployctlError as err:
            hr.outcome, hr.error = "error", err
        finally:
            try:
                _flush(t, report)
            except DeployctlError as err:  # the host went away: the report still says what happened
                hr.error = hr.error or err
                hr.outcome = "error"
            finally:
                host.close()
    return report


def _observe(t: Target, step: Step, timeout: float, poll_s: float, wait: bool) -> tuple[Observation, bool]:
    """Observe once, or poll until the expectation holds or ``timeout`` s pass when ``wait``."""
    expect = step.expectation
    deadline = time.monotonic() + timeout
    while True:
        obs = observe(t, step)
        if obs.cannot_judge:
            ok = False  # too few observations: with wait, poll for more within the bound
        elif obs.no_data:
            ok = getattr(step.check.spec, "no_data", "fail") == "pass"
        else:
            ok = expect.holds(obs.value, t.fill)
        if ok or not wait or time.monotonic() + poll_s > deadline:
            return obs, ok
        time.sleep(poll_s)


def _run_host(rb: Runbook, t: Target, hr: HostReport, report: RunReport, opts: RunOptions) -> None:
    i, fixed_any, failed_any = 0, False, False
    for _ in range(MAX_STEPS_PER_HOST):
        if i >= len(rb.steps):
            break
        step = rb.steps[i]
        started = time.monotonic()
        obs, ok = _observe(t, step, step.timeout_s, opts.poll_s, step.wait and not opts.dry_run)
        t.observed[step.id] = obs
        res = StepResult(t.host_cfg.name, step.id, step.title, step.check.kind, obs.value, step.expect, ok, obs.detail,
                         {k: obs.fields.get(k) for k in step.record}, outcome="ok" if ok else "failed")
        flow = step.on_pass if ok else step.on_fail
        if obs.cannot_judge:  # neither a pass nor a finding: say so, take no action, go on as after a pass
            res.outcome = "cannot judge"
            flow = step.on_pass if isinstance(step.on_pass, str) else "next"
        elif not ok:
            failed_any = True
        if isinstance(flow, Action):
            try:
                flow = _act(step, flow, obs, t, res, opts)
            except DeployctlError as err:
                res.result, res.outcome = f"failed: {err}", "error"
                _finish(res, t, hr, report, opts)
                hr.outcome, hr.error = "error", err
                return
            fixed_any = fixed_any or res.outcome in ("fixed", "done")
        res.duration_s = round(time.monotonic() - started, 3)
        _finish(res, t, hr, report, opts)
        if flow == "stop":
            break
        i = i + 1 if flow == "next" else rb.step_index(flow)
    last = hr.steps[-1].outcome if hr.steps else "ok"
    if any(s.outcome == "escalated" for s in hr.steps):
        hr.outcome = "escalated"  # a finding for a person, even when the run went on to other steps
    elif last in ("ok", "fixed", "done", "cannot judge"):
        if any(s.outcome == "cannot judge" for s in hr.steps):
            hr.outcome = "cannot judge"  # not healthy either: a statistic had too few samples to say
        else:
            hr.outcome = "fixed" if fixed_any else ("ok" if failed_any else "healthy")
    else:
        hr.outcome = last


def _act(step: Step, action: Action, obs: Observation, t: Target, res: StepResult, opts: RunOptions) -> str:
    """Do (or describe) the action; set res.action/result/outcome; return the flow to follow."""
    res.action = actions.describe(action, obs, t)
    if not action.is_changing:
        res.result, res.outcome = actions.perform(action, obs, t), "escalated"
        return action.then
    if opts.dry_run:
        res.result, res.outcome = "not run (dry-run)", "would act"
        return action.then
    if action.needs_confirmation and not opts.yes and not opts.confirm(f"{t.host_cfg.name}: {res.action}?"):
        res.result, res.outcome = "declined: nothing changed", "declined"
        return "stop"
    res.result = actions.perform(action, obs, t)
    if not action.verify:
        res.outcome = "done"
        return action.then
    after, ok = _observe(t, step, action.timeout_s, opts.poll_s, wait=True)
    t.observed[step.id] = after
    res.result += f"; then: {after.detail}"
    res.outcome = "fixed" if ok else "not fixed"
    return action.then if ok else "stop"


def _finish(res: StepResult, t: Target, hr: HostReport, report: RunReport, opts: RunOptions) -> None:
    hr.steps.append(res)
    t.pending_audit.append(audit.record(res, run_id=report.run_id, runbook=report.runbook, user=report.user,
                                        dry_run=report.dry_run))
    if res.outcome in ("fixed", "done", "not fixed", "error"):  # something changed: on record before the next step
        _flush(t, report)
    opts.on_step(res)


def _flush(t: Target, report: RunReport) -> None:
    records, t.pending_audit = t.pending_audit, []
    audit.append(t.host, t.variables["state_dir"], records)
