"""``hosts[].replicas`` on the sshd fleet (issue 26): one host entry with 2 replicas runs two engines side by side
(the bundled runtime on CPU standing in for a GPU engine), each on its own port from its own deploy_root, both
behind nginx; a second release is canaried on replica 0 while replica 1 serves the first, then promoted; every
request through the router is answered. The GPU split is checked by tests/deployctl/render/test_render_replicas.py."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from deployctl.demo.run import Traffic
from support.rollout import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _state(root: Path) -> dict:
    try:
        return json.loads((root / "state" / "rollout.json").read_text())
    except (OSError, ValueError):
        return {}


def _served(port: int) -> str | None:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
    return r.headers.get("x-deployctl-release")


def test_two_replicas_on_one_host_serve_side_by_side_and_roll_out(rollout_env):
    env = rollout_env(1, engine="standin", steps=[50, 100], pause_s=2, analysis={"interval_s": 2, "min_requests": 1,
                                                               "outputs": {"enabled": False}})
    host = env.cfg["hosts"][0]
    host["replicas"] = 2
    env.write()
    cfg = env.load()
    names = [h.name for h in cfg.hosts]
    ports = [h.server_port for h in cfg.hosts]
    roots = [Path(h.deploy_root) for h in cfg.hosts]
    assert names == [f"{host['name']}-r0", f"{host['name']}-r1"] and ports[1] == ports[0] + 1
    assert roots == [Path(host["deploy_root"]) / "r0", Path(host["deploy_root"]) / "r1"]
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    v1 = _served(ports[0])
    assert v1 and _served(ports[1]) == v1
    pids = [(root / "shared" / "run" / "runtime.child.pid").read_text().strip() for root in roots]
    assert pids[0] != pids[1]  # two engines, each supervised from its own deploy_root
    upstream = env.upstream_conf()
    assert all(f"127.0.0.1:{p}" in upstream for p in ports), upstream

    env.cfg["engine"]["max_num_seqs"] = 6  # a second release
    env.write()
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        deploy = env.popen("deploy", "--yes")
        wait_for(lambda: _state(roots[0]).get("weight") == 50, 120, "replica 0 at 50%", deploy)
        v2 = _state(roots[0])["release"]
        assert _served(ports[0]) == v2 and _served(ports[1]) == v1  # the canary is one replica of the host
        out, err = deploy.communicate(timeout=180)
        assert deploy.returncode == 0, err[-3000:]
    finally:
        traffic.stop()
    assert [_served(p) for p in ports] == [v2, v2]
    st = env.status()
    assert [(h["host"], h["healthy"]) for h in st["hosts"]] == [(n, True) for n in names], st["hosts"]
    ok, failures = traffic.snapshot()
    assert sum(ok.values()) > 5 and not failures, (ok, failures)
