"""Issue 28 on a real fleet (sshd hosts, nginx, the runtime on CPU): a canary judged against the SLO, not only against
stable, and a canary nobody sends traffic to is never promoted on deployctl's probes alone.

- Both releases slow (DEPLOYCTL_RUNTIME_FAULT token_delay_ms on stable and canary), both over slo.tpot_p99_s, the
  canary at 100% from its first step (no earlier window gives stable a baseline): the ratio canary/stable cannot
  see it; the SLO rule aborts it, naming the objective. The step is written {weight, pause} and the deploy plan
  says when it ends.
- Zero client traffic: every window is inconclusive (the probes pass, and that is not enough with
  min_client_requests 1, the default); after inconclusive_limit windows in a row the deploy aborts with that reason,
  and the fleet stays on the previous release.
"""
from __future__ import annotations

import pytest

from deployctl.demo.run import Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_canary_at_100_as_slow_as_stable_but_over_the_slo_is_aborted(rollout_env):
    env = rollout_env(2, steps=[{"weight": 100, "pause": "40s"}],
                      analysis={"interval_s": 2, "min_requests": 5, "max_slo_factor": 1.0,
                                "outputs": {"enabled": False}})
    env.cfg["slo"] = {"tpot_p99_s": 0.05}
    env.write()
    slow = {"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=150"}
    r = env.cli("deploy", "--yes", env=slow)
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    env.cfg["engine"]["max_num_seqs"] = 6  # a new release, as slow as the old one
    env.write()
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=2).start()
    try:
        r = env.cli("deploy", "--yes", env=slow)
    finally:
        traffic.stop()
    print(r.stderr[-2500:])
    assert "weights 100%; analysis per step: 100% for 40s, ends ≥ " in r.stderr and "(+40s)" in r.stderr, r.stderr
    assert r.returncode == 6, r.stderr
    assert "analysis failed at 100%: canary P99 TPOT" in r.stderr, r.stderr
    assert "> slo.tpot_p99_s 50 ms × max_slo_factor 1 = 50 ms (SLO)" in r.stderr, r.stderr
    assert [env.current(n) for n in env.names] == [v1, v1]
    hist = [h for h in env.history() if h["action"] == "deploy"][-1]
    assert hist["result"] == "aborted" and "slo.tpot_p99_s" in hist["reason"]
    assert hist["verdict"]["canary"]["p99_tpot_s"] > 0.05


def test_no_client_traffic_is_inconclusive_then_aborted_not_promoted(rollout_env):
    env = rollout_env(2, steps=[50, 100], pause_s=120,
                      analysis={"interval_s": 2, "min_requests": 5, "inconclusive_limit": 3,
                                "outputs": {"enabled": False}})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    env.cfg["engine"]["max_num_seqs"] = 6
    env.write()
    r = env.cli("deploy", "--yes")  # nobody sends a request: only deployctl's probes reach the hosts
    print(r.stderr[-2500:])
    assert r.returncode == 6, r.stderr
    windows = [line for line in r.stderr.splitlines() if "analysis at 50%:" in line]
    assert len(windows) == 3 and all("inconclusive [" in w for w in windows), windows
    assert all("probes alone do not promote" in w for w in windows), windows  # the probes passed
    assert ("3 analysis windows in a row without client traffic at 50% (< min_client_requests 1; "
            "inconclusive_limit 3)") in r.stderr, r.stderr
    assert "analysis at 100%" not in r.stderr and "paused" not in r.stderr
    assert [env.current(n) for n in env.names] == [v1, v1]
    assert {env.release_served(n) for n in env.names} == {v1}
    hist = [h for h in env.history() if h["action"] == "deploy"][-1]
    assert hist["result"] == "aborted" and "without client traffic" in hist["reason"]
