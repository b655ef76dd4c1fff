"""What `status --check` exits 1 on (deployctl.rollout.status.check_problems), from status documents: a live
canary's two releases are by design (a cron's --check exited 1 in the middle of every canary), but a host on a third
release, a difference within one release, an unhealthy host, or a rollout in progress that nobody runs still are.
The CLI over a real fleet: test_rollout_canary.py (mid-canary, exit 0) and test_ops_c30_supervision_consistency.py."""
from __future__ import annotations

from deployctl.rollout.fleetcheck import differences
from deployctl.rollout.status import check_problems, rollout_live


def host(name, release, engine="deployctl-runtime", config="c1", healthy=True, weight=50.0):
    return {"host": name, "current_release": release, "engine": engine, "engine_version": "1", "model_manifest": "m",
            "config_hash": config, "healthy": healthy, "detail": "" if healthy else "readyz 503", "weight": weight}


def doc(hosts, status="running", lock=True, stale=False, canary=("a",), weight=5):
    rollout = None if status is None else {"action": "deploy", "status": status, "release": "R2", "from_release": "R1",
                                           "canary_hosts": list(canary), "weight": weight}
    lk = {"stale": stale, "why_stale": "no heartbeat for 120 s", "text": "deploy by op"} if lock else None
    return {"hosts": hosts, "rollout": rollout, "lock": lk, "differences": differences(hosts)}


def test_a_live_canary_on_another_release_engine_and_config_is_no_problem():
    d = doc([host("a", "R2", engine="vllm", config="c2"), host("b", "R1"), host("c", "R1")])
    assert d["differences"] and rollout_live(d)  # status still shows how a differs
    assert check_problems(d) == []
    for status in ("paused", "aborting"):
        assert check_problems(doc(d["hosts"], status=status)) == []


def test_within_a_release_a_host_on_a_third_release_and_an_unhealthy_host_are_problems():
    d = doc([host("a", "R2"), host("b", "R2", config="c9"), host("c", "R1"), host("d", "R1"), host("e", "R0"),
             host("f", "R1", healthy=False)])
    problems = check_problems(d)
    assert any(p.startswith("b: ") and "c9" in p for p in problems), problems  # differs from a, on the same release
    assert "e: release R0 is neither the rollout's R2 nor the R1 it replaces" in problems
    assert "f unhealthy (readyz 503)" in problems
    assert not any(p.startswith(("a: ", "c: ", "d: ")) for p in problems), problems


def test_a_rollout_nobody_runs_and_a_finished_one_count_every_difference():
    hosts = [host("a", "R2"), host("b", "R1")]
    for d in (doc(hosts, lock=False), doc(hosts, stale=True)):
        problems = check_problems(d)
        assert not rollout_live(d)
        assert problems[0].startswith("the deploy of R2 is running on the hosts but nobody runs it")
        assert "deploy --resume" in problems[0] and set(d["differences"]) <= set(problems)
    assert "its lock is stale: no heartbeat for 120 s" in check_problems(doc(hosts, stale=True))[0]
    for status in ("done", "aborted", None):  # no rollout in progress: two releases are an inconsistency
        d = doc(hosts, status=status)
        assert check_problems(d) == d["differences"] != []


def test_a_host_the_live_rollout_took_out_of_the_router_may_be_down_while_it_is_switched():
    switching = host("a", "R2", healthy=False, weight=0.0)
    assert check_problems(doc([switching, host("b", "R1"), host("c", "R1")])) == []
    # with traffic on it, or with no rollout at it, down is down
    assert check_problems(doc([host("a", "R2", healthy=False, weight=5.0), host("b", "R1")])) == [
        "a unhealthy (readyz 503)"]
    assert "a unhealthy (readyz 503)" in check_problems(doc([switching, host("b", "R2")], status="done"))


def test_a_host_with_traffic_on_the_release_its_step_does_not_have_it_on_is_a_problem():
    # both releases are the rollout's, so the pair check alone passed them: a stable host switched by hand during
    # the canary, and the canary host back on the old release while the router still sends it 5%
    by_hand = check_problems(doc([host("a", "R2", weight=5.0), host("b", "R2", weight=47.5), host("c", "R1")]))
    assert by_hand == ["b: a stable host on R2 with 47.5% of the traffic while the rollout at 5% has it on R1"]
    back = check_problems(doc([host("a", "R1", weight=5.0), host("b", "R1"), host("c", "R1")]))
    assert back == ["a: a canary host on R1 with 5% of the traffic while the rollout at 5% has it on R2"]
    # drained hosts (weight 0) are being switched; from 100% on every host with traffic is on the new release
    assert check_problems(doc([host("a", "R1", weight=0.0), host("b", "R1"), host("c", "R1")])) == []
    assert check_problems(doc([host("a", "R2", weight=50.0), host("b", "R2", weight=50.0), host("c", "R1", weight=0.0)],
                              weight=100)) == []
    assert check_problems(doc([host("a", "R2", weight=100.0), host("b", "R1", weight=0.1)], weight=100)) == [
        "b: a stable host on R1 with 0.1% of the traffic while the rollout at 100% has it on R2"]
    # an abort moves hosts back: no step to hold them to
    assert check_problems(doc([host("a", "R1", weight=5.0), host("b", "R2")], status="aborting")) == []
