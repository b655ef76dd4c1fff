"""Preflight: facts from every host (probe + weight verification), then checks with fixes.

``run_preflight(cfg, hosts)`` -> PreflightReport; ``report.to_json()`` is the shape of
``deployctl preflight --json`` in docs/CONTRACTS.md:
``{"ok": bool, "hosts": [{"host", "checks": [{"name", "status", "message", "fix"}], "facts": {...}}]}``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from deployctl.config import DeployConfig
from deployctl.preflight.checks import Check, run_checks
from deployctl.preflight.gather import ProgressFn, gather


@dataclass
class HostReport:
    host: str
    checks: list[Check]
    facts: dict

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_json(self) -> dict:
        return {"host": self.host, "checks": [c.to_json() for c in self.checks], "facts": self.facts}


@dataclass
class PreflightReport:
    hosts: list[HostReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def counts(self) -> dict:
        out = {"pass": 0, "warn": 0, "fail": 0}
        for h in self.hosts:
            for c in h.checks:
                out[c.status] += 1
        return out

    def to_json(self) -> dict:
        return {"ok": self.ok, "hosts": [h.to_json() for h in self.hosts]}


def check_facts(cfg: DeployConfig, facts_by_host: list, environ: Optional[Mapping[str, str]] = None) -> PreflightReport:
    """Run the checks over [(HostConfig, facts)] (recorded or gathered)."""
    return PreflightReport([HostReport(hc.name, run_checks(cfg, hc, facts, environ), facts) for hc, facts in facts_by_host])


def run_preflight(cfg: DeployConfig, host_names: Optional[list[str]] = None, *, verify_weights: bool = True,
                  on_progress: Optional[ProgressFn] = None, environ: Optional[Mapping[str, str]] = None) -> PreflightReport:
    """Gather facts from the hosts in parallel, then check them. Never raises for a host's failure:
    an unreachable host is a failed "reach" check. Raises ConfigError for an unknown host name."""
    return check_facts(cfg, gather(cfg, host_names, verify_weights=verify_weights, on_progress=on_progress), environ)


__all__ = ["Check", "HostReport", "PreflightReport", "run_preflight", "check_facts", "run_checks"]
