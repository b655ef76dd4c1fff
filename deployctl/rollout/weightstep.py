"""One canary weight step of the deploy's step machine (``Deployment``'s part that waits): route the step's share,
hold the analysis windows over its pause, end the pause on a hand ``promote``, compare the golden outputs, abort on
a failed verdict.

After a kill, ``deploy --resume`` redoes the begun step but not its whole pause: the journal's ``pause`` point
(``began``: Unix time, ``pause_s``) says when the step's pause began, and the resumed step waits only what is left of
it, saying so; the analysis windows that passed before the kill (the journal's ``window`` points) still count. A
remainder of 0 with a passed window moves on at once; without one, one analysis window (``interval_s``, at most the
pause) judges the canary first.
"""
from __future__ import annotations

import time
from typing import Optional

from deployctl.config.units import format_duration
from deployctl.rollout.outputgate import OutputGate
from deployctl.rollout.plan import DeployPlan
from deployctl.rollout.router import split_for


class Abort(Exception):
    """The rollout must abort: ``reason`` (and the failed ``verdict``, when one decided it)."""

    def __init__(self, reason: str, verdict: Optional[dict] = None):
        super().__init__(reason)
        self.reason, self.verdict = reason, verdict


class WeightSteps:
    """The weight steps of ``deployctl.rollout.deploy.Deployment`` (a mix-in: it uses the deployment's ``cfg``,
    ``fleet``, ``journal``, ``progress``, ``outputs``, ``verdicts``, ``state``, ``say``, ``check``, ``_route``,
    ``_save``, ``_stable_kind``)."""

    def _weight_step(self, plan: DeployPlan, i: int, weight: int, new: list[str], old: list[str]) -> None:
        self.say("step", f"step {i + 1}/{len(plan.steps)}: canary weight {weight}%", weight=weight, index=i)
        self._route(split_for(new, old, weight))
        self._save(step_index=i, weight=weight)
        job = self._gate(plan).start(new, old)
        left, passed = self._pause_left(f"weight:{i}", i, weight, plan.pause_at(i))
        self._analyze(plan, new, old, weight, job, pause=left, passed=passed)
        self._gate(plan).settle(job, weight, wait=True)

    def _pause_left(self, step: str, i: int, weight: int, pause: float) -> tuple[float, int]:
        """(seconds of the step's pause still to wait, analysis windows that passed in it so far), from the
        journal (module doc); a first run journals when the pause begins and waits all of it."""
        if pause <= 0:
            return 0.0, 0
        began = self.progress.pause_began.get(step)
        passed = self.progress.passes.get(step, 0)
        if began is None:
            self.journal.point("pause", weight=weight, began=time.time(), pause_s=pause)
            return pause, 0
        left = max(0.0, pause - (time.time() - began))
        note = ""
        if not passed and left < min(pause, self.cfg.rollout.analysis.interval_s):
            left = min(pause, self.cfg.rollout.analysis.interval_s)
            note = "; no window passed before the kill: one analysis window first"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(began))
        self.say("resume", f"step {i + 1} ({weight}%): {format_duration(round(left))} of its {format_duration(pause)} "
                           f"pause left (it began {when}); {passed} analysis window(s) passed before{note}",
                 left_s=round(left, 1), pause_s=pause, passed=passed)
        return left, passed

    def _record(self, vj: dict) -> None:
        """Keep a verdict in state/rollout.json: every output comparison and the 20 newest analysis windows."""
        self.verdicts.append(vj)
        recent = {i for i, v in enumerate(self.verdicts) if v.get("kind") != "outputs"}
        recent = set(sorted(recent)[-20:])
        self.state.verdicts = [v for i, v in enumerate(self.verdicts) if i in recent or v.get("kind") == "outputs"]
        self._save()

    def _gate(self, plan: DeployPlan) -> OutputGate:
        """This deploy's golden-output comparisons (deployctl.rollout.outputgate), made on first use."""
        if self.outputs is None:
            self.outputs = OutputGate(self.cfg, self.fleet.hosts, plan.release.id, plan.from_release,
                                      record=self._record, say=self.say, check=self.check)
        return self.outputs

    def _wait_paused(self, weight: int, why: str, job=None) -> bool:
        """Pause for a human: True when promoted (go on), else Intervened/StopRequested raise out of check()
        (and a failed output comparison aborts meanwhile)."""
        self._save(status="paused", reason=why)
        self.say("pause", f"paused at {weight}%: {why}; `deployctl promote` to go on or `deployctl abort`")
        while not self.promote_requested:
            self.check()
            self.outputs.settle(job, weight, wait=False)
            time.sleep(0.25)
        self._save(status="running", reason=None)
        return True

    def _analyze(self, plan: DeployPlan, new: list[str], old: list[str], weight: int, job=None, *,
                 pause: float = 0.0, passed: int = 0) -> None:
        """Analysis windows over ``pause`` seconds (``passed``: windows of this step that passed before a kill);
        Abort on a failed verdict, or when no window passed by the end."""
        a = self.cfg.rollout.analysis
        if pause <= 0:  # rollout.steps[].pause / pause_s 0 (the plan said so too), or nothing left of it on resume
            if not passed:
                self.say("warn", f"{weight}%: pause 0, no analysis window: the step goes on unjudged but for the "
                                 "canary's start checks and its golden outputs")
            return
        from deployctl.rollout.analysis import Analyzer  # here: a deploy without analysis pauses never needs it
        from deployctl.rollout.verdicts import InconclusiveStreak, idle

        fl = self.fleet
        chat = self.outputs.chat if self.outputs is not None and self.outputs.chat is not None else True
        an = Analyzer(self.cfg, fl.router, fl.hosts, new, old, chat=chat, baseline=self.baseline,
                      stable_kind=self._stable_kind(plan, old))
        streak = InconclusiveStreak(a.inconclusive_limit)
        try:
            deadline = time.monotonic() + pause
            win = an.open_window()
            passes, last = passed, None
            while True:
                next_eval = min(deadline, time.monotonic() + a.interval_s)
                while time.monotonic() < next_eval:
                    self.check()
                    self.outputs.settle(job, weight, wait=False)
                    if self.promote_requested:  # sent during this pause or just before it
                        self.promote_requested = False
                        self.say("info", f"promoted by hand at {weight}%")
                        if job is not None:
                            job.reported = True  # the operator decided: the comparison is not waited for
                        return
                    time.sleep(min(0.25, max(0.0, next_eval - time.monotonic())))
                last = an.evaluate(win, weight)
                self.baseline = an.baseline
                vj = last.to_json()
                self._record(vj)
                self.journal.point("window", weight=weight, result=last.result)
                self.say("analysis", f"analysis at {weight}%: {last.summary()}", verdict=vj)
                if last.result == "fail":
                    raise Abort(f"analysis failed at {weight}%: {last.reason} ({last.summary()})", vj)
                if last.result == "pass":
                    passes += 1
                    win = an.open_window()
                if streak.add(last.result, idle(last, a.min_client_requests)):
                    if streak.all_idle:  # nothing judged the canary: abort, do not hold it untested
                        raise Abort(f"{streak.count} analysis windows in a row without client traffic at {weight}% "
                                     f"(< min_client_requests {a.min_client_requests}; inconclusive_limit "
                                     f"{a.inconclusive_limit}): {last.reason}", vj)
                    self._wait_paused(weight, f"{streak.count} inconclusive analysis windows in a row "
                                              f"(inconclusive_limit {a.inconclusive_limit}): {last.reason}", job)
                    self.promote_requested = False
                    self.say("info", f"promoted by hand at {weight}%")
                    if job is not None:
                        job.reported = True
                    return
                if time.monotonic() >= deadline:
                    break
        finally:
            an.close()
        if passes == 0:
            raise Abort(f"not enough traffic to judge at {weight}%: {last.summary()}; "
                         "send traffic or `deployctl promote` by hand", last.to_json())

