"""The capacity plan for a runbook's host: deploy.yaml's engine settings on the model the host serves
(config.json and safetensors headers read from the host), via deployctl.sizing."""
from __future__ import annotations

import tempfile
from pathlib import Path

from deployctl.capacity import CapacityPlan


def capacity_plan(t) -> CapacityPlan:
    """Plan for target ``t`` (checks.Target). Raises ConfigError when the model config cannot be read."""
    from deployctl.sizing import size_plan

    cfg = t.cfg
    model_path = cfg.model.path
    if t.host_cfg.is_local:
        return size_plan(cfg.engine, Path(model_path), dtype=cfg.model.dtype).plan
    with tempfile.TemporaryDirectory(prefix="deployctl-plan-") as tmp:
        local = Path(tmp) / "config.json"
        t.host.get(f"{model_path}/config.json", local, timeout=30)
        return size_plan(cfg.engine, None, model_config=local, dtype=cfg.model.dtype).plan
