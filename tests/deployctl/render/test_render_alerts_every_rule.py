"""Issue 40: every alert that deployctl renders, for every engine kind and the optional parts (E2E objective, router
TLS, CUDA GPUs), has a `promtool test rules` case where it fires on its fault and one where it stays silent. The
cases live beside the feature they test (each module's ``rule_cases()``); this collects them, runs them all through
the real promtool, and fails naming any rendered alert that lacks either case, so a new alert without tests breaks
the suite. Every alert also names the runbook that handles it (annotation ``runbook``)."""
from __future__ import annotations

import re

import pytest

from support.alerts import alert_names, rendered_rules, run_rule_cases
from support.paths import REPO
from support.render import make_config

TLS = {"certificate": "/etc/ssl/llm.pem", "key": "/etc/ssl/llm.key"}
FULL = {"slo": {"e2e_p99_s": 20.0}, "router": {"server_name": "llm.example.com", "listen": 443, "tls": TLS}}
# configurations that together render every alert deployctl has
CONFIGS = {
    "deployctl-runtime": make_config(**FULL),
    "vllm": make_config(engine={"kind": "vllm", "version": "0.33.0"}, **FULL),
    "sglang": make_config(engine={"kind": "sglang", "version": "0.5.23"}, **FULL),
    "cpu": make_config(engine={"device": "cpu"}, **FULL),
}
CASE_MODULES = ("test_render_alerts", "test_render_alerts_stall", "test_render_alerts_tls",
                "test_render_alerts_targets", "test_render_watch", "test_render_alerts_autoscale")


def _all_cases() -> list:
    import importlib

    out = []
    for name in CASE_MODULES:
        module = importlib.import_module(f"{__package__}.{name}" if __package__ else name)
        out += module.rule_cases()
    return out


def _rendered() -> set[str]:
    return {name for cfg in CONFIGS.values() for name in alert_names(cfg)}


def test_every_rendered_alert_has_a_firing_and_a_silent_promtool_case():
    checks = [c for cases in _all_cases() for c in cases.checks()]
    fires = {name for name, fired in checks if fired}
    silent = {name for name, fired in checks if not fired}
    rendered = _rendered()
    assert len(rendered) >= 25, sorted(rendered)
    missing = {name: [what for what, have in (("firing", name in fires), ("silent", name in silent)) if not have]
               for name in sorted(rendered)}
    gaps = {k: v for k, v in missing.items() if v}
    assert not gaps, ("rendered alerts without a promtool case where they fire / stay silent (add one to the "
                      f"rule_cases() of the module that tests them): {gaps}")


def test_every_case_passes_promtool(tmp_path):
    failed = []
    for cases in _all_cases():
        result = run_rule_cases(tmp_path, cases)
        if not result.ok:
            failed.append(f"{cases.label}: {result.output}")
    assert failed == []


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_every_alert_names_a_runbook_that_exists(kind):
    from deployctl.resources import runbooks_dir

    for group in rendered_rules(CONFIGS[kind])["groups"]:
        for rule in group["rules"]:
            runbook = rule["annotations"].get("runbook")
            assert runbook, f"{rule['alert']} has no runbook annotation"
            if "/" not in runbook:  # a deployctl runbook: `deployctl runbook run NAME`
                assert (runbooks_dir() / f"{runbook}.yaml").is_file(), (rule["alert"], runbook)
                continue
            path, _, anchor = runbook.partition("#")  # a document of this repository, and its section
            assert (REPO / path).is_file(), (rule["alert"], runbook)
            assert not anchor or anchor in _anchors((REPO / path).read_text()), (rule["alert"], runbook)
