"""`deployctl hosts trust/check` misused: bad --timeout values, an address where something listens but never speaks
SSH. Loopback only: every port is one this test opened or found closed."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


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
