"""`deployctl hosts check`: every host's outcome, one line each, exit 4 when any failed. Unreachable
(closed port), wrong user and wrong key are distinct one-line errors. Real sshd; the real CLI."""
from __future__ import annotations

import json
import subprocess

from test_hosts_keys import cli, deployctl, write_deploy_yaml


def test_check_reports_every_host_with_distinct_errors(ssh_fleet, tmp_path):
    fleet = ssh_fleet(2)
    fleet.stop("gpu-b")  # closed port
    good, down = fleet.host_yaml()
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    hosts = [good, down,
             dict(good, name="wrong-user", user="nosuchuser"),
             dict(good, name="wrong-key", ssh_key=str(other_key)),
             dict(good, name="no-key-file", ssh_key=str(tmp_path / "missing_key"))]
    conf = write_deploy_yaml(tmp_path / "deploy.yaml", hosts)

    res = deployctl("hosts", "check", "-c", conf)
    assert res.returncode == 4, res.stderr
    lines = dict(line.split(None, 1) for line in res.stdout.splitlines())
    assert list(lines) == ["gpu-a", "gpu-b", "wrong-user", "wrong-key", "no-key-file"]
    assert lines["gpu-a"].startswith("ok")
    assert lines["gpu-b"].startswith(f"FAIL  cannot reach gpu-b at 127.0.0.1:{down['port']}: connection refused")
    assert lines["wrong-user"].startswith("FAIL  wrong-user (127.0.0.1:") and "as user 'nosuchuser'" in lines["wrong-user"]
    assert lines["wrong-key"].startswith("FAIL  wrong-key (127.0.0.1:") and f"with key {other_key}" in lines["wrong-key"]
    assert lines["no-key-file"].startswith(f"FAIL  ssh_key {tmp_path / 'missing_key'} for no-key-file does not exist")
    failed = [v for k, v in lines.items() if k != "gpu-a"]
    assert len(set(failed)) == len(failed)  # distinct
    assert "4 of 5 hosts failed the check" in res.stderr and len(res.stderr.strip().splitlines()) == 1

    res = cli("hosts", "check", "-c", conf, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 4 and doc["ok"] is False
    assert [h["error_type"] for h in doc["hosts"]] == [None, "HostUnreachable", "AuthFailed", "AuthFailed", "AuthFailed"]

    for name, fragment in (("gpu-b", "connection refused"), ("wrong-user", "refused login")):
        res = cli("hosts", "check", name, "-c", conf)
        assert res.returncode == 4 and fragment in res.stdout
    res = deployctl("hosts", "trust", "gpu-b", "-c", conf, "--yes")
    assert res.returncode == 4 and res.stderr.strip().startswith("error: cannot reach gpu-b")
    assert len(res.stderr.strip().splitlines()) == 1

    fleet.start("gpu-b")
    res = cli("hosts", "check", "gpu-b", "-c", conf)
    assert res.returncode == 0 and res.stdout.startswith("gpu-b  ok")
    res = cli("hosts", "check", "nope", "-c", conf)
    assert res.returncode == 2 and "host 'nope' is not in" in res.stderr
