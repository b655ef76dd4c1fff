"""judge()'s absolute rules (issue 28): the canary's own P99 TTFT / TPOT / E2E against slo × max_slo_factor, its
KV cache usage against the alert threshold, a restart, and min_client_requests (probes alone never promote unless
it is 0); and the streak of windows without client traffic that aborts the deploy. Every verdict names the number
and the limit."""
from __future__ import annotations

import pytest

from deployctl.rollout.analysis import GroupStats, Verdict, judge
from deployctl.rollout.verdicts import InconclusiveStreak, combine, held, idle
from support.render import make_config


def cfg(**analysis):
    return make_config(slo={"ttft_p99_s": 0.5, "tpot_p99_s": 0.05, "e2e_p99_s": 4.0, "max_kv_cache_usage": 0.8},
                       rollout={"analysis": {"min_requests": 10, "min_latency_samples": 5, "max_slo_factor": 1.2,
                                             **analysis}})


def side(hosts, **kw):
    base = dict(requests=100, errors=0, p99_ttft_s=0.1, p99_tpot_s=0.02, p99_e2e_s=1.0, ttft_count=100)
    kw.setdefault("generations", kw.get("requests", base["requests"]))  # client traffic: generation requests
    return GroupStats(hosts, **{**base, **kw})


@pytest.mark.parametrize("field, value, needle", [
    ("p99_ttft_s", 0.7, "canary P99 TTFT 700.0 ms > slo.ttft_p99_s 500 ms × max_slo_factor 1.2 = 600 ms (SLO)"),
    ("p99_tpot_s", 0.08, "canary P99 TPOT 80.0 ms > slo.tpot_p99_s 50 ms × max_slo_factor 1.2 = 60 ms (SLO)"),
    ("p99_e2e_s", 5.0, "canary P99 E2E 5000.0 ms > slo.e2e_p99_s 4000 ms × max_slo_factor 1.2 = 4800 ms (SLO)"),
])
def test_slo_breached_on_both_sides_is_held_on_the_canary_alone_fails(field, value, needle):
    """Issue 41: stable as slow, with traffic and samples of its own, over the same objective: the fleet suffers as a
    whole, the window is inconclusive and held (verdicts.held), not a fail. Stable within it: the canary fails on
    its SLO as before."""
    c = cfg()
    v = judge(c, side(["a"], **{field: value}), side(["b"], **{field: value}), 30.0, 25)
    assert v.result == "inconclusive" and held(v), v.reason
    assert v.reason == f"SLO breached on stable and canary: {needle}; {needle.replace('canary', 'stable')}"
    v = judge(c, side(["a"], **{field: value}), side(["b"]), 30.0, 25)
    assert v.result == "fail" and v.reason == needle, v.reason
    # stable serving traffic with too few samples to say: the window stays open until it has them
    v = judge(c, side(["a"], **{field: value}), side(["b"], ttft_count=4, **{field: value}), 30.0, 25)
    assert v.result == "inconclusive" and not held(v), v.reason
    assert v.reason == (f"{needle}; stable has 4 latency samples < min_latency_samples 5: cannot tell a slow fleet "
                        "from a slow canary yet")
    # stable with no samples of its own (an engine without histograms) or no traffic (100%): the canary alone
    for stable in (side(["b"], ttft_count=0, p99_ttft_s=None, p99_tpot_s=None, p99_e2e_s=None),
                   GroupStats(["b"])):
        v = judge(c, side(["a"], **{field: value}), stable, 30.0, 25)
        assert v.result == "fail" and v.reason == needle, v.reason
    # the canary down is never excused by a slow stable
    v = judge(c, side(["a"], down=["a"], **{field: value}), side(["b"], **{field: value}), 30.0, 25)
    assert v.result == "fail" and "does not answer /metrics" in v.reason


def test_slo_at_100_percent_without_baseline():
    """Stable serves nothing and no earlier window gives a baseline: the ratio cannot be judged, the SLO can."""
    c = cfg()
    assert judge(c, side(["a"]), GroupStats(["b"]), 30.0, 100).result == "inconclusive"
    v = judge(c, side(["a"], p99_tpot_s=0.09), GroupStats(["b"]), 30.0, 100)
    assert v.result == "fail" and "slo.tpot_p99_s" in v.reason


def test_within_factor_passes_and_no_e2e_objective_is_not_judged():
    assert judge(cfg(), side(["a"], p99_ttft_s=0.55), side(["b"], p99_ttft_s=0.55), 30.0).result == "pass"
    c = make_config(rollout={"analysis": {"min_requests": 10}})  # slo.e2e_p99_s unset
    assert c.slo.e2e_p99_s is None
    assert judge(c, side(["a"], p99_e2e_s=600.0), side(["b"]), 30.0).result == "pass"


def test_slo_needs_latency_samples():
    v = judge(cfg(), side(["a"], p99_ttft_s=3.0, ttft_count=3), side(["b"]), 30.0)
    assert v.result == "inconclusive" and "min_latency_samples" in v.reason


def test_kv_usage_over_the_alert_threshold_fails_with_little_traffic():
    v = judge(cfg(), side(["a"], kv_usage=0.93, requests=2), side(["b"], kv_usage=0.2), 30.0)
    assert v.result == "fail"
    assert v.reason == ("canary KV cache usage 93.0% > slo.max_kv_cache_usage 80.0% "
                        "(the KVCacheUsageHigh alert's threshold)")
    assert judge(cfg(), side(["a"], kv_usage=0.79), side(["b"]), 30.0).result == "pass"
    assert "KV 93%" in v.summary()


def test_restart_fails_naming_the_count_and_the_allowance():
    v = judge(cfg(), side(["a"], restarted=["a"]), side(["b"]), 30.0)
    assert v.result == "fail"
    assert v.reason == "canary a: the runtime restarted 1 time during the window > restarts allowed 0 (crashed)"
    v = judge(cfg(), side(["a", "c"], restarted=["a", "c"], restarts={"a": 1, "c": 2}, requests=0), side(["b"]), 30.0)
    assert v.reason == ("canary a, c: the runtime restarted 3 times during the window (a 1, c 2) > restarts "
                        "allowed 0 (crashed)"), v.reason


def test_restarts_are_counted_from_the_pids_seen_in_the_window():
    from deployctl.rollout.analysis import Window

    w = Window(0.0, 0, pids={"a": 411, "c": 7})
    assert w.note_pids({"a": 502, "c": 7}) == {"a": 1, "c": 0}
    assert w.note_pids({"a": None, "c": 7}) == {"a": 1, "c": 0}  # between two starts: not running
    assert w.note_pids({"a": 588, "c": 7}) == {"a": 2, "c": 0}


@pytest.mark.parametrize("client_requests", [0, 15])
def test_a_quiet_window_fails_on_the_slo_and_the_probes_cannot_pass_it(client_requests):
    """Issue 28 audit: 15 client requests (< min_requests 20) with a P99 TTFT of 3 s over 200 samples (the probes'
    included) against an SLO of 0.5 s came out "pass [probes]": judge said inconclusive before the SLO rule ran."""
    c = cfg(min_requests=20, max_slo_factor=1.0)
    quiet = side(["a"], requests=client_requests, p99_ttft_s=3.0, ttft_count=200)
    v = combine(judge(c, quiet, side(["b"]), 30.0, 5), _probe_pass(), c.rollout.analysis.min_client_requests)
    assert (v.result, v.source) == ("fail", "metrics"), v.summary()
    assert v.reason == "canary P99 TTFT 3000.0 ms > slo.ttft_p99_s 500 ms × max_slo_factor 1 = 500 ms (SLO)"
    # within the SLO the same quiet window cannot fail on it, and passes only on probes with client traffic
    fine = combine(judge(c, side(["a"], requests=client_requests, ttft_count=200), side(["b"]), 30.0, 5),
                   _probe_pass(), c.rollout.analysis.min_client_requests)
    assert fine.result == ("pass" if client_requests else "inconclusive"), fine.summary()


def test_kv_usage_fails_a_window_without_client_traffic():
    v = judge(cfg(), side(["a"], kv_usage=0.93, requests=0, ttft_count=0), side(["b"]), 30.0)
    assert v.result == "fail" and "canary KV cache usage 93.0% > slo.max_kv_cache_usage 80.0%" in v.reason


def _probe_pass():
    return "pass", "", {"canary": {}, "stable": {}, "result": "pass", "reason": ""}


def test_probes_alone_never_promote_unless_min_client_requests_is_0():
    c = cfg(min_client_requests=1)
    quiet = judge(c, side(["a"], requests=0, ttft_count=4), side(["b"]), 30.0)
    v = combine(quiet, _probe_pass(), c.rollout.analysis.min_client_requests)
    assert v.result == "inconclusive" and "0 client requests < min_client_requests 1" in v.reason, v.reason
    assert "probes alone do not promote" in v.reason and idle(v, 1)
    # 0: the operator lets the probes judge a canary without client traffic
    c0 = cfg(min_client_requests=0)
    quiet = judge(c0, side(["a"], requests=0, ttft_count=4), side(["b"]), 30.0)
    v = combine(quiet, _probe_pass(), 0)
    assert v.result == "pass" and v.source == "probes"
    # a few client requests (below min_requests, at least min_client_requests): the probes judge latency
    some = judge(c, side(["a"], requests=3, ttft_count=7), side(["b"]), 30.0)
    assert combine(some, _probe_pass(), 1).result == "pass"


def test_min_client_requests_above_min_requests_holds_the_metrics_pass():
    c = cfg(min_client_requests=50)
    v = judge(c, side(["a"], requests=20), side(["b"]), 30.0)
    assert v.result == "inconclusive" and v.reason == ("cannot judge: 20 canary client requests < min_client_requests 50 "
                                                       "(generation requests via the router)")


def test_streak_of_idle_windows():
    s = InconclusiveStreak(3)
    assert not s.add("inconclusive", True) and not s.add("inconclusive", True)
    assert s.add("inconclusive", True) and s.all_idle
    s = InconclusiveStreak(3)
    s.add("inconclusive", True), s.add("inconclusive", False)
    assert s.add("inconclusive", True) and not s.all_idle  # a NaN window in the streak: pause for a human
    s = InconclusiveStreak(2)
    s.add("inconclusive", True), s.add("pass")
    assert s.count == 0 and not s.add("inconclusive", True)
