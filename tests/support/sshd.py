"""The test fleet: real OpenSSH servers on 127.0.0.1, one per fake host (tests/conftest.py imports this).

``ssh_fleet(n, *, users=None, trusted=True, nopasswd_sudo=False) -> Fleet`` starts n Debian sshd on free
loopback ports with generated ed25519 host keys, one session-wide client key, and a known_hosts file with
``[127.0.0.1]:PORT`` entries that $DEPLOYCTL_KNOWN_HOSTS points at (monkeypatched). Each host gets its own
deploy_root, and root its own $HOME (so this machine's /root/.bashrc runs for no remote command). Hosts log
in as root unless ``users`` names login users: a str for every host, or a list with one entry per host (None =
root). Each named user is created for real (useradd) under a unique name
(``Fleet.hosts[i].user``), with the client key authorized, a password (``Fleet.password(user)``) and a
sudoers rule that requires it (``nopasswd_sudo=True``: NOPASSWD). Everything is torn down after the test:
sshd processes, users and their processes, sudoers files, the temp directory.
sshd runs as root per ../shared/notes/test-fleet.md; the fixture skips when that is impossible.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import pytest
from support.ports import free_port as _free_port

__all__ = ["ssh_fleet", "fleet_client_key", "Fleet", "FleetHost"]

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 10.0


@dataclass
class FleetHost:
    """One fake host: its sshd, its port, its deploy_root and its host key."""

    name: str
    port: int
    deploy_root: str
    user: str
    host_key: Path
    host_key_fingerprint: str
    address: str = "127.0.0.1"
    dir: Path = field(default=Path("."), repr=False)
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.address}]:{self.port}"


def _run(argv: list[str], **kw) -> str:
    """Run ``argv``; retry while another test holds the /etc/passwd lock (useradd, chpasswd, userdel)."""
    for attempt in range(50):
        proc = subprocess.run(argv, capture_output=True, text=True, **kw)
        if proc.returncode == 0:
            return proc.stdout
        if "lock" not in proc.stderr.lower() or attempt == 49:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        time.sleep(0.1)
    raise AssertionError("unreachable")


def _keygen(path: Path) -> str:
    """Generate an ed25519 key at ``path``; return its SHA256 fingerprint as ssh-keygen prints it."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "deployctl-test", "-f", str(path)])
    return _run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(path) + ".pub"]).split()[1]


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


class _PortTaken(RuntimeError):
    pass


class Fleet:
    """Real sshd servers for one test. ``hosts`` in start order; names gpu-a, gpu-b, ..."""

    def __init__(self, root: Path, client_key: Path, known_hosts: Path, first_index: int = 0):
        self.root = root
        self.client_key = client_key
        self.known_hosts = known_hosts
        self.hosts: list[FleetHost] = []
        self._first = first_index
        self._users: dict[str, str] = {}  # requested name -> real name
        self._passwords: dict[str, str] = {}
        self._sudoers: list[Path] = []
        self.max_sessions: dict[str, int] = {}  # host name -> sshd_config MaxSessions (default 50)
        self.max_startups: dict[str, str] = {}  # host name -> sshd_config MaxStartups (default 100:30:200)
        (root / "authorized_keys").mkdir(exist_ok=True)
        os.chmod(root / "authorized_keys", 0o755)

    # -- set-up ------------------------------------------------------------------------------------
    def _user(self, requested: Optional[str], nopasswd_sudo: bool) -> str:
        if requested in (None, "root"):
            self._authorize("root")
            return "root"
        if requested in self._users:
            return self._users[requested]
        real = f"{requested[:20]}-{secrets.token_hex(3)}"
        password = secrets.token_urlsafe(12)
        _run(["useradd", "-m", "-s", "/bin/bash", real])
        self._users[requested] = real
        _run(["chpasswd"], input=f"{real}:{password}\n")
        self._passwords[real] = password
        rule = "NOPASSWD: ALL" if nopasswd_sudo else "ALL"
        sudoers = Path(f"/etc/sudoers.d/deployctl-test-{real}")
        if not sudoers.parent.is_dir():
            pytest.skip("sudo is not installed (tests/setup.sh installs it)")
        sudoers.write_text(f"{real} ALL=(ALL) {rule}\n")
        os.chmod(sudoers, 0o440)
        self._sudoers.append(sudoers)
        self._authorize(real)
        return real

    def _authorize(self, user: str) -> None:
        path = self.root / "authorized_keys" / user
        path.write_text(Path(str(self.client_key) + ".pub").read_text())
        os.chmod(path, 0o644)

    def add_host(self, user: Optional[str], nopasswd_sudo: bool, trusted: bool) -> FleetHost:
        index = self._first + len(self.hosts)
        name = "gpu-" + (chr(ord("a") + index) if index < 26 else str(index))
        hdir = self.root / name
        hdir.mkdir()
        os.chmod(hdir, 0o755)
        real_user = self._user(user, nopasswd_sudo)
        deploy_root = hdir / "deploy"
        deploy_root.mkdir()
        if real_user != "root":
            shutil.chown(deploy_root, real_user, real_user)
        key = hdir / "ssh_host_ed25519_key"
        host = FleetHost(name=name, port=_free_port(), deploy_root=str(deploy_root), user=real_user,
                         host_key=key, host_key_fingerprint=_keygen(key), dir=hdir)
        self.hosts.append(host)
        for _ in range(5):  # another test may take the free port before sshd binds it
            try:
                self.start(name)
                break
            except _PortTaken:
                host.port = _free_port()
        else:
            raise RuntimeError(f"no free port for the sshd of {name}")
        if trusted:
            self.trust(name)
        return host

    def _config(self, host: FleetHost) -> Path:
        path = host.dir / "sshd_config"
        home = host.dir / "home"
        home.mkdir(exist_ok=True)
        path.write_text("\n".join([
            f"Port {host.port}", f"ListenAddress {host.address}", f"HostKey {host.host_key}",
            f"PidFile {host.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.root}/authorized_keys/%u",
            "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UseDNS no",
            "PrintMotd no", f"MaxStartups {self.max_startups.get(host.name, '100:30:200')}", f"MaxSessions {self.max_sessions.get(host.name, 50)}",
            "Subsystem sftp internal-sftp",
            # each root host its own $HOME, as separate machines have: sshd runs commands through the login
            # shell, and Debian's bash sources ~/.bashrc for them. This machine's /root/.bashrc runs `pyenv init`,
            # whose rehash lock serialises every remote command of every host (~0.3 s each idle, ~1 s under load)
            "Match User root", f"    SetEnv HOME={home}", "",
        ]))
        return path

    # -- control -----------------------------------------------------------------------------------
    def host(self, name: str) -> FleetHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def start(self, name: str) -> None:
        """Start (or restart after stop) the sshd of ``name`` on its port; wait until it answers."""
        host = self.host(name)
        if host.proc is not None and host.proc.poll() is None:
            return
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        log = open(host.dir / "sshd.log", "ab")
        host.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self._config(host))], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if host.proc.poll() is not None:
                if "Address already in use" in (host.dir / "sshd.log").read_text():
                    raise _PortTaken(name)
                raise RuntimeError(f"sshd for {name} exited: {(host.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection((host.address, host.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {name} did not answer on port {host.port} within {START_TIMEOUT_S} s")

    def _tree(self, name: str) -> list[int]:
        """The sshd of ``name`` and every process below it (per-connection sshd, sessions), parents first."""
        proc = self.host(name).proc
        if proc is None or proc.poll() is not None:
            return []
        out, todo = [], [proc.pid]
        while todo:
            pid = todo.pop(0)
            out.append(pid)
            todo.extend(_children(pid))
        return out

    def freeze(self, name: str) -> None:
        """SIGSTOP the sshd of ``name`` and everything below it: the kernel still ACKs TCP, nothing answers (a hung
        host). ``thaw`` undoes it; ``stop`` thaws first."""
        for pid in self._tree(name):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def thaw(self, name: str) -> None:
        for pid in self._tree(name):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def restart(self, name: str, *, max_sessions: Optional[int] = None, max_startups: Optional[str] = None) -> None:
        """Stop and start the sshd of ``name``, with sshd_config's MaxSessions set to ``max_sessions`` (None: 50)
        and MaxStartups to ``max_startups`` ("start:rate:full"; None: 100:30:200)."""
        self.stop(name)
        for table, value in ((self.max_sessions, max_sessions), (self.max_startups, max_startups)):
            if value is None:
                table.pop(name, None)
            else:
                table[name] = value
        self.start(name)

    def stop(self, name: str) -> None:
        """Stop the sshd of ``name`` and drop its open connections: the host becomes unreachable."""
        self.thaw(name)
        host = self.host(name)
        proc, host.proc = host.proc, None
        if proc is None or proc.poll() is not None:
            return
        for pid in _children(proc.pid):  # per-connection sshd processes (own sessions)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def regenerate_host_key(self, name: str) -> str:
        """Give ``name`` a new host key (known_hosts keeps the old one); restart its sshd. Returns the
        new SHA256 fingerprint."""
        host = self.host(name)
        self.stop(name)
        host.host_key_fingerprint = _keygen(host.host_key)
        self.start(name)
        return host.host_key_fingerprint

    def trust(self, name: str) -> None:
        """Add ``[127.0.0.1]:PORT <key>`` for ``name`` to the fleet's known_hosts."""
        host = self.host(name)
        algo, blob = Path(str(host.host_key) + ".pub").read_text().split()[:2]
        with open(self.known_hosts, "a") as fh:
            fh.write(f"{host.known_hosts_name} {algo} {blob}\n")

    def untrust(self, name: str) -> None:
        """Remove every known_hosts entry for ``name``."""
        prefix = self.host(name).known_hosts_name + " "
        lines = [ln for ln in self.known_hosts.read_text().splitlines(True) if not ln.startswith(prefix)]
        self.known_hosts.write_text("".join(lines))

    def password(self, user: str) -> str:
        """The login/sudo password of a user this fleet created."""
        return self._passwords[user]

    def host_yaml(self, python: str = sys.executable, *, launcher: str = "process", **extra) -> list[dict]:
        """deploy.yaml ``hosts:`` entries for the fleet (``extra`` keys added to each)."""
        return [dict({"name": h.name, "address": h.address, "port": h.port, "user": h.user,
                      "deploy_root": h.deploy_root, "python": python, "launcher": launcher,
                      "ssh_key": str(self.client_key), "connect_timeout_s": 5}, **extra) for h in self.hosts]

    def host_configs(self, **kw):
        """``host_yaml`` as deployctl.config.HostConfig objects."""
        from deployctl.config import HostConfig

        return [HostConfig(**d) for d in self.host_yaml(**kw)]

    def close(self) -> None:
        for host in self.hosts:
            self.stop(host.name)
        for sudoers in self._sudoers:
            sudoers.unlink(missing_ok=True)
        for real in self._users.values():
            uid = int(_run(["id", "-u", real]).strip())
            for pid in _pids_of_uid(uid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                _run(["userdel", "-f", "-r", real])
            except RuntimeError:
                pass  # its home under /home stays; nothing else depends on it


@pytest.fixture(scope="session")
def fleet_client_key(tmp_path_factory) -> Path:
    """One ed25519 client key for the whole session (private key path; ``.pub`` beside it)."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (tests/setup.sh installs it)")
    if os.geteuid() != 0:
        pytest.skip("the sshd test fleet runs sshd as root")
    key = tmp_path_factory.mktemp("fleet-client") / "id_ed25519"
    _keygen(key)
    return key


@pytest.fixture
def ssh_fleet(monkeypatch, fleet_client_key):
    """Factory: ``ssh_fleet(n, *, users=None, trusted=True, nopasswd_sudo=False) -> Fleet``."""
    root = Path(tempfile.mkdtemp(prefix="deployctl-fleet-", dir="/tmp"))
    os.chmod(root, 0o755)  # login users reach their deploy_root and authorized_keys
    known_hosts = root / "known_hosts"
    known_hosts.touch()
    monkeypatch.setenv("DEPLOYCTL_KNOWN_HOSTS", str(known_hosts))
    fleets: list[Fleet] = []

    def factory(n: int = 1, *, users: Union[None, str, list] = None, trusted: bool = True,
                nopasswd_sudo: bool = False) -> Fleet:
        per_host = users if isinstance(users, list) else [users] * n
        if len(per_host) != n:
            raise ValueError(f"users has {len(per_host)} entries for {n} hosts")
        sub = root / f"fleet{len(fleets)}"
        sub.mkdir()
        os.chmod(sub, 0o755)
        fleet = Fleet(sub, fleet_client_key, known_hosts, sum(len(f.hosts) for f in fleets))
        fleets.append(fleet)
        for user in per_host:
            fleet.add_host(user, nopasswd_sudo, trusted)
        return fleet

    try:
        yield factory
    finally:
        for fleet in fleets:
            fleet.close()
        shutil.rmtree(root, ignore_errors=True)
