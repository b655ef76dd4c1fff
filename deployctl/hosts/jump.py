"""``hosts[].jump``: reach a host through a bastion, as ssh's ProxyJump does.

deployctl logs in to the bastion ("[user@]host[:port]", deployctl.config.hosts.jump_endpoint) with the host's own
ssh_key, connect timeout and known_hosts (the bastion's key must be trusted like any host's), then Fabric's
``gateway=`` opens a ``direct-tcpip`` channel from the bastion to the host's address:port, over which the host's own
SSH session runs end to end (its host key checked as usual). One bastion connection per host connection, as
``ssh -J`` makes; new ones start at the bastion's own connect rate (deployctl.hosts.startrate).
A bastion that cannot be reached, or that cannot reach the host, is an error naming the bastion.
"""
from __future__ import annotations

import paramiko
from fabric import Connection

from deployctl.config.hosts import jump_endpoint
from deployctl.hosts.base import HostError, HostUnreachable


def gateway(cfg, connect_kwargs: dict, connect_timeout: int) -> Connection:
    """The bastion's Connection for host config ``cfg`` (not yet open); its user defaults to the host's."""
    user, address, port = jump_endpoint(cfg.jump)
    return Connection(host=address, user=user or cfg.user, port=port, connect_timeout=connect_timeout,
                      connect_kwargs=dict(connect_kwargs))


def label(cfg) -> str:
    """What errors call the bastion of host config ``cfg``."""
    return f"bastion {cfg.jump} (hosts[].jump of {cfg.name})"


def bastion_fix(cfg) -> str:
    """The fix of a bastion that cannot be reached."""
    return (f"check that the bastion {cfg.jump} is up and its sshd runs, that it accepts {cfg.name}'s ssh_key and "
            "user, and that its host key is in known_hosts (hosts[].jump)")


def forward_refused(cfg, exc: paramiko.ChannelException) -> HostError:
    """The bastion was reached but refused or failed to open its channel to the host."""
    return HostUnreachable(
        f"{label(cfg)} could not open a connection to {cfg.name} at {cfg.address}:{cfg.port}: {exc.text or exc}",
        host=cfg.name,
        fix=f"check that {cfg.name}'s sshd runs and that the bastion reaches {cfg.address}:{cfg.port} (hosts[].address "
            "is resolved on the bastion), and that the bastion's sshd allows TCP forwarding (AllowTcpForwarding)")
