"""C32 (../shared/cases/operations.md, issue 21): with ``hosts[].spare_port`` a rollback starts the restored release
on every host at once, beside the runtime that serves, moves the router over and then drains the old runtimes: one
start instead of two batches, and no request through nginx lost. The two ports alternate (a second rollback goes
back to the configured port). A host whose restored release cannot start keeps serving its old release on its old
port; the rollback says so (exit 5) and the other hosts are rolled back. A deploy afterwards brings every host back
to server_port. Timing is bench/bench_rollback.py's job."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from support.rollout import served as _served, pid_link as _pid_link

from deployctl.demo.run import Traffic
from support.nginx import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]




def test_rollback_starts_beside_switches_the_router_and_loses_no_request(rollout_env):
    env = rollout_env(2, steps=[100], pause_s=0, standby_s=0)  # no sleeping standby: the start-beside path
    for h in env.cfg["hosts"]:
        h["spare_port"] = free_port()
    env.write()
    a, b = env.names
    port = {n: env.host(n)["server_port"] for n in env.names}
    spare = {n: env.host(n)["spare_port"] for n in env.names}
    for _ in range(2):
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr
    v2 = env.current(a)
    v1 = json.loads(env.cli("history", "--json").stdout)["history"][-1]["from_release"]
    assert v1 and v1 != v2 and {_served(port[n]) for n in env.names} == {v2}

    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        r = env.cli("rollback", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        # one start phase for both hosts, beside the old runtimes, then the old ones drained
        assert [(b_["mode"], sorted(b_["hosts"])) for b_ in doc["phases"]["batches"]] == [("beside", [a, b])]
        assert doc["phases"]["drain_s"] > 0
        assert all(f"starting {v1} on port {spare[n]} beside the serving runtime" in r.stderr for n in env.names)
        for n in env.names:
            assert env.current(n) == v1 and _served(spare[n]) == v1 and _served(port[n]) is None
            assert _pid_link(env, n) == f"runtime.{spare[n]}.pid"
        conf = env.upstream_conf()
        assert all(f":{spare[n]}" in conf for n in env.names) and not any(f":{port[n]}" in conf for n in env.names)
        st = env.status()  # status finds the runtimes on their second port: healthy, supervised
        assert all(h["healthy"] and h["current_release"] == v1 for h in st["hosts"]), st["hosts"]

        # back to v2: the ports alternate; b's v2 is broken, so b keeps serving v1 on its spare port (exit 5)
        bad = Path(env.host(b)["deploy_root"]) / "releases" / v2 / "runtime.yaml"
        bad.write_text(bad.read_text() + "max_num_seqs: -3\n")
        r = env.cli("rollback", "--to", v2)
        assert r.returncode == 5, r.stderr
        assert f"{b} still serves its previous release on port {spare[b]}" in r.stderr
        assert env.current(a) == v2 and _served(port[a]) == v2 and _served(spare[a]) is None
        assert _pid_link(env, a) == f"runtime.{port[a]}.pid"
        assert env.current(b) == v1 and _served(spare[b]) == v1 and _served(port[b]) is None
        assert _pid_link(env, b) == f"runtime.{spare[b]}.pid"
        conf = env.upstream_conf()
        assert f":{port[a]}" in conf and f":{spare[b]}" in conf

        # a deploy from there finds b on its spare port, drains it there and restarts every host on server_port
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr
        v3 = env.current(a)
        for n in env.names:
            assert env.current(n) == v3 and _served(port[n]) == v3 and _served(spare[n]) is None
            assert _pid_link(env, n) is None  # a plain pidfile again
        conf = env.upstream_conf()
        assert all(f":{port[n]}" in conf and f":{spare[n]}" not in conf for n in env.names)
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    print(f"traffic through nginx during both rollbacks: {dict(ok)}, failed {dict(failed)}, retried {traffic.retried}")
    assert not failed and ok[v1] > 0 and ok[v2] > 0 and ok[v3] > 0
