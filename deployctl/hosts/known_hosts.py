"""SSH host-key trust: known_hosts files, a reject policy, fingerprints, and recording a trusted key.

Fabric 3's ``Connection`` sets paramiko's ``AutoAddPolicy`` and loads no known_hosts (fabric/fabric#2071,
case C19). ``secure_client`` undoes that: it loads the system, user and deployctl-managed known_hosts files
and installs ``RejectUnknownPolicy`` (a paramiko ``RejectPolicy`` that keeps the offered key, so the error
can show its SHA256 fingerprint). A changed key is refused by paramiko itself (``BadHostKeyException``).
Non-standard ports are looked up as ``[host]:port``, as OpenSSH writes them.

Only this module and the SSH transport (deployctl/hosts/ssh.py, which also probes a host's key) import paramiko.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import paramiko

from deployctl.hosts.base import known_hosts_path

# paramiko logs transport failures ("Exception (client): Error reading SSH protocol banner") through Python's
# last-resort handler onto stderr; deployctl reports each failure itself, in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key: "SHA256:" + unpadded base64 of sha256(key blob)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    """The name a host is filed under in known_hosts: ``host`` on port 22, else ``[host]:port``."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


class UnknownHostKeyRejected(paramiko.SSHException):
    """Raised by RejectUnknownPolicy; carries the known_hosts name and the offered key."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class RejectUnknownPolicy(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, raising an exception that keeps the offered key for the message."""

    def missing_host_key(self, client, hostname, key):  # noqa: D401 (paramiko's signature)
        raise UnknownHostKeyRejected(hostname, key)


def known_hosts_files(user_files: list[str] | None = None) -> list[Path]:
    """Files read, in order: system, user (ssh_config's UserKnownHostsFile if given), deployctl-managed."""
    users = user_files if user_files else list(USER_KNOWN_HOSTS)
    paths = [Path(p) for p in SYSTEM_KNOWN_HOSTS] + [Path(p).expanduser() for p in users]
    paths.append(known_hosts_path())
    return paths


def _load_each(load, user_files: list[str] | None, extra: Path | None) -> None:
    """Call ``load(path)`` for every known_hosts file that exists (``extra`` last); unreadable ones are skipped."""
    for path in known_hosts_files(user_files) + ([Path(extra)] if extra is not None else []):
        if path.is_file():
            try:
                load(str(path))
            except (OSError, paramiko.SSHException):
                continue


def secure_client(client: paramiko.SSHClient, *, user_files: list[str] | None = None,
                  extra: Path | None = None) -> None:
    """Load known_hosts into ``client`` and set RejectUnknownPolicy. Unreadable files are skipped."""
    _load_each(client.load_system_host_keys, user_files, extra)
    client.set_missing_host_key_policy(RejectUnknownPolicy())


def fetch_host_key(hostname: str, port: int, *, timeout: float = 10,
                   prefer: list[str] | None = None, sock=None) -> paramiko.PKey:
    """Connect to ``hostname:port`` (or use ``sock``, a socket-like channel there: a bastion's direct-tcpip), run the
    SSH key exchange only (no authentication) and return the server's host key, asking for the ``prefer`` key types
    first (as paramiko's client does for types already in known_hosts). Raises OSError (refused, DNS, timeout) or
    paramiko.SSHException (not SSH)."""
    sock = sock if sock is not None else socket.create_connection((hostname, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = timeout
    if prefer:
        options = transport.get_security_options()
        first = [t for t in prefer if t in options.key_types]
        options.key_types = tuple(first + [t for t in options.key_types if t not in first])
    try:
        transport.start_client(timeout=timeout)
        if not transport.is_active():  # start_client can return at its timeout before the banner check fails
            raise transport.get_exception() or paramiko.SSHException("Error reading SSH protocol banner")
        return transport.get_remote_server_key()
    finally:
        transport.close()


def lookup(hostname: str, port: int, *, user_files: list[str] | None = None,
           extra: Path | None = None) -> dict[str, paramiko.PKey]:
    """Keys already trusted for ``hostname:port`` across all known_hosts files (key type -> key)."""
    keys = paramiko.HostKeys()
    _load_each(keys.load, user_files, extra)
    found = keys.lookup(known_hosts_name(hostname, port))
    return {name: found[name] for name in (found.keys() if found else [])}


def record_host_key(hostname: str, port: int, key: paramiko.PKey, *, path: Path | None = None,
                    replace: bool = False) -> Path:
    """Append ``key`` for ``hostname:port`` to the deployctl-managed known_hosts (mode 0600).
    With ``replace``, earlier entries for that name in that file are dropped first. Returns the path."""
    target = Path(path) if path else known_hosts_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    name = known_hosts_name(hostname, port)
    lines: list[str] = []
    if target.exists():
        for line in target.read_text().splitlines():
            names = line.split(" ", 1)[0].split(",") if line and not line.startswith("#") else []
            if replace and name in names:
                continue
            lines.append(line)
    lines.append(f"{name} {key.get_name()} {key.get_base64()}")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class HostKeyProbe:
    """What a host offers versus what known_hosts holds. ``status``: "trusted", "unknown" or "changed"."""

    host: str
    known_hosts_name: str
    hostname: str
    port: int
    key_type: str
    fingerprint: str
    status: str
    expected_fingerprint: str | None
    key: paramiko.PKey
