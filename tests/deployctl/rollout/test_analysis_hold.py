"""Issue 41's verdict logic, where a fleet adds nothing: when a weight step is promoted, held or timed out
(weightstep.step_outcome), the 4xx share rule on the router's access log, a window short of latency samples that
the probes cannot pass, the per-step hold settings, and the journal replay that recomputes every verdict from the
numbers a window record keeps (rollout/replay.py). The fleet side: tests/deployctl/rollout/test_rollout_slo.py."""
from __future__ import annotations

import json

import pytest

from deployctl.config import parse_config
from deployctl.rollout.accesslog import HostCount, count_access_log, upstream_map
from deployctl.rollout.analysis import GroupStats, judge
from deployctl.rollout.probes import ProbeStats
from deployctl.rollout.replay import recompute, replay, window_record
from deployctl.rollout.verdicts import combine, held, judge_probes, probe_json
from deployctl.rollout.weightstep import step_outcome
from support.analysis_cases import CASES, config
from support.render import make_config


def test_a_step_promotes_only_on_a_last_window_that_passed():
    # the pause (deadline 100) still runs: judge on, whatever the window said
    assert step_outcome("pass", 50, 100, 160) == "next"
    assert step_outcome("inconclusive", 50, 100, 160) == "next"
    # the pause is over: a pass promotes; an inconclusive tail holds, even when earlier windows passed
    assert step_outcome("pass", 100, 100, 160) == "promote"
    assert step_outcome("inconclusive", 100, 100, 160) == "hold"
    assert step_outcome("inconclusive", 159.9, 100, 160) == "hold"
    # held past max_hold: on_hold_timeout decides; a pass in the last held window still promotes
    assert step_outcome("inconclusive", 160, 100, 160) == "timeout"
    assert step_outcome("pass", 170, 100, 160) == "promote"


def test_hold_settings_per_step_and_their_defaults():
    cfg = make_config(rollout={"steps": [{"weight": 10, "min_duration": "10m", "max_hold": "2h"}, 50, 100],
                               "max_hold": "30m", "on_hold_timeout": "pause"})
    r = cfg.rollout
    assert r.hold_of(10) == (600, 7200) and r.hold_of(50) == (0, 1800) and r.on_hold_timeout == "pause"
    assert make_config().rollout.hold_of(100) == (0, 3600)
    assert make_config().rollout.on_hold_timeout == "abort"
    with pytest.raises(Exception, match="on_hold_timeout"):
        make_config(rollout={"on_hold_timeout": "wait"})


def _line(addr, status, uri="/v1/chat/completions"):
    return json.dumps({"request_method": "POST", "uri": uri, "status": status, "upstream_addr": addr,
                       "upstream_status": str(status)})


CFG = """
service: {name: svc}
model: {path: /m}
hosts:
  - {name: a, address: 127.0.0.1, deploy_root: /d/a, server_port: 8001}
  - {name: b, address: 127.0.0.1, deploy_root: /d/b, server_port: 8002}
rollout: {analysis: {min_requests: 10, max_error_rate: 0.05}}
slo: {ttft_p99_s: 5.0, tpot_p99_s: 1.0}
"""


def _groups(text, cfg):
    counts = count_access_log(text, upstream_map(cfg))
    out = []
    for name in ("a", "b"):
        c = counts.get(name, HostCount())
        out.append(GroupStats([name], requests=c.requests, errors=c.errors, generations=c.generations,
                              client_errors=c.client_errors, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=50))
    return out


def test_a_canary_answering_404_to_the_clients_model_name_fails_on_its_4xx_share():
    """Issue 41: a canary that answered 404 to every client still using the old served name passed ("0 errors").
    404/400/422 count; 401 and 429 (the client's key, the router's limiter) do not; stable's own share is the
    baseline: only the excess over max_error_rate fails."""
    cfg = parse_config(CFG)
    canary = ([_line("127.0.0.1:8001", 404)] * 18 + [_line("127.0.0.1:8001", 200)] * 2)
    stable = [_line("127.0.0.1:8002", 200)] * 60
    c, s = _groups("\n".join(canary + stable), cfg)
    assert (c.client_errors, c.errors, s.client_errors) == (18, 0, 0)
    v = judge(cfg, c, s, 30.0, 25)
    assert v.result == "fail", v.summary()
    assert v.reason == ("canary 4xx share 90.0% (18/20 answered 400/404/422) is 90.0% over stable's 0.0% (0/60) > "
                        "max_error_rate 5.0%")
    assert "18 4xx (90.0%)" in v.summary()
    # 401 and 429 are no release's fault
    theirs = [_line("127.0.0.1:8001", 401)] * 9 + [_line("127.0.0.1:8001", 429)] * 9 + [_line("127.0.0.1:8001", 200)] * 2
    c, s = _groups("\n".join(theirs + stable), cfg)
    assert c.client_errors == 0 and judge(cfg, c, s, 30.0, 25).result == "pass"
    # both sides refuse bad bodies alike (400/422 from the clients): no excess, no fail
    both = ([_line("127.0.0.1:8001", 422)] * 2 + [_line("127.0.0.1:8001", 200)] * 18
            + [_line("127.0.0.1:8002", 400)] * 6 + [_line("127.0.0.1:8002", 200)] * 54)
    c, s = _groups("\n".join(both), cfg)
    assert (c.client_errors, s.client_errors) == (2, 6) and judge(cfg, c, s, 30.0, 25).result == "pass"


def _probes(samples):
    return ProbeStats(["x"], sent=samples, errors=0, ttft_s=0.02, tpot_s=0.005, samples=samples, error_detail="",
                      failing=[])


def test_a_window_short_of_latency_samples_does_not_pass_on_the_probes():
    cfg = parse_config(CFG)
    a = cfg.rollout.analysis
    c = GroupStats(["a"], requests=20, generations=20, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=3)
    s = GroupStats(["b"], requests=60, generations=60, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=60)
    v = judge(cfg, c, s, 30.0, 25)
    res, why = judge_probes(a, _probes(4), _probes(4))
    assert res == "pass"
    v = combine(v, (res, why, probe_json(_probes(4), _probes(4), res, why)), a.min_client_requests)
    assert v.result == "inconclusive" and v.reason.startswith("cannot judge: 3 samples"), v.reason
    assert held(v)  # too little traffic to judge: the step holds for more
    # too few requests (min_requests) with enough client generations: the probes still judge latency
    c = GroupStats(["a"], requests=5, generations=5, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=0)
    v = combine(judge(cfg, c, s, 30.0, 25), (res, why, None), a.min_client_requests)
    assert v.result == "pass" and v.source == "probes"


def _side(d, hosts, **kw):
    if d is None:
        return GroupStats(hosts)
    n = d["requests"] - d["errors"]
    return GroupStats(hosts, requests=d["requests"], errors=d["errors"], generations=d["requests"],
                      p99_ttft_s=d["ttft_p99_s"] if n else None, p99_tpot_s=d["tpot_p99_s"] if n else None,
                      p99_e2e_s=d.get("e2e_p99_s", 1.0) if n else None, ttft_count=n, kv_usage=0.3, **kw)


def test_journal_replay_recomputes_every_verdict_from_its_record():
    """Every window of the shared analysis table (and a 4xx one, a probes-judged one, one judged on an earlier
    baseline), written as the journal writes it and read back as JSON: replay gives the recorded result and reason
    for each; under other thresholds it gives others (the record holds what the verdict rested on)."""
    cfg = config()
    a = cfg.rollout.analysis
    verdicts = [judge(cfg, _side(k["canary"], ["gpu-b"]), _side(k["stable"], ["gpu-a"]), 60.0, 25) for k in CASES]
    ok = {"requests": 300, "errors": 0, "ttft_p99_s": 0.2, "tpot_p99_s": 0.03}
    verdicts.append(judge(cfg, _side(ok, ["gpu-b"], client_errors=40), _side(ok, ["gpu-a"]), 60.0, 50))
    verdicts.append(judge(cfg, _side(ok, ["gpu-b"]), GroupStats(["gpu-a"]), 60.0, 100, baseline=_side(ok, ["gpu-a"])))
    quiet = judge(cfg, GroupStats(["gpu-b"], requests=3, generations=3), _side(ok, ["gpu-a"]), 60.0, 5)
    pj = probe_json(_probes(4), _probes(4), "pass", "")
    verdicts.append(combine(quiet, ("pass", "", pj), a.min_client_requests))
    results = {v.result for v in verdicts}
    assert results == {"pass", "fail", "inconclusive"}, results
    assert any(v.reason.startswith("SLO breached on stable and canary") for v in verdicts)
    assert any("4xx share" in v.reason for v in verdicts) and any(v.source == "probes" for v in verdicts)
    records = [json.loads(json.dumps({"kind": "point", "what": "window", **window_record(cfg, v)})) for v in verdicts]
    out = replay(records)
    assert len(out) == len(verdicts)
    assert [o["recomputed"] for o in out] == [[v.result, v.reason] for v in verdicts]
    assert all(o["match"] for o in out)
    # the numbers decide: a laxer objective turns the shared breach into a pass on replay
    shared = next(r for r in records if r["reason"].startswith("SLO breached"))
    lax = json.loads(json.dumps(shared["thresholds"]))
    lax["slo"]["ttft_p99_s"] = 5.0
    assert recompute(shared, lax)[0] == "pass"


def test_status_json_shows_each_steps_windows_from_the_journal(tmp_path, monkeypatch):
    """`status --json`'s journal section (status.journal_status) lists per weight step the windows the journal
    holds, with their numbers, thresholds, verdict and reason."""
    from deployctl.rollout import journal
    from deployctl.rollout.state import RolloutState
    from deployctl.rollout.status import journal_status

    monkeypatch.setenv("DEPLOYCTL_STATE", str(tmp_path / "state"))
    monkeypatch.delenv("DEPLOYCTL_TEST_KILL_AT", raising=False)
    cfg = config()
    slow = {"requests": 200, "errors": 0, "ttft_p99_s": 1.8, "tpot_p99_s": 0.03}
    v = judge(cfg, _side(slow, ["gpu-b"]), _side(slow, ["gpu-a"]), 30.0, 50)
    j = journal.Journal(cfg.service.name)
    j.start({"release": {"id": "R2"}, "generation": 5, "steps": [50, 100]})
    j.begin("weight:0")
    j.point("window", **window_record(cfg, v))
    jr = journal_status(cfg, RolloutState(release="R2", status="running", generation=5))
    (w,) = jr["windows"]["weight step 1/2 (50%)"]
    assert w["result"] == "inconclusive" and w["reason"].startswith("SLO breached on stable and canary")
    assert w["canary"]["requests"] == 200 and w["stable"]["p99_ttft_s"] == 1.8
    assert w["thresholds"]["slo"]["ttft_p99_s"] == 1.0 and w["weight"] == 50
