"""Prometheus alert rules: `promtool check rules` accepts them and `promtool test rules` shows each alert firing
on the series it is about (and staying quiet on the healthy ones)."""
from __future__ import annotations

import yaml

from deployctl.render.targets import render_alerts
from deployctl.render.validate import check_alert_rules
from support.alerts import RuleCases, expected, rendered_rules, run_rule_cases
from support.render import make_config

JOB = 'job="chat-7b"'
_expected = _expected_all = expected


def _hist(name: str, instance: str, per_min: dict[str, int]) -> list[dict]:
    """Cumulative histogram buckets growing by ``per_min`` requests per minute per bucket bound."""
    out, total = [], 0
    for le, n in per_min.items():
        total += n
        out.append({"series": f'{name}_bucket{{{JOB},instance="{instance}",le="{le}"}}', "values": f"0+{total}x40"})
    return out


def slo_cases() -> RuleCases:
    """KV cache, errors, TTFT/TPOT, rejections for length, restarts and the queue on the bundled runtime."""
    cfg = make_config(slo={"ttft_p99_s": 2.0, "tpot_p99_s": 0.1})
    rules = rendered_rules(cfg)
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
        {   # a healthy runtime: fast answers, no failures, the cache half full, a queue that comes and goes
            "interval": "1m",
            "input_series": [
                {"series": f'{m}kv_cache_usage_ratio{{{JOB},instance="a"}}', "values": "0.5x40"},
                {"series": f'{m}request_success_total{{{JOB},instance="a",finish_reason="stop"}}', "values": "0+100x40"},
                {"series": f'{m}request_rejected_total{{{JOB},instance="a",reason="queue_full"}}', "values": "0x40"},
                {"series": f'{m}num_requests_waiting{{{JOB},instance="a"}}', "values": "0 2 4 2 0 " * 8},
                {"series": f'process_start_time_seconds{{{JOB},instance="a"}}', "values": "100x40"},
                *_hist(f"{m}time_to_first_token_seconds", "a", {"0.5": 99, "2.5": 1, "+Inf": 0}),
                *_hist(f"{m}time_per_output_token_seconds", "a", {"0.025": 99, "0.05": 1, "+Inf": 0})],
            "alert_rule_test": [{"eval_time": "30m", "alertname": name, "exp_alerts": []} for name in (
                "DeployctlKVCacheNearlyFull", "DeployctlErrorRateHigh", "DeployctlTTFTP99OverObjective",
                "DeployctlTPOTP99OverObjective", "DeployctlRejectedForLength", "DeployctlQueueGrowing",
                "DeployctlRuntimeRestarted")],
        },
    ]
    return RuleCases("slo", cfg, tests)


def test_alert_rules_pass_promtool_and_fire_on_their_conditions(tmp_path):
    cases = slo_cases()
    rules_path = tmp_path / "alerts.rules.yaml"
    rules_path.write_text(render_alerts(cases.cfg).content)
    checked = check_alert_rules(rules_path)
    assert checked.ok and "SUCCESS: 26 rules found" in checked.output, checked.output
    result = run_rule_cases(tmp_path, cases)
    assert result.ok, result.output


def test_alert_thresholds_follow_slo_settings():
    cfg = make_config(slo={"ttft_p99_s": 0.75, "max_kv_cache_usage": 0.9, "prometheus_job": "llm"})
    text = render_alerts(cfg).content
    assert "> 0.75\n" in text and "> 0.9\n" in text and 'job="llm"' in text and 'job="chat-7b"' not in text


def down_cases() -> RuleCases:
    """A runtime that stays down, a host whose series disappear, a whole service gone, requests that end with an
    error mid-generation, E2E P99 over its objective, a filling disk."""
    cfg = make_config(slo={"e2e_p99_s": 20.0, "down_for_m": 5})
    rules = rendered_rules(cfg)
    m = "deployctl_runtime_"
    up = 'up{%s,instance="%s",deployctl_host="%s"}'
    gib = 2**30
    tests = [
        {   # gpu-a's series disappear at 10 m (its target left Prometheus); gpu-b is up: one host, not the service
            "interval": "1m",
            "input_series": [{"series": up % (JOB, "10.0.0.11:8080", "gpu-a"), "values": "1x10 _x30"},
                             {"series": up % (JOB, "10.0.0.12:8080", "gpu-b"), "values": "1x40"}],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "DeployctlRuntimeAbsent", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "DeployctlRuntimeAbsent",
                 "exp_alerts": [_expected_all(rules, "DeployctlRuntimeAbsent", job="chat-7b", deployctl_host="gpu-a")]},
                {"eval_time": "25m", "alertname": "DeployctlServiceDown", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "DeployctlRuntimeDown", "exp_alerts": []}],
        },
        {   # gpu-b fails its scrapes from 10 m, gpu-a's series are gone: the service is down
            "interval": "1m",
            "input_series": [{"series": up % (JOB, "10.0.0.11:8080", "gpu-a"), "values": "1x10 _x30"},
                             {"series": up % (JOB, "10.0.0.12:8080", "gpu-b"), "values": "1x10 0x30"}],
            "alert_rule_test": [
                {"eval_time": "12m", "alertname": "DeployctlServiceDown", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "DeployctlServiceDown",
                 "exp_alerts": [_expected_all(rules, "DeployctlServiceDown")]},
                {"eval_time": "25m", "alertname": "DeployctlRuntimeDown",
                 "exp_alerts": [_expected_all(rules, "DeployctlRuntimeDown", job="chat-7b", instance="10.0.0.12:8080",
                                              deployctl_host="gpu-b")]}],
        },
        {   # no target at all for the job (never scraped, or the job removed): the service is down
            "interval": "1m",
            "input_series": [{"series": 'up{job="other"}', "values": "1x40"}],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "DeployctlServiceDown",
                 "exp_alerts": [_expected_all(rules, "DeployctlServiceDown")]}],
        },
        {   # 3% of requests end with an error mid-generation, no rejection: the error alert counts them
            "interval": "1m",
            "input_series": [
                {"series": f'{m}request_success_total{{{JOB},instance="a",finish_reason="stop"}}', "values": "0+97x40"},
                {"series": f'{m}request_success_total{{{JOB},instance="a",finish_reason="error"}}', "values": "0+3x40"},
                {"series": f'{m}request_rejected_total{{{JOB},instance="a",reason="queue_full"}}', "values": "0x40"},
                *_hist(f"{m}e2e_request_latency_seconds", "a", {"5": 90, "30": 10, "+Inf": 0})],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "DeployctlErrorRateHigh",
                 "exp_alerts": [_expected(rules, "DeployctlErrorRateHigh")]},
                {"eval_time": "20m", "alertname": "DeployctlE2EP99OverObjective",
                 "exp_alerts": [_expected(rules, "DeployctlE2EP99OverObjective")]}],
        },
        {   # disk: 0.5 GiB free on gpu-a's /opt (full), 3 GiB on gpu-b's / (nearly); tmpfs and another host quiet
            "interval": "1m",
            "input_series": [
                {"series": f'node_filesystem_avail_bytes{{job="node",deployctl_host="gpu-a",mountpoint="/opt",fstype="ext4"}}',
                 "values": f"{gib // 2}x40"},
                {"series": f'node_filesystem_avail_bytes{{job="node",deployctl_host="gpu-b",mountpoint="/",fstype="xfs"}}',
                 "values": f"{3 * gib}x40"},
                {"series": f'node_filesystem_avail_bytes{{job="node",deployctl_host="gpu-b",mountpoint="/run",fstype="tmpfs"}}',
                 "values": "0x40"},
                {"series": f'node_filesystem_avail_bytes{{job="node",deployctl_host="db-1",mountpoint="/",fstype="ext4"}}',
                 "values": "0x40"}],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "DeployctlDiskFull",
                 "exp_alerts": [_expected_all(rules, "DeployctlDiskFull", job="node", deployctl_host="gpu-a",
                                              mountpoint="/opt", fstype="ext4")]},
                {"eval_time": "20m", "alertname": "DeployctlDiskNearlyFull",
                 "exp_alerts": [_expected_all(rules, "DeployctlDiskNearlyFull", job="node", deployctl_host=h,
                                              mountpoint=mp, fstype=fs)
                                for h, mp, fs in (("gpu-a", "/opt", "ext4"), ("gpu-b", "/", "xfs"))]}],
        },
        {   # healthy: both targets up, answers well inside the E2E objective, plenty of disk
            "interval": "1m",
            "input_series": [
                {"series": up % (JOB, "10.0.0.11:8080", "gpu-a"), "values": "1x40"},
                {"series": up % (JOB, "10.0.0.12:8080", "gpu-b"), "values": "1x40"},
                *_hist(f"{m}e2e_request_latency_seconds", "a", {"5": 99, "30": 1, "+Inf": 0}),
                *[{"series": f'node_filesystem_avail_bytes{{job="node",deployctl_host="{h}",mountpoint="/",fstype="ext4"}}',
                   "values": f"{50 * gib}x40"} for h in ("gpu-a", "gpu-b")]],
            "alert_rule_test": [{"eval_time": "30m", "alertname": name, "exp_alerts": []} for name in (
                "DeployctlRuntimeDown", "DeployctlRuntimeFlapping", "DeployctlRuntimeAbsent", "DeployctlServiceDown",
                "DeployctlE2EP99OverObjective", "DeployctlDiskNearlyFull", "DeployctlDiskFull")],
        },
    ]
    return RuleCases("down", cfg, tests)


def rule_cases() -> list[RuleCases]:
    return [slo_cases(), down_cases()]


def test_down_absent_error_finish_e2e_and_disk_alerts_fire(tmp_path):
    """Each fires in `promtool test rules` on its fault, and stays silent beside it."""
    result = run_rule_cases(tmp_path, down_cases())
    assert result.ok, result.output


def test_scrape_config_names_every_host_and_prometheus_accepts_it(tmp_path):
    """prometheus/scrape.yaml carries the deployctl_host label the per-host rules select on; promtool check config
    accepts it with the rules file loaded."""
    import shutil
    import subprocess

    from deployctl.render.targets import render_scrape

    cfg = make_config()
    doc = yaml.safe_load(render_scrape(cfg).content)
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {"chat-7b", "node", "mtail", "dcgm"} and jobs["chat-7b"]["metrics_path"] == "/metrics"

    def targets(job):
        return [(s["targets"], s["labels"]["deployctl_host"]) for s in jobs[job]["static_configs"]]

    assert targets("chat-7b") == [(["10.0.0.11:8080"], "gpu-a"), (["10.0.0.12:8080"], "gpu-b")]
    # mtail on the router host (router.host: local), dcgm-exporter on every CUDA host at their default ports
    assert targets("mtail") == [(["127.0.0.1:3903"], "router")]
    assert targets("dcgm") == [(["10.0.0.11:9400"], "gpu-a"), (["10.0.0.12:9400"], "gpu-b")]
    (tmp_path / "alerts.rules.yaml").write_text(render_alerts(cfg).content)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.rules.yaml"], "scrape_configs": doc["scrape_configs"]}))
    r = subprocess.run([shutil.which("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
