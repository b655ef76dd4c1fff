"""The capacity plan for a runbook's host: the preflight's plan from the host's own facts (config.json and
safetensors headers from its model directory, GPU memory from its NVML), deployctl.sizing underneath."""
from __future__ import annotations

from deployctl.capacity import CapacityPlan
from deployctl.errors import CheckFailed


def capacity_plan(t) -> CapacityPlan:
    """Plan for target ``t`` (checks.Target) with deploy.yaml's current engine settings. Raises CheckFailed when
    the host's facts cannot size it (no config.json, GPU unknown), RemoteError for SSH."""
    from deployctl.preflight.checks import plan_from_facts
    from deployctl.preflight.gather import host_facts

    # the model's config and the GPU's size do not change within a run: probe the host once
    if t.plan_facts is None:
        t.plan_facts = host_facts(t.host, t.cfg, verify_weights=False)
    sized, reason = plan_from_facts(t.cfg, t.host_cfg, t.plan_facts)
    if sized is None:
        raise CheckFailed(f"no capacity plan for {t.host_cfg.name}: {reason}", fix="run `deployctl preflight` and fix what it names")
    return sized.plan
