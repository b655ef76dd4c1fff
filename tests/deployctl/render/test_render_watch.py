"""The router's and the GPUs' alerts in `promtool test rules` on recorded series (mtail's counter from the router's
access log; dcgm-exporter's gauges: no GPU here, so nothing live), and the Grafana dashboard: every panel's PromQL
parses in Prometheus's own parser (promtool) and names only series that the rendered scrape targets export (the
bundled runtime's registry, the rendered mtail program run on a log line, dcgm-exporter's default counters)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from deployctl.engines import adapter
from deployctl.render.dashboard import dashboard_file, expressions
from deployctl.render.targets import _error_terms, render_alerts
from deployctl.render.validate import check_dashboard, check_dashboard_model
from deployctl.render.watch import router_files
from support.paths import DATA
from support.alerts import RuleCases, rendered_rules, run_rule_cases
from support.render import make_config

# dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter): the gauges and counters it exports by default
DCGM_DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE"}
# one line in the router's log_format (templates/nginx-upstream.conf.j2), as nginx writes it
LOG_LINE = ('{"time":"2026-12-02T03:00:00+00:00","msec":1764644400.000,"remote_addr":"127.0.0.1","request_method":'
            '"POST","uri":"/v1/completions","status":200,"body_bytes_sent":310,"request_time":0.120,"upstream_addr":'
            '"127.0.0.1:8080","upstream_status":"200","upstream_connect_time":"0.000","upstream_header_time":"0.010",'
            '"upstream_response_time":"0.120","probe":"","release":"r1"}')


def _expected(rules: dict, alertname: str, value: str = "", **labels: str) -> dict:
    """promtool's expected alert: the rule's labels plus ``labels``, annotations with $labels and $value filled."""
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == alertname)
    all_labels = {**rule["labels"], **labels}
    annotations = {}
    for k, v in rule["annotations"].items():
        for name, val in all_labels.items():
            v = v.replace("{{ $labels.%s }}" % name, val)
        annotations[k] = v.replace("{{ $value }}", value)
    return {"exp_labels": all_labels, "exp_annotations": annotations}


def router_cases() -> RuleCases:
    """3% of the router's answers are 502 (a runtime stopped behind it): fires; 0.5% does not; mtail's target gone
    (no up series at all) fires after slo.down_for_m, an mtail that answers does not."""
    cfg = make_config()
    rules = rendered_rules(cfg)
    c = 'deployctl_router_requests_total{job="mtail",deployctl_host="router",status="%s",release="%s"}'
    tests = [
        {"interval": "1m",
         "input_series": [{"series": c % ("200", "r1"), "values": "0+97x30"},
                          {"series": c % ("502", ""), "values": "0+3x30"},
                          {"series": 'up{job="mtail",deployctl_host="router"}', "values": "1x30"}],
         "alert_rule_test": [
             {"eval_time": "3m", "alertname": "DeployctlRouterErrorRateHigh", "exp_alerts": []},
             {"eval_time": "20m", "alertname": "DeployctlRouterErrorRateHigh",
              "exp_alerts": [_expected(rules, "DeployctlRouterErrorRateHigh")]},
             {"eval_time": "20m", "alertname": "DeployctlRouterMetricsDown", "exp_alerts": []}]},
        {"interval": "1m",  # 1 in 200 is under the 1% objective; a 429 (the client's limit) is no server error
         "input_series": [{"series": c % ("200", "r1"), "values": "0+190x30"},
                          {"series": c % ("429", ""), "values": "0+9x30"},
                          {"series": c % ("504", ""), "values": "0+1x30"}],
         "alert_rule_test": [
             {"eval_time": "20m", "alertname": "DeployctlRouterErrorRateHigh", "exp_alerts": []},
             {"eval_time": "3m", "alertname": "DeployctlRouterMetricsDown", "exp_alerts": []},
             {"eval_time": "10m", "alertname": "DeployctlRouterMetricsDown",
              "exp_alerts": [_expected(rules, "DeployctlRouterMetricsDown", job="mtail")]}]},
    ]
    return RuleCases("router", cfg, tests)


def test_router_5xx_share_and_a_silent_mtail_alert(tmp_path):
    result = run_rule_cases(tmp_path, router_cases())
    assert result.ok, result.output


def gpu_cases() -> RuleCases:
    """gpu-a serves on GPU 0, gpu-b on GPU 1 (deploy.yaml hosts[].gpu). Recorded dcgm-exporter series: GPU 0 of
    gpu-a past 95% of its memory fires, a fuller GPU 1 there (not the service's) does not; gpu-a's GPU idle while
    its runtime has requests waiting fires (gpu-b busy with a queue does not); Xid 79 on gpu-b's GPU 1 fires for
    15 minutes, on an unused GPU never."""
    cfg = make_config()
    rules = rendered_rules(cfg)
    d = 'DCGM_FI_DEV_%s{job="dcgm",deployctl_host="%s",gpu="%s"}'
    waiting = 'deployctl_runtime_num_requests_waiting{job="chat-7b",deployctl_host="%s",instance="%s:8080"}'
    tests = [
        {"interval": "1m",
         "input_series": [{"series": d % ("FB_USED", "gpu-a", "0"), "values": "77000x30"},
                          {"series": d % ("FB_FREE", "gpu-a", "0"), "values": "3000x30"},
                          {"series": d % ("FB_USED", "gpu-a", "1"), "values": "79900x30"},
                          {"series": d % ("FB_FREE", "gpu-a", "1"), "values": "100x30"},
                          {"series": d % ("FB_USED", "gpu-b", "1"), "values": "72000x30"},
                          {"series": d % ("FB_FREE", "gpu-b", "1"), "values": "8000x30"},
                          {"series": d % ("GPU_UTIL", "gpu-a", "0"), "values": "1x30"},
                          {"series": d % ("GPU_UTIL", "gpu-b", "1"), "values": "85x30"},
                          {"series": waiting % ("gpu-a", "10.0.0.11"), "values": "3x30"},
                          {"series": waiting % ("gpu-b", "10.0.0.12"), "values": "2x30"},
                          {"series": d % ("XID_ERRORS", "gpu-a", "0"), "values": "0x40"},
                          {"series": d % ("XID_ERRORS", "gpu-a", "3"), "values": "0x10 79x30"},
                          {"series": d % ("XID_ERRORS", "gpu-b", "1"), "values": "0x10 79x30"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "DeployctlGPUMemoryNearlyFull", "exp_alerts": []},
             {"eval_time": "15m", "alertname": "DeployctlGPUMemoryNearlyFull", "exp_alerts": [
                 _expected(rules, "DeployctlGPUMemoryNearlyFull", job="dcgm", deployctl_host="gpu-a", gpu="0")]},
             {"eval_time": "15m", "alertname": "DeployctlGPUIdleWhileRequestsWait", "exp_alerts": [
                 _expected(rules, "DeployctlGPUIdleWhileRequestsWait", deployctl_host="gpu-a")]},
             {"eval_time": "9m", "alertname": "DeployctlGPUXidError", "exp_alerts": []},
             {"eval_time": "12m", "alertname": "DeployctlGPUXidError", "exp_alerts": [
                 _expected(rules, "DeployctlGPUXidError", "79", job="dcgm", deployctl_host="gpu-b", gpu="1")]},
             {"eval_time": "30m", "alertname": "DeployctlGPUXidError", "exp_alerts": []}]},
        {"interval": "1m",
         "input_series": [{"series": 'up{job="dcgm",deployctl_host="gpu-b",instance="10.0.0.12:9400"}',
                           "values": "1x5 0x20"}],
         "alert_rule_test": [
             {"eval_time": "15m", "alertname": "DeployctlGPUMetricsDown", "exp_alerts": [
                 _expected(rules, "DeployctlGPUMetricsDown", job="dcgm", deployctl_host="gpu-b",
                           instance="10.0.0.12:9400")]}]},
        {"interval": "1m",  # an idle GPU with nothing waiting, a busy one with a queue: neither is stuck
         "input_series": [{"series": d % ("GPU_UTIL", "gpu-a", "0"), "values": "0x30"},
                          {"series": waiting % ("gpu-a", "10.0.0.11"), "values": "0x30"},
                          {"series": d % ("GPU_UTIL", "gpu-b", "1"), "values": "95x30"},
                          {"series": waiting % ("gpu-b", "10.0.0.12"), "values": "5x30"}],
         "alert_rule_test": [
             {"eval_time": "25m", "alertname": "DeployctlGPUIdleWhileRequestsWait", "exp_alerts": []}]},
    ]
    return RuleCases("gpu", cfg, tests)


def rule_cases() -> list[RuleCases]:
    return [router_cases(), gpu_cases()]


def test_gpu_memory_idle_and_xid_alerts_watch_the_services_gpus_only(tmp_path):
    result = run_rule_cases(tmp_path, gpu_cases())
    assert result.ok, result.output
    cpu = render_alerts(make_config(engine={"device": "cpu"})).content
    assert "DCGM_" not in cpu and "DeployctlRouterErrorRateHigh" in cpu  # no GPUs to watch on CPU hosts


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
             "inf", "nan", "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk",
             "quantile", "count_values"}  # operators, and aggregations (their "by (...)" may stand before the "(")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers that are neither functions, keywords, label names
    (inside {} or a by/on/ignoring list) nor numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    return {m.group(1) for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", text)
            if m.group(1).lower() not in _KEYWORDS}


def _runtime_exports() -> set[str]:
    """Series names of the bundled runtime's own registry (what its /metrics serves)."""
    from deployctl_runtime.server.metrics import Metrics

    names = set()
    for line in Metrics(lambda: None).render().decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def _mtail_exports(tmp_path, cfg) -> set[str]:
    """Series names the rendered mtail program exports after reading LOG_LINE (mtail --one_shot)."""
    mtail = shutil.which("mtail")
    if mtail is None:
        pytest.fail("mtail is not installed: run tests/setup.sh (apt-get install -y mtail)")
    progs = tmp_path / "progs"
    progs.mkdir()
    program = next(f for f in router_files(cfg) if f.path.endswith(".mtail"))
    (progs / "router.mtail").write_text(program.content)
    (tmp_path / "access.json").write_text(LOG_LINE + "\n")
    done = subprocess.run([mtail, "--progs", str(progs), "--logs", str(tmp_path / "access.json"), "--one_shot",
                           "--one_shot_format", "prometheus", "--emit_prog_label=false", "--logtostderr"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return {line.split("{")[0].split()[0] for line in done.stdout.splitlines() if line and not line.startswith("#")}


def test_dashboard_promql_parses_and_names_only_exported_series(tmp_path):
    cfg = make_config(slo={"e2e_p99_s": 20.0})
    rendered = dashboard_file(cfg, _error_terms(adapter("deployctl-runtime"), "chat-7b"))
    path = tmp_path / "dashboard.json"
    path.write_text(rendered.content)
    checked = check_dashboard(path)
    assert checked.ok, checked.output
    doc = json.loads(rendered.content)
    titles = [p["title"] for p in doc["panels"]]
    assert titles == ["Time to first token P99 vs objective", "Time per output token P99 vs objective",
                      "End-to-end latency P99 vs objective", "Error share: router and runtimes", "KV cache usage",
                      "Requests waiting and running", "GPU memory in use", "GPU utilisation",
                      "Share of answers per release (canary weight)"]
    exported = _runtime_exports() | _mtail_exports(tmp_path, cfg) | DCGM_DEFAULT_COUNTERS
    assert "deployctl_router_requests_total" in exported and "deployctl_runtime_kv_cache_usage_ratio" in exported
    named = {where: metric_names(expr) for where, expr in expressions(doc)}
    assert set().union(*named.values()) - exported == set(), named
    assert metric_names('sum by (le, deployctl_host) (rate(foo_bucket{job="x"}[5m])) / on (a) bar') == {"foo_bucket",
                                                                                                       "bar"}
    # a panel expression Prometheus cannot parse fails the check, naming the panel
    doc["panels"][4]["targets"][0]["expr"] = "max by (deployctl_host) (deployctl_runtime_kv_cache_usage_ratio"
    path.write_text(json.dumps(doc))
    broken = check_dashboard(path)
    assert not broken.ok and "'KV cache usage / A'" in broken.output, broken.output


def test_dashboard_is_grafana_foundation_sdks_model_and_a_foreign_key_fails_naming_it(tmp_path):
    cfg = make_config()
    path = tmp_path / "dashboard.json"
    path.write_text(dashboard_file(cfg, _error_terms(adapter("deployctl-runtime"), "chat-7b")).content)
    checked = check_dashboard_model(path)
    assert checked.ok, checked.output
    doc = json.loads(path.read_text())
    assert doc["uid"] == "deployctl-chat-7b" and doc["templating"]["list"][0]["type"] == "datasource"
    assert [p["id"] for p in doc["panels"]] == list(range(1, len(doc["panels"]) + 1))
    assert doc["panels"][1]["gridPos"] == {"h": 8, "w": 12, "x": 12, "y": 0}
    doc["panels"][2]["gridpos"] = doc["panels"][2].pop("gridPos")  # a hand edit Grafana would silently drop
    path.write_text(json.dumps(doc))
    broken = check_dashboard_model(path)
    assert not broken.ok and "panels[2].gridpos: not in the model" in broken.output, broken.output


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_dashboard_of_another_engine_uses_its_adapters_names(tmp_path, kind):
    from deployctl.config import parse_config

    cfg = parse_config((DATA / "engines" / f"deploy-{kind}.yaml").read_text(), "d.yaml")
    a = adapter(kind)
    job = cfg.slo.prometheus_job or cfg.service.name
    path = tmp_path / "dashboard.json"
    path.write_text(dashboard_file(cfg, _error_terms(a, job)).content)
    assert check_dashboard(path).ok
    ours = {n + s for n in a.metrics.names.values() if n for s in ("", "_bucket")}
    exported = ours | _mtail_exports(tmp_path, cfg) | DCGM_DEFAULT_COUNTERS
    used = set().union(*(metric_names(e) for _, e in expressions(json.loads(path.read_text()))))
    assert used and used - exported == set(), used - exported


def test_render_compiles_the_mtail_program_and_notes_a_missing_mtail(tmp_path, monkeypatch):
    from deployctl.render.validate import check_mtail_program

    program = tmp_path / "chat-7b.mtail"
    program.write_text(next(f for f in router_files(make_config()) if f.path.endswith(".mtail")).content)
    compiled = check_mtail_program(program)
    assert compiled.ok and not compiled.notes, compiled.output
    program.write_text(program.read_text().replace("counter deployctl_router_requests_total by status, release",
                                                   "counter deployctl_router_requests_total by status"))
    broken = check_mtail_program(program)  # the program indexes a label it no longer declares
    assert not broken.ok and "chat-7b.mtail" in broken.output, broken.output
    monkeypatch.setenv("PATH", str(tmp_path))  # no mtail on the operator's machine: noted, not failed
    missing = check_mtail_program(program)
    assert missing.ok and "apt-get install -y mtail" in missing.notes[0]
