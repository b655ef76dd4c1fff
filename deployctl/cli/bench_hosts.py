"""`deployctl bench -c deploy.yaml --hosts A,B`: the runtimes' URLs and the API key from deploy.yaml.

A name is a host from ``hosts:``, or ``canary`` / ``stable``: the first canary host and the first stable host of
a rollout (the first ``rollout.canary_hosts`` hosts are the canaries, as deployctl.rollout.plan splits them).
URL: http://ADDRESS:PORT with the host's address (127.0.0.1, or server.bind when it is an address, for a
``local`` host) and its ``server_port`` or ``server.port``. The key: the env var ``server.api_key_env`` names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from deployctl.errors import UsageError


def resolve_hosts(config: Path, names: str) -> tuple[list[tuple[str, str]], Optional[str]]:
    """([(name, url)], api key or None). Raises UsageError for an unknown name, ConfigError for a bad file."""
    from deployctl import settings
    from deployctl.config import load_config

    cfg = load_config(config)
    hosts = {h.name: h for h in cfg.hosts}
    order = [h.name for h in cfg.hosts]
    n_canary = min(cfg.rollout.canary_hosts, max(len(order) - 1, 0))
    roles = {"canary": order[:n_canary] or order[:1], "stable": order[n_canary:]}
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name in hosts:
            host = hosts[name]
        elif name in roles and roles[name]:
            host = hosts[roles[name][0]]
        else:
            raise UsageError(f"--hosts {name!r} is not a host in {config}",
                             fix=f"use host names ({', '.join(order)}) or canary/stable")
        if host.address == "local":
            bind = cfg.server.bind
            address = "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind
        else:
            address = host.address
        if ":" in address:
            address = f"[{address}]"
        out.append((name, f"http://{address}:{host.server_port or cfg.server.port}"))
    key = None
    if cfg.server.api_key_env:
        key = settings.secret(cfg.server.api_key_env)
        if not key:
            raise UsageError(f"{config}: server.api_key_env {cfg.server.api_key_env} is not set in the environment",
                             fix=f"export {cfg.server.api_key_env}=...")
    return out, key
