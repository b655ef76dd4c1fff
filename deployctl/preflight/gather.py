"""Facts from every host, in parallel: run the probe (deployctl/hostscripts/probe.py) with the host's python,
then verify the weights there (deployctl/hostscripts/weights.py shipped the same way; in-process for local hosts,
with byte progress). Both scripts travel inside the command line (see hostscripts.snippets.module_argv); nothing is copied.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from deployctl.hostscripts import probe as probe_module
from deployctl.hostscripts.snippets import module_argv
from deployctl.hostscripts import weights as weights_module
from deployctl.config import DeployConfig, HostConfig, layout
from deployctl import settings
from deployctl.errors import DeployctlError, RemoteError

# on_progress(host, phase, advance_bytes, total_bytes): phase "probe" | "weights" | "done".
ProgressFn = Callable[[str, str, int, Optional[int]], None]
PROBE_TIMEOUT_S = 120
HASH_BYTES_PER_S_FLOOR = 100e6  # remote hashing timeout: 120 s + bytes at this (slow disk) rate


def probe_params(cfg: DeployConfig, host: HostConfig) -> dict:
    """What the probe needs to know about this host's deployment."""
    from deployctl.engines import of

    return {"deploy_root": host.deploy_root, "model_path": cfg.model.path, "bind": cfg.server.bind,
            "port": layout.service_port(cfg, host), "gpu": host.gpu, "python": host.python, "torch_timeout_s": 60,
            "unit": layout.unit_name(cfg, host) if host.launcher == "systemd" else "",
            "engine_distribution": of(cfg).distribution, "engine_module": of(cfg).module,
            "engine_version": cfg.engine.version, "engines_dir": layout.engines_dir(host),
            # tests: the stand-in GPU's ledger (DEPLOYCTL_FAKE_GPU_MEMORY) instead of NVML
            "fake_gpu_memory": settings.current().fake_gpu_memory,
            # the other ports deployctl allocates there (spare_port, dist_port): preflight's allocated_ports
            "more_ports": more_ports(cfg, host)}


def more_ports(cfg: DeployConfig, host: HostConfig) -> list:
    """[[bind, port, what]] of the host's allocated ports besides its service port (config.replicas.allocated_ports):
    spare_port on server.bind, dist_port on 0.0.0.0 (the engines' rendezvous store binds every IPv4 address)."""
    from deployctl.config.replicas import allocated_ports

    service = layout.service_port(cfg, host)
    return [["0.0.0.0" if what == "dist_port" else cfg.server.bind, port, what]
            for port, what in sorted(allocated_ports(cfg, host).items()) if port != service and what != "server_port"]


def cache_path(host: HostConfig) -> str:
    """The host's hash cache: <deploy_root>/shared/hash-cache.json."""
    return layout.hash_cache(host)


def _parse_json(text: str, host: str, what: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    raise RemoteError(f"{what} on {host} printed no JSON: {text.strip()[-300:]!r}",
                      fix="check that hosts[].python is a working Python 3.8+")


def host_facts(host, cfg: DeployConfig, *, verify_weights: bool = True, on_progress: Optional[ProgressFn] = None) -> dict:
    """Facts for one Host (deployctl.hosts.Host). Raises RemoteError subclasses for SSH failures."""
    hc: HostConfig = host.config
    report = on_progress or (lambda *a: None)
    report(hc.name, "probe", 0, None)
    from deployctl.hosts import RemoteCommandError

    try:
        res = host.run(module_argv(hc.python, probe_module, json.dumps(probe_params(cfg, hc))), timeout=PROBE_TIMEOUT_S)
    except RemoteCommandError as exc:  # its message quotes the probe's whole (base64) command line
        why = exc.stderr_tail.strip().splitlines()[-1] if exc.stderr_tail.strip() else "no output"
        raise RemoteError(f"the probe could not run on {hc.name} with python {hc.python} (exit {exc.remote_status}: {why})",
                          fix="set hosts[].python to a working Python 3.8+ there (the runtime environment's "
                              "python)") from None
    facts = _parse_json(res.stdout, hc.name, "the probe")
    facts["standby"] = standby_facts(host) if hc.spare_port else None
    if not hc.is_local:
        from deployctl.preflight import shell

        try:
            facts["login_shell"] = shell.measure(host)
        except DeployctlError as err:
            facts["login_shell"] = {"error": err.message}
        from deployctl.preflight import sshdlimits

        try:
            facts["sshd"] = sshdlimits.measure(host)
        except DeployctlError as err:
            facts["sshd"] = {"error": err.message}
    facts["weights"] = None
    if verify_weights and (facts.get("model") or {}).get("exists"):
        total = sum(f["size"] for f in facts["model"]["files"])
        report(hc.name, "weights", 0, total)
        facts["weights"] = _verify(host, cfg, total, lambda n: report(hc.name, "weights", n, total))
    elif verify_weights:
        facts["weights"] = {"error": f"model directory {cfg.model.path} does not exist"}
    report(hc.name, "done", 0, None)
    return facts


def standby_facts(host) -> Optional[dict]:
    """The host's own sleeping standby (shared/run/standby.json, deployctl.rollout.standby): ``{"release", "port",
    "pids", "residue_bytes": {"<gpu>": bytes}|None, "measured"}`` (pids: its supervisor's process group, ``pgrep -g``), or None when there is none or it cannot be
    read. Two commands, the second only where a standby is recorded."""
    import shlex

    try:
        r = host.run(f"cat {shlex.quote(layout.standby_file(host.config))} 2>/dev/null || true", timeout=15)
        d = json.loads(r.stdout) if r.stdout.strip() else None
        if not isinstance(d, dict) or not d.get("port"):
            return _no_standby_facts(host)
        pidf = shlex.quote(layout.spare_pid_file(host.config, int(d["port"])))
        r = host.run(f'p=$(cat {pidf} 2>/dev/null) && [ -n "$p" ] && pgrep -g "$p" || true', timeout=15)
        pids = [int(x) for x in r.stdout.split() if x.isdigit()]
        rb = d.get("residue_bytes") if isinstance(d.get("residue_bytes"), dict) else None
        return {"release": d.get("release"), "port": int(d["port"]), "pids": pids, "residue_bytes": rb,
                "measured": d.get("measured")}
    except (DeployctlError, ValueError, TypeError):
        return None


def _no_standby_facts(host) -> Optional[dict]:
    """Without a standby: the residue measured at the host's last sleep from its no-standby note
    (layout.no_standby_file, written by deployctl.rollout.standby.note_none) as ``{"release", "port": None, "pids":
    [], "residue_bytes", "measured", "no_standby": why}``, or None."""
    import shlex

    r = host.run(f"cat {shlex.quote(layout.no_standby_file(host.config))} 2>/dev/null || true", timeout=15)
    note = json.loads(r.stdout) if r.stdout.strip() else None
    rb = note.get("residue_bytes") if isinstance(note, dict) else None
    if not isinstance(rb, dict) or not rb:
        return None
    return {"release": note.get("release"), "port": None, "pids": [], "residue_bytes": rb,
            "measured": note.get("measured"), "no_standby": note.get("why")}


def _verify(host, cfg: DeployConfig, total: int, advance: Callable[[int], None]) -> dict:
    hc: HostConfig = host.config
    if hc.is_local:
        cache = weights_module.HashCache(Path(cache_path(hc)))
        return weights_module.verify(Path(cfg.model.path), manifest=cfg.model.manifest, cache=cache, progress=advance).to_json()
    res = host.run(module_argv(hc.python, weights_module, "verify", cfg.model.path, "--manifest", cfg.model.manifest,
                               "--cache", cache_path(hc)), timeout=120 + total / HASH_BYTES_PER_S_FLOOR)
    advance(total)
    return _parse_json(res.stdout, hc.name, "weight verification")


def gather(cfg: DeployConfig, host_names: Optional[list[str]] = None, *, verify_weights: bool = True,
           on_progress: Optional[ProgressFn] = None, max_workers: Optional[int] = None) -> list[tuple[HostConfig, dict]]:
    """[(host config, facts)] for the named hosts (all when None), probed in parallel, ``max_workers`` at once
    (default rollout.parallel_hosts, as every fleet-wide operation). A host that cannot be reached gets facts
    ``{"error": message, "fix": fix}`` instead of raising."""
    from deployctl.hosts import Host, run_on_hosts

    configs = [cfg.host(n) for n in host_names] if host_names else list(cfg.hosts)
    hosts = [Host.from_config(hc) for hc in configs]
    try:
        outcomes = run_on_hosts(hosts, lambda h: host_facts(h, cfg, verify_weights=verify_weights, on_progress=on_progress),
                                max_workers=max_workers or cfg.rollout.parallel_hosts)
    finally:
        for h in hosts:
            h.close()
    out = []
    for hc, outcome in zip(configs, outcomes):
        if outcome.error is not None:
            err = outcome.error
            fix = err.fix if isinstance(err, DeployctlError) else None
            msg = err.message if isinstance(err, DeployctlError) else f"{type(err).__name__}: {err}"
            out.append((hc, {"error": msg, "fix": fix}))
            if on_progress:
                on_progress(hc.name, "done", 0, None)
        else:
            out.append((hc, outcome.value))
    return out
