"""The on-host layout: every path under a host's deploy_root, and where the runtime answers there. The one home
of these rules: render, rollout, runbooks, preflight and the service layer all ask this module.

Under ``deploy_root`` (docs/DESIGN.md, "On a host")::

    releases/<release id>/   one rendered release (runtime.yaml, launch.sh, unit, runtime.env, manifest.sha256)
    current -> releases/<id> the release that runs (a relative symlink, switched atomically)
    shared/logs/runtime.log  the runtime's log (appended across releases)
    shared/run/runtime.pid   the launcher's pid (launch.sh; its process group holds the runtime)
    shared/run/runtime.child.pid  the runtime's own pid
    shared/run/runtime.<port>.pid  a supervisor started on a second port (rollback); runtime.pid links to it
    shared/run/standby.json  the previous release kept asleep on the other port (release, port, expires_at)
    shared/hash-cache.json   preflight's weight-hash cache
    state/                   rollout state, lock, history, audit.jsonl

The runtime listens on ``server.bind`` at ``service_port``; from its own host it is reached at
``runtime_address`` (loopback for a wildcard bind). All paths are POSIX strings (they name files on the host).
"""
from __future__ import annotations

import ipaddress
import posixpath

from deployctl.config.models import DeployConfig, HostConfig

WILDCARD_BINDS = ("0.0.0.0", "::", "")
LOOPBACK = "127.0.0.1"


def unit_name(cfg: DeployConfig, h: HostConfig) -> str:
    """The systemd unit of the runtime on ``h``: ``<service>.service``, ``<service>-r<i>.service`` for replica i of
    a host entry with replicas (config/replicas.py)."""
    return f"{cfg.service.name}{h.unit}.service"


def log_cap_units(cfg: DeployConfig, h: HostConfig) -> tuple[str, str]:
    """The systemd service and timer that cap the runtime log on ``h`` (deploy.yaml ``logs:``; config/logs.py):
    ``<unit stem>-logs.service`` and ``<unit stem>-logs.timer``."""
    stem = unit_name(cfg, h).removesuffix(".service")
    return f"{stem}-logs.service", f"{stem}-logs.timer"


def releases_dir(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "releases")


def release_dir(h: HostConfig, release_id: str) -> str:
    """``<deploy_root>/releases/<release_id>``."""
    return posixpath.join(h.deploy_root, "releases", release_id)


def current_link(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "current")


def current_target(release_id: str) -> str:
    """What ``current`` points at for ``release_id``: ``releases/<id>``, relative to deploy_root."""
    return posixpath.join("releases", release_id)


def runtime_yaml(h: HostConfig) -> str:
    """The runtime.yaml of the release that runs: ``<deploy_root>/current/runtime.yaml``."""
    return posixpath.join(current_link(h), "runtime.yaml")


def state_dir(h: HostConfig) -> str:
    return posixpath.join(h.deploy_root, "state")


def state_file(h: HostConfig, name: str) -> str:
    return posixpath.join(h.deploy_root, "state", name)


def shared_dir(h: HostConfig, *parts: str) -> str:
    return posixpath.join(h.deploy_root, "shared", *parts)


def machine_root(h: HostConfig) -> str:
    """The deploy_root that the machine's replicas share: a replica (``hosts[].replicas``) lives under
    ``<deploy_root>/r<i>`` (config/replicas.py), so its machine's is the parent; any other host's is its own."""
    root = h.deploy_root.rstrip("/") or "/"
    return posixpath.dirname(root) if h.replica is not None else root


def engines_dir(h: HostConfig) -> str:
    """The machine's shared engine venvs, one per (engine, version): ``<machine_root>/shared/engines``, so the
    replicas of one machine install a pinned engine once, not once each (rollout/release.py ENGINE_INSTALL)."""
    return posixpath.join(machine_root(h), "shared", "engines")


def engine_links_glob(h: HostConfig) -> str:
    """An sh glob (quoted where it must be) of every release's ``engine`` link on the machine: the replicas'
    releases all link into one engines_dir, so pruning one replica's must see the others' links."""
    import shlex

    if h.replica is not None:
        return f"{shlex.quote(machine_root(h))}/r*/releases/*/engine"
    return f"{shlex.quote(release_dir(h, ''))}*/engine"


def log_file(h: HostConfig) -> str:
    return shared_dir(h, "logs", "runtime.log")


def pid_file(h: HostConfig) -> str:
    """The launcher's pidfile (launch.sh; the runtime runs in its process group)."""
    return shared_dir(h, "run", "runtime.pid")


def child_pid_file(h: HostConfig) -> str:
    """The runtime process's own pidfile (written by launch.sh)."""
    return shared_dir(h, "run", "runtime.child.pid")


def standby_file(h: HostConfig) -> str:
    """The record of the release kept asleep beside the serving one (deployctl.rollout.standby)."""
    return shared_dir(h, "run", "standby.json")


def no_standby_file(h: HostConfig) -> str:
    """Why the last deploy kept no standby on the host, with the residue it measured (deployctl.rollout.standby)."""
    return shared_dir(h, "run", "no-standby.json")


def hash_cache(h: HostConfig) -> str:
    """Preflight's weight-hash cache on the host."""
    return shared_dir(h, "hash-cache.json")


def configured_port(cfg: DeployConfig, h: HostConfig) -> int:
    """The port deploy.yaml gives the runtime on host ``h``: the host's ``server_port`` if set, else
    ``server.port`` (what a release renders into runtime.yaml)."""
    return getattr(h, "server_port", None) or cfg.server.port


def service_port(cfg: DeployConfig, h: HostConfig) -> int:
    """The port the runtime answers on host ``h`` now: ``configured_port``, or the host's ``spare_port`` when a
    rollback left the runtime there (the active port ``launcher.load_port`` read from the host)."""
    return getattr(h, "_active_port", None) or configured_port(cfg, h)


def spare_pid_file(h: HostConfig, port: int, child: bool = False) -> str:
    """The pidfile of a supervisor started on ``port`` beside the serving one (launch.sh with
    DEPLOYCTL_LAUNCH_PORT): ``runtime.<port>.pid`` / ``runtime.child.<port>.pid``. Once it serves alone,
    ``pid_file``/``child_pid_file`` are symlinks to these, and the link's target names the active port."""
    return shared_dir(h, "run", f"runtime.child.{int(port)}.pid" if child else f"runtime.{int(port)}.pid")


def runtime_address(cfg: DeployConfig) -> str:
    """Where the runtime answers on its own host: ``server.bind``, or loopback (127.0.0.1) for a wildcard bind
    (0.0.0.0, ::)."""
    bind = cfg.server.bind
    return LOOPBACK if bind in WILDCARD_BINDS else bind


def url_host(address: str) -> str:
    """``address`` as the host part of a URL or an nginx ``server`` line: an IPv6 literal in brackets."""
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]"
    except ValueError:
        pass
    return address


def base_url(cfg: DeployConfig, h: HostConfig, port: int | None = None) -> str:
    """``http://<runtime_address>:<service_port>`` (or ``port``): the runtime as seen from its own host."""
    return f"http://{url_host(runtime_address(cfg))}:{port or service_port(cfg, h)}"


def router_keys_path(cfg: DeployConfig) -> str:
    """The router's API keys file on the router host (deployctl.render.keys): ``<router.upstream_conf>.keys``, 0600,
    outside nginx's ``conf.d/*.conf`` glob; included by the rendered router conf when server.api_key_env is set."""
    return cfg.router.upstream_conf + ".keys"


def network_address(h: HostConfig) -> str:
    """The host's address from another machine's side (the router, the access log): ``address``, or 127.0.0.1
    for ``address: local``."""
    return LOOPBACK if h.is_local else h.address
