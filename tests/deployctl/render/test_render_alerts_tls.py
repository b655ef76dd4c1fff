"""Certificate alerts (router.tls): blackbox_exporter's ``probe_ssl_earliest_cert_expiry`` and ``probe_success`` for
https://server_name, checked by `promtool check rules` and unit-tested with `promtool test rules`: each alert fires
on its condition, only for this service's probe, and stays quiet on a healthy certificate."""
from __future__ import annotations

from deployctl.render.targets import render_alerts
from deployctl.render.validate import check_alert_rules
from support.alerts import RuleCases, rendered_rules, run_rule_cases
from support.render import make_config

DAY = 86400
TLS = {"certificate": "/etc/ssl/llm.pem", "key": "/etc/ssl/llm.key", "probe_job": "blackbox-https"}


def _alert(rules: dict, name: str, **labels: str) -> dict:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == name)
    annotations = {k: v.replace("{{ $labels.instance }}", labels.get("instance", ""))
                   for k, v in rule["annotations"].items()}
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def _expiry(instance: str, expires_at_s: int, job: str = "blackbox-https") -> dict:
    return {"series": f'probe_ssl_earliest_cert_expiry{{job="{job}",instance="{instance}"}}',
            "values": f"{expires_at_s}x300"}


def tls_cases() -> RuleCases:
    cfg = make_config(router={"server_name": "llm.example.com", "listen": 443, "tls": TLS})
    rules = rendered_rules(cfg)
    ours_20d, ours_3d = "https://llm.example.com:443", "https://llm.example.com/v1/models"
    tests = [
        {   # promtool starts at time() = 0: a value of N days is N days left.
            "interval": "1m",
            "input_series": [_expiry(ours_20d, 20 * DAY), _expiry(ours_3d, 3 * DAY),
                             _expiry("https://other.example.com", 1 * DAY),  # another service's probe
                             _expiry("https://llm.example.com", 1 * DAY, job="blackbox-other")],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "DeployctlCertificateExpiresSoon", "exp_alerts": []},  # for: 1h
                {"eval_time": "2h", "alertname": "DeployctlCertificateExpiresSoon",
                 "exp_alerts": [_alert(rules, "DeployctlCertificateExpiresSoon", instance=ours_20d),
                                _alert(rules, "DeployctlCertificateExpiresSoon", instance=ours_3d)]},
                {"eval_time": "30m", "alertname": "DeployctlCertificateExpiresVerySoon",
                 "exp_alerts": [_alert(rules, "DeployctlCertificateExpiresVerySoon", instance=ours_3d)]}],
        },
        {   # a healthy certificate (90 days left) and a probe that answers: quiet; a failing probe: alert.
            "interval": "1m",
            "input_series": [_expiry(ours_20d, 90 * DAY),
                             {"series": f'probe_success{{job="blackbox-https",instance="{ours_20d}"}}',
                              "values": "1x300"},
                             {"series": 'probe_success{job="blackbox-https",instance="https://llm.example.com:8443"}',
                              "values": "0x300"}],
            "alert_rule_test": [
                {"eval_time": "3h", "alertname": "DeployctlCertificateExpiresSoon", "exp_alerts": []},
                {"eval_time": "3h", "alertname": "DeployctlCertificateExpiresVerySoon", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "DeployctlTLSProbeFailing",
                 "exp_alerts": [_alert(rules, "DeployctlTLSProbeFailing", job="blackbox-https",
                                       instance="https://llm.example.com:8443")]}],
        },
        {   # the probe answers: quiet
            "interval": "1m",
            "input_series": [{"series": f'probe_success{{job="blackbox-https",instance="{ours_20d}"}}',
                              "values": "1x300"}],
            "alert_rule_test": [{"eval_time": "3h", "alertname": "DeployctlTLSProbeFailing", "exp_alerts": []}],
        },
    ]
    return RuleCases("tls", cfg, tests)


def rule_cases() -> list[RuleCases]:
    return [tls_cases()]


def test_certificate_alerts_fire_on_expiry_for_this_service_only(tmp_path):
    cases = tls_cases()
    rules_path = tmp_path / "alerts.rules.yaml"
    rules_path.write_text(render_alerts(cases.cfg).content)
    checked = check_alert_rules(rules_path)
    assert checked.ok and "SUCCESS: 29 rules found" in checked.output, checked.output
    result = run_rule_cases(tmp_path, cases)
    assert result.ok, result.output


def test_no_certificate_alerts_without_tls_and_a_wildcard_name_matches_one_label():
    assert "Certificate" not in render_alerts(make_config()).content
    text = render_alerts(make_config(router={"server_name": "*.example.com", "tls": TLS})).content
    assert r'instance=~"https://[^/:.]+\\.example\\.com(:[0-9]+)?(/.*)?"' in text
