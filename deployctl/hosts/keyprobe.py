"""``deployctl hosts trust``'s probe: the host key a host offers (key exchange only, no login), directly or through its
bastion (hosts[].jump), compared with every known_hosts file."""
from __future__ import annotations

from pathlib import Path

import paramiko

from deployctl.hosts import connect_errors, jump, known_hosts as hostkeys, ssh


def probe_host_key(cfg, *, known_hosts: Path | None = None) -> hostkeys.HostKeyProbe:
    """Fetch the host key ``cfg`` offers (key exchange only, no login; ssh_config's HostName and Port
    honoured; through hosts[].jump's bastion, logged in there, when set) and compare it with every known_hosts file.
    Raises HostUnreachable (naming the bastion when its leg failed), or the bastion's own connect errors."""
    conn = ssh.fabric_connection(cfg)
    user_files = conn.ssh_config.get("userknownhostsfile")
    if isinstance(user_files, str):
        user_files = user_files.split()
    known = hostkeys.lookup(conn.host, conn.port, user_files=user_files, extra=known_hosts)
    gateway = ssh.SSHTransport(cfg, known_hosts=known_hosts)._new_connection().gateway if cfg.jump else None
    try:
        sock = None
        if gateway is not None:
            try:
                gateway.open()
                sock = gateway.transport.open_channel("direct-tcpip", (conn.host, int(conn.port)), ("", 0),
                                                      timeout=cfg.connect_timeout_s)
            except paramiko.ChannelException as exc:
                raise jump.forward_refused(cfg, exc) from None
            except Exception as exc:  # noqa: BLE001 - every connect failure becomes one line naming the bastion
                raise connect_errors.connect_error(cfg, gateway, exc, name=jump.label(cfg),
                                                   fix=jump.bastion_fix(cfg)) from None
        key = hostkeys.fetch_host_key(conn.host, conn.port, timeout=cfg.connect_timeout_s, prefer=list(known),
                                      sock=sock)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise connect_errors.connect_error(cfg, conn, exc) from None
    finally:
        if gateway is not None:
            ssh._close(gateway)
    fp = hostkeys.fingerprint(key)
    if any(k.asbytes() == key.asbytes() for k in known.values()):
        status, expected = "trusted", fp
    elif known:
        old = known.get(key.get_name()) or next(iter(known.values()))
        status, expected = "changed", hostkeys.fingerprint(old)
    else:
        status, expected = "unknown", None
    return hostkeys.HostKeyProbe(cfg.name, hostkeys.known_hosts_name(conn.host, conn.port), conn.host, conn.port,
                                 key.get_name(), fp, status, expected, key)
