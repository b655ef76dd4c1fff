"""Fast tests of the rollout's pure parts: access-log counting, verdicts, traffic shares, plans, stale locks."""
from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timedelta, timezone

import pytest

from deployctl.config import parse_config
from deployctl.errors import ConfigError, UsageError
from deployctl.rollout.accesslog import HostCount, count_access_log, upstream_map
from deployctl.rollout.analysis import GroupStats, judge
from deployctl.rollout.router import split_for
from deployctl.rollout.lock import judge as judge_lock
from deployctl.rollout.plan import make_plan, steps_for
from deployctl.render import new_release_id
from deployctl.rollout.release import ReleaseInfo, make_release_info
from deployctl.rollout.router import shares

CFG = """
service: {name: svc}
model: {path: /m}
hosts:
  - {name: a, address: 127.0.0.1, deploy_root: /d/a, server_port: 8001}
  - {name: b, address: 127.0.0.1, deploy_root: /d/b, server_port: 8002}
  - {name: c, address: 127.0.0.1, deploy_root: /d/c, server_port: 8003}
rollout:
  steps: [5, 25, 50, 100]
  analysis: {min_requests: 10, max_error_rate: 0.05, max_p99_ttft_ratio: 2.0, max_p99_tpot_ratio: 2.0, min_p99_delta_s: 0.01}
slo: {ttft_p99_s: 5.0, tpot_p99_s: 1.0}  # far above these windows: the ratio rules are judged apart from the SLO
"""


@pytest.fixture
def cfg():
    return parse_config(CFG)


def line(addr, status, upstream_status=None):
    return json.dumps({"request_method": "POST", "uri": "/v1/chat/completions", "status": status,
                       "upstream_addr": addr, "upstream_status": upstream_status or str(status)})


def test_access_log_counts_each_attempt_against_its_server(cfg):
    text = "\n".join([
        line("127.0.0.1:8001", 200), line("127.0.0.1:8001", 500),
        # nginx tried a (refused: 502) then b (200): the failure counts against a, the success for b
        line("127.0.0.1:8001, 127.0.0.1:8002", 200, "502, 200"),
        line("127.0.0.1:8003", 503), "not json", line("-", 404),
        # deployctl's own probe sent through the router: not user traffic
        json.dumps({"status": 500, "upstream_addr": "127.0.0.1:8001", "upstream_status": "500", "probe": "probe"}),
    ])
    counts = count_access_log(text, upstream_map(cfg))
    assert counts == {"a": HostCount(3, 2, 3), "b": HostCount(1, 0, 1), "c": HostCount(1, 1, 1)}


def test_verdicts(cfg):
    ok = GroupStats(["b"], requests=100, generations=100, errors=0, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=50)
    few = GroupStats(["a"], requests=9, generations=9)
    assert judge(cfg, few, ok, 5.0).result == "inconclusive"
    bad = GroupStats(["a"], requests=20, generations=20, errors=2, p99_ttft_s=0.1, p99_tpot_s=0.02, ttft_count=10)
    v = judge(cfg, bad, ok, 5.0)
    assert v.result == "fail" and "10.0%" in v.reason and "max_error_rate" in v.reason
    slow = GroupStats(["a"], requests=20, generations=20, p99_ttft_s=0.1, p99_tpot_s=0.2, ttft_count=10)
    v = judge(cfg, slow, ok, 5.0)
    assert v.result == "fail" and "TPOT" in v.reason and "10.0×" in v.reason
    # over the ratio but within min_p99_delta_s: noise, not a regression
    tiny = GroupStats(["a"], requests=20, generations=20, p99_ttft_s=0.1, p99_tpot_s=0.012, ttft_count=10)
    fast = GroupStats(["b"], requests=100, generations=100, p99_ttft_s=0.1, p99_tpot_s=0.005, ttft_count=50)
    assert judge(cfg, tiny, fast, 5.0).result == "pass"
    good = GroupStats(["a"], requests=20, generations=20, p99_ttft_s=0.12, p99_tpot_s=0.021, ttft_count=10)
    assert judge(cfg, good, ok, 5.0).result == "pass"
    # a P99 of a handful of samples is noise: latency is not judged (the demo flaked on 59.7 vs 14.3 ms this way)
    handful = GroupStats(["a"], requests=73, generations=73, p99_ttft_s=0.0597, p99_tpot_s=0.2, ttft_count=3)
    v = judge(cfg, handful, ok, 5.0)
    assert v.result == "inconclusive" and "3 canary latency samples < min_latency_samples 5" in v.reason
    # no stable latency in this window (100% on the canary): the baseline from earlier windows is used
    none = GroupStats(["b"])
    assert judge(cfg, slow, none, 5.0, baseline=ok).result == "fail"


def test_shares_and_splits():
    assert shares(["b", "c"], ["a"], 5) == {"b": 47.5, "c": 47.5, "a": 5.0}
    assert shares(["b"], ["a"], 100) == {"b": 0.0, "a": 100.0}
    assert shares(["b", "c"], [], 0) == {"b": 50.0, "c": 50.0}
    s = split_for(["a"], [], 100)
    assert s.stable == ("a",) and s.canary == ()  # nginx needs a live group: collapse to one side
    assert split_for([], ["b", "c"], 5).canary == ()


def test_plan_modes_and_steps(cfg):
    info = ReleaseInfo("r2", "", "", "", "w.whl", "0" * 64, "0.1.0")
    assert steps_for(cfg, 10) == [10, 25, 50, 100]
    assert steps_for(cfg, None) == [5, 25, 50, 100]
    with pytest.raises(UsageError):
        steps_for(cfg, 100)
    first = make_plan(cfg, info, {"a": None, "b": None, "c": None})
    assert first.mode == "first" and first.stable == ["a", "b", "c"]
    routed = parse_config(CFG + "router: {host: local, listen: 18123, upstream_conf: /etc/nginx/conf.d/svc.conf}\n")
    canary = make_plan(routed, info, {"a": "r1", "b": "r1", "c": "r1"}, 5)
    assert (canary.mode, canary.canary, canary.stable, canary.batches) == ("canary", ["a"], ["b", "c"], [["b"], ["c"]])
    # no router: no traffic split, so no canary (the deploy crashed on the missing router): all hosts, verified
    bare = make_plan(cfg, info, {"a": "r1", "b": "r1", "c": "r1"}, 5)
    assert (bare.mode, bare.stable) == ("no-router", ["a", "b", "c"]) and any("no router" in ln for ln in bare.lines())
    one = parse_config(CFG.replace("  - {name: b, address: 127.0.0.1, deploy_root: /d/b, server_port: 8002}\n", "")
                       .replace("  - {name: c, address: 127.0.0.1, deploy_root: /d/c, server_port: 8003}\n", ""))
    p = make_plan(one, info, {"a": "r1"}, 5)
    assert p.mode == "in-place" and any("no canary" in ln for ln in p.lines())


def test_release_id_shape_and_content_hash(cfg):
    when = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)
    a = new_release_id(cfg, runtime_version="0.1.0", manifest="m", when=when)
    assert a.startswith("20261130T010203Z-") and len(a.split("-")[1]) == 8
    assert new_release_id(cfg, runtime_version="0.1.0", manifest="m2", when=when) != a
    assert new_release_id(cfg, runtime_version="0.2.0", manifest="m", when=when) != a
    other = parse_config(CFG.replace("deploy_root: /d/b", "deploy_root: /d/bb"))
    assert new_release_id(other, runtime_version="0.1.0", manifest="m", when=when) != a
    assert new_release_id(cfg, runtime_version="0.1.0", manifest="m", when=when) == a


def test_render_and_deploy_name_the_same_release_alike(tmp_path):
    """`deployctl render` and `deployctl deploy` used 7 and 8 hex digits of different inputs for one release."""
    from deployctl.render.targets import default_release_id, runtime_version

    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.sha256").write_text("ab" * 32 + "  model.safetensors\n")
    c = parse_config(CFG.replace("path: /m", f"path: {model}"))
    wheel = tmp_path / f"deployctl_runtime-{runtime_version()}-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel: only its name and sha256 matter here")
    when = datetime(2026, 11, 30, 1, 2, 3, tzinfo=timezone.utc)
    rendered = default_release_id(c, env={"SOURCE_DATE_EPOCH": str(int(when.timestamp()))})
    deployed = make_release_info(c, wheel, (model / "manifest.sha256").read_text(), when=when).id
    assert rendered == deployed and rendered.startswith("20261130T010203Z-")


def test_stale_lock_detection():
    now = datetime.now(timezone.utc)
    me = {"machine": socket.gethostname(), "pid": os.getpid(), "started": now.isoformat()}
    assert judge_lock(me) == (False, "")
    # a pid that does not exist on this machine
    dead = dict(me, pid=2 ** 22 + 12345)
    stale, why = judge_lock(dead)
    assert stale and "not running" in why
    old = dict(me, machine="elsewhere", started=(now - timedelta(hours=7)).isoformat())
    assert judge_lock(old, max_age_s=3600)[0]
    assert not judge_lock(dict(old, started=now.isoformat()), max_age_s=3600)[0]


def test_down_or_restarted_canary_fails_before_counting(cfg):
    ok = GroupStats(["b"], requests=100, generations=100)
    down = GroupStats(["a"], requests=0, generations=0, down=["a"])
    v = judge(cfg, down, ok, 5.0)
    assert v.result == "fail" and "does not answer /metrics" in v.reason
    v = judge(cfg, GroupStats(["a"], requests=50, generations=50, restarted=["a"]), ok, 5.0)
    assert v.result == "fail" and "restarted" in v.reason


@pytest.mark.parametrize("setting,sizes", [
    ("", [2, 2, 2, 1]),              # unset: a quarter of 8 hosts (more than the one canary host)
    ("max_unavailable: 1", [1] * 7),
    ("max_unavailable: 3", [3, 3, 1]),
    ("max_unavailable: '50%'", [4, 3]),
    ("max_unavailable: '10%'", [1] * 7),  # 0.8 hosts: at least one
])
def test_the_roll_after_the_canary_goes_in_batches_of_max_unavailable(setting, sizes):
    hosts = "".join(f"  - {{name: h{i}, address: 127.0.0.1, deploy_root: /d/h{i}, server_port: {8000 + i}}}\n"
                    for i in range(8))
    cfg = parse_config("service: {name: svc}\nmodel: {path: /m}\nhosts:\n" + hosts +
                       "router: {host: local, listen: 18123, upstream_conf: /etc/nginx/conf.d/svc.conf}\n"
                       f"rollout: {{canary_hosts: 1, {setting}}}\n")
    info = ReleaseInfo("r2", "", "", "", "w.whl", "0" * 64, "0.1.0")
    p = make_plan(cfg, info, {f"h{i}": "r1" for i in range(8)}, 5)
    assert p.canary == ["h0"] and [len(b) for b in p.batches] == sizes
    assert [n for b in p.batches for n in b] == [f"h{i}" for i in range(1, 8)]


@pytest.mark.parametrize("bad", ["0", "'0%'", "'101%'", "'half'", "-1"])
def test_a_bad_max_unavailable_is_refused_naming_it(bad):
    with pytest.raises(ConfigError) as exc:
        parse_config(f"service: {{name: svc}}\nmodel: {{path: /m}}\nhosts: [{{name: a, address: local}}]\n"
                     f"rollout: {{max_unavailable: {bad}}}\n")
    assert "max_unavailable must be a host count >= 1 or a percentage" in str(exc.value)


def test_fleet_wide_steps_pass_parallel_hosts_as_the_worker_bound(monkeypatch):
    # the bound itself (at most max_workers at once) is tests/deployctl/hosts/test_hosts_group_deadline.py's
    from deployctl.rollout.fleet import Fleet

    hosts = "".join(f"  - {{name: h{i}, address: 127.0.0.1, deploy_root: /d/h{i}, server_port: {8000 + i}}}\n"
                    for i in range(6))
    cfg = parse_config("service: {name: svc}\nmodel: {path: /m}\nhosts:\n" + hosts + "rollout: {parallel_hosts: 2}\n")
    seen = {}
    monkeypatch.setattr("deployctl.hosts.run_on_hosts",
                        lambda hosts, fn, **kw: seen.update(kw, n=len(hosts)) or [])
    Fleet(cfg, lambda *a, **k: None).on_hosts([object()] * 6, lambda h: None, deadline_s=10, what="test")
    assert seen["max_workers"] == 2 and seen["n"] == 6
    assert seen["deadline_s"] == 10  # one host's bound, each host timed from its own start (run_on_hosts)


@pytest.mark.parametrize("bad", ["true", "2.0"])
def test_max_unavailable_and_parallel_hosts_take_whole_numbers_only(bad):
    for key in ("max_unavailable", "parallel_hosts"):
        with pytest.raises(ConfigError) as exc:
            parse_config(f"service: {{name: svc}}\nmodel: {{path: /m}}\nhosts: [{{name: a, address: local}}]\n"
                         f"rollout: {{{key}: {bad}}}\n")
        assert key in str(exc.value)


def test_hosts_waiting_for_a_worker_spend_none_of_their_deadline_waiting():
    import time

    from deployctl.rollout import hostops

    hosts = [type("H", (), {"name": f"h{i}"})() for i in range(6)]
    ok, bad = hostops.on_hosts(hosts, lambda h: time.sleep(1.0) or h.name, workers=2, deadline_s=1.6)
    assert not bad and sorted(ok) == [f"h{i}" for i in range(6)]  # three rounds of 1 s, each host within 1.6 s
