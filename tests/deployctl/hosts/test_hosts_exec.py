"""Timeouts kill the whole remote process group; quoting; secrets never on a command line; detached
background starts; parallel group runs. Real sshd (tests/fleet_sshd.py) and the local transport."""
from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from pathlib import Path

import pytest

from deployctl.hosts import CommandTimeout, Host, HostUnreachable, run_on_hosts


def _procs_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != str(os.getpid()):
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _wait_gone(marker: str, within: float = 1.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := _procs_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_timeout_kills_process_group_and_names_host(two_hosts):
    for host in two_hosts:
        host.run(["true"])  # connect first: the bound is on the command
        for script in ("sleep {a} & sleep {b}; wait", "trap '' TERM; sleep {a} & sleep {b}; wait"):
            a, b = f"41.{secrets.randbelow(10**6):06d}", f"42.{secrets.randbelow(10**6):06d}"
            start = time.monotonic()
            with pytest.raises(CommandTimeout) as info:
                host.run(script.format(a=a, b=b), timeout=1.0)
            elapsed = time.monotonic() - start
            assert elapsed < 1.0 + 2, (host.name, script, elapsed)
            assert host.name in str(info.value) and "after 1 s" in str(info.value) and info.value.host == host.name
            assert _wait_gone(a) == [] and _wait_gone(b) == [], f"left behind on {host.name}: {script}"
        assert host.run(["echo", "still usable"]).stdout == "still usable\n"


def test_paths_and_values_arrive_literally(two_hosts):
    for host in two_hosts:
        root = host.config.deploy_root
        home = host.run('printf %s "$HOME"').stdout
        weird_dir = f"{root}/d $(touch pwned);x"
        weird = f"{weird_dir}/x y;$(touch pwned)'\""
        value = "a b;$(touch pwned) `touch pwned` 'q' \"dq\" $HOME"
        host.put_text(value, weird)
        assert host.read_text(weird) == value and host.exists(weird)
        assert host.run(["cat", weird]).stdout == value
        assert host.run(["ls", weird_dir]).stdout == "x y;$(touch pwned)'\"\n"
        assert host.run('printf %s "$V"', env={"V": value}).stdout == value
        assert host.run(["printf", "%s", value]).stdout == value
        host.run(["touch", weird + ".2"])
        assert Path(weird + ".2").exists()
        for where in (home, root, weird_dir, os.getcwd()):
            assert not Path(where, "pwned").exists(), (host.name, where)


def test_env_secret_never_on_a_command_line(two_hosts):
    for host in two_hosts:
        secret = "sk-" + secrets.token_hex(16)
        seen: list[int] = []
        done = threading.Event()

        def watch():
            while not done.is_set():
                seen.extend(_procs_with(secret))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            result = host.run('sleep 1; printf %s "$API_KEY"', env={"API_KEY": secret})
        finally:
            done.set()
            watcher.join()
        assert result.stdout == secret  # it reached the command...
        assert seen == [] and secret not in result.command  # ...but never through a command line
        if not host.is_local:
            assert host.run("ls -a /tmp | grep -c '^.deployctl-env-' || true").stdout.strip() == "0"


def test_background_start_detaches_and_returns_promptly(two_hosts, tmp_path):
    for host in two_hosts:
        root = host.config.deploy_root
        marker = f"57.{secrets.randbelow(10**6):06d}"
        host.put_text("TOKEN='v 1'\n", f"{root}/runtime.env", mode=0o600)
        log, pidf = f"{root}/shared/logs/runtime.log", f"{root}/shared/run/runtime.pid"
        start = time.monotonic()
        pid = host.start_background(["sh", "-c", f'echo "token=$TOKEN cwd=$PWD"; exec sleep {marker}'],
                                    log_file=log, pid_file=pidf, env_file=f"{root}/runtime.env", cwd=root)
        took = time.monotonic() - start
        try:
            assert took < 3, took
            assert host.run(["kill", "-0", str(pid)]).exit_code == 0
            assert host.read_text(pidf).strip() == str(pid)
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            assert int(stat[3]) == pid  # session id: setsid made it a session leader
            assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
            assert os.readlink(f"/proc/{pid}/fd/1") == log == os.readlink(f"/proc/{pid}/fd/2")
            deadline = time.monotonic() + 3
            while "token=" not in host.read_text(log) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert host.read_text(log) == f"token=v 1 cwd={root}\n"
            assert marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        finally:
            host.run(["kill", str(pid)], check=False)
        assert _wait_gone(marker, 3) == []


def test_parallel_runs_take_about_the_slowest_host(ssh_fleet):
    fleet = ssh_fleet(3, users="deploy")
    hosts = [Host.from_config(c) for c in fleet.host_configs()]
    for h in hosts:
        h.run(["true"])
    delays = {"gpu-a": 0.6, "gpu-b": 0.8, "gpu-c": 1.0}
    start = time.monotonic()
    serial = [h.run(["sleep", str(delays[h.name])]).exit_code for h in hosts]
    serial_s = time.monotonic() - start
    start = time.monotonic()
    outcomes = run_on_hosts(hosts, lambda h: h.run(["sleep", str(delays[h.name])]).exit_code)
    parallel_s = time.monotonic() - start
    assert serial == [0, 0, 0] and [o.value for o in outcomes] == [0, 0, 0]
    assert parallel_s < 0.7 * serial_s and parallel_s < 1.0 + 1.0, (parallel_s, serial_s)

    fleet.stop("gpu-b")  # every host's outcome is reported, not only the first failure
    outcomes = run_on_hosts(hosts, lambda h: h.run(["hostname"]).exit_code)
    assert [o.host for o in outcomes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert outcomes[0].value == 0 and outcomes[2].value == 0
    assert isinstance(outcomes[1].error, HostUnreachable) and "gpu-b" in str(outcomes[1].error)
    fleet.start("gpu-b")
    assert hosts[1].run(["true"]).exit_code == 0  # reconnects once the host is back
    for h in hosts:
        h.close()


def test_never_hangs_on_a_silent_port_or_a_dropped_connection(ssh_fleet):
    fleet = ssh_fleet(1, users="deploy")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts TCP, never speaks SSH
    try:
        cfg = fleet.host_configs(connect_timeout_s=1)[0].model_copy(update={"port": silent.getsockname()[1]})
        start = time.monotonic()
        with pytest.raises(HostUnreachable, match=r"cannot reach gpu-a at 127\.0\.0\.1:\d+"):
            Host.from_config(cfg).run(["true"])
        assert time.monotonic() - start < 1 + 2
    finally:
        silent.close()

    host = Host.from_config(fleet.host_configs()[0])
    host.run(["true"])
    threading.Timer(0.5, fleet.stop, args=("gpu-a",)).start()
    start = time.monotonic()
    with pytest.raises(HostUnreachable, match="lost the SSH connection to gpu-a during `sleep 20`"):
        host.run(["sleep", "20"], timeout=30)
    assert time.monotonic() - start < 5
