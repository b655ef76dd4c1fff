"""The golden-output comparisons of one deploy (deployctl.rollout.goldencheck), as the step machine
(deployctl.rollout.deploy) runs them: once at weight 0, when the canary hosts serve the new release and before the
router sends them any client request (``before_traffic``), then beside every weight step's analysis (``start`` /
``settle``).

A failed comparison aborts the rollout (``OutputsFailed``, exit 6) naming the prompt, both sides' first differing
tokens and which of the model's files changed between the releases (release.json ``model_files``; "no file
changed" when they are the same). With ``rollout.analysis.outputs.on_change: report`` a comparison that failed only
its agreement rule (the answers changed; none empty, looping, garbled, erroring or off in length) is recorded with
its differences, result ``changed``, and the deploy goes on; the degenerate checks abort whatever it says.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.errors import DeployctlError

# seconds a canary may take beyond max(P99 ratio) × stable's time to answer the golden prompts at weight 0
SLOW_GRACE_S = 10.0
# the keys of an outputs verdict kept in a deploy's history record (``changed`` ones keep their differences too)
HISTORY_KEYS = ("weight", "canary_host", "result", "mode", "identical", "compared", "total")


class OutputsFailed(Exception):
    """A comparison failed: ``reason`` for the abort, ``verdict`` (the outputs verdict JSON) for the history."""

    def __init__(self, reason: str, verdict: Optional[dict] = None):
        super().__init__(reason)
        self.reason, self.verdict = reason, verdict


def only_changed(rep) -> bool:
    """The OutputReport ``rep`` failed its agreement rule and nothing else (what ``on_change: report`` lets by)."""
    return rep.result == "fail" and rep.changed and len(rep.problems) == 1


def history_outputs(verdicts: list[dict]) -> list[dict]:
    """The outputs verdicts of a deploy as its history record keeps them."""
    out = []
    for v in verdicts:
        if v.get("kind") != "outputs":
            continue
        h = {k: v.get(k) for k in HISTORY_KEYS}
        if v.get("result") == "changed":
            h.update(why=v.get("why"), reason=v.get("reason"), diffs=(v.get("diffs") or [])[:4])
        out.append(h)
    return out


def changed_note(verdicts: list[dict]) -> Optional[str]:
    """What a finished deploy's status and history say when outputs changed under on_change report (None: none)."""
    changed = [v for v in verdicts if v.get("kind") == "outputs" and v.get("result") == "changed"]
    if not changed:
        return None
    v = changed[0]
    return (f"outputs changed at {v['weight']}% on {v['canary_host']} (outputs.on_change report; {len(changed)} "
            f"comparison(s)): {v.get('reason')} ({v.get('mode')}: {v.get('why')})")


class OutputGate:
    """One deploy's comparisons. ``record(verdict_json)`` keeps a verdict (state and history), ``say`` reports
    progress (deployctl.rollout.events), ``check()`` raises when the deploy must stop (called while waiting)."""

    def __init__(self, cfg: DeployConfig, hosts: dict, release_id: str, from_release: Optional[str], *,
                 record: Callable[[dict], None], say, check: Callable[[], None]):
        self.cfg, self.record, self.say, self.check = cfg, record, say, check
        self._args = (hosts, release_id, from_release)
        self.golden = None  # deployctl.rollout.goldencheck.GoldenCheck, made at the first comparison

    @property
    def chat(self) -> Optional[bool]:
        """The model has a chat template (None until the first comparison looked)."""
        return self.golden.chat if self.golden is not None else None

    def stop(self) -> None:
        if self.golden is not None:
            self.golden.stop()

    def start(self, new: list[str], old: list[str]):
        """Start a comparison of the canary hosts ``new`` with stable ``old`` in the background (a goldencheck.Job;
        None when outputs are off or nothing is stable)."""
        from deployctl.rollout.goldencheck import GoldenCheck

        if not self.cfg.rollout.analysis.outputs.enabled or not old:
            return None
        if self.golden is None:
            self.golden = GoldenCheck(self.cfg, *self._args)
        return self.golden.start(new, old)

    def before_traffic(self, new: list[str], old: list[str]) -> None:
        """The comparison at weight 0: the canary serves the new release, the router sends it nothing yet; waits
        for it (a difference aborts before any user request reaches the canary). A canary still answering the
        prompts long after stable answered them all (over the analysis' P99 ratio × stable's time + SLOW_GRACE_S)
        aborts too, naming both times: the answers of a canary that slow are not worth waiting for, and no client
        should meet it."""
        job = self.start(new, old)
        if job is None:
            return
        self.say("step", f"golden outputs at 0%: {', '.join(new)} against stable, before any client traffic",
                 weight=0)
        a = self.cfg.rollout.analysis
        factor = max(a.max_p99_ttft_ratio, a.max_p99_tpot_ratio)
        while not job.done():
            self.check()
            slow = self.golden.too_slow(new, old, factor, SLOW_GRACE_S)
            if slow:
                self.golden.stop()
                raise OutputsFailed(f"golden outputs at 0% (before any client traffic): {slow}")
            time.sleep(0.25)
        self.settle(job, 0, wait=True)

    def settle(self, job, weight: int, *, wait: bool) -> None:
        """Report the comparison once it is done (``wait``: until then, calling check()); raises OutputsFailed."""
        if job is None or job.reported:
            return
        while wait and not job.done():
            self.check()
            time.sleep(0.25)
        if not job.done():
            return
        job.reported = True
        try:
            reports = job.result()
        except DeployctlError:
            raise
        except Exception as e:  # a bug in the check must not leave the fleet half switched
            raise OutputsFailed(f"output check at {weight}% crashed: {type(e).__name__}: {e}") from e
        where = "0% (before any client traffic)" if weight == 0 else f"{weight}%"
        on_change = self.cfg.rollout.analysis.outputs.on_change
        for rep in reports:
            if on_change == "report" and only_changed(rep):
                rep.result = "changed"
            vj = {"kind": "outputs", "weight": weight, **rep.to_json()}
            self.record(vj)
            self.say("analysis", f"at {weight}%: {rep.summary()}", outputs=vj)
            if rep.result == "changed":
                self.say("warn", f"outputs changed at {where} on {rep.canary_host} ({rep.mode}: {rep.why}): "
                                 f"{rep.reason}; outputs.on_change report: recorded, the deploy goes on", outputs=vj)
            elif rep.result == "fail":
                raise OutputsFailed(f"output check failed at {where} on {rep.canary_host}: {rep.reason} "
                                    f"({rep.mode}: {rep.why})", vj)
        if weight == 0:
            self._record(reports)

    def _record(self, reports: list) -> None:
        """Keep the releases' golden answers of the comparison at weight 0 (deployctl.rollout.goldenrecord): stable's
        for the stable release when it has no record yet, a passing canary host's for the new release."""
        from deployctl.rollout import goldenrecord

        for rec in self.golden.records(reports):
            hosts = self._args[0]
            written = goldenrecord.save(hosts, rec, workers=self.cfg.rollout.parallel_hosts, only_missing=True,
                                        say=self.say)
            if written:
                self.say("info", f"golden answers of {rec.release} recorded on {len(written)} host(s) "
                                 f"(from {rec.source}): they are asked again wherever it comes back")
