"""Issue 42, cordon and uncordon, and the host-maintenance runbook: under steady traffic through real nginx, `hosts cordon` takes a host to weight 0
with no failed request and records who, why and since (status shows it); a deploy leaves it out and says so; an
uncordon refuses while the host's golden answers differ (weight still 0) and, once they match, installs the release
the fleet moved to, verifies it and gives the weight back; the host-maintenance runbook cordons, checks and
uncordons another host, all without a failed request. Real sshd fleet, real nginx, the stand-in engine (the
fleet and the router are the point)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import served, upstream_weights as weights

pytestmark = [pytest.mark.timeout(400)]


def _golden(env, name: str, release: str) -> Path:
    return Path(env.host(name)["deploy_root"]) / "shared" / "golden" / f"{release}.json"


def test_cordon_drains_without_a_failed_request_deploy_leaves_it_out_uncordon_checks_golden(rollout_env):
    env = rollout_env(3, engine="standin", steps=[50, 100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    a, b, c = env.names
    port = {n: str(env.host(n)["server_port"]) for n in env.names}
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(a)
    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=1).start()
    try:
        r = env.cli("hosts", "cordon", c, "--reason", "ECC errors on GPU 0", "--stop")
        assert r.returncode == 0, r.stderr
        assert f"{c}: router weight 0" in r.stdout and f"{c}: drained in" in r.stdout, r.stdout
        assert weights(env.upstream_conf()) == {port[a]: 1, port[b]: 1, port[c]: 0}
        assert served(int(port[c])) is None  # --stop: the engine stopped once drained
        row = next(h for h in env.status()["hosts"] if h["host"] == c)
        assert row["weight"] == 0 and row["cordoned"]["reason"] == "ECC errors on GPU 0"
        assert row["cordoned"]["by"] and row["cordoned"]["since"].startswith("20") and row["cordoned"]["stopped"]
        assert env.cli("status", "--check").returncode == 0  # out of service on purpose: not a problem
        assert f"cordoned: {c} by {row['cordoned']['by']} since" in env.cli("status").stdout

        env.cfg["engine"]["max_num_seqs"] = 6  # a new release
        env.write()
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr
        assert f"leaving out {c}: cordoned by" in r.stderr, r.stderr
        v2 = env.current(a)
        assert v2 != v1 and env.current(b) == v2 and env.current(c) == v1
        assert port[c] not in weights(env.upstream_conf())
        record = json.loads(_golden(env, a, v2).read_text())  # the canary's answers, recorded by the deploy

        # c's copy of the record says otherwise: the uncordon installs and starts v2 there but refuses the weight
        bad = json.loads(json.dumps(record))
        ans = bad["answers"][0]
        ans.update(tokens=["not", "what", "it", "says"], text="not what it says",
                   token_ids=[i + 1 for i in ans["token_ids"]] if ans.get("token_ids") else None)
        _golden(env, c, v2).parent.mkdir(parents=True, exist_ok=True)
        _golden(env, c, v2).write_text(json.dumps(bad))
        r = env.cli("hosts", "uncordon", c)
        assert r.returncode == 5, (r.stdout, r.stderr)
        assert "golden answers" in r.stderr and c in r.stderr, r.stderr
        assert env.current(c) == v2 and port[c] not in weights(env.upstream_conf())
        assert next(h for h in env.status()["hosts"] if h["host"] == c)["cordoned"]

        _golden(env, c, v2).unlink()  # the uncordon copies the peers' record
        r = env.cli("hosts", "uncordon", c)
        assert r.returncode == 0, r.stderr
        assert "golden_s" in r.stdout and f"{c}: uncordoned" in r.stdout, r.stdout
        assert weights(env.upstream_conf()) == {port[a]: 1, port[b]: 1, port[c]: 1}
        assert json.loads(_golden(env, c, v2).read_text())["answers"] == record["answers"]
        assert all(h["cordoned"] is None for h in env.status()["hosts"])
        assert [x["action"] for x in env.history() if x["action"] in ("cordon", "uncordon")] == ["cordon", "uncordon"]

        # the host-maintenance runbook: cordon, checks, uncordon, under the same traffic
        r = env.cli("runbook", "run", "host-maintenance", "--host", b, "--yes", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
        steps = {s["step"]: s for s in json.loads(r.stdout)["hosts"][0]["steps"]}
        assert steps["cordon"]["outcome"] == "fixed" and f"{b}: router weight 0" in steps["cordon"]["result"], steps
        # without --stop the engine kept serving /healthz while cordoned: the runbook's check passed as it was
        assert steps["drained"]["outcome"] == "ok" and steps["healthy"]["outcome"] == "ok", steps
        assert steps["uncordon"]["outcome"] == "fixed" and "golden" in steps["uncordon"]["result"], steps
        assert weights(env.upstream_conf()) == {port[a]: 1, port[b]: 1, port[c]: 1}
        assert [x["host"] for x in env.history() if x["action"] in ("cordon", "uncordon")] == [c, c, b, b]
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    assert not failed and ok.get(v1) and ok.get(v2), (dict(ok), dict(failed))
