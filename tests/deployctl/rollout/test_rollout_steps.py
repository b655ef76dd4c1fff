"""rollout.steps as {weight, pause} with durations (the short form of bare percentages stays valid): the config,
the deploy plan's schedule (when each step ends) and the Argo Rollout's per-step measurement counts."""
from __future__ import annotations

import time

import pytest
import yaml

from deployctl.config import parse_config
from deployctl.config.units import format_duration, parse_duration
from deployctl.errors import ConfigError
from deployctl.rollout.plan import make_plan
from deployctl.rollout.release import ReleaseInfo

BASE = """
service: {name: svc}
model: {path: /m}
hosts:
  - {name: a, address: 127.0.0.1, deploy_root: /d/a, server_port: 8001}
  - {name: b, address: 127.0.0.1, deploy_root: /d/b, server_port: 8002}
router: {host: local, listen: 18123, upstream_conf: /etc/nginx/conf.d/svc.conf}
"""


def cfg_with(rollout: str):
    return parse_config(BASE + "rollout:\n" + rollout)


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("5m", 300), ("24h", 86400), ("1.5d", 129600),
                                           ("250ms", 0.25), (90, 90), (2.5, 2.5), ("45", 45), ("1h30m", 5400),
                                           ("24h10m", 87000), ("1d2h", 93600), ("1m30s", 90), ("1s500ms", 1.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "30m1h", "1h 30m", "1h1h", "h", "-5s", "", True])
def test_bad_durations_name_the_value_and_the_forms(bad):
    with pytest.raises(ValueError, match="expected a duration like 30s, 5m, 24h, 1h30m"):
        parse_duration(bad)


def test_format_duration():
    seconds = (86400, 300, 90, 0.5, 7200, 87000, 0, 3661)
    assert [format_duration(s) for s in seconds] == [
        "24h", "5m", "1m30s", "0.5s", "2h", "24h10m", "0s", "1h1m1s"]
    # what the plan prints can be written back into deploy.yaml (it read '+24h10m' and refused '24h10m')
    assert [parse_duration(format_duration(s)) for s in seconds] == list(seconds)


def test_short_form_stays_valid_and_takes_pause_s():
    c = cfg_with("  steps: [5, 25, 100]\n  pause_s: 5m\n")
    assert c.rollout.weights == [5, 25, 100]
    assert [c.rollout.pause_of(w) for w in c.rollout.weights] == [300, 300, 300]


def test_standby_and_pauses_take_durations():
    c = cfg_with("  steps: [{weight: 5, pause: 1h30m}, 100]\n  standby_s: 24h\n")
    assert (c.rollout.pause_of(5), c.rollout.standby_s) == (5400, 86400)


def test_steps_with_their_own_pause():
    c = cfg_with("  steps: [{weight: 5, pause: 24h}, 25, {weight: 100, pause: 30s}]\n  pause_s: 120\n")
    assert c.rollout.weights == [5, 25, 100]
    assert [c.rollout.pause_of(w) for w in (5, 25, 100)] == [86400, 120, 30]
    assert c.rollout.pause_of(10) == 120  # a --canary weight that is no configured step


@pytest.mark.parametrize("rollout, needle", [
    ("  steps: [{weight: 5, pause: soon}, 100]\n", "rollout.steps[0].pause: expected a duration like 30s"),
    ("  steps: [{weight: 5, pause: 8d}, 100]\n", "rollout.steps[0].pause"),
    ("  steps: [{weight: 50}, {weight: 25}, 100]\n", "steps must be increasing"),
    ("  steps: [{weight: 5, pasue: 1h}, 100]\n", "did you mean 'pause'"),
    ("  steps: [5, 50]\n", "ending at 100"),
    ("  pause_s: 2 weeks\n", "rollout.pause_s"),
    # YAML's lax casts: yes/true and quoted numbers are no percentage or factor (weight yes planned as '1%')
    ("  steps: [{weight: yes, pause: 1m}, 100]\n", "rollout.steps[0].weight: Input should be a valid integer"),
    ("  steps: [{weight: '5'}, 100]\n", "rollout.steps[0].weight: Input should be a valid integer (got '5')"),
    ("  analysis: {max_slo_factor: true}\n", "rollout.analysis.max_slo_factor: Input should be a valid number"),
    ("  standby_s: a day\n", "rollout.standby_s: expected a duration"),
])
def test_bad_steps_are_refused_with_the_key(rollout, needle):
    with pytest.raises(ConfigError) as e:
        cfg_with(rollout)
    assert needle in str(e.value), str(e.value)


def test_plan_prints_when_each_step_ends():
    c = cfg_with("  steps: [{weight: 5, pause: 24h}, {weight: 50, pause: 5m}, {weight: 100, pause: 30s}]\n")
    info = ReleaseInfo("r2", "", "", "", "w.whl", "0" * 64, "0.1.0")
    plan = make_plan(c, info, {"a": "r1", "b": "r1"})
    t0 = plan.made_at
    assert plan.step_ends() == [t0 + 86400, t0 + 86700, t0 + 86730]
    text = "; ".join(plan.lines())
    day = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0 + 86400))
    assert f"5% for 24h, ends ≥ {day} (+24h)" in text, text
    assert "50% for 5m" in text and "(+24h5m)" in text and "100% for 30s" in text, text
    j = plan.to_json()
    assert j["pauses_s"] == [86400, 300, 30] and len(j["step_ends"]) == 3 and j["step_ends"][0].endswith("Z")


def test_canary_flag_weight_takes_pause_s():
    c = cfg_with("  steps: [{weight: 25, pause: 1h}, 100]\n  pause_s: 60\n")
    info = ReleaseInfo("r2", "", "", "", "w.whl", "0" * 64, "0.1.0")
    plan = make_plan(c, info, {"a": "r1", "b": "r1"}, canary_pct=10)
    assert plan.steps == [10, 25, 100] and [plan.pause_at(i) for i in range(3)] == [60, 3600, 60]


def test_argo_rollout_counts_per_step():
    """Steps with different pauses: each Rollout analysis step passes its own measurement count."""
    from deployctl.render.targets import render_files
    from support.render import API_KEY, make_config

    cfg = make_config(rollout={"steps": [{"weight": 5, "pause": "10m"}, {"weight": 50, "pause": "2m"}, 100],
                               "analysis": {"interval_s": 60}})
    files = {f.path: f.content for f in render_files(cfg, target="k8s-rollout", release_id="r1", api_key=API_KEY)}
    rollout = next(d for d in yaml.safe_load_all(files["k8s/rollout.yaml"] if "k8s/rollout.yaml" in files
                                                 else files["k8s/workload.yaml"]) if d and d["kind"] == "Rollout")
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    counts = [next(a["value"] for a in s["analysis"]["args"] if a["name"] == "measurements")
              for s in steps if "analysis" in s]
    assert counts == ["10", "2"]
    tmpl = yaml.safe_load(files["k8s/analysis-template.yaml"])
    prom = [m for m in tmpl["spec"]["metrics"] if "prometheus" in m["provider"]]
    assert prom and all(m["count"] == "{{args.measurements}}" for m in prom)


def test_capacity_plan_command_prints_the_step_schedule(tmp_path):
    """`deployctl plan` with a deploy.yaml of several hosts behind a router: the canary steps and when each ends."""
    import subprocess
    import sys

    from deployctl.demo.localenv import tiny_model
    from support.render import write_config

    model = tiny_model(tmp_path / "tiny")
    cfg = write_config(tmp_path / "deploy.yaml", model={"path": str(model)}, engine={"device": "cpu", "max_model_len": 256, "max_num_batched_tokens": 256, "kv_cache_memory": "8MiB"},
                       rollout={"steps": [{"weight": 10, "pause": "2h"}, {"weight": 50, "pause": 0},
                                          {"weight": 100, "pause": "10m"}]})
    r = subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(cfg)], capture_output=True, text=True,
                       timeout=120)
    out = " ".join(r.stdout.split())
    assert "canary steps if deployed now: 10% for 2h, ends ≥ " in out and "100% for 10m" in out, r.stdout + r.stderr
    assert "(+2h10m)" in out and "(+130m)" not in out, out  # offsets in hours and minutes, not 130m
    assert "50% with no analysis (pause 0), ends ≥ " in out, out  # a step without a window says so


BAD_CONFIGS = [
    # (deploy.yaml addition, what the one-line error says)
    ("rollout: {analysis: {max_slo_factor: .inf}}",
     "rollout.analysis.max_slo_factor: max_slo_factor must be a finite number >= 1 (1: the canary fails over the SLO "
     "itself; 1.5: up to 50% over it); for a stricter canary lower slo.*_p99_s instead (got inf)"),
    ("rollout: {analysis: {max_slo_factor: 0.5}}", "max_slo_factor must be a finite number >= 1"),
    ("rollout: {analysis: {max_slo_factor: .nan}}", "max_slo_factor must be a finite number >= 1"),
    ("rollout: {steps: ['5', 100]}",
     "rollout.steps: item 0 is '5', a string: write a whole percentage unquoted (5) or {weight: 5, pause: 24h}"),
    ("rollout: {steps: [5.5, 100]}", "rollout.steps: item 0 is 5.5, not a whole percentage: write a whole percentage"),
    ("rollout: {steps: [5, null, 100]}", "rollout.steps: item 1 is None, no step: write"),
    ("rollout: {steps: [{weight: 5, pause: 24x}, 100]}",
     "rollout.steps[0].pause: expected a duration like 30s, 5m, 24h, 1h30m or a number of seconds, got '24x'"),
]


@pytest.mark.parametrize("extra, says", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_analysis_and_step_settings_are_refused_naming_key_value_and_fix(extra, says):
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + extra + "\n")
    assert says in str(e.value), str(e.value)
    assert str(e.value).count("24x") <= 1, str(e.value)  # the value is named once, not "(got '24x') (got '24x')"


def test_whole_float_steps_and_finite_slo_factors_are_taken():
    c = parse_config(BASE + "rollout: {steps: [5.0, 100], analysis: {max_slo_factor: 1.5}}\n")
    assert c.rollout.weights == [5, 100] and c.rollout.analysis.max_slo_factor == 1.5


@pytest.mark.parametrize("value, seconds", [(0, 0), (1, 1), ("30s", 30), ("1m", 60), (15, 15)])
def test_keepalive_interval_takes_durations(value, seconds):
    c = parse_config(BASE.replace("server_port: 8001}", f"server_port: 8001, keepalive_interval_s: {value}}}"))
    assert c.hosts[0].keepalive_interval_s == seconds


@pytest.mark.parametrize("value", [0.001, 0.5, "2h", "fast"])
def test_keepalive_interval_below_a_second_is_refused(value):
    with pytest.raises(ConfigError) as e:
        parse_config(BASE.replace("server_port: 8001}", f"server_port: 8001, keepalive_interval_s: {value}}}"))
    msg = str(e.value)
    assert "hosts[0].keepalive_interval_s: " in msg and repr(value) in msg, msg
    assert msg.count(repr(value)) == 1, msg
    if value != "fast":
        assert "must be 0 (off) or from 1 s to 1h" in msg and "e.g. 15 or 15s" in msg, msg


def test_plan_command_refuses_a_bad_setting_with_exit_3(tmp_path):
    from support.cli import run_cli

    path = tmp_path / "deploy.yaml"
    path.write_text(BASE + "rollout: {steps: [{weight: 5, pause: 24x}, 100], analysis: {max_slo_factor: .inf}}\n")
    r = run_cli("plan", "-c", str(path))
    assert r.returncode == 3, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "rollout.steps[0].pause: expected a duration like 30s, 5m, 24h, 1h30m or a number of seconds, got '24x'" in err
    assert err.count("'24x'") == 1 and "rollout.analysis.max_slo_factor" in err and "(got inf)" in err, err
