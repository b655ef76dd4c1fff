"""C18: sudo never waits at a prompt. A real unprivileged user whose sudoers rule requires a password:
without a password source sudo fails at once with "sudo on HOST requires a password"; with
sudo_password_env the password goes on stdin, never on a command line or in the output."""
from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from deployctl.hosts import CommandTimeout, Host, SudoPasswordRequired
from test_hosts_exec import _procs_with


def test_sudo_without_password_source_fails_fast_with_clear_message(ssh_fleet):
    fleet = ssh_fleet(1, users="deploy")
    (cfg,) = fleet.host_configs()
    host = Host.from_config(cfg)
    assert host.run(["id", "-u"]).stdout.strip() != "0"
    start = time.monotonic()
    with pytest.raises(SudoPasswordRequired) as info:
        host.sudo(["id", "-u"], timeout=10)
    assert time.monotonic() - start < 10
    assert str(info.value).startswith("sudo on gpu-a requires a password")
    assert info.value.host == "gpu-a" and type(info.value).exit_code == 4
    host.close()


def test_sudo_password_from_env_on_stdin_only(ssh_fleet, monkeypatch):
    fleet = ssh_fleet(1, users="deploy")
    user = fleet.hosts[0].user
    password = fleet.password(user)
    (cfg,) = fleet.host_configs(sudo_password_env="DEPLOYCTL_TEST_SUDO_PW")

    host = Host.from_config(cfg)
    with pytest.raises(SudoPasswordRequired, match=r"\$DEPLOYCTL_TEST_SUDO_PW .* is not set"):
        host.sudo(["id", "-u"])

    monkeypatch.setenv("DEPLOYCTL_TEST_SUDO_PW", "wrong-" + password)
    with pytest.raises(SudoPasswordRequired, match="sudo on gpu-a requires a password .*was refused"):
        host.sudo(["id", "-u"], timeout=15)

    monkeypatch.setenv("DEPLOYCTL_TEST_SUDO_PW", password)
    seen: list[str] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        if password.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                            seen.append(entry)
                    except OSError:
                        pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = host.sudo("id -u; sleep 0.5; echo \"$SUDO_USER\"")
    finally:
        done.set()
        watcher.join()
    assert result.stdout.split() == ["0", user]
    assert seen == [] and password not in result.command + result.stdout + result.stderr
    host.close()


def test_sudo_nopasswd_and_root_login(ssh_fleet):
    fleet = ssh_fleet(2, users=["deploy", None], nopasswd_sudo=True)
    for cfg in fleet.host_configs():
        with Host.from_config(cfg) as host:
            assert host.sudo(["id", "-u"]).stdout.strip() == "0"
            assert host.sudo("echo 'a b;$(x)'").stdout == "a b;$(x)\n"
    # a sudo'd command that outlives its timeout is killed too
    marker = f"43.{secrets.randbelow(10**6):06d}"
    with Host.from_config(fleet.host_configs()[0]) as host:
        start = time.monotonic()
        with pytest.raises(CommandTimeout, match="on gpu-a timed out after 1 s"):
            host.sudo(["sleep", marker], timeout=1)
        assert time.monotonic() - start < 3
    deadline = time.monotonic() + 1
    while _procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with(marker) == []
