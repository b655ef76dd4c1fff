"""One canary weight step of the deploy's step machine (``Deployment``'s part that waits): route the step's share,
hold the analysis windows over its pause, end the pause on a hand ``promote``, compare the golden outputs, abort on
a failed verdict.

Held steps: a step lasts its pause or ``min_duration``, whichever is longer, and ends in a promotion only when its
LAST window passed (an earlier pass followed by inconclusive windows is stale). Otherwise the step is held: not
promoted, windows go on, until one passes or ``max_hold`` (past the pause) runs out; then ``on_hold_timeout``
aborts or pauses for a person. A window that fails aborts at once, held or not. Held windows (too little client
traffic, or the SLO breached on stable and canary: deployctl.rollout.verdicts.held) do not count toward
``inconclusive_limit``; other inconclusive windows (NaN, counter reset) pause at it as before. Each window is
journaled with its numbers (deployctl.rollout.replay).

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


def step_outcome(last: str, now: float, deadline: float, hold_until: float) -> str:
    """What a weight step does after a window whose result is ``last`` (pass | inconclusive; a fail aborts before),
    at ``now`` (seconds, the clock of ``deadline``: the end of the step's pause or min_duration, and ``hold_until``:
    deadline + max_hold): ``next`` (the pause runs: judge on), ``promote`` (the pause is over and the LAST window
    passed: an earlier pass followed by inconclusive windows is stale), ``hold`` (over, not passed: judge on, not
    promoted) or ``timeout`` (held past max_hold: rollout.on_hold_timeout decides)."""
    if now < deadline:
        return "next"
    if last == "pass":
        return "promote"
    return "timeout" if now >= hold_until else "hold"


class Abort(Exception):
    """The rollout must abort: ``reason`` (and the failed ``verdict``, when one decided it)."""

    def __init__(self, reason: str, verdict: Optional[dict] = None, fix: Optional[str] = None):
        super().__init__(reason)
        self.reason, self.verdict, self.fix = reason, verdict, fix  # fix: None, "fix the release"


class WeightSteps:
    """The weight steps of ``deployctl.rollout.deploy.Deployment`` (a mix-in: it uses the deployment's ``cfg``,
    ``fleet``, ``journal``, ``progress``, ``outputs``, ``verdicts``, ``state``, ``say``, ``check``, ``_route``,
    ``_save``, ``_stable_kind``)."""

    def _weight_step(self, plan: DeployPlan, i: int, weight: int, new: list[str], old: list[str]) -> None:
        self.say("step", f"step {i + 1}/{len(plan.steps)}: canary weight {weight}%", weight=weight, index=i)
        self._route(split_for(new, old, weight))
        self._save(step_index=i, weight=weight)
        job = self._gate(plan).start(new, old)
        min_duration, _ = self.cfg.rollout.hold_of(weight)
        step_pause = max(plan.pause_at(i), min_duration) if plan.pause_at(i) > 0 else 0.0
        left, passed = self._pause_left(f"weight:{i}", i, weight, step_pause)
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
        """Analysis windows over ``pause`` seconds (``passed``: windows of this step that passed before a kill), then
        while the step is held (module doc); Abort on a failed verdict or a hold past max_hold (on_hold_timeout
        abort)."""
        a = self.cfg.rollout.analysis
        if pause <= 0:  # rollout.steps[].pause / pause_s 0 (the plan said so too), or nothing left of it on resume
            if not passed:
                self.say("warn", f"{weight}%: pause 0, no analysis window: the step goes on unjudged but for the "
                                 "canary's start checks and its golden outputs")
            return
        from deployctl.rollout.analysis import Analyzer  # here: a deploy without analysis pauses never needs it
        from deployctl.rollout.replay import window_record
        from deployctl.rollout.verdicts import InconclusiveStreak, held

        fl = self.fleet
        chat = self.outputs.chat if self.outputs is not None and self.outputs.chat is not None else True
        an = Analyzer(self.cfg, fl.router, fl.hosts, new, old, chat=chat, baseline=self.baseline,
                      stable_kind=self._stable_kind(plan, old))
        streak = InconclusiveStreak(a.inconclusive_limit)
        _, max_hold = self.cfg.rollout.hold_of(weight)
        try:
            began = time.monotonic()
            deadline = began + pause
            hold_until = deadline + max_hold
            win = an.open_window()
            last, holding = None, False
            while True:
                end = hold_until if holding else deadline
                next_eval = min(end, time.monotonic() + a.interval_s)
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
                self.journal.point("window", **window_record(self.cfg, last))
                self.say("analysis", f"analysis at {weight}%: {last.summary()}", verdict=vj)
                if last.result == "fail":
                    raise Abort(f"analysis failed at {weight}%: {last.reason} ({last.summary()})", vj)
                if last.result == "pass":
                    win = an.open_window()
                if streak.add("held" if held(last) else last.result):
                    self._wait_paused(weight, f"{streak.count} inconclusive analysis windows in a row "
                                              f"(inconclusive_limit {a.inconclusive_limit}): {last.reason}", job)
                    self._promoted_by_hand(weight, job)
                    return
                now = time.monotonic()
                outcome = step_outcome(last.result, now, deadline, hold_until)
                if outcome == "promote":
                    if holding:
                        self._save(reason=None)
                        self.say("info", f"{weight}%: a window passed after the hold: promoted")
                    return
                if outcome == "timeout":
                    self._hold_timeout(weight, max_hold, now - began, last, vj, job)
                    return
                if outcome == "hold" and not holding:
                    holding = True
                    self._save(reason=f"held at {weight}%: {last.reason}")
                    self.say("hold", f"held at {weight}%: the last window is {last.result} ({last.reason}); the step "
                                     f"is not promoted until a window passes, for up to max_hold "
                                     f"{format_duration(max_hold)}", weight=weight, max_hold_s=max_hold)
        finally:
            an.close()

    def _promoted_by_hand(self, weight: int, job) -> None:
        self.promote_requested = False
        self.say("info", f"promoted by hand at {weight}%")
        if job is not None:
            job.reported = True

    def _hold_timeout(self, weight: int, max_hold: float, held_s: float, last, vj: dict, job) -> None:
        """The step was held past max_hold: abort (raise Abort) or pause for a person, per rollout.on_hold_timeout."""
        why = (f"step {weight}% held {format_duration(round(held_s))} without a passing window (max_hold "
               f"{format_duration(max_hold)}): {last.reason}")
        if self.cfg.rollout.on_hold_timeout == "abort":
            raise Abort(f"{why}; rollout.on_hold_timeout abort", vj,
                        fix="the release was not judged failing, only never passing: deploy it again when the fleet "
                            "has client traffic and meets its SLO, or raise rollout.max_hold, or set "
                            "rollout.on_hold_timeout: pause to decide by hand")
        self._wait_paused(weight, f"{why}; rollout.on_hold_timeout pause", job)
        self._promoted_by_hand(weight, job)
