"""Issue 25, found by trying it as a new user: a host added to deploy.yaml with no release installed was planned as
stable and got router weight, so nginx sent users to a host where nothing listens. Now a host without a release is
never stable: during the canary it gets no traffic, an abort leaves it serving nothing (no ``current``), and a
promotion installs the new release on it in the last batch, then routes to it. No request through nginx fails."""
from __future__ import annotations

import pytest

from deployctl.demo.run import Traffic
from support.rollout import rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_host_without_a_release_gets_traffic_only_once_it_serves_the_new_one(rollout_env):
    env = rollout_env(3, engine="standin", steps=[10, 100], pause_s=600,
                      analysis={"interval_s": 2, "min_requests": 5, "min_p99_delta_s": 0.5})
    a, b, c = env.names
    new_host = env.host(c)
    env.cfg["hosts"] = [env.host(a), env.host(b)]
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(a)
    env.cfg["hosts"].append(new_host)  # c joins deploy.yaml with nothing installed
    env.write()
    c_port = f":{new_host['server_port']}"
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        deploy = env.popen("deploy", "--yes", "--canary", "10")
        wait_for(lambda: rollout_state(env).get("weight") == 10 and rollout_state(env).get("status") == "running",
                 240, "the canary at 10%", deploy)
        assert c_port not in env.upstream_conf()  # c serves nothing: no weight
        r = env.cli("abort")
        assert r.returncode == 0, r.stderr
        _, err = deploy.communicate(timeout=120)
        assert deploy.returncode == 6, err
        assert f"no release yet on {c}" in err  # the plan says so
        assert env.current(c) is None and c_port not in env.upstream_conf()
        assert [env.current(n) for n in (a, b)] == [v1, v1]

        env.cfg["rollout"]["pause_s"] = 0
        env.write()
        r = env.cli("deploy", "--yes", timeout=900)  # three restarts one after the other
        assert r.returncode == 0, r.stderr
        v2 = env.current(a)
        assert v2 != v1 and [env.current(n) for n in env.names] == [v2] * 3
        assert {env.release_served(n) for n in env.names} == {v2}
        assert c_port in env.upstream_conf()
        st = env.status()
        assert all(h["healthy"] for h in st["hosts"]), st["hosts"]
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    print(f"traffic: {dict(ok)}; failed {dict(failed)}")
    assert not failed
