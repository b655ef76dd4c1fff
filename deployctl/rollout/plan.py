"""What a deploy will do, computed before anything changes: the release, the mode, the canary and stable
hosts, the weight steps with each one's analysis pause and the clock time it ends at the earliest, and the batches
that follow 100%."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.config.units import format_duration
from deployctl.errors import UsageError
from deployctl.rollout.release import ReleaseInfo


@dataclass(frozen=True)
class DeployPlan:
    """``mode``: ``first`` (nothing serves yet: all hosts at once), ``in-place`` (one host: no canary, a verified
    switch with the previous release restored on failure), ``no-router`` (several hosts but no ``router:``: no
    traffic split is possible, so a verified switch on all hosts at once, the previous release restored on failure)
    or ``canary``."""

    release: ReleaseInfo
    mode: str
    from_release: Optional[str]
    canary: list[str]
    stable: list[str]
    steps: list[int]
    pause_s: float
    batches: list[list[str]]
    current: dict[str, Optional[str]] = field(default_factory=dict)
    pauses: list[float] = field(default_factory=list)  # seconds of analysis per step (rollout.steps[].pause)
    made_at: float = field(default_factory=time.time)  # Unix time the plan was made

    def pause_at(self, index: int) -> float:
        """Seconds of analysis at step ``index``."""
        return self.pauses[index] if index < len(self.pauses) else self.pause_s

    def step_ends(self) -> list[float]:
        """Unix time each step's analysis ends at the earliest: the plan's time plus the pauses so far (the
        upload, the canary's start and hand promotes move them; a failed verdict ends the rollout sooner)."""
        out, t = [], self.made_at
        for i in range(len(self.steps)):
            t += self.pause_at(i)
            out.append(t)
        return out

    def schedule(self) -> list[str]:
        """``5% for 24h, ends ≥ 2026-12-03 10:00 UTC (+24h)`` per step."""
        return step_schedule(self.steps, [self.pause_at(i) for i in range(len(self.steps))], self.made_at)


    def lines(self) -> list[str]:
        out = [f"release {self.release.id} (from {self.from_release or 'nothing'})"]
        if self.mode == "first":
            out.append(f"no release serves yet: install, start and verify on all hosts ({', '.join(self.stable)}), "
                       "then route traffic to them")
        elif self.mode == "no-router":
            out.append(f"no router: no canary possible; verified switch on all hosts ({', '.join(self.stable)}), "
                       f"{self.from_release} restored on failure")
        elif self.mode == "in-place":
            out.append(f"one host ({self.stable[0]}): no canary possible; verified in-place switch, "
                       f"{self.from_release or 'nothing'} restored on failure")
        else:
            out.append(f"canary on {', '.join(self.canary)}; stable {', '.join(self.stable)}")
            out.append(f"weights {' → '.join(f'{s}%' for s in self.steps)}; analysis per step: "
                       + "; ".join(self.schedule()))
            if self.batches:
                out.append("then roll " + "; ".join(", ".join(b) for b in self.batches))
            new = [n for n in self.current if not self.current.get(n)]
            if new:
                out.append(f"no release yet on {', '.join(new)}: no traffic until it serves {self.release.id}")
        return out

    def to_json(self) -> dict:
        return {"release": self.release.id, "mode": self.mode, "from_release": self.from_release,
                "canary": self.canary, "stable": self.stable, "steps": self.steps, "pause_s": self.pause_s,
                "pauses_s": [self.pause_at(i) for i in range(len(self.steps))],
                "step_ends": [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in self.step_ends()],
                "batches": self.batches, "current": self.current}


def steps_for(cfg: DeployConfig, canary_pct: Optional[int]) -> list[int]:
    """The weight steps: rollout.steps, or with ``--canary PCT`` PCT first then the configured steps above it."""
    steps = cfg.rollout.weights
    if canary_pct is None:
        return steps
    if not 0 < canary_pct < 100:
        raise UsageError(f"--canary {canary_pct} is not a percentage in 1..99", fix="pass e.g. --canary 5")
    return [canary_pct] + [s for s in steps if s > canary_pct]


def make_plan(cfg: DeployConfig, info: ReleaseInfo, current: dict[str, Optional[str]],
              canary_pct: Optional[int] = None) -> DeployPlan:
    names = [h.name for h in cfg.hosts]
    serving = Counter(v for v in current.values() if v)
    from_release = serving.most_common(1)[0][0] if serving else None
    steps = steps_for(cfg, canary_pct)
    if from_release is None:
        return DeployPlan(info, "first", None, [], names, [100], 0, [], dict(current))
    if len(names) == 1:
        return DeployPlan(info, "in-place", from_release, [], names, [100], 0, [], dict(current))
    if cfg.router is None:  # a canary needs a traffic split; without a router the deploy crashed on the first one
        return DeployPlan(info, "no-router", from_release, [], names, [100], 0, [], dict(current))
    # a host with no release yet (added to deploy.yaml since the last deploy) serves nothing: it is never stable
    # (no router weight before it serves), and it gets the new release in the last batch, after the canary passed
    serving_hosts = [n for n in names if current.get(n)]
    bare = [n for n in names if not current.get(n)]
    if len(serving_hosts) == 1:  # the only serving host stays stable; the new hosts are the canary
        canary, stable = bare, serving_hosts
        bare = []
    else:
        n_canary = min(cfg.rollout.canary_hosts, len(serving_hosts) - 1)
        canary, stable = serving_hosts[:n_canary], serving_hosts[n_canary:]
    size = cfg.rollout.unavailable(len(names), len(canary))
    batches = [stable[i:i + size] for i in range(0, len(stable), size)] + ([bare] if bare else [])
    return DeployPlan(info, "canary", from_release, canary, stable, steps, cfg.rollout.pause_s, batches, dict(current),
                      pauses=[cfg.rollout.pause_of(w) for w in steps])


def step_schedule(weights: list[int], pauses: list[float], start: float) -> list[str]:
    """One line per step, ``5% for 24h, ends ≥ 2026-12-03 10:00 UTC (+24h)``: its analysis pause and the earliest
    clock time it ends when the steps start at Unix time ``start``. A pause of 0 holds no analysis window: the line
    says so (``5% with no analysis (pause 0)``), the step moves on once the canary's outputs are checked."""
    out, t = [], start
    for w, pause in zip(weights, pauses):
        t += pause
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
        held = f"for {format_duration(pause)}" if pause > 0 else "with no analysis (pause 0)"
        out.append(f"{w}% {held}, ends ≥ {when} (+{format_duration(round(t - start))})")
    return out


def config_schedule(cfg: DeployConfig, start: Optional[float] = None) -> list[str]:
    """``step_schedule`` of rollout.steps for a deploy whose canary steps start at ``start`` (default now)."""
    w = cfg.rollout.weights
    return step_schedule(w, [cfg.rollout.pause_of(x) for x in w], time.time() if start is None else start)
