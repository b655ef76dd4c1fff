"""deploy.yaml ``rollout:``: the canary steps, their analysis (golden outputs, active probes, the window's
rules) and the fleet-wide pacing (models only; run by deployctl.rollout)."""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, Field, field_validator

from deployctl.config.fields import MAX_SECONDS, Duration, _Frozen


class OutputsConfig(_Frozen):
    """Golden outputs (deployctl.rollout.golden, outputcheck): prompts asked of canary and stable at weight 0, before
    any client traffic, and at every step."""

    enabled: bool = True
    """Ask the golden prompts of canary and stable and judge the answers."""
    prompts: Optional[str] = None
    """JSON-lines file of {"messages": [...]} or {"prompt": "..."}; default: 16 shipped"""
    max_tokens: int = Field(32, ge=1, le=4096)
    """Tokens per golden answer (greedy)."""
    timeout_s: float = Field(60, gt=0, le=3600)
    """Seconds for each golden prompt's answer."""
    min_exact_share: float = Field(1.0, ge=0, le=1)
    """same engine and dtype: share of prompts answered identically"""
    min_prefix_tokens: int = Field(8, ge=1)
    """across engines or dtypes: tokens that must agree from the start"""
    min_prefix_share: float = Field(0.9, ge=0, le=1)
    """Across engines or dtypes: share of prompts whose answers agree for min_prefix_tokens."""
    on_model_change: Literal["check", "skip"] = "check"
    """weights changed (manifest of the weight files differs): "check" still requires agreement (a re-converted or
    re-downloaded checkpoint should answer the same), "skip" runs only the degenerate checks (new weights on
    purpose)
    """
    on_change: Literal["abort", "report"] = "abort"
    """the answers differ from stable's (the agreement rule failed, nothing degenerate): "abort" the rollout (exit
    6), or "report": record the differences in the rollout's verdicts and history and go on
    """
    max_repeats: int = Field(8, ge=2)
    """a token or n-gram (n <= 4) repeated this many times back to back"""
    min_length_ratio: float = Field(0.5, ge=0)
    """Shortest answer, as a share of stable's length, before it counts as degenerate."""
    max_length_ratio: float = Field(2.0, gt=0)
    """Longest answer, as a multiple of stable's length, before it counts as degenerate."""


class ProbesConfig(_Frozen):
    """Active probes (deployctl.rollout.probes): small streaming requests deployctl sends to every canary and stable
    host during each analysis window, timed on the client."""

    enabled: bool = True
    """Send active probes during each analysis window."""
    requests: int = Field(4, ge=0, le=1000)
    """per host and window"""
    max_tokens: int = Field(8, ge=2, le=1024)
    """Tokens per probe request."""
    timeout_s: float = Field(30, gt=0, le=3600)
    """Seconds for each probe request."""
    min_samples: int = Field(3, ge=1)
    """successful probes per side before probe latencies are judged"""


class AnalysisConfig(_Frozen):
    interval_s: float = Field(30, gt=0, le=MAX_SECONDS)
    """Seconds between two analysis verdicts during a canary step."""
    min_requests: int = Field(20, ge=1)
    """Client requests per side in a window before the canary's metrics are judged (fewer: inconclusive)."""
    max_error_rate: float = Field(0.01, ge=0, le=1)
    """Largest canary error rate (share of failed requests) in a window."""
    max_p99_ttft_ratio: float = Field(2.0, gt=0)
    """Largest canary P99 TTFT as a multiple of stable's."""
    max_p99_tpot_ratio: float = Field(2.0, gt=0)
    """Largest canary P99 TPOT as a multiple of stable's."""
    min_p99_delta_s: float = Field(0.01, ge=0)
    """A P99 ratio over its limit fails only when canary − stable also exceeds this many seconds (below it, the
    difference is bucket resolution and noise).
    """
    min_latency_samples: int = Field(5, ge=1)
    """A canary P99 from fewer latency samples than this is noise: the window stays open (inconclusive) until it
    holds enough. Counted from the canary's TTFT histogram.
    """
    inconclusive_limit: int = Field(5, ge=0)
    """this many inconclusive windows in a row pause the rollout for a human (promote or abort); 0: never pause. When
    every window of the streak lacked client traffic (min_client_requests) the rollout aborts instead.
    """
    max_slo_factor: float = Field(1.0, strict=True)
    """The canary's own P99 TTFT / TPOT / E2E fail a window over slo.*_p99_s × this factor, whatever stable does (a
    fleet slow as a whole, or 100% against an old baseline). strict: true is no factor
    """
    min_client_requests: int = Field(1, ge=0)
    """Client requests (via the router, deployctl's probes not counted) the canary must serve in a window for it to
    pass: below, the window is inconclusive even when the probes pass; 0: probes alone may promote.
    """
    outputs: OutputsConfig = Field(default_factory=OutputsConfig)
    """Golden outputs asked of canary and stable."""
    probes: ProbesConfig = Field(default_factory=ProbesConfig)
    """Active probes sent to canary and stable hosts."""

    @field_validator("max_slo_factor")
    @classmethod
    def _slo_factor(cls, v: float) -> float:
        # below 1 the canary would fail at latencies its own SLO (and the alerts rendered from it) accept
        if not math.isfinite(v) or v < 1:
            raise ValueError("max_slo_factor must be a finite number >= 1 (1: the canary fails over the SLO itself; "
                             "1.5: up to 50% over it); for a stricter canary lower slo.*_p99_s instead")
        return v


class RolloutStep(_Frozen):
    """One canary step: the canary's share of traffic (percent) and how long the analysis holds it there
    (``pause``: a duration, e.g. ``30s``, ``5m``, ``24h``; None: rollout.pause_s)."""

    weight: int = Field(ge=1, le=100, strict=True)
    """The canary's traffic share at this step, a whole percentage (YAML yes/true and '5' are refused)."""
    pause: Optional[Duration] = None
    """How long this step lasts before the next one; default: until `deployctl promote`."""
    min_duration: Optional[Duration] = Field(None, description=(
        "This step's rollout.min_duration: the least time the canary is held at this weight before it may be "
        "promoted (a duration, e.g. 10m); unset: rollout.min_duration."))
    max_hold: Optional[Duration] = Field(None, description=(
        "This step's rollout.max_hold: how long the step may be held past its pause while its windows are "
        "inconclusive (e.g. 2h); unset: rollout.max_hold."))


def _step_form(v: Any) -> Any:
    """A bare percentage (the short form ``steps: [5, 25, 50, 100]``) is a step without its own pause; anything
    else that is not a mapping (a quoted '5', 5.5, null) is refused naming the entry and both forms."""
    if not isinstance(v, list):
        return v
    out = []
    for i, s in enumerate(v):
        whole = isinstance(s, (int, float)) and not isinstance(s, bool) and float(s).is_integer()
        if whole:
            out.append({"weight": int(s)})
        elif isinstance(s, dict):
            out.append(s)
        else:
            what = "a string" if isinstance(s, str) else "not a whole percentage" if isinstance(s, float) else "no step"
            raise ValueError(f"item {i} is {s!r}, {what}: write a whole percentage unquoted (5) or "
                             "{weight: 5, pause: 24h}")
    return out


class RolloutConfig(_Frozen):
    canary_hosts: int = Field(1, ge=1)
    """Hosts that take the canary's first step."""
    steps: Annotated[list[RolloutStep], BeforeValidator(_step_form)] = Field(
        default_factory=lambda: [RolloutStep(weight=w) for w in (5, 25, 50, 100)])
    """percentages, or {weight, pause} per step (e.g. [{weight: 5, pause: 24h}, {weight: 100, pause: 5m}])"""
    pause_s: Duration = 300
    """the analysis pause of a step without its own ``pause``"""
    min_duration: Duration = Field(0, description=(
        "The least time (seconds, or a duration such as 10m) every weight step is held before it may be promoted; "
        "a step lasts its pause or this, whichever is longer. 0: the pause alone. Per step: steps[].min_duration."))
    max_hold: Duration = Field(3600, description=(
        "How long a weight step may be held past its pause (seconds, or a duration such as 2h) while its last "
        "window is not a pass: too little client traffic to judge, or the SLO breached on stable and canary "
        "alike. The step is never promoted while held; past max_hold, on_hold_timeout decides. Default 1 h: "
        "a business peak's shoulder. Per step: steps[].max_hold."))
    on_hold_timeout: Literal["abort", "pause"] = Field("abort", description=(
        "What a step held past max_hold does: abort (roll the canary back, exit 6, naming the last window's "
        "reason) or pause (wait for a person: `deployctl promote` or `deployctl abort`)."))
    analysis: AnalysisConfig = Field(default_factory=AnalysisConfig)
    """The canary analysis: thresholds, golden outputs and probes."""
    keep_releases: int = Field(5, ge=2)
    """Releases kept on each host (older ones are removed); at least 2 so that a rollback has somewhere to go."""
    standby_s: Duration = 86400
    """Seconds the previous release stays asleep on every host after a promotion (a rollback inside the window wakes
    it); 0: no standby (today's stop + cold start). Default 24 h: one business peak. Engines without a sleep mode
    (engines.Adapter.sleep None, e.g. transformers) fall back to the cold start whatever this says.
    """
    standby_misfit: Literal["drop", "fail"] = "drop"
    """When the next release does not fit on the GPU beside the sleeping standby's measured residue
    (rollout.residue): drop: stop the standby first, say so, start cold (no standby this time); fail: refuse
    before anything changes.
    """
    standby_drain_s: Optional[Duration] = None
    """Seconds the old release gets to finish its in-flight requests (out of the router) before it sleeps; unset:
    server.drain_timeout_s. Past it: no standby (said in the deploy's output, status and history).
    """
    parallel_hosts: int = Field(8, ge=1, le=256, strict=True)
    """Hosts worked on at once by every fleet-wide step (upload, status, rollback's starts, each batch's restarts):
    the bound of deployctl's pool of SSH workers.
    """
    max_unavailable: Optional[int | str] = None
    """Hosts out of nginx at once while the roll after the canary's last step restarts the stable hosts: a count or
    "N%" of all hosts (rounded down, at least 1), as Kubernetes' maxUnavailable. Unset: the canary's host count,
    or a quarter of the fleet when that is more (rollout/plan.py).
    """

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, v):
        if v is None or isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
        if isinstance(v, str) and v.endswith("%") and v[:-1].isdigit() and 1 <= int(v[:-1]) <= 100:
            return v
        raise ValueError("max_unavailable must be a host count >= 1 or a percentage such as \"25%\" (1% to 100%)")

    def unavailable(self, num_hosts: int, num_canary: int) -> int:
        """Hosts per batch of the roll after the canary (see max_unavailable), at least 1."""
        v = self.max_unavailable
        if v is None:
            return max(1, num_canary, num_hosts // 4)
        if isinstance(v, str):
            return max(1, num_hosts * int(v[:-1]) // 100)
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[RolloutStep]) -> list[RolloutStep]:
        w = [s.weight for s in v]
        if not w or w != sorted(set(w)) or w[-1] != 100:
            raise ValueError(f"steps must be increasing percentages in 1..100 ending at 100, got {w}")
        return v

    @property
    def weights(self) -> list[int]:
        """The canary weights of the steps, in percent."""
        return [s.weight for s in self.steps]

    def hold_of(self, weight: int) -> tuple[float, float]:
        """(min_duration, max_hold) in seconds at ``weight``: that step's own, else the rollout-wide ones."""
        for s in self.steps:
            if s.weight == weight:
                return (s.min_duration if s.min_duration is not None else self.min_duration,
                        s.max_hold if s.max_hold is not None else self.max_hold)
        return self.min_duration, self.max_hold

    def pause_of(self, weight: int) -> float:
        """Seconds of analysis at ``weight``: that step's ``pause``, else pause_s (also for a ``--canary`` weight
        that is no configured step)."""
        for s in self.steps:
            if s.weight == weight and s.pause is not None:
                return s.pause
        return self.pause_s
