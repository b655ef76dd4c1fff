"""Issue 41: `deployctl preflight` reads each host's sshd limits with `sshd -T` (the config file the listening sshd was
started with, Match blocks applied) and warns, naming both figures and the fix, when rollout.parallel_hosts over the
entries sharing one sshd exceeds MaxStartups' start or hosts[].max_channels exceeds MaxSessions; a host reached
through a bastion (hosts[].jump) is read on the host itself; a login without root or password-less sudo is noted,
never failed. Real sshd on loopback (the tests run as root)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from support.cli import deployctl


def test_preflight_compares_parallel_hosts_and_max_channels_with_sshd_limits(ssh_fleet, tmp_path):
    fleet = ssh_fleet(3, users=[None, None, "ops"])  # "ops" has sudo with a password only: sudo -n fails
    shared, behind, ops = fleet.hosts
    fleet.restart(shared.name, max_startups="2:50:4", max_sessions=3)
    a, b, c = fleet.host_yaml(python="python3")
    hosts = [dict(a, name=f"shared-{i}", max_channels=4) for i in range(3)]  # 3 at once against start 2
    hosts += [dict(b, jump=f"root@127.0.0.1:{shared.port}"), c]
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump({"service": {"name": "svc"}, "model": {"path": str(tmp_path / "no-model")},
                                    "engine": {"device": "cpu"}, "hosts": hosts}))
    res = deployctl("preflight", "--json", "-c", str(path))
    doc = json.loads(res.stdout)
    checks = {h["host"]: {c["name"]: c for c in h["checks"]} for h in doc["hosts"]}
    facts = {h["host"]: h["facts"] for h in doc["hosts"]}

    limits = checks["shared-0"]["sshd_limits"]
    assert limits["status"] == "warn", limits
    for figure in ("rollout.parallel_hosts 8", "3 hosts[] entries share that sshd", "up to 3 SSH handshakes",
                   "MaxStartups 2:50:4", "hosts[].max_channels 4", "MaxSessions 3"):
        assert figure in limits["message"], (figure, limits)
    assert "rollout.parallel_hosts or hosts[].connect_rate to 2 or less" in limits["fix"]
    assert "max_channels for shared-0 to 3" in limits["fix"]
    # read from the test sshd's own config file (the listener's -f, found in /proc), not /etc/ssh/sshd_config
    assert facts["shared-0"]["sshd"] == {"max_startups": "2:50:4", "max_sessions": 3,
                                         "config": str(shared.dir / "sshd_config")}

    # through the bastion (shared's sshd): read on the target's own sshd, defaults of the fixture, no warning
    assert facts[behind.name]["sshd"]["max_sessions"] == 50, facts[behind.name]
    assert checks[behind.name]["sshd_limits"]["status"] == "pass"
    assert "reach" not in checks[behind.name] and facts[behind.name]["login_shell"]["command_s"] > 0

    # no root, sudo wants a password: noted, not failed
    note = checks[ops.name]["sshd_limits"]
    assert note["status"] == "pass" and "not read" in note["message"] and "sudo -n" in note["message"], note
    print("\n" + limits["message"] + "\n" + note["message"])
