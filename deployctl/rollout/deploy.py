"""``deploy``: the step machine (../shared/notes/canary-analysis.md; cases C18, C20).

preflight gate → disk check (deployctl.rollout.diskcheck: the measured payload fits on every host) → lock →
upload the release to every host → canary hosts: drain, switch, install, restart, verify →
golden outputs at weight 0 (deployctl.rollout.outputgate: before the router sends the canary any client request) →
for each weight step: render + ``nginx -t`` + reload, analysis over the pause (a pause of 0: none, said) → at 100%
roll the remaining hosts in batches (drain, switch, restart, verify, put back) → all hosts stable on the new
release → prune → done.

Any failure or failed verdict → abort: all traffic to the hosts still on the previous release, switched hosts back
to it (restarted, verified, put back), RolloutAborted (exit 6) with the reason and the numbers. Before every step
and during waits the deploy reads state/control.json: a rollback from another shell makes it stop at once without
touching anything more (the rollback owns the fleet now) and exit 6 "aborted by rollback"; an abort makes it run
its own abort; a promote ends the current pause.

Every step is journaled on the control machine before and after it acts (deployctl.rollout.journal: ``_step``);
``Deployment(resume=True)`` (``deploy --resume``) continues a killed deploy from its journal or rolls it back where
it cannot be continued (deployctl.rollout.resume), and says which.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.errors import DeployctlError, Fenced, RolloutAborted, about
from deployctl.rollout import hostops, release, standby
from deployctl.rollout.events import Progress, emitter
from deployctl.rollout.fleet import Fleet, Interrupted
from deployctl.rollout.interrupt import Interruption, StopRequested
from deployctl.rollout.journal import Journal, Progress as JournalProgress
from deployctl.rollout.outputgate import OutputGate, OutputsFailed, changed_note, history_outputs
from deployctl.rollout.plan import DeployPlan, make_plan
from deployctl.rollout.router import Split, split_for
from deployctl.rollout.state import Control, RolloutState
from deployctl.rollout.weightstep import Abort as _Abort, WeightSteps
from deployctl.rollout.deploy_abort import Aborting


class Intervened(Exception):
    """Another shell sent abort or rollback (``control``)."""

    def __init__(self, control: Control):
        super().__init__(control.command)
        self.control = control


@dataclass
class DeployResult:
    release: str
    from_release: Optional[str]
    mode: str
    verdicts: list[dict] = field(default_factory=list)
    duration_s: float = 0.0


class Deployment(Aborting, WeightSteps):
    """One run of ``deploy``. ``confirm(plan) -> bool`` is asked before anything changes (None: go)."""

    def __init__(self, cfg: DeployConfig, *, canary_pct: Optional[int] = None, break_lock: bool = False,
                 progress: Optional[Progress] = None, confirm: Optional[Callable[[DeployPlan], bool]] = None,
                 skip_preflight: Optional[bool] = None,
                 canary_check: Optional[Callable[[list[str]], Optional[str]]] = None, resume: bool = False,
                 runner=None, allow_served_name_change: bool = False):
        self.cfg, self.canary_pct, self.break_lock = cfg, canary_pct, break_lock
        # a new model.served_name is refused unless this says it is meant (deployctl.rollout.servedname)
        self.allow_served_name_change = allow_served_name_change
        self.resume = resume
        self.runner = runner  # deployctl.rollout.runner.RunnerStart of a detached runner: its journal and lock say so
        self.journal = Journal(cfg.service.name, runner=runner.token if runner is not None else None)
        self.progress = JournalProgress()  # the journal read back by a resume: steps already done are skipped
        self._journal_open = False  # this run writes the journal (started or adopted): it records the finish
        # deploy --validate: called with the canary host names once they serve the new release, before the first
        # weight step; a returned reason aborts the rollout (exit 6), None goes on
        self.canary_check = canary_check
        # per host, from the events of standby.activate / restore: the standby kept or why none, the abort's path
        self.standbys: dict[str, dict] = {}
        self.paths: dict[str, dict] = {}
        self.say = self._noting(emitter(progress))
        self.confirm = confirm
        # DEPLOYCTL_SKIP_PREFLIGHT=1: tests that exercise other parts skip the gate's few seconds per deploy
        self.skip_preflight = settings.current().skip_preflight if skip_preflight is None else skip_preflight
        self.fleet = Fleet(cfg, self.say)
        self.gen = 0
        self.promote_requested = False
        self.switched: set[str] = set()
        self.state: Optional[RolloutState] = None
        self.verdicts: list[dict] = []
        self.outputs: Optional[OutputGate] = None  # this deploy's golden-output comparisons
        self.baseline = None  # stable's latency figures from the last window that had them
        self.stable_engine = None  # engine.kind of the stable hosts' release (mixed fleets: analysis per side)
        # Ctrl-C is cooperative (deployctl.rollout.interrupt): the handler records it, check() acts on it
        self.interruption = Interruption("stopping at the next safe point, then aborting back to the previous release",
                                         on_force=self._left_undone)

    def _noting(self, say: Callable[..., None]) -> Callable[..., None]:
        """``say`` that also keeps, per host, what the history records: a standby kept (event data ``residue``)
        or not (``no_standby``: why) by standby.activate, the path an abort took (``path``, ``why``) by
        standby.restore."""

        def noting(kind: str, message: str, **data) -> None:
            host = data.get("host")
            if host and "no_standby" in data:
                self.standbys[host] = {"standby": False, "why": data["no_standby"]}
            elif host and "residue" in data:
                self.standbys[host] = {"standby": True, "residue_bytes": (data["residue"] or {}).get("residue_bytes")}
            if host and "path" in data:
                self.paths[host] = {"path": data["path"], "why": data.get("why")}
            say(kind, message, **data)

        return noting

    def _standby_note(self) -> str:
        """'no standby on a: why; ...' for the hosts where the deploy kept none, '' when none is missing."""
        return "; ".join(f"no standby on {h}: {d['why']}" for h, d in sorted(self.standbys.items())
                         if not d["standby"])

    # ------------------------------------------------------------------------------------------ control
    def check(self, *, every_host: bool = False) -> None:
        """Raise Intervened when another shell sent abort/rollback; note a promote. After Ctrl-C, raise
        StopRequested (in worker threads too, so that parallel host steps stop at their next check).
        ``every_host`` (at step boundaries): every host's control.json is read, and each must answer (RemoteError
        otherwise: losing a host mid-rollout aborts it). Else (the ticks of pauses, windows and readiness waits)
        one host's, in turn (StateStore.poll_control): a lost host is still found, at its turn."""
        self.interruption.check()
        store = self.fleet.store
        c = store.read_control(strict=True) if every_host else store.poll_control()
        if c.generation <= self.gen:  # older: a poll from before this deploy's own start
            return
        if c.command == "promote":
            self.gen = c.generation
            self.promote_requested = True
            self.say("info", f"promote requested by {c.by}")
            return
        raise Intervened(c)

    def _save(self, **changes) -> None:
        for k, v in changes.items():
            setattr(self.state, k, v)
        self.fleet.store.write_rollout(self.state)

    def _step(self, name: str, fn: Callable[[], None], *, switch: Optional[list[str]] = None) -> None:
        """Run step ``name`` journaled: a ``begin`` record before it acts (``switch``: the hosts it may switch to
        the new release, which an abort after a kill must put back), an ``end`` record after. A step a resumed
        journal shows ended is skipped."""
        if name in self.progress.done:
            return
        self.journal.begin(name, **({"switch": switch} if switch else {}))
        fn()
        self.journal.end(name)

    def _route(self, split: Split) -> None:
        shares = self.fleet.router.apply(split)
        self.state.weights = shares
        self.say("router", "traffic: " + ", ".join(f"{h} {w:g}%" for h, w in shares.items() if w) or "none",
                 shares=shares)

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> DeployResult:
        """Run the deploy. Ctrl-C (SIGINT, when called from the main thread) is cooperative
        (deployctl.rollout.interrupt): the deploy stops at its next check point, aborts to a consistent state and
        raises Interrupted (exit 130); a second Ctrl-C exits at once, saying what is left undone."""
        with self.interruption.installed():
            return self._run()

    def _before_changes(self) -> None:
        """A check point before anything on the fleet changed: Ctrl-C ends the deploy here with nothing to undo."""
        if self.interruption.requested:
            raise Interrupted("deploy interrupted before anything changed", fix="run `deployctl deploy` again")

    def _run(self) -> DeployResult:
        t0 = time.monotonic()
        fl = self.fleet
        if self.resume:
            return self._resumed(t0)
        try:
            fl.connect()
            fl.leave_out()  # cordoned hosts and hosts not serving (warm pool, scaled in) are left out, said
            self.cfg = fl.cfg
            self._before_changes()
            current = fl.current_releases()
            if self.cfg.model.source:  # issue 43: the model version onto every host first (nothing else changes)
                self._before_changes()
                fl.fetch_model()
            if not self.skip_preflight:
                self._before_changes()
                fl.preflight_gate()
            self._before_changes()
            info = fl.make_release()
            plan = make_plan(self.cfg, info, current, self.canary_pct)
            self.say("plan", "plan: " + "; ".join(plan.lines()), plan=plan.to_json())
            self._served_name_change(plan, current)
            fl.check_disk(info)  # the payload measured, every host's free space: before the lock and any upload
            self._before_changes()
            if self.confirm is not None:
                with self.interruption.suspended():  # Ctrl-C at the prompt: KeyboardInterrupt, nothing changed
                    go = self.confirm(plan)
                if not go:
                    raise DeployctlError("deploy cancelled; nothing changed")
            self._before_changes()
            fl.lock("deploy", break_lock=self.break_lock, runner=self.runner)
            return self._journaled(lambda: self._unlocking(plan, t0))
        finally:
            fl.close()

    def _served_name_change(self, plan: DeployPlan, current: dict) -> None:
        """Name a change of model.served_name against the stable release; refuse it unless allowed (UsageError)."""
        from deployctl.rollout.servedname import check_change

        on_old = [n for n, r in current.items() if r and r == plan.from_release]
        if not on_old:
            return
        line = check_change(self.cfg, self.fleet.hosts[on_old[0]], plan.from_release,
                            allow=self.allow_served_name_change)
        if line:
            self.say("warn", f"{line} (--allow-served-name-change)")

    def _resumed(self, t0: float) -> DeployResult:
        """``deploy --resume``: the journal's plan, the lock (refused while the deploy still runs; a killed one's
        stale lock broken), then continue or roll back (deployctl.rollout.resume)."""
        from deployctl.rollout import resume

        self.progress = resume.load(self.cfg)
        plan = resume.plan_of(self.progress.start)
        fl = self.fleet
        try:
            fl.connect()
            resume.take_lock(fl, self.cfg, self.runner)
            return self._journaled(lambda: self._unlocking(plan, t0))
        finally:
            fl.close()

    def _journaled(self, fn: Callable[[], DeployResult]) -> DeployResult:
        """Run ``fn`` and journal how it finished (once its journal was started or adopted): the ``finish``
        record comes after the lock is released, the deploy's very last act."""
        try:
            result = fn()
        except Fenced as e:  # taken over: the journal is the new holder's when it was taken here (refused then)
            if self._journal_open:
                try:
                    self.journal.finish(type(e).__name__, e.exit_code, str(e))
                except Fenced:
                    pass
            raise
        except DeployctlError as e:
            if self._journal_open:
                self.journal.finish(type(e).__name__, e.exit_code, str(e))
            raise
        if self._journal_open:
            self.journal.finish("done", 0)
        return result

    def _unlocking(self, plan: DeployPlan, t0: float) -> DeployResult:
        try:
            return self._locked(plan, t0)
        finally:
            self.fleet.unlock()

    def _locked(self, plan: DeployPlan, t0: float) -> DeployResult:
        fl = self.fleet
        self.journal.generation = fl.generation  # a newer holder's lock fences our journal too
        why_not = None
        if self.resume:
            from deployctl.rollout import resume

            p = self.progress
            self.gen = int(p.start.get("generation") or 0)  # an abort or rollback sent meanwhile is seen at check()
            self.switched = set(p.touched)
            self.journal.adopt()
            self._journal_open = True
            wheel = None
            if "upload" not in p.done:
                fl.wheel = release.build_wheel()
                wheel = release._sha256_file(fl.wheel)
            why_not = p.abort_reason or resume.why_not(self.cfg, plan, p, wheel)
            at = p.label(p.open_step) if p.open_step else "the step after " + (
                p.label(p.ended[-1]) if p.ended else "the start")
            if why_not:
                self.say("resume", f"resuming {plan.release.id}: cannot continue at {at}: {why_not}; rolling back "
                                   f"to {plan.from_release or 'nothing'}")
            else:
                self.say("resume", f"resuming {plan.release.id} from the journal at {at} "
                                   f"(done: {', '.join(p.label(d) for d in p.ended) or 'nothing'})")
        else:
            self.gen = fl.store.send("deploy", reason=plan.release.id).generation
            from deployctl.rollout.resume import start_record

            self.journal.start(start_record(plan, self.gen))
            self._journal_open = True
        self.state = RolloutState(action="deploy", release=plan.release.id, from_release=plan.from_release,
                                  generation=self.gen, steps=plan.steps, canary_hosts=plan.canary,
                                  stable_hosts=plan.stable, pid=os.getpid())
        self._save()
        fl.store.append_history("deploy", release=plan.release.id, result="resumed" if self.resume else "started",
                                from_release=plan.from_release, mode=plan.mode,
                                **({"reason": f"rolling back: {why_not}"} if why_not else {}),
                                **({"model_fetch": fl.model_fetch} if fl.model_fetch else {}))
        try:
            if why_not:
                raise _Abort(f"resume could not continue: {why_not}")
            self.check(every_host=True)
            self._step("upload", lambda: fl.upload_all(plan.release, point=self.journal.point))
            if plan.mode == "canary":
                self._canary(plan)
            else:
                self._all_at_once(plan)
        except Fenced:
            raise  # another command holds the lock now: this deploy touches nothing more (deployctl.hosts.fence)
        except Intervened as iv:
            c = iv.control
            if c.command == "rollback":
                reason = f"aborted by rollback from {c.by}"
                self.say("abort", reason)
                fl.store.append_history("deploy", release=plan.release.id, result="aborted", reason=reason)
                err = RolloutAborted(reason, fix="the rollback restores the previous release; see `deployctl status`")
                self.journal.finish(type(err).__name__, err.exit_code, str(err))  # before the rollback holds the lock
                self._journal_open = False
                fl.unlock()  # the rollback waits for our lock: let go (last: from then on it fences us)
                raise err from None
            return self._abort(plan, f"aborted by {c.by}" + (f": {c.reason}" if c.reason else ""))
        except (StopRequested, KeyboardInterrupt):  # KeyboardInterrupt: a caller's own handler (not the CLI's)
            self.interruption.request()
            self._abort(plan, "interrupted (Ctrl-C)", interrupted=True)
        except (_Abort, OutputsFailed) as a:
            self._abort(plan, a.reason, verdict=a.verdict, cause=a if getattr(a, "fix", None) else None)
        except DeployctlError as e:
            self._abort(plan, str(e), cause=e)
        self._step("prune", lambda: fl.prune(plan))
        note = changed_note(self.verdicts)  # outputs.on_change report: the differences it let by
        note = "; ".join(x for x in (note, self._standby_note()) if x) or None
        self._save(status="done", step_index=len(plan.steps) - 1, weight=100, reason=note)
        dur = time.monotonic() - t0
        outputs = history_outputs(self.verdicts)
        fl.store.append_history("deploy", release=plan.release.id, result="ok", from_release=plan.from_release,
                                duration_s=round(dur, 1), **({"outputs": outputs} if outputs else {}),
                                **({"standby": self.standbys} if self.standbys else {}),
                                **({"reason": note} if note else {}))
        missing = self._standby_note()
        self.say("done", f"release {plan.release.id} serves all traffic ({dur:.1f} s)"
                 + (f"; {missing}" if missing else ""))
        return DeployResult(plan.release.id, plan.from_release, plan.mode, self.verdicts, dur)

    # ------------------------------------------------------------------------------------------ modes
    def _activate(self, names: list[str], release_id: str, *, route_first: bool = False) -> None:
        """Switch ``names`` to ``release_id``. ``route_first`` (in place: the one host is not drained): the router
        moves to the new release once it is verified beside the old one, before the old one sleeps."""
        hosts = [self.fleet.hosts[n] for n in names]
        for n in names:
            self.say("host", f"{n}: switching to {release_id}, restarting, verifying", host=n)
        ready = (lambda n: self._route(Split((n,), (), 0))) if route_first else None

        def act(h):  # the old release sleeps beside the new one when it can (deployctl.rollout.standby)
            return standby.activate(h, self.cfg, release_id, should_stop=self.check, on_switch=self.switched.add,
                                    say=self.say, on_ready=ready)

        ok, bad = self.fleet.on_hosts(hosts, act, deadline_s=hostops.activate_deadline_s(self.cfg),
                                   what=f"switching to {release_id}")
        for n, v in ok.items():
            self.say("host", f"{n}: ready in {v.ready_s:.1f} s, sample inference {v.tokens} tokens{v.note()} "
                             f"({', '.join(f'{k} {x:g}' for k, x in v.timings.items())})", host=n, timings=v.timings)
        for err in bad.values():
            if isinstance(err, (Intervened, StopRequested)):
                raise err
        if bad:
            n, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else DeployctlError(about(n, err))

    def _all_at_once(self, plan: DeployPlan) -> None:
        names = plan.stable
        if plan.mode == "in-place":
            self.say("info", f"one host: no canary possible; verified in-place switch on {names[0]}")
        in_place = plan.mode == "in-place" and bool(self.cfg.router)  # the only host: moved before its old one sleeps
        self._step("activate", lambda: self._activate(names, plan.release.id, route_first=in_place), switch=names)
        if self.cfg.router:
            self._step("route", lambda: self._route(Split(tuple(names), (), 0)))
        self._save(step_index=0, weight=100)

    def _canary(self, plan: DeployPlan) -> None:
        new, old = list(plan.canary), list(plan.stable)
        self.check(every_host=True)
        stable_kind = self._stable_kind(plan, old)
        if stable_kind and stable_kind != self.cfg.engine.kind:  # both engines behind one nginx upstream
            self.fleet.router.engines_behind = frozenset({stable_kind})
        self._step("drain", lambda: self._route(split_for([], old, 0)))  # drain the canary hosts
        self._step("activate", lambda: self._activate(new, plan.release.id), switch=new)
        if self.canary_check is not None:
            self._step("validate", lambda: self._validate(new))
        self._step("outputs", lambda: self._gate(plan).before_traffic(new, old))  # weight 0: no client yet
        for i, weight in enumerate(plan.steps):
            self.check(every_host=True)
            self._step(f"weight:{i}", lambda: self._weight_step(plan, i, weight, new, old))
        for j, batch in enumerate(plan.batches):
            self.check(every_host=True)
            old = [n for n in old if n not in batch]
            self._step(f"batch:{j}", lambda: self._batch(plan, batch, new, old), switch=batch)
            new += batch
        self.fleet.router.engines_behind = frozenset()  # only the new release's engine from here on
        self._step("route", lambda: self._route(Split(tuple(new), (), 0)))

    def _validate(self, new: list[str]) -> None:
        self.say("step", f"validating the canary {', '.join(new)} before the first weight step")
        why = self.canary_check(new)
        if why:
            raise _Abort(f"canary validation failed: {why}")

    def _batch(self, plan: DeployPlan, batch: list[str], new: list[str], old: list[str]) -> None:
        """Drain ``batch``, switch it to the new release, put it back beside ``new`` (``old``: stable without it)."""
        self._route(split_for(new, old, 100))  # drain the batch
        self._activate(batch, plan.release.id)
        self._route(split_for(new + batch, old, 100))

    def _stable_kind(self, plan: DeployPlan, old: list[str]):
        """The engine the stable hosts run (release.json of the release the deploy started from; None: unknown,
        taken as engine.kind), read at the first analysis."""
        if self.stable_engine is None and old and plan.from_release:  # "" once read and unreadable: read once
            self.stable_engine = release.engine_of(self.fleet.hosts[old[0]], plan.from_release)[0] or ""
        return self.stable_engine or None
