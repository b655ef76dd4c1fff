"""Run one preflight check by name on a runbook's host: fresh facts from the probe (deployctl.preflight.gather;
weights hashed only for the ``weights`` check), then deployctl.preflight.checks over them."""
from __future__ import annotations

from deployctl.errors import ConfigError

# The names run_checks gives its checks, in its order.
PREFLIGHT_CHECKS = ("nvidia_driver", "torch", "gpu_memory", "capacity", "port", "disk", "weights", "chat_template",
                    "api_key")


def run_preflight_check(t, name: str, timeout: float):
    """Observation of preflight check ``name`` on target ``t``: value = status (pass, warn, fail); fields message,
    fix. Raises RemoteError (SSH), ConfigError (unknown name)."""
    from deployctl.preflight.checks import run_checks
    from deployctl.preflight.gather import host_facts
    from deployctl.runbook.checks import Observation

    facts = host_facts(t.host, t.cfg, verify_weights=name == "weights")
    found = [c for c in run_checks(t.cfg, t.host_cfg, facts) if c.name == name]
    if not found:
        raise ConfigError(f"preflight check {name!r} does not exist", fix=f"use one of: {', '.join(PREFLIGHT_CHECKS)}")
    c = found[0]
    return Observation(c.status, {"message": c.message, "fix": c.fix}, f"preflight {name}: {c.status}: {c.message}")
