"""The preflight gate of a deploy: deployctl.preflight's checks on every host; a failed check stops the
deploy before anything changes (CheckFailed, exit 1)."""
from __future__ import annotations

from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed


def preflight_gate(cfg: DeployConfig, hosts: dict, say) -> None:
    try:
        from deployctl.preflight import run_preflight  # type: ignore[attr-defined]
    except ImportError:
        say("warn", "preflight is not available in this build: gate skipped")
        return
    report = run_preflight(cfg, list(hosts.values()))
    failed = [(h.host, c) for h in report.hosts for c in h.checks if c.status == "fail"]
    if failed:
        host, c = failed[0]
        raise CheckFailed(f"preflight failed on {host}: {c.name}: {c.message}", fix=c.fix or "run `deployctl preflight`")
    say("info", f"preflight passed on {len(report.hosts)} hosts")
