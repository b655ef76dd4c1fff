"""Issue 41, SSH at fleet scale: new connections to one sshd start at hosts[].connect_rate (a token bucket: the burst,
then one per 1/rate s), and hosts[].jump reaches a host through a bastion (the traffic provably through it; a
bastion that is down is named as the bastion). Real sshd on loopback."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import paramiko
import pytest

from deployctl.hosts import Host, run_on_hosts
from deployctl.hosts.base import HostKeyUnknown, HostUnreachable
from support.cli import deployctl
from test_hosts_keys import write_deploy_yaml


def _own_tcp_peer_ports() -> list[int]:
    """Remote ports of this process's own TCP sockets (its fds matched to /proc/net/tcp by inode)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open("/proc/net/tcp") as fh:
        for row in list(fh)[1:]:
            cols = row.split()
            if cols[9] in inodes and cols[3] == "01":  # ESTABLISHED
                ports.append(int(cols[2].split(":")[1], 16))
    return ports


def test_connections_to_one_sshd_start_at_connect_rate(ssh_fleet, monkeypatch):
    fleet = ssh_fleet(1)
    (one,) = fleet.host_configs()
    rate = 4.0
    configs = [one.model_copy(update={"name": f"h{i:02d}", "connect_rate": rate}) for i in range(12)]
    starts: list[float] = []
    lock = threading.Lock()
    real_connect = paramiko.SSHClient.connect

    def recorded(self, *a, **kw):  # where the TCP connect and handshake begin, below deployctl's bound
        with lock:
            starts.append(time.monotonic())
        return real_connect(self, *a, **kw)

    monkeypatch.setattr(paramiko.SSHClient, "connect", recorded)
    hosts = [Host.from_config(c) for c in configs]
    try:
        outcomes = run_on_hosts(hosts, lambda h: h.run(["true"], timeout=30).exit_code, max_workers=12)
    finally:
        for h in hosts:
            h.close()
    assert [o.value for o in outcomes] == [0] * 12, [o.error for o in outcomes]
    starts.sort()
    assert len(starts) == 12
    # any span of starts holds at most the burst (rate) plus rate per second of its length; 0.1 s of slack for a
    # thread that a busy machine delays between its turn and the connect (without the bound: 7.9 starts over)
    worst = max(j - i + 1 - (rate + rate * (starts[j] - starts[i] + 0.1))
                for i in range(12) for j in range(i, 12))
    assert worst <= 0, [round(t - starts[0], 3) for t in starts]
    assert starts[-1] - starts[0] >= (12 - rate) / rate - 0.05  # the 8 after the burst: 0.25 s apart
    print(f"\n12 connections at connect_rate {rate:g}: started over {starts[-1] - starts[0]:.2f} s")


def test_jump_goes_through_the_bastion_and_a_bastion_down_is_named(ssh_fleet, tmp_path):
    fleet = ssh_fleet(2)
    bastion, target = fleet.hosts
    (_, cfg) = fleet.host_configs()
    cfg = cfg.model_copy(update={"jump": f"root@127.0.0.1:{bastion.port}", "connect_timeout_s": 3})
    fleet.untrust(target.name)  # `hosts trust` fetches its key through the bastion
    (_, entry) = fleet.host_yaml()
    logins = (bastion.dir / "sshd.log").read_text().count("Accepted publickey")
    res = deployctl("hosts", "trust", target.name, "--yes", "-c",
                    write_deploy_yaml(tmp_path / "deploy.yaml", [dict(entry, jump=cfg.jump)]))
    assert res.returncode == 0 and target.host_key_fingerprint in res.stdout, res.stdout + res.stderr
    assert (bastion.dir / "sshd.log").read_text().count("Accepted publickey") == logins + 1  # logged in there
    host = Host.from_config(cfg)
    try:
        assert host.run(["cat", "/proc/sys/kernel/hostname"], timeout=30).exit_code == 0
        host.put_text("through", f"{target.deploy_root}/jumped")  # SFTP too
        peers = _own_tcp_peer_ports()
        assert bastion.port in peers and target.port not in peers, (peers, bastion.port, target.port)
        assert (Path(target.deploy_root) / "jumped").read_text() == "through"
    finally:
        host.close()

    fleet.untrust(bastion.name)  # the bastion's key unknown: the fix is not `hosts trust` (not a hosts[] entry)
    err = _connect_fails(cfg, HostKeyUnknown)
    assert f"bastion root@127.0.0.1:{bastion.port}" in str(err), str(err)
    fix = err.fix
    assert f"ssh-keyscan -p {bastion.port} 127.0.0.1" in fix and "is not one" in fix, fix

    fleet.stop(bastion.name)
    err = _connect_fails(cfg, HostUnreachable)
    msg = str(err)
    assert f"bastion root@127.0.0.1:{bastion.port} (hosts[].jump of gpu-b)" in msg and "connection refused" in msg, msg
    assert "bastion" in err.fix


def _connect_fails(cfg, error: type):
    """The ``error`` a command on host config ``cfg`` raises (its connection does not open)."""
    host = Host.from_config(cfg)
    try:
        with pytest.raises(error) as info:
            host.run(["true"], timeout=10)
    finally:
        host.close()
    return info.value


def test_jump_accepts_ssh_j_form_and_names_it_when_not():
    from pydantic import ValidationError

    from deployctl.config import HostConfig
    from deployctl.config.hosts import jump_endpoint

    assert jump_endpoint("ops@bastion.example:2222") == ("ops", "bastion.example", 2222)
    assert jump_endpoint("bastion") == (None, "bastion", 22) and jump_endpoint("[::1]:2")[1:] == ("::1", 2)
    with pytest.raises(ValidationError) as info:
        HostConfig(name="a", address="10.0.0.1", deploy_root="/opt/x", jump="ops@bastion:99999")
    assert "[user@]host[:port]" in str(info.value) and "ops@bastion:99999" in str(info.value)
