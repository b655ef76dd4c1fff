"""The host side of fencing (deployctl.hosts.fence), over SSH and locally: a Host carrying generation 1 runs and
writes while the host's fence file says 1; once a newer holder raised it to 2, every command and every file write
is refused on the host before it changes anything (Fenced, exit 7, naming who took over), with check=False too."""
from __future__ import annotations

import shlex

import pytest

from deployctl.config.layout import state_dir
from deployctl.errors import ExitCode, Fenced
from deployctl.hosts.fence import Fence, write_command


def _raise(host, generation: int, who: str) -> None:
    host.run(f"mkdir -p {shlex.quote(state_dir(host.config))} && " + write_command(host.config, generation, who))


def test_newer_generation_refuses_commands_and_writes_on_the_host(two_hosts):
    for host in two_hosts:
        root = host.config.deploy_root
        _raise(host, 1, "deploy of me")
        host.fence = Fence(1, "deploy")
        host.run(f"touch {root}/made-by-1")
        host.put_text("one\n", f"{root}/conf")
        assert host.exists(f"{root}/made-by-1") and host.read_text(f"{root}/conf") == "one\n"

        host.fence = None  # the newer holder's own (unfenced) raise
        _raise(host, 2, "rollback of ops@box, pid 7")
        _raise(host, 1, "a lower raise never lowers it")
        host.fence = Fence(1, "deploy")
        with pytest.raises(Fenced) as e:
            host.run(f"touch {root}/made-by-ghost", check=False)
        assert e.value.exit_code == ExitCode.TAKEN_OVER == 7
        assert e.value.current == 2 and "taken over by rollback of ops@box, pid 7" in str(e.value), str(e.value)
        with pytest.raises(Fenced):
            host.put_text("ghost\n", f"{root}/conf")
        assert host.fence.refused is not None
        host.fence = None
        assert not host.exists(f"{root}/made-by-ghost")
        assert host.read_text(f"{root}/conf") == "one\n"
        assert host.run(f"ls -A {root}").stdout.split() == ["conf", "made-by-1", "state"]  # no temporary file left

        host.fence = Fence(2, "rollback")  # the current holder acts
        host.put_text("two\n", f"{root}/conf")
        assert host.read_text(f"{root}/conf") == "two\n"
