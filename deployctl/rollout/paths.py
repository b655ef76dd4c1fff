"""Where things live under a host's deploy_root (layout in ../shared/DESIGN.md) and who is acting."""
from __future__ import annotations

import getpass
import os
import posixpath
import socket
from datetime import datetime, timezone

from deployctl.config import DeployConfig, HostConfig


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


def actor() -> str:
    """``user@machine`` of the operator running deployctl."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = os.environ.get("USER", "unknown")
    return f"{user}@{socket.gethostname()}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
