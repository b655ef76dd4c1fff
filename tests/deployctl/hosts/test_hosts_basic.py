"""Host.run / put_text / put / read_text / exists / get over real sshd (root and an unprivileged user) and
locally, through the same interface."""
from __future__ import annotations

import os
import stat

import pytest

from deployctl.config import HostConfig
from deployctl.hosts import Host, RemoteCommandError


def _hosts(ssh_fleet, tmp_path):
    fleet = ssh_fleet(2, users=[None, "deploy"])
    local = HostConfig(name="here", address="local", deploy_root=str(tmp_path / "local-root"))
    return fleet, [Host.from_config(c) for c in fleet.host_configs()] + [Host.from_config(local)]


def test_run_files_and_errors_on_ssh_and_local(ssh_fleet, tmp_path):
    fleet, hosts = _hosts(ssh_fleet, tmp_path)
    users = [fleet.hosts[0].user, fleet.hosts[1].user, "root"]
    for host, user in zip(hosts, users):
        with host:
            root = host.config.deploy_root
            r = host.run(["id", "-un"])
            assert (r.host, r.exit_code, r.stdout.strip()) == (host.name, 0, user)
            assert host.run("echo out; echo err >&2; exit 3", check=False).exit_code == 3
            with pytest.raises(RemoteCommandError) as info:
                host.run("echo boom >&2; exit 7")
            err = info.value
            assert (err.host, err.remote_status, err.stderr_tail) == (host.name, 7, "boom")
            assert host.name in str(err) and "exit code 7" in str(err)
            assert err.exit_code == 4  # deployctl's exit code; the remote command's status is remote_status
            assert host.run(["cat"], input="piped\n").stdout == "piped\n"
            big = "x" * 200_000 + "\n"  # a shipped script's size: must not trickle in byte by byte
            assert host.run(["wc", "-c"], input=big, timeout=10).stdout.strip() == str(len(big))

            target = f"{root}/releases/r1/runtime.env"
            host.put_text("K=v\n", target, mode=0o600)
            assert host.read_text(target) == "K=v\n"
            assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
            assert host.exists(target) and not host.exists(f"{root}/nope")
            assert host.run(["stat", "-c", "%U", target]).stdout.strip() == user
            assert os.listdir(os.path.dirname(target)) == ["runtime.env"]  # temp file renamed away

            src = tmp_path / f"wheel-{host.name}.whl"
            src.write_bytes(os.urandom(300_000))
            host.put(src, f"{root}/releases/r1/w.whl", mode=0o644)
            back = tmp_path / f"back-{host.name}"
            host.get(f"{root}/releases/r1/w.whl", back)
            assert back.read_bytes() == src.read_bytes()
            with pytest.raises(RemoteCommandError, match=f"cannot read {root}/missing on {host.name}"):
                host.read_text(f"{root}/missing")
