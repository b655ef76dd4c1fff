"""Host.run(on_stderr=...) hands each stderr line over while the command still runs (issue 26: an engine's
multi-GB pip install shows its progress), over real sshd and on the local transport. The command waits for a file
that only the callback creates: if the lines came at the end, it would time out."""
from __future__ import annotations

import os

import pytest

from deployctl.hosts import CommandTimeout


def test_stderr_lines_arrive_while_the_command_runs(two_hosts, tmp_path):
    for host in two_hosts:
        flag = f"/tmp/.deployctl-test-flag-{host.name}-{tmp_path.name}"
        seen: list[str] = []

        def on_line(line: str, flag=flag, seen=seen) -> None:  # sshd runs on this machine: one /tmp
            seen.append(line)
            if line == "engine: Collecting sglang==0.5.23":
                open(flag, "w").close()

        script = (f"echo 'engine: Collecting sglang==0.5.23' >&2; echo out-line; "
                  f"for i in $(seq 100); do [ -f {flag} ] && break; sleep 0.05; done; [ -f {flag} ] || exit 7; "
                  f"printf 'engine: Successfully installed' >&2")
        try:
            r = host.run(["bash", "-c", script], timeout=30, on_stderr=on_line)
        finally:
            if os.path.exists(flag):
                os.remove(flag)
        assert r.exit_code == 0, (host.name, r.stderr)  # 7: the first line came only after the command ended
        assert seen == ["engine: Collecting sglang==0.5.23", "engine: Successfully installed"], host.name
        assert r.stdout == "out-line\n" and r.stderr.startswith("engine: Collecting"), host.name


def test_a_streamed_command_that_times_out_still_names_its_stderr(two_hosts):
    for host in two_hosts:
        seen: list[str] = []
        with pytest.raises(CommandTimeout) as info:
            host.run("echo 'engine: Downloading vllm (400 MB)' >&2; sleep 30", timeout=1.0, on_stderr=seen.append)
        assert seen == ["engine: Downloading vllm (400 MB)"], host.name
        assert "Downloading vllm" in (info.value.stderr_tail or ""), host.name
        assert host.run(["echo", "still usable"]).stdout == "still usable\n"
