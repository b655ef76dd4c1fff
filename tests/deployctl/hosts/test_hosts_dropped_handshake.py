"""Handshakes sshd drops (MaxStartups: unauthenticated connections over its limit are closed at once) are tried
again with jittered backoff within connect_timeout_s, counted, and named as drops when they never get through;
a fleet of 32 host entries behind one sshd (as behind a bastion) is reached whole. Real sshd on loopback."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from test_hosts_keys import write_deploy_yaml

from deployctl.errors import ExitCode
from deployctl.hosts import Host
from deployctl.hosts.base import HostUnreachable
from support.cli import deployctl


def _hold(port: int) -> socket.socket:
    """An unauthenticated connection sshd counts against MaxStartups until it is closed; returns once sshd's banner
    came (the connection is accepted and counted). Tried again while sshd still counts another one (the fleet's own
    start-up probe): it answers "Exceeded MaxStartups" and closes."""
    deadline = time.monotonic() + 10
    while True:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        first = s.recv(64)
        if first.startswith(b"SSH-"):
            return s
        s.close()
        assert b"MaxStartups" in first and time.monotonic() < deadline, first
        time.sleep(0.05)


def test_a_dropped_handshake_is_retried_until_sshd_has_room(ssh_fleet):
    fleet = ssh_fleet(1)
    fleet.restart("gpu-a", max_startups="1:100:1")  # one unauthenticated connection at a time, the rest dropped
    (cfg,) = fleet.host_configs()
    held = _hold(cfg.port)
    threading.Timer(1.0, held.close).start()  # room again after a second, inside connect_timeout_s (5 s)
    host = Host.from_config(cfg)
    try:
        started = time.monotonic()
        assert host.run(["true"], timeout=10).exit_code == 0
        assert host.connect_retries >= 1 and time.monotonic() - started < cfg.connect_timeout_s
    finally:
        host.close()


def test_handshakes_dropped_past_the_deadline_are_named_as_drops_not_as_a_silent_port(ssh_fleet):
    fleet = ssh_fleet(1)
    fleet.restart("gpu-a", max_startups="1:100:1")
    (cfg,) = fleet.host_configs()
    cfg = cfg.model_copy(update={"connect_timeout_s": 2})
    held = _hold(cfg.port)
    host = Host.from_config(cfg)
    try:
        with pytest.raises(HostUnreachable) as info:
            host.run(["true"], timeout=10)
    finally:
        held.close()
        host.close()
    msg = str(info.value)
    assert "sshd closed the connection during the handshake" in msg and "MaxStartups" in msg, msg
    assert "no SSH banner" not in msg and host.connect_retries >= 1


def test_32_host_entries_behind_one_sshd_with_max_startups_4_50_8_are_all_reached(ssh_fleet, tmp_path):
    fleet = ssh_fleet(1)
    fleet.restart("gpu-a", max_startups="4:50:8")
    (one,) = fleet.host_yaml()
    hosts = [dict(one, name=f"h{i:02d}") for i in range(32)]  # 8 at once (run_on_hosts' default, parallel_hosts)
    res = deployctl("hosts", "check", "-c", write_deploy_yaml(tmp_path / "deploy.yaml", hosts), "--json")
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] and [h["host"] for h in doc["hosts"] if h["ok"]] == [h["name"] for h in hosts]
    assert doc["connect_retries"] == sum(h["connect_retries"] for h in doc["hosts"])
    print(f"\n32 hosts through one sshd (MaxStartups 4:50:8): {doc['connect_retries']} dropped handshakes retried")
