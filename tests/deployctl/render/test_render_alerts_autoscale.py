"""Issue 42: the "scale out needed" alerts, run by the real `promtool test rules`: DeployctlScaleOutNeededKVCache
fires when the fleet's mean KV cache usage stays above autoscale.scale_out_kv_usage for 10 minutes (not when one
engine alone is full), DeployctlScaleOutNeededQueueAtMax when requests wait for 5 minutes with autoscale.max_hosts
engines up (not below max, where autoscale can still add one, and not without a queue)."""
from __future__ import annotations

from support.alerts import RuleCases, expected, rendered_rules, run_rule_cases
from support.render import make_config

KV, WAIT = "deployctl_runtime_kv_cache_usage_ratio", "deployctl_runtime_num_requests_waiting"


def _s(name: str, instance: str, values: str) -> dict:
    return {"series": f'{name}{{job="chat-7b",instance="{instance}"}}', "values": values}


def autoscale_cases() -> RuleCases:
    cfg = make_config()  # two hosts: autoscale.max_hosts 2
    rules = rendered_rules(cfg)
    kv_fired = [expected(rules, "DeployctlScaleOutNeededKVCache")]
    q_fired = [expected(rules, "DeployctlScaleOutNeededQueueAtMax")]
    full = {"interval": "1m", "input_series": [  # both engines over 85%, both up, a queue on a
        _s(KV, "a", "0.9x20"), _s(KV, "b", "0.88x20"), _s(WAIT, "a", "3x20"), _s(WAIT, "b", "0x20"),
        _s("up", "a", "1x20"), _s("up", "b", "1x20")], "alert_rule_test": [
        {"eval_time": "9m", "alertname": "DeployctlScaleOutNeededKVCache", "exp_alerts": []},  # pending
        {"eval_time": "11m", "alertname": "DeployctlScaleOutNeededKVCache", "exp_alerts": kv_fired},
        {"eval_time": "4m", "alertname": "DeployctlScaleOutNeededQueueAtMax", "exp_alerts": []},
        {"eval_time": "6m", "alertname": "DeployctlScaleOutNeededQueueAtMax", "exp_alerts": q_fired}]}
    below = {"interval": "1m", "input_series": [  # one engine full (mean 72.5%); a queue with only one engine up
        _s(KV, "a", "0.95x20"), _s(KV, "b", "0.5x20"), _s(WAIT, "a", "3x20"), _s(WAIT, "b", "0x20"),
        _s("up", "a", "1x20"), _s("up", "b", "0x20")], "alert_rule_test": [
        {"eval_time": "15m", "alertname": "DeployctlScaleOutNeededKVCache", "exp_alerts": []},
        {"eval_time": "15m", "alertname": "DeployctlScaleOutNeededQueueAtMax", "exp_alerts": []}]}
    idle = {"interval": "1m", "input_series": [  # at max but nothing waits
        _s(WAIT, "a", "0x20"), _s(WAIT, "b", "0x20"), _s("up", "a", "1x20"), _s("up", "b", "1x20")],
        "alert_rule_test": [{"eval_time": "15m", "alertname": "DeployctlScaleOutNeededQueueAtMax", "exp_alerts": []}]}
    return RuleCases("autoscale", cfg, [full, below, idle])


def rule_cases() -> list[RuleCases]:
    return [autoscale_cases()]


def test_scale_out_needed_alerts_fire_and_stay_silent(tmp_path):
    result = run_rule_cases(tmp_path, autoscale_cases())
    assert result.ok, result.output


def test_thresholds_follow_deploy_yaml_autoscale():
    rules = rendered_rules(make_config(autoscale={"scale_out_kv_usage": 0.9, "max_hosts": 5, "min_hosts": 2}))
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert exprs["DeployctlScaleOutNeededKVCache"].endswith("> 0.9")
    assert exprs["DeployctlScaleOutNeededQueueAtMax"].endswith(">= 5")
