"""The sshd fleet fixture itself: stop/start makes a host unreachable and back. (The nginx fixture,
tests/nginx_fixture.py, is exercised by the render and rollout tests.)"""
from __future__ import annotations

from deployctl.hosts import Host, HostUnreachable


def test_ssh_fleet_hosts_and_stop_start(ssh_fleet):
    fleet = ssh_fleet(2, users=[None, "deploy"])
    assert [h.name for h in fleet.hosts] == ["gpu-a", "gpu-b"] and len({h.port for h in fleet.hosts}) == 2
    assert all(h.host_key_fingerprint.startswith("SHA256:") for h in fleet.hosts)
    entries = fleet.known_hosts.read_text().splitlines()
    assert [e.split()[0] for e in entries] == [f"[127.0.0.1]:{h.port}" for h in fleet.hosts]
    host = Host.from_config(fleet.host_configs()[1])
    assert host.run(["pwd"]).exit_code == 0
    fleet.stop("gpu-b")
    try:
        host.run(["true"])
        raise AssertionError("ran on a stopped host")
    except HostUnreachable as err:
        assert err.host == "gpu-b"
    fleet.start("gpu-b")
    assert host.run(["echo", "back"]).stdout == "back\n"
    host.close()
