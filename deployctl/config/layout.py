"""Where things live under a host's deploy_root (layout in ../shared/DESIGN.md), and the runtime's port there."""
from __future__ import annotations

import posixpath

from deployctl.config.models import DeployConfig, HostConfig


def releases_dir(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "releases")


def release_dir(h: HostConfig, release_id: str) -> str:
    return posixpath.join(h.deploy_root, "releases", release_id)


def current_link(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "current")


def state_dir(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "state")


def state_file(h: HostConfig, name: str) -> str:
    return posixpath.join(h.deploy_root, "state", name)


def shared_dir(h: HostConfig, *parts: str) -> str:
    return posixpath.join(h.deploy_root, "shared", *parts)


def log_file(h: HostConfig) -> str:
    return shared_dir(h, "logs", "runtime.log")


def pid_file(h: HostConfig) -> str:
    return shared_dir(h, "run", "runtime.pid")


def service_port(cfg: DeployConfig, h: HostConfig) -> int:
    """The runtime's port on host ``h``: the host's ``server_port`` if set, else ``server.port``."""
    return getattr(h, "server_port", None) or cfg.server.port
