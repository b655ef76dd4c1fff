"""The one-line errors of an SSH connection that did not open (deployctl.hosts.ssh): unknown or changed host key,
refused login, refused or silent port, handshakes sshd dropped (MaxStartups), each naming the host and the fix."""
from __future__ import annotations

import socket

import paramiko

from deployctl.hosts import known_hosts as hostkeys
from deployctl.hosts.base import AuthFailed, HostError, HostKeyChanged, HostKeyUnknown, HostUnreachable


def connect_error(cfg, conn, exc: Exception, *, retries: int = 0, dropped: bool = False,
                  name: str | None = None, fix: str | None = None) -> HostError:
    """The one-line HostError for an exception raised while connecting ``conn`` (a Fabric Connection) for host config
    ``cfg``; ``name``: what the message calls the peer (default the host's name; the bastion's when its leg failed,
    deployctl.hosts.jump), ``fix`` that of an unreachable one; ``retries`` dropped handshakes tried again."""
    host = cfg.name
    name, where = name or host, f"{conn.host}:{conn.port}"
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, hostkeys.UnknownHostKeyRejected):
        fp = hostkeys.fingerprint(exc.key)
        return HostKeyUnknown(
            f"host key of {name} ({exc.hostname}) is not trusted: {exc.key.get_name()} {fp}",
            host=host, fingerprint=fp,
            fix=f"check the fingerprint out of band, then run `deployctl hosts trust {name}`" if name == host else
                f"check the fingerprint out of band, then add it to your known_hosts (`ssh-keyscan -p {conn.port} "
                f"{conn.host} >> ~/.ssh/known_hosts`, or `ssh -p {conn.port} {conn.host}` once); `deployctl hosts "
                f"trust` takes hosts[] entries, and {name} is not one")
    if isinstance(exc, paramiko.BadHostKeyException):
        fp, old = hostkeys.fingerprint(exc.key), hostkeys.fingerprint(exc.expected_key)
        kh = hostkeys.known_hosts_name(conn.host, conn.port)
        return HostKeyChanged(
            f"host key changed for {name} ({kh}): offered {fp}, known_hosts has {old}",
            host=host, fingerprint=fp, expected=old,
            fix=f"refusing to connect; if {name} was reinstalled, verify the new key and run "
                f"`deployctl hosts trust {name} --replace`")
    if isinstance(exc, paramiko.AuthenticationException):
        key = cfg.ssh_key or "ssh agent / ~/.ssh keys"
        return AuthFailed(
            f"{name} ({where}) refused login as user {conn.user!r} with key {key}",
            host=host, fix="check hosts[].user and hosts[].ssh_key, and that the key is in that "
                           "user's authorized_keys")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reason = "connection refused"
    elif isinstance(exc, socket.gaierror):
        reason = f"cannot resolve {conn.host!r}"
    elif isinstance(exc, (socket.timeout, TimeoutError)):
        reason = f"no answer within {cfg.connect_timeout_s:g} s"
    elif dropped:
        reason = (f"sshd closed the connection during the handshake, {retries + 1} times in "
                  f"{cfg.connect_timeout_s:g} s (sshd's MaxStartups drops unauthenticated connections over "
                  "its limit: fewer hosts at once (parallel_hosts, hosts[].connect_rate) or a higher MaxStartups)")
    elif "SSH protocol banner" in str(exc) or str(exc) == "No existing session":
        reason = (f"no SSH banner within {cfg.connect_timeout_s:g} s (something listens there but does not "
                  "speak SSH, or sshd is overloaded)")
    else:
        reason = " ".join(str(exc).split()) or type(exc).__name__
    return HostUnreachable(f"cannot reach {name} at {where}: {reason}", host=host,
                           fix=fix or "check that the host is up, sshd runs, and hosts[].address/port are right")

