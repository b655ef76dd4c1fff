"""A deploy's abort (``deployctl.rollout.deploy.Deployment`` mixes this in): every switched host back on the
previous release and traffic with it, the outcome recorded, and the error that names why — RolloutAborted (6) for
the release's fault, InfraAborted (4) for the infrastructure's, HealthError (5) for a first deploy that never
served, Interrupted (130) for Ctrl-C. A deploy whose lock another command took over (deployctl.hosts.fence) stops
at once instead, touching nothing more.
"""
from __future__ import annotations

from typing import Optional

from deployctl.errors import HealthError, RolloutAborted
from deployctl.rollout.fleet import Interrupted
from deployctl.rollout.infra import InfraAborted, kind as infrastructure
from deployctl.rollout.plan import DeployPlan


class Aborting:
    """The abort half of a Deployment: uses its ``fleet``, ``state``, ``switched``, ``outputs``, ``journal``,
    ``paths``, ``standbys``, ``say``, ``_save`` and ``_route``."""

    def _left_undone(self) -> str:
        """What a second Ctrl-C leaves behind, for the line printed before it exits."""
        prev = self.state.from_release if self.state is not None else None
        if not self.switched:
            where = "no host was switched to the new release"
        else:
            where = f"{', '.join(sorted(self.switched))} may still run the new release"
        weights = (self.state.weights if self.state is not None else None) or {}
        traffic = ", ".join(f"{h} {w:g}%" for h, w in weights.items() if w) or "unknown"
        back = f"`deployctl rollback` to put every host back on {prev}" if prev else "`deployctl rollback --to ID`"
        return (f"The abort did not finish: {where}; last traffic split: {traffic}. Run `deployctl status`, then "
                f"{back} (it breaks this deploy's stale lock).")

    def _raise_if_fenced(self) -> None:
        """Raise the first refusal of this deploy's lock generation (deployctl.hosts.fence), if a host refused."""
        fence = self.fleet.fence
        if fence is not None and fence.refused is not None:
            raise fence.refused

    def _abort(self, plan: DeployPlan, reason: str, *, verdict: Optional[dict] = None,
               cause: Optional[BaseException] = None, interrupted: bool = False):
        fl = self.fleet
        self._raise_if_fenced()
        if self.outputs is not None:
            self.outputs.stop()
        self.say("abort", f"aborting: {reason}")
        self.journal.abort(reason)
        # fresh SSH connections: the ones in use when the failure or Ctrl-C came may be broken or busy (issue 31)
        fl.reconnect()
        try:
            self.state.status = "aborting"
            fl.store.write_rollout(self.state)
        except Exception:
            pass
        problems = fl.restore(plan, self.switched, self._route if self.cfg.router else None)
        self._raise_if_fenced()  # restore reports a host's error as a problem: a refusal ends the abort here
        for p in problems:
            self.say("warn", p)
        status = "interrupted" if interrupted else "aborted"
        try:
            self._save(status=status, reason=reason)
            fl.store.append_history("deploy", release=plan.release.id, result=status, reason=reason,
                                    problems=problems, verdict=verdict, paths=self.paths,
                                    **({"standby": self.standbys} if self.standbys else {}))
        except Exception as e:  # state is best effort once we are aborting
            self._raise_if_fenced()
            self.say("warn", f"could not record the abort on every host: {e}")
        where = f"traffic back on {plan.from_release}" if plan.from_release else "nothing serves"
        extra = f"; not restored: {'; '.join(problems)}" if problems else ""
        if cause is not None and isinstance(cause, HealthError) and not plan.from_release:
            # a first deploy that fails verification: nothing to go back to, the health failure is the story (5)
            raise HealthError(f"first deploy failed: {reason}; {where}{extra}",
                              fix="fix the release and deploy again") from cause
        if interrupted:
            raise Interrupted(f"deploy interrupted: {where}{extra}",
                              fix="run `deployctl status` to check, then `deployctl deploy` again")
        infra = infrastructure(cause)
        if infra:  # not the release's fault: it was never judged (deployctl.rollout.infra, exit 4)
            raise InfraAborted(f"rollout aborted by an infrastructure error ({infra}), not by the release: {reason}; "
                               f"{where}{extra}",
                               fix="fix the host it names (`deployctl hosts check`), then deploy the same release "
                                   "again") from cause
        raise RolloutAborted(f"rollout aborted: {reason}; {where}{extra}",
                             fix=getattr(cause, "fix", None) or "see `deployctl history`; fix the release and deploy "
                                                                 "again") from cause
