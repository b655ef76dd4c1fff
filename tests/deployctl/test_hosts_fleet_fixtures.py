"""The fleet fixtures themselves: sshd stop/start makes a host unreachable and back; nginx starts on its
own prefix and port, reloads, and stops."""
from __future__ import annotations

import socket
import urllib.request

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


def test_nginx_server_start_reload_stop(nginx_server):
    nginx = nginx_server()
    nginx.include.write_text(f"server {{ listen 127.0.0.1:{nginx.port}; location / {{ return 200 'one'; }} }}\n")
    assert nginx.test().returncode == 0
    nginx.start()
    assert urllib.request.urlopen(nginx.url, timeout=5).read() == b"one"
    nginx.include.write_text(f"server {{ listen 127.0.0.1:{nginx.port}; location / {{ return 200 'two'; }} }}\n")
    nginx.reload()
    assert urllib.request.urlopen(nginx.url, timeout=5).read() == b"two"
    assert nginx.access_log.read_text().count("GET / ") == 2
    nginx.include.write_text("server { listen nonsense; }\n")
    assert nginx.test().returncode != 0
    nginx.stop()
    try:
        socket.create_connection(("127.0.0.1", nginx.port), timeout=1).close()
        raise AssertionError("nginx still listening after stop")
    except OSError:
        pass
