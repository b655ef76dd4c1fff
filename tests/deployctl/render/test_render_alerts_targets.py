"""Issue 40: alerts over the scrape targets themselves, run by the real `promtool test rules`. A runtime target
flapping up and down between scrapes (never down long enough for DeployctlRuntimeDown) fires
DeployctlRuntimeFlapping; one outage and recovery, or a steady target, does not. A dcgm-exporter that answers its
scrapes but exports no series (or not every series the GPU rules read) for the service's GPUs fires
DeployctlGPUMetricsMissing; one whose target left Prometheus fires DeployctlGPUMetricsAbsent for that host."""
from __future__ import annotations

import copy

from support.alerts import RuleCases, expected, rendered_rules, run_rule_cases
from support.render import BASE, make_config

RUNTIME_UP = 'up{job="chat-7b",instance="%s"}'
DCGM_UP = 'up{job="dcgm",deployctl_host="%s",instance="%s:9400"}'
DCGM = 'DCGM_FI_DEV_%s{job="dcgm",deployctl_host="%s",gpu="%s"}'
FIELDS = ("GPU_UTIL", "FB_USED", "FB_FREE", "XID_ERRORS")


def flapping_cases() -> RuleCases:
    cfg = make_config()
    rules = rendered_rules(cfg)
    flap = " ".join(["1", "0"] * 20)  # up, down, up, down ... one scrape a minute
    tests = [{"interval": "1m", "input_series": [
        {"series": RUNTIME_UP % "a", "values": flap},
        {"series": RUNTIME_UP % "b", "values": "1x40"},  # steady
        {"series": RUNTIME_UP % "c", "values": "1x10 0x2 1x28"},  # one outage of 3 minutes, then back
    ], "alert_rule_test": [
        {"eval_time": "3m", "alertname": "DeployctlRuntimeFlapping", "exp_alerts": []},
        {"eval_time": "15m", "alertname": "DeployctlRuntimeFlapping",
         "exp_alerts": [expected(rules, "DeployctlRuntimeFlapping", job="chat-7b", instance="a")]},
        {"eval_time": "30m", "alertname": "DeployctlRuntimeFlapping",
         "exp_alerts": [expected(rules, "DeployctlRuntimeFlapping", job="chat-7b", instance="a")]},
        # what the issue saw: the down alert never fires on it
        {"eval_time": "30m", "alertname": "DeployctlRuntimeDown", "exp_alerts": []},
    ]}]
    return RuleCases("flapping", cfg, tests)


def _gpu_series(host: str, gpu: str, fields=FIELDS) -> list[dict]:
    return [{"series": DCGM % (f, host, gpu), "values": "0x40" if f == "XID_ERRORS" else "40x40"} for f in fields]


def exporter_cases() -> RuleCases:
    """gpu-a serves on GPU 0, gpu-b on GPU 1 (tests/support/render.py)."""
    cfg = make_config()
    rules = rendered_rules(cfg)

    def missing(host: str, address: str) -> dict:
        return expected(rules, "DeployctlGPUMetricsMissing", job="dcgm", deployctl_host=host,
                        instance=f"{address}:9400")

    tests = [
        {"interval": "1m", "input_series": [  # gpu-a healthy; gpu-b's exporter up with no GPU series at all
            {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "1x40"},
            {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"},
            *_gpu_series("gpu-a", "0")],
         "alert_rule_test": [
             {"eval_time": "3m", "alertname": "DeployctlGPUMetricsMissing", "exp_alerts": []},
             {"eval_time": "10m", "alertname": "DeployctlGPUMetricsMissing",
              "exp_alerts": [missing("gpu-b", "10.0.0.12")]},
             {"eval_time": "10m", "alertname": "DeployctlGPUMetricsDown", "exp_alerts": []},
             {"eval_time": "10m", "alertname": "DeployctlGPUMetricsAbsent", "exp_alerts": []}]},
        {"interval": "1m", "input_series": [  # gpu-a exports no Xid field; gpu-b only another GPU than its own
            {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "1x40"},
            {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"},
            *_gpu_series("gpu-a", "0", FIELDS[:3]), *_gpu_series("gpu-b", "0")],
         "alert_rule_test": [
             {"eval_time": "10m", "alertname": "DeployctlGPUMetricsMissing",
              "exp_alerts": [missing("gpu-a", "10.0.0.11"), missing("gpu-b", "10.0.0.12")]}]},
        {"interval": "1m", "input_series": [  # an exporter that is down is DeployctlGPUMetricsDown's, not this
            {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "0x40"},
            {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"}, *_gpu_series("gpu-b", "1")],
         "alert_rule_test": [
             {"eval_time": "20m", "alertname": "DeployctlGPUMetricsMissing", "exp_alerts": []}]},
        {"interval": "1m", "input_series": [  # gpu-a's exporter target leaves Prometheus at 10 m
            {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "1x10 _x30"},
            {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"}, *_gpu_series("gpu-b", "1")],
         "alert_rule_test": [
             {"eval_time": "9m", "alertname": "DeployctlGPUMetricsAbsent", "exp_alerts": []},
             {"eval_time": "25m", "alertname": "DeployctlGPUMetricsAbsent", "exp_alerts": [
                 expected(rules, "DeployctlGPUMetricsAbsent", job="dcgm", deployctl_host="gpu-a")]},
             {"eval_time": "25m", "alertname": "DeployctlGPUMetricsDown", "exp_alerts": []}]},
    ]
    return RuleCases("gpu-exporter", cfg, tests)


def multi_gpu_cases() -> RuleCases:
    """gpu-a serves on GPUs 0 and 1: an exporter that reports GPU 0 only is missing one of them."""
    hosts = copy.deepcopy(BASE["hosts"])
    hosts[0]["gpus"] = [0, 1]
    cfg = make_config(hosts=hosts)
    rules = rendered_rules(cfg)
    tests = [{"interval": "1m", "input_series": [
        {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "1x40"},
        {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"},
        *_gpu_series("gpu-a", "0"), *_gpu_series("gpu-b", "1")],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "DeployctlGPUMetricsMissing", "exp_alerts": [
                expected(rules, "DeployctlGPUMetricsMissing", job="dcgm", deployctl_host="gpu-a",
                         instance="10.0.0.11:9400")]}]},
        {"interval": "1m", "input_series": [
            {"series": DCGM_UP % ("gpu-a", "10.0.0.11"), "values": "1x40"},
            {"series": DCGM_UP % ("gpu-b", "10.0.0.12"), "values": "1x40"},
            *_gpu_series("gpu-a", "0"), *_gpu_series("gpu-a", "1"), *_gpu_series("gpu-b", "1")],
         "alert_rule_test": [
             {"eval_time": "10m", "alertname": "DeployctlGPUMetricsMissing", "exp_alerts": []}]}]
    return RuleCases("gpu-exporter-two-gpus", cfg, tests)


def rule_cases() -> list[RuleCases]:
    return [flapping_cases(), exporter_cases(), multi_gpu_cases()]


def test_a_flapping_runtime_fires_flapping_and_one_outage_does_not(tmp_path):
    result = run_rule_cases(tmp_path, flapping_cases())
    assert result.ok, result.output


def test_gpu_exporter_up_without_the_services_gpu_series_or_gone_fires(tmp_path):
    result = run_rule_cases(tmp_path, exporter_cases())
    assert result.ok, result.output


def test_gpu_exporter_must_report_every_gpu_of_the_host(tmp_path):
    result = run_rule_cases(tmp_path, multi_gpu_cases())
    assert result.ok, result.output
