"""Prometheus alert rules: `promtool check rules` accepts them and `promtool test rules` shows each alert firing
on the series it is about (and staying quiet on the healthy ones)."""
from __future__ import annotations

import yaml

from deployctl.render.targets import render_alerts
from deployctl.render.validate import check_alert_rules
from support.render import make_config, promtool_rule_tests

JOB = 'job="chat-7b"'


def _expected(rules: dict, alertname: str, **labels: str) -> dict:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == alertname)
    annotations = {k: v.replace("{{ $labels.instance }}", labels.get("instance", ""))
                   for k, v in rule["annotations"].items()}
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def _hist(name: str, instance: str, per_min: dict[str, int]) -> list[dict]:
    """Cumulative histogram buckets growing by ``per_min`` requests per minute per bucket bound."""
    out, total = [], 0
    for le, n in per_min.items():
        total += n
        out.append({"series": f'{name}_bucket{{{JOB},instance="{instance}",le="{le}"}}', "values": f"0+{total}x40"})
    return out


def test_alert_rules_pass_promtool_and_fire_on_their_conditions(tmp_path):
    cfg = make_config(slo={"ttft_p99_s": 2.0, "tpot_p99_s": 0.1})
    rendered = render_alerts(cfg)
    rules_path = tmp_path / "alerts.rules.yaml"
    rules_path.write_text(rendered.content)
    checked = check_alert_rules(rules_path)
    assert checked.ok and "SUCCESS: 7 rules found" in checked.output, checked.output
    rules = yaml.safe_load(rendered.content)
    m = "deployctl_runtime_"
    tests = [
        {   # KV cache at 90% on a, 80% on b: only a alerts, and only after 10 minutes.
            "interval": "1m",
            "input_series": [{"series": f'{m}kv_cache_usage_ratio{{{JOB},instance="a"}}', "values": "0.9x40"},
                             {"series": f'{m}kv_cache_usage_ratio{{{JOB},instance="b"}}', "values": "0.8x40"}],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "DeployctlKVCacheNearlyFull", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "DeployctlKVCacheNearlyFull",
                 "exp_alerts": [_expected(rules, "DeployctlKVCacheNearlyFull", instance="a")]}],
        },
        {   # 2% of requests fail (queue full): error alert; TTFT P99 ~ 4.9 s > 2 s; TPOT P99 fine.
            "interval": "1m",
            "input_series": [
                {"series": f'{m}request_success_total{{{JOB},instance="a",finish_reason="stop"}}', "values": "0+98x40"},
                {"series": f'{m}request_rejected_total{{{JOB},instance="a",reason="queue_full"}}', "values": "0+2x40"},
                *_hist(f"{m}time_to_first_token_seconds", "a", {"0.5": 50, "2.5": 0, "5": 50, "+Inf": 0}),
                *_hist(f"{m}time_per_output_token_seconds", "a", {"0.025": 90, "0.05": 10, "+Inf": 0})],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "DeployctlErrorRateHigh",
                 "exp_alerts": [_expected(rules, "DeployctlErrorRateHigh")]},
                {"eval_time": "20m", "alertname": "DeployctlTTFTP99OverObjective",
                 "exp_alerts": [_expected(rules, "DeployctlTTFTP99OverObjective")]},
                {"eval_time": "20m", "alertname": "DeployctlTPOTP99OverObjective", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "DeployctlRejectedForLength", "exp_alerts": []}],
        },
        {   # 1% rejected for length: that alert, and no error alert (the client's fault).
            "interval": "1m",
            "input_series": [
                {"series": f'{m}request_success_total{{{JOB},instance="a",finish_reason="stop"}}', "values": "0+99x40"},
                {"series": f'{m}request_rejected_total{{{JOB},instance="a",reason="context_length_exceeded"}}',
                 "values": "0+1x40"},
                *_hist(f"{m}time_per_output_token_seconds", "a", {"0.1": 0, "0.25": 100, "+Inf": 0})],
            "alert_rule_test": [
                {"eval_time": "25m", "alertname": "DeployctlRejectedForLength",
                 "exp_alerts": [_expected(rules, "DeployctlRejectedForLength")]},
                {"eval_time": "25m", "alertname": "DeployctlErrorRateHigh", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "DeployctlTPOTP99OverObjective",
                 "exp_alerts": [_expected(rules, "DeployctlTPOTP99OverObjective")]}],
        },
        {   # A restart (new process start time) and a queue that keeps growing.
            "interval": "1m",
            "input_series": [
                {"series": f'process_start_time_seconds{{{JOB},instance="a"}}', "values": "100x5 460x30"},
                {"series": f'process_start_time_seconds{{{JOB},instance="b"}}', "values": "100x35"},
                {"series": f'{m}num_requests_waiting{{{JOB},instance="a"}}', "values": "0+1x40"},
                {"series": f'{m}num_requests_waiting{{{JOB},instance="b"}}', "values": "3x40"}],
            "alert_rule_test": [
                {"eval_time": "8m", "alertname": "DeployctlRuntimeRestarted",
                 "exp_alerts": [_expected(rules, "DeployctlRuntimeRestarted", job="chat-7b", instance="a")]},
                {"eval_time": "30m", "alertname": "DeployctlRuntimeRestarted", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "DeployctlQueueGrowing",
                 "exp_alerts": [_expected(rules, "DeployctlQueueGrowing", job="chat-7b", instance="a")]}],
        },
    ]
    result = promtool_rule_tests(tmp_path / "alerts.test.yaml", rules_path, tests)
    assert result.ok, result.output


def test_alert_thresholds_follow_slo_settings():
    cfg = make_config(slo={"ttft_p99_s": 0.75, "max_kv_cache_usage": 0.9, "prometheus_job": "llm"})
    text = render_alerts(cfg).content
    assert "> 0.75\n" in text and "> 0.9\n" in text and 'job="llm"' in text and 'job="chat-7b"' not in text
