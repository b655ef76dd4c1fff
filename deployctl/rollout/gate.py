"""The preflight gate of a deploy: deployctl.preflight's checks on every host (facts gathered in parallel,
weights verified against the manifest); any failed check stops the deploy before anything changes
(CheckFailed, exit 1, naming the host, the check and its fix). Warnings are passed on as progress."""
from __future__ import annotations

from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed


def preflight_gate(cfg: DeployConfig, say):
    """Run the gate; returns the PreflightReport (its facts give release.json's ``platform``). Raises CheckFailed."""
    from deployctl.preflight import run_preflight

    say("info", f"preflight on {len(cfg.hosts)} hosts")
    report = run_preflight(cfg)
    for h in report.hosts:
        for c in h.checks:
            if c.status == "warn":
                say("warn", f"preflight {h.host}: {c.name}: {c.message}")
    failed = [(h.host, c) for h in report.hosts for c in h.checks if c.status == "fail"]
    if failed:
        host, c = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise CheckFailed(f"preflight failed on {host}: {c.name}: {c.message}{more}; nothing was changed",
                          fix=c.fix or "run `deployctl preflight` for the full table")
    counts = report.counts()
    say("info", f"preflight passed: {counts['pass']} checks pass, {counts['warn']} warn")
    return report
