"""What a deploy will do, computed before anything changes: the release, the mode, the canary and stable
hosts, the weight steps and the batches that follow 100%."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from deployctl.config import DeployConfig
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
            out.append(f"weights {' → '.join(f'{s}%' for s in self.steps)}, {self.pause_s:g} s analysis per step")
            if self.batches:
                out.append("then roll " + "; ".join(", ".join(b) for b in self.batches))
        return out

    def to_json(self) -> dict:
        return {"release": self.release.id, "mode": self.mode, "from_release": self.from_release,
                "canary": self.canary, "stable": self.stable, "steps": self.steps, "pause_s": self.pause_s,
                "batches": self.batches, "current": self.current}


def steps_for(cfg: DeployConfig, canary_pct: Optional[int]) -> list[int]:
    """The weight steps: rollout.steps, or with ``--canary PCT`` PCT first then the configured steps above it."""
    steps = list(cfg.rollout.steps)
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
    n_canary = min(cfg.rollout.canary_hosts, len(names) - 1)
    canary, stable = names[:n_canary], names[n_canary:]
    size = max(1, n_canary)
    batches = [stable[i:i + size] for i in range(0, len(stable), size)]
    return DeployPlan(info, "canary", from_release, canary, stable, steps, cfg.rollout.pause_s, batches, dict(current))
