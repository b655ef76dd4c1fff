"""Acceptance (issue 8): a broken canary is aborted automatically with exit 6, the fleet ends on the previous
release, and the stable release answered every request meanwhile. Three breakages injected into the new release
through the runtime's test-only DEPLOYCTL_RUNTIME_FAULT (deployctl copies it into that release's runtime.env):
fails to start; answers 500 to every inference request (caught by the sample inference before any traffic);
slow tokens (caught at weight 0, before any traffic: its golden answers take far longer than stable's, which the
deploy does not wait out); and a canary that crashes after it was verified and took traffic: nginx
retries the refused requests on stable (clients see 200) and the analysis counts the 502s against the canary from
the access log."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from deployctl.demo.run import Traffic
from support.rollout import even_split, rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # three broken canaries, each a restart and an abort

CASES = [
    ("fail_start=1", "exited while starting"),
    ("error_rate=1.0", "sample inference (/v1/chat/completions) failed: HTTP 500"),
    ("token_delay_ms=800", "too slow to serve"),  # at 0%: its golden answers take far longer than stable's
]


def test_broken_canaries_are_aborted_while_stable_serves(rollout_env):
    env = rollout_env(2, steps=[20, 100], pause_s=40,
                      analysis={"interval_s": 2, "min_requests": 8, "max_error_rate": 0.05})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=2).start()
    try:
        for fault, expect in CASES:
            r = env.cli("deploy", "--yes", "--canary", "20", env={"DEPLOYCTL_RUNTIME_FAULT": fault})
            print(f"\n{fault}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:400]}")
            assert r.returncode == 6, r.stderr
            assert "rollout aborted" in r.stderr and expect in r.stderr, r.stderr
            assert [env.current(n) for n in env.names] == [v1, v1]
            assert {env.release_served(n) for n in env.names} == {v1}
            assert even_split(env.upstream_conf())
            assert httpx.get(env.url + "/v1/models", timeout=10).headers["x-deployctl-release"] == v1

        deploy = env.popen("deploy", "--yes", "--canary", "20")
        before = rollout_state(env).get("release")
        wait_for(lambda: rollout_state(env).get("release") != before and rollout_state(env).get("weight") == 20
                 and rollout_state(env).get("status") == "running", 180, "the canary at 20%", deploy)
        child = Path(env.host(env.names[0])["deploy_root"]) / "shared" / "run" / "runtime.child.pid"
        os.kill(int(child.read_text()), signal.SIGKILL)
        _, err = deploy.communicate(timeout=180)
        print(f"crashed canary: exit {deploy.returncode}: {err.strip().splitlines()[-1][:400]}")
        assert deploy.returncode == 6, err
        # whichever check looks first after the kill catches it: the metrics analysis (the canary restarted, does
        # not answer, or its error rate) or the output check (its prompts get no answer): both name the canary
        by_metrics = "analysis failed at 20%: canary" in err and any(
            w in err for w in ("restarted", "does not answer", "error rate"))
        by_outputs = f"output check failed at 20% on {env.names[0]}" in err and "the canary did not answer" in err
        assert by_metrics or by_outputs, err
        assert [env.current(n) for n in env.names] == [v1, v1]
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    print(f"traffic: {dict(ok)}; failed {dict(failed)}; retried {traffic.retried}")
    assert ok[v1] > 0
    # every failed request was answered by a broken canary, never by the stable release: in nginx's access log no
    # answer of v1 is a 5xx, and every 5xx came from the canary host's port (its last upstream attempt)
    canary_port = str(env.host(env.names[0])["server_port"])
    entries = env.nginx.wait_entries(0, lambda es: sum(int(e["status"]) >= 500 for e in es) >= sum(failed.values()))
    bad = [e for e in entries if int(e["status"]) >= 500]
    assert not [e for e in bad if e.get("release") == v1], bad
    assert all(e["upstream_addr"].split(",")[-1].strip().endswith(":" + canary_port) for e in bad), bad
    assert sum(failed.values()) == len(bad)
    hist = [h for h in env.history() if h["action"] == "deploy" and h["result"] == "aborted"]
    assert len(hist) == 4 and all(h["reason"] for h in hist)
    for _, expect in CASES:  # each abort's own cause is on record
        assert any(expect in h["reason"] for h in hist), [h["reason"] for h in hist]
    # the crashed canary's: a failed analysis window or output comparison, its verdict kept
    assert hist[-1].get("verdict") and ("analysis failed" in hist[-1]["reason"]
                                        or "output check failed" in hist[-1]["reason"]), hist[-1]
