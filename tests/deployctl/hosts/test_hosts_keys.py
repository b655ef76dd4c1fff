"""C19: unknown and changed SSH host keys are refused on real sshd; `[127.0.0.1]:PORT` entries match;
`deployctl hosts trust` records a key after confirmation and the connection then works."""
from __future__ import annotations

import os

import paramiko
import pytest
import yaml

from deployctl.hosts import Host, HostKeyChanged, HostKeyUnknown
from support.cli import deployctl, run_cli as cli


def write_deploy_yaml(path, hosts: list[dict]) -> str:
    """A minimal deploy.yaml around ``hosts`` (shared by the hosts CLI tests)."""
    path.write_text(yaml.safe_dump({"service": {"name": "svc"}, "model": {"path": "/models/m"}, "hosts": hosts}))
    return str(path)


def test_reject_policy_in_force_and_unknown_key_refused_with_fingerprint(ssh_fleet):
    fleet = ssh_fleet(1, trusted=False)
    (cfg,) = fleet.host_configs()
    host = Host.from_config(cfg)
    with pytest.raises(HostKeyUnknown) as info:
        host.run(["true"])
    err = info.value
    fp = fleet.hosts[0].host_key_fingerprint  # as `ssh-keygen -lf` prints it
    assert err.fingerprint == fp and err.host == "gpu-a"
    assert fp in str(err) and "deployctl hosts trust gpu-a" in str(err) and "\n" not in str(err)
    assert f"[127.0.0.1]:{cfg.port}" in str(err)
    # The policy on Fabric's paramiko client is a reject policy, and nothing was recorded on the way.
    conn = host._transport._new_connection()
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)
    assert fleet.known_hosts.read_text() == ""
    # Control: Fabric's own default (AutoAddPolicy) would have logged in to this very sshd silently.
    from fabric import Connection

    plain = Connection("127.0.0.1", user="root", port=cfg.port,
                       connect_kwargs={"key_filename": str(fleet.client_key), "look_for_keys": False,
                                       "allow_agent": False})
    try:
        assert plain.run("echo in", hide=True, in_stream=False).stdout == "in\n"
    finally:
        plain.close()


def test_changed_key_always_refused(ssh_fleet, tmp_path):
    fleet = ssh_fleet(1, users="deploy")
    (cfg,) = fleet.host_configs()
    old = fleet.hosts[0].host_key_fingerprint
    host = Host.from_config(cfg)
    assert host.run(["true"]).exit_code == 0  # [127.0.0.1]:PORT entry matched on a non-22 port
    host.close()
    old_blob = (fleet.hosts[0].host_key.parent / "ssh_host_ed25519_key.pub").read_text().split()[1]
    new = fleet.regenerate_host_key("gpu-a")
    with pytest.raises(HostKeyChanged) as info:
        host.run(["true"])
    assert str(info.value).startswith("host key changed for gpu-a")
    assert info.value.fingerprint == new and info.value.expected == old and new in str(info.value)
    # `hosts trust` refuses a changed key without --replace, exit 4
    conf = write_deploy_yaml(tmp_path / "deploy.yaml", fleet.host_yaml())
    res = cli("hosts", "trust", "gpu-a", "-c", conf, "--yes")
    assert res.returncode == 4 and "host key changed for gpu-a" in res.stderr, res.stderr
    res = cli("hosts", "trust", "gpu-a", "-c", conf, "--yes", "--replace")
    assert res.returncode == 0, res.stderr
    entries = fleet.known_hosts.read_text().splitlines()
    assert len(entries) == 1 and old_blob not in entries[0]  # the old entry was replaced, not kept
    assert Host.from_config(cfg).run(["true"]).exit_code == 0


def test_hosts_trust_shows_fingerprint_records_after_confirmation(ssh_fleet, tmp_path):
    fleet = ssh_fleet(1, trusted=False)
    (cfg,) = fleet.host_configs()
    fp = fleet.hosts[0].host_key_fingerprint
    conf = write_deploy_yaml(tmp_path / "deploy.yaml", fleet.host_yaml())

    res = deployctl("hosts", "trust", "gpu-a", "-c", conf, input="n\n")
    assert res.returncode == 1 and fp in res.stdout, (res.stdout, res.stderr)
    assert fleet.known_hosts.read_text() == ""
    with pytest.raises(HostKeyUnknown):
        Host.from_config(cfg).run(["true"])

    res = cli("hosts", "trust", "gpu-a", "-c", conf, input="y\n")
    assert res.returncode == 0 and fp in res.stdout, (res.stdout, res.stderr)
    line = fleet.known_hosts.read_text().strip()
    assert line.startswith(f"[127.0.0.1]:{cfg.port} ssh-ed25519 ")
    assert oct(os.stat(fleet.known_hosts).st_mode & 0o777) == "0o600"
    assert Host.from_config(cfg).run(["echo", "ok"]).stdout == "ok\n"

    res = cli("hosts", "trust", "gpu-a", "-c", conf, "--yes")
    assert res.returncode == 0 and "already trusted" in res.stderr
    assert fleet.known_hosts.read_text().strip() == line


def test_ssh_config_alias_port_user_and_key_honoured(ssh_fleet, tmp_path, monkeypatch):
    fleet = ssh_fleet(1, users="deploy")
    fh = fleet.hosts[0]
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {fh.port}\n  User {fh.user}\n"
                          f"  IdentityFile {fleet.client_key}\n")
    monkeypatch.setenv("DEPLOYCTL_SSH_CONFIG", str(ssh_config))
    from deployctl.config import HostConfig

    cfg = HostConfig(name="gpu-a", address="gpu-alias", deploy_root=fh.deploy_root)  # no port, user, key
    with Host.from_config(cfg) as host:
        assert host.run(["id", "-un"]).stdout.strip() == fh.user  # [127.0.0.1]:PORT entry matched
    fleet.untrust("gpu-a")
    with pytest.raises(HostKeyUnknown, match=rf"\[127\.0\.0\.1\]:{fh.port}"):
        Host.from_config(cfg).run(["true"])
