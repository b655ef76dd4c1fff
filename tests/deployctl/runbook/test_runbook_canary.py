"""canary-went-bad against a real canary rollout (tests/rollout_env.py: sshd fleet, nginx, the runtime on CPU):
`deployctl deploy` holds a slow canary (every token +300 ms, injected into the new release) at 50% while its
analysis has too little traffic to judge; the runbook on the canary host finds mean TPOT over the P99 objective
(a P99 of a few requests cannot be judged), aborts with
--yes (the running deploy puts traffic back on stable and the canary back on the previous release), and then finds
the canary answering on the previous release, so no rollback is needed."""
from __future__ import annotations

import pytest

from support.rollout import rollout_state, wait_for
from support.runbook_fleet import audit_records

pytestmark = pytest.mark.slow


def test_canary_went_bad_is_aborted_back_to_stable(rollout_env):
    # golden outputs off: at 0% they would abort a canary this slow before it reached 50%, where the runbook acts
    env = rollout_env(2, steps=[50, 100], pause_s=300,
                      analysis={"interval_s": 2, "min_requests": 1000, "outputs": {"enabled": False}})
    env.cfg["slo"] = {"tpot_p99_s": 0.1}
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])

    deploy = env.popen("deploy", "--yes", "--canary", "50", env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=300"})
    try:
        st = wait_for(lambda: (lambda s: s if s.get("release") not in (None, v1) and s.get("weight") == 50
                                         and s.get("status") == "running" else None)(rollout_state(env)),
                      240, "the canary at 50%", deploy)
        canary = st["canary_hosts"][0]
        assert env.current(canary) != v1

        # a "no" changes nothing: the canary keeps its traffic
        r = env.cli("runbook", "run", "canary-went-bad", "--host", canary)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "declined" in r.stdout and rollout_state(env)["weight"] == 50 and deploy.poll() is None

        r = env.cli("runbook", "run", "canary-went-bad", "--host", canary, "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "abort the rollout (all traffic back to stable), from " + canary in r.stderr
        _, err = deploy.communicate(timeout=180)
        assert deploy.returncode == 6, err
    finally:
        if deploy.poll() is None:
            deploy.kill()
    assert [env.current(n) for n in env.names] == [v1, v1]
    assert env.release_served(canary) == v1
    recs = audit_records(env.host(canary)["deploy_root"])
    last = {x["step"]: x for x in recs if x["run_id"] == recs[-1]["run_id"]}
    assert last["sample"]["outcome"] == "ok" and last["errors"]["outcome"] == "ok"
    # a handful of requests: the mean judges (>= 1 sample), the P99 could not (< 100) and is not reached
    assert last["tpot_mean"]["observed"] >= 0.3 and last["tpot_mean"]["outcome"] == "done"
    assert "aborted" in last["tpot_mean"]["result"] and "tpot_p99" not in last
    assert last["rolled_back"]["outcome"] == "ok"  # the deploy's abort already put the canary back on v1
    assert "weight=" not in env.upstream_conf()
    assert any(h["action"] == "deploy" and h["result"] == "aborted" for h in env.history())
