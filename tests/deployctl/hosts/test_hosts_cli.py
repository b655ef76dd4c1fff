"""`deployctl hosts check`: every host's outcome, one line each, exit 4 when any failed. Unreachable
(closed port), wrong user and wrong key are distinct one-line errors. Real sshd; the real CLI."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_hosts_keys import write_deploy_yaml

from support.cli import deployctl, repo_env, run_cli as cli


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


# -- regressions (from test_hosts_cli_edge_cases.py): `deployctl hosts trust/check` misused: bad --timeout values, an address where something listens but never speaks SSH. Loopback only: every port is one this test opened or found closed.

ENV = repo_env()


def hosts(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", "hosts", *args, "-c", str(tmp_path / "deploy.yaml")],
                          env=ENV, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def write_cfg(tmp_path: Path, host_yaml: str) -> None:
    (tmp_path / "deploy.yaml").write_text("service: {name: svc}\nmodel: {path: /nonexistent/model}\n"
                                          f"hosts:\n  - {host_yaml}\n")


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_check_timeout_that_is_not_a_positive_number_is_a_usage_error(tmp_path, timeout):
    # the host was blamed instead: "h1 FAIL cannot convert float NaN to integer" / "timed out after -1 s", exit 4
    write_cfg(tmp_path, f"{{name: h1, address: local, deploy_root: {tmp_path / 'root'}}}")
    proc = hosts(tmp_path, "check", "--timeout", timeout)
    assert proc.returncode == 2, proc.stderr
    assert "--timeout" in one_error_line(proc)


@pytest.fixture
def silent_listener():
    """A loopback port that accepts connections and never sends an SSH banner."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("command", [["trust", "h1", "--yes"], ["check"]])
def test_a_port_that_never_speaks_ssh_is_one_line_naming_the_banner(tmp_path, silent_listener, command):
    # paramiko's own log leaked "Exception (client): Error reading SSH protocol banner" as a second stderr line,
    # and the error said "No existing session", which names nothing the operator can fix
    write_cfg(tmp_path, f"{{name: h1, address: 127.0.0.1, port: {silent_listener}, "
                        f"deploy_root: {tmp_path / 'root'}, connect_timeout_s: 1}}")
    proc = hosts(tmp_path, *command)
    assert proc.returncode == 4, proc.stderr
    err = proc.stderr if command[0] == "trust" else proc.stdout + proc.stderr
    assert "Exception (client)" not in err and "No existing session" not in err, err
    assert "SSH banner" in err and f"127.0.0.1:{silent_listener}" in err, err
    if command[0] == "trust":
        one_error_line(proc)
