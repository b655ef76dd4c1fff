"""SSH keepalive and channel refusals on a real sshd (tests/support/sshd.py): a frozen peer (its sshd and every
process below it SIGSTOPped: TCP still ACKed, nothing answers) is found within keepalive_interval_s ×
keepalive_count with an error naming the keepalive; a channel refused because sshd's MaxSessions is reached gets a
message naming MaxSessions, not "lost the SSH connection"; hosts[].max_channels keeps deployctl under it."""
from __future__ import annotations

import threading
import time

import pytest

from deployctl.config import HostConfig
from deployctl.hosts import Host, HostUnreachable
from deployctl.hosts.base import CommandTimeout, RemoteCommandError


def _host(fleet, **extra) -> Host:
    return Host.from_config(HostConfig(**{**fleet.host_yaml()[0], **extra}))


def test_defaults():
    h = HostConfig(name="a", address="10.0.0.1", deploy_root="/opt/x")
    assert (h.keepalive_interval_s, h.keepalive_count) == (15, 3)


def test_frozen_peer_is_found_within_interval_times_count(ssh_fleet):
    fleet = ssh_fleet(1)
    name = fleet.hosts[0].name
    host = _host(fleet, keepalive_interval_s=1, keepalive_count=3)
    try:
        assert host.run(["true"]).exit_code == 0
        fleet.freeze(name)
        start = time.monotonic()
        with pytest.raises(HostUnreachable) as info:
            host.run(["sleep", "30"], timeout=60)  # hangs without the keepalive: the peer never answers
        took = time.monotonic() - start
        msg = str(info.value)
        print(f"\nfrozen sshd found after {took:.1f} s: {msg}")
        assert "no answer to SSH keepalives" in msg and "keepalive_interval_s 1 × keepalive_count 3" in msg, msg
        assert host.name in msg and "frozen" in msg
        assert took <= 3 + 1.5, took  # interval × count, plus the watcher's tick and load on a shared machine
    finally:
        fleet.thaw(name)
        host.close()
    # the host answers again once thawed: a new connection
    host = _host(fleet, keepalive_interval_s=1, keepalive_count=3)
    try:
        assert host.run(["echo", "back"]).stdout == "back\n"
    finally:
        host.close()


def test_keepalive_keeps_an_idle_connection_and_off_means_off(ssh_fleet):
    fleet = ssh_fleet(1)
    host = _host(fleet, keepalive_interval_s=1, keepalive_count=2)  # 1 s: the shortest interval besides 0 (off)
    try:
        host.run(["true"])
        time.sleep(3)  # three intervals idle (over interval × count): every keepalive answered, nothing declared dead
        assert host.run(["echo", "ok"]).stdout == "ok\n"
        assert host.run(["sleep", "2"], timeout=10).exit_code == 0  # a command longer than interval × count is fine
    finally:
        host.close()
    off = _host(fleet, keepalive_interval_s=0)
    try:
        off.run(["true"])
        assert off._transport._alive is None
    finally:
        off.close()


def test_many_commands_at_once_stay_under_max_sessions_and_all_succeed(ssh_fleet):
    """Issue 28 audit 6: the golden thread, the scrapes, runtime_pid and the control polls share one connection; 16
    commands at once on one Host against an sshd with MaxSessions 3 and hosts[].max_channels 3 (SFTP's one and
    two for commands) all succeed, the rest waiting for a free channel: never more than two run at once."""
    fleet = ssh_fleet(1)
    name = fleet.hosts[0].name
    fleet.restart(name, max_sessions=3)
    host = _host(fleet, max_channels=3)
    try:
        # under this fleet's own deploy_root: another test (or worktree) running beside this one must not add to
        # the count of commands running at once
        root = fleet.hosts[0].deploy_root
        host.put_text("x", f"{root}/sessions/probe")  # SFTP's channel is open from here on
        mark = f"{root}/sessions/running"
        # each command counts the commands running beside it (a file per command while it runs)
        cmd = (f"mkdir -p {mark} && touch {mark}/$$ && ls {mark} | wc -l > {mark}.$$ && sleep 0.3 && "
               f"cat {mark}.$$ && rm -f {mark}/$$ {mark}.$$")
        results, errors = [], []

        def one():
            try:
                results.append(int(host.run(cmd, timeout=60).stdout.strip()))
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(results) == 16 and max(results) <= 2, results
        print(f"\n16 commands on one connection, at most {max(results)} at once (max_channels 3, MaxSessions 3)")
        # a caller that cannot get a channel within its own timeout is told so, naming the bound
        busy = [threading.Thread(target=lambda: host.run(["sleep", "2"], timeout=10)) for _ in range(2)]
        for t in busy:
            t.start()
        time.sleep(0.5)
        with pytest.raises(CommandTimeout) as info:
            host.run(["true"], timeout=0.5)
        for t in busy:
            t.join()
        assert "waited 0.5 s for a free SSH channel" in str(info.value) and "max_channels 3" in str(info.value)
    finally:
        host.close()


def test_max_sessions_below_max_channels_is_refused_naming_both(ssh_fleet):
    fleet = ssh_fleet(1)
    name = fleet.hosts[0].name
    fleet.restart(name, max_sessions=1)
    host = _host(fleet)  # max_channels 8 against MaxSessions 1
    try:
        started = threading.Event()

        def busy():
            started.set()
            host.run(["sleep", "5"], timeout=10)  # held past the refused open's retries (REFUSED_RETRY_S, 2 s)

        t = threading.Thread(target=busy)
        t.start()
        started.wait()
        time.sleep(1)  # the first session is open
        with pytest.raises(RemoteCommandError) as info:
            host.run(["true"])
        t.join()
        msg = str(info.value)
        print(f"\n{msg}\n{info.value.fix}")
        assert "refused to open an SSH channel" in msg and "MaxSessions" in msg and "lost the SSH" not in msg, msg
        assert "max_channels 8" in msg and "MaxSessions" in info.value.fix and "hosts[].max_channels" in info.value.fix
        assert host.run(["echo", "after"]).stdout == "after\n"  # the connection itself is fine
    finally:
        host.close()


def test_max_sessions_2_with_max_channels_2_runs_four_rounds_in_a_row(ssh_fleet):
    """Issue 41: with MaxSessions 2 and max_channels 2, as the refusal's own fix advises, a channel opened just after
    another closed was refused (sshd frees the slot on a later turn of its loop). Four rounds of a fresh connection,
    an SFTP write and 24 commands, two at a time, each with env (an SFTP file) and a file read: none refused."""
    fleet = ssh_fleet(1)
    name = fleet.hosts[0].name
    fleet.restart(name, max_sessions=2)
    errors: list[Exception] = []
    for round_ in range(4):
        host = _host(fleet, max_channels=2)
        path = f"{fleet.hosts[0].deploy_root}/ms2/f{round_}"
        try:
            host.put_text("x", path)

            def one(i: int) -> None:
                try:
                    assert host.run(["true"], timeout=30, env={"N": str(i)}).exit_code == 0
                    assert host.read_text(path, timeout=30) == "x"
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    errors.append(e)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            host.close()
    assert not errors, errors


def test_an_sftp_channel_the_server_closed_is_reopened_while_the_connection_lives(ssh_fleet):
    """The CI of stop 50 saw sshd close the SFTP channel under MaxSessions 2 on a loaded machine ("Server connection
    dropped") while the connection lived: a file operation then runs on a fresh SFTP channel instead of reporting a
    lost connection."""
    fleet = ssh_fleet(1)
    host = _host(fleet)
    path = f"{fleet.hosts[0].deploy_root}/reopen/f"
    try:
        host.put_text("one", path)
        conn = host._transport.connection()
        conn.sftp().get_channel().close()  # as the server's close leaves it: this channel is done
        host.put_text("two", path)
        assert host.read_text(path, timeout=30) == "two" and conn.sftp().get_channel().closed is False
    finally:
        host.close()
