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


PLATFORM_KEYS = ("nvidia_driver", "cuda", "torch", "torch_cuda", "engine_version")


def platform_of(facts: dict) -> dict:
    """The versions a host runs under, from its preflight facts (hostscripts/probe.py): ``nvidia_driver`` (NVML's
    driver version, e.g. "570.133.20"), ``cuda`` (the newest CUDA the driver supports, "12.8"), ``torch`` (torch's
    version in the host's runtime python, "2.6.0+cu124"), ``torch_cuda`` (the CUDA torch was built for, "12.4") and
    ``engine_version`` (the pinned engine's version importable there; None for the bundled runtime). Each None
    when the probe did not get it. Recorded per host in release.json ``platform`` and compared by ``status``."""
    nv = facts.get("nvidia") or {}
    torch = facts.get("torch") or {}
    engine = facts.get("engine") or {}
    return {"nvidia_driver": nv.get("driver_version") if nv.get("available") else None,
            "cuda": nv.get("cuda_version") if nv.get("available") else None,
            "torch": torch.get("version") if torch.get("ok") else None,
            "torch_cuda": torch.get("cuda") if torch.get("ok") else None,
            "engine_version": engine.get("version") if engine.get("importable") else None}


def check_facts(cfg: DeployConfig, facts_by_host: list, environ: Optional[Mapping[str, str]] = None) -> PreflightReport:
    """Run the checks over [(HostConfig, facts)] (recorded or gathered)."""
    return PreflightReport([HostReport(hc.name, run_checks(cfg, hc, facts, environ), facts) for hc, facts in facts_by_host])


def run_preflight(cfg: DeployConfig, host_names: Optional[list[str]] = None, *, verify_weights: bool = True,
                  on_progress: Optional[ProgressFn] = None, environ: Optional[Mapping[str, str]] = None) -> PreflightReport:
    """Gather facts from the hosts in parallel, then check them. Never raises for a host's failure:
    an unreachable host is a failed "reach" check. Raises ConfigError for an unknown host name.
    With ``router.tls`` (and no host filter, or one naming the router host) the router's certificate is checked
    too (deployctl.preflight.certs): its checks join that host's report, or a report of their own."""
    report = check_facts(cfg, gather(cfg, host_names, verify_weights=verify_weights, on_progress=on_progress), environ)
    if cfg.router is not None and cfg.router.tls is not None:
        from deployctl.preflight.certs import router_certificate

        name = cfg.router_host().name
        if not host_names or name in host_names:
            name, checks, facts = router_certificate(cfg)
            same = next((h for h in report.hosts if h.host == name), None)
            if same is not None:
                same.checks.extend(checks)
                same.facts.update(facts)
            else:
                report.hosts.append(HostReport(name, checks, facts))
    return report


__all__ = ["Check", "HostReport", "PLATFORM_KEYS", "PreflightReport", "run_preflight", "check_facts", "run_checks",
           "platform_of"]
