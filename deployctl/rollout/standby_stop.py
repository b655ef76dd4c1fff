"""``deployctl standby stop``: stop the previous release kept asleep on a host's other port before its window ends
(issue 39): the host's RAM, or on a GPU the sleeper's residue, is wanted back, or the standby is known bad.

Per host: read ``shared/run/standby.json`` (deployctl.rollout.standby.read), stop its supervisor and forget it
(``standby.stop``: the standby's runtime gets SIGTERM, then SIGKILL with what is left of its engine; the record is
removed), and append a ``standby-stop`` record to the fleet's history (release, host, port, how it ended). Under
the deploy lock, so it never races a deploy or rollback that is waking or replacing that standby.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from deployctl.config import DeployConfig
from deployctl.errors import DeployctlError, RemoteError, UsageError, about
from deployctl.rollout import hostops, standby
from deployctl.rollout.events import Progress, emitter
from deployctl.rollout.fleet import Fleet


@dataclass(frozen=True)
class StandbyStopped:
    """One host's outcome: ``release`` and ``port`` of the standby stopped (None/0: the host had none),
    ``expired`` (its window had ended), ``seconds`` the stop took."""

    host: str
    release: Optional[str]
    port: int = 0
    expired: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"host": self.host, "release": self.release, "port": self.port or None, "expired": self.expired,
                "seconds": self.seconds}


def stop_standbys(cfg: DeployConfig, hosts: Sequence[str] = (), *, reason: str = "",
                  progress: Optional[Progress] = None) -> list[StandbyStopped]:
    """Stop the standby on each of ``hosts`` (names; empty: every host). Returns one StandbyStopped per host, in
    deploy.yaml's order. Raises UsageError (exit 2) for a name that is no host of deploy.yaml, LockHeld while a
    deploy or rollback holds the lock (LockHeld), RemoteError (exit 4) when a host cannot be reached."""
    names = [h.name for h in cfg.hosts]
    unknown = [n for n in hosts if n not in names]
    if unknown:
        raise UsageError(f"--host {unknown[0]!r} is not a host of deploy.yaml ({', '.join(names)})",
                         fix="pass one of the names under hosts:")
    wanted = [n for n in names if not hosts or n in hosts]
    say = emitter(progress)
    fleet = Fleet(cfg, say)
    try:
        fleet.connect()
        fleet.lock("standby stop")
        try:
            def one(host) -> StandbyStopped:
                rec = standby.read(host)
                if rec is None:
                    return StandbyStopped(host.name, None)
                seconds = standby.stop(host, cfg, rec)
                return StandbyStopped(host.name, rec.release, rec.port, rec.expired, seconds)

            ok, bad = fleet.on_hosts([fleet.hosts[n] for n in wanted], one,
                                     deadline_s=hostops.QUICK_DEADLINE_S + 60, what="stopping the standby")
            for r in ok.values():
                if r.release is not None:
                    say("info", f"{r.host}: stopped the standby of {r.release} on port {r.port}"
                                + (" (expired)" if r.expired else " (inside its window)"))
                    fleet.store.append_history("standby-stop", release=r.release, result="stopped",
                                               reason=reason or "deployctl standby stop", host=r.host, port=r.port,
                                               expired=r.expired)
            if bad:
                name, err = next(iter(bad.items()))
                raise err if isinstance(err, DeployctlError) else RemoteError(about(name, err))
            return [ok[n] for n in wanted]
        finally:
            fleet.unlock()
    finally:
        fleet.close()
