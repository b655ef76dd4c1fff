"""Issue 25, found by trying it as a new user: after a rollback onto ``hosts[].spare_port`` the runtime serves on the
spare port and nginx points there. The restart runbooks used to start it again on ``server_port``: the host left the
router silently, ``status --check`` said healthy, and with every host so nginx answered 502 to everything. Now a
runbook (re)starts the runtime where it serves: the spare port stays the service port, nginx keeps reaching it.
A hung engine (SIGSTOP) is restarted by connection-resets on the spare port too."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from support.rollout import served as _served

from support.nginx import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]



def _kill_group(env, name: str) -> None:
    run = Path(env.host(name)["deploy_root"]) / "shared" / "run"
    os.killpg(int((run / "runtime.pid").read_text().strip()), signal.SIGKILL)


def test_restart_runbooks_keep_the_runtime_on_its_spare_port(rollout_env):
    # standby_s 0: the rollback starts v1 beside v2 on the spare port (with a standby it would wake v1 where it slept)
    env = rollout_env(2, steps=[100], pause_s=0, standby_s=0)
    for h in env.cfg["hosts"]:
        h["spare_port"] = free_port()
    env.write()
    a, b = env.names
    port = {n: env.host(n)["server_port"] for n in env.names}
    spare = {n: env.host(n)["spare_port"] for n in env.names}
    for _ in range(2):
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr
    r = env.cli("rollback")
    assert r.returncode == 0, r.stderr
    v1 = env.current(a)
    assert all(_served(spare[n]) == v1 and _served(port[n]) is None for n in env.names)

    # a crash on a: the supervisor and its runtime are gone; the restart-after-crash runbook brings it back
    _kill_group(env, a)
    r = env.cli("runbook", "run", "restart-after-crash", "--host", a, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _served(spare[a]) == v1 and _served(port[a]) is None

    # the same crash on b: connection-resets restarts it (its first step finds the process gone)
    _kill_group(env, b)
    r = env.cli("runbook", "run", "connection-resets", "--host", b, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _served(spare[b]) == v1 and _served(port[b]) is None

    # a hung engine on a (SIGSTOP: the port still accepts, nothing answers): connection-resets finds /healthz
    # silent, restarts it where it serves, and the host is back on the spare port
    child = Path(env.host(a)["deploy_root"]) / "shared" / "run" / f"runtime.child.{spare[a]}.pid"
    os.kill(int(child.read_text().strip()), signal.SIGSTOP)
    r = env.cli("runbook", "run", "connection-resets", "--host", a, "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _served(spare[a]) == v1 and _served(port[a]) is None

    conf = env.upstream_conf()
    assert all(f":{spare[n]}" in conf for n in env.names)
    for _ in range(20):  # through nginx: both hosts answer
        resp = httpx.get(env.url + "/v1/models", timeout=10)
        assert resp.status_code == 200 and resp.headers["x-deployctl-release"] == v1
    r = env.cli("status", "--check", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(h["healthy"] for h in json.loads(r.stdout)["hosts"])
