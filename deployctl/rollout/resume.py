"""``deploy --resume``: read a killed deploy's journal (deployctl.rollout.journal) back into its plan, and decide
whether its step machine can be continued where it stopped or must roll back.

Continue: the journal is unfinished, deploy.yaml renders the same configuration (config hash of the journaled
release) and, while the upload has not ended, the runtime wheel is byte-identical to the journaled one. A step that
had begun and not ended is done again from its start (every step is idempotent: an upload skips a complete
release directory, an activation switches, restarts and verifies, a weight step routes and opens a fresh analysis
window). An abort that had begun is finished. Otherwise (``why_not`` names the reason) the resume rolls back:
the abort path, every host that a begun step switched back on the previous release, traffic on stable (exit 6).

A deploy that still runs is never resumed (``take_lock``): its detached runner alive here, or a live holder of the
lock (its heartbeat fresh: deployctl.rollout.lock), refuses the resume naming it; a second step machine on the same
fleet would fight the first. A runner whose lease expired (its lock's heartbeat older than DEPLOYCTL_LOCK_MAX_AGE_S:
stopped with SIGSTOP, hung) is taken over, and the history says so (a ``takeover`` record): the lock's new
generation fences it, so that once continued it changes nothing (deployctl.hosts.fence).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from typing import Any, Optional

from deployctl.config import DeployConfig
from deployctl.errors import DeployctlError
from deployctl.rollout.journal import Progress, control_dir, read
from deployctl.rollout.plan import DeployPlan
from deployctl.rollout.release import ReleaseInfo


class NothingToResume(DeployctlError):
    """No unfinished deploy in the journal (exit 1)."""


RUNNING_FIX = ("it still runs: follow it with `deployctl rollout watch` (detached) or in its terminal, and steer it "
               "with `deployctl promote` / `deployctl abort` / `deployctl rollback`; `deploy --resume` continues only "
               "a deploy whose process is gone")


def take_lock(fleet, cfg: DeployConfig, runner=None) -> None:
    """The resume's lock (module doc): RunnerBusy when the service's detached runner runs here (other than this
    process), LockHeld naming the holder (user@machine, pid, unit) when a live deploy holds the lock; a killed
    deploy's stale lock is broken. ``runner``: the RunnerStart of a detached runner that resumes."""
    from deployctl.rollout import detach
    from deployctl.rollout.lock import LockHeld, describe

    busy = detach.runner_pid(cfg.service.name)
    if busy and busy != os.getpid():
        _runner_expired(fleet, cfg, busy)
    try:
        fleet.lock("deploy", break_stale=True, runner=runner)
    except LockHeld as e:
        if not e.owner:
            raise
        what = e.owner.get("command") or "deploy"
        raise LockHeld(f"deploy --resume: the {what} that holds the lock on {e.host} still runs: {describe(e.owner)} "
                       "(its heartbeat is fresh); nothing to resume", owner=e.owner, host=e.host,
                       fix=RUNNING_FIX) from None


def _runner_expired(fleet, cfg: DeployConfig, pid: int) -> None:
    """Return when the service's detached runner ``pid`` (alive here) lost its lease: every lock it holds has a
    heartbeat older than DEPLOYCTL_LOCK_MAX_AGE_S (said, then taken over by the caller). Else RunnerBusy: it still
    runs, or it is stopped (SIGSTOP) and its lease has not expired yet (when it will is said)."""
    from deployctl import settings
    from deployctl.rollout import detach, procs

    service = cfg.service.name
    who = detach.describe_runner(service, pid)
    held = [i for i in fleet.inspect_lock() if int(i.owner.get("pid") or 0) == pid]
    if held and all(i.stale for i in held):
        state = "stopped (SIGSTOP)" if procs.is_stopped(pid) else "not refreshing its lock"
        fleet.say("warn", f"the detached rollout of {service} ({who}) is {state}: its lease expired "
                          f"({held[0].why_stale}); taking it over")
        return
    if held and procs.is_stopped(pid):
        bound = settings.current().lock_max_age_s
        age = max(float(i.owner.get("heartbeat_age_s") or 0) for i in held)
        raise detach.RunnerBusy(
            f"deploy --resume: the detached rollout of {service} ({who}) is stopped (SIGSTOP) and holds the lock; "
            f"its lease expires when its heartbeat is {bound:g} s old (now {age:.0f} s)",
            fix=f"continue it (kill -CONT {pid}), or run `deployctl deploy --resume` again in {max(1, bound - age):.0f} s "
                "to take it over (or `deployctl rollback`)")
    raise detach.RunnerBusy(f"deploy --resume: the detached rollout of {service} still runs as {who}; nothing to "
                            "resume", fix=RUNNING_FIX)


def start_record(plan: DeployPlan, generation: int) -> dict[str, Any]:
    """The journal's ``start`` record: the whole plan, so that a resume needs nothing else."""
    return {"release": asdict(plan.release), "mode": plan.mode, "from_release": plan.from_release,
            "canary": plan.canary, "stable": plan.stable, "steps": plan.steps, "pause_s": plan.pause_s,
            "batches": plan.batches, "current": plan.current, "pauses": plan.pauses, "made_at": plan.made_at,
            "generation": generation}


def plan_of(start: dict[str, Any]) -> DeployPlan:
    """The DeployPlan a ``start`` record describes."""
    return DeployPlan(ReleaseInfo(**start["release"]), start["mode"], start.get("from_release"),
                      list(start.get("canary") or []), list(start.get("stable") or []), list(start["steps"]),
                      float(start.get("pause_s") or 0), [list(b) for b in start.get("batches") or []],
                      dict(start.get("current") or {}), list(start.get("pauses") or []),
                      float(start.get("made_at") or 0))


def load(cfg: DeployConfig) -> Progress:
    """The service's unfinished deploy. Raises NothingToResume when there is none (no journal, or it finished)."""
    p = Progress.of(read(cfg.service.name))
    where = control_dir(cfg.service.name)
    if p.start is None:
        raise NothingToResume(f"no deploy journal for {cfg.service.name} under {where}: nothing to resume",
                              fix="run `deployctl deploy` (a resume continues a deploy started on this machine)")
    if p.finish is not None:
        rel = p.start["release"]["id"]
        raise NothingToResume(f"the last deploy ({rel}) finished: {p.finish.get('result')} "
                              f"(exit {p.finish.get('exit_code')}); nothing to resume",
                              fix="see `deployctl status`; run `deployctl deploy` for a new rollout")
    return p


def why_not(cfg: DeployConfig, plan: DeployPlan, progress: Progress, wheel_sha: Optional[str]) -> Optional[str]:
    """Why the deploy cannot be continued (None: it can): deploy.yaml changed, a host left it, or the wheel an
    unfinished upload needs is not the journaled one."""
    from deployctl.render import config_text

    now = hashlib.sha256(config_text(cfg).encode()).hexdigest()
    if now != plan.release.config_hash:
        return (f"deploy.yaml changed since the deploy started (config {now[:12]}, the release's "
                f"{plan.release.config_hash[:12]})")
    names = {h.name for h in cfg.hosts}
    gone = [n for n in [*plan.canary, *plan.stable] if n not in names]
    if gone:
        return f"{', '.join(gone)} no longer in deploy.yaml"
    if "upload" not in progress.done and wheel_sha is not None and wheel_sha != plan.release.runtime_wheel_sha256:
        return (f"the upload had not finished and the runtime wheel changed (sha256 {wheel_sha[:12]}, the "
                f"release's {plan.release.runtime_wheel_sha256[:12]})")
    return None
