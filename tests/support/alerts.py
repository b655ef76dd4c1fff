"""promtool unit tests of the rendered alert rules, as data (a helper module, not a test file).

A ``RuleCases`` is one deploy.yaml and the promtool ``tests:`` groups over the rules rendered from it. The test
modules that own alert cases expose them through a module-level ``rule_cases()``; each runs its own with
``run_rule_cases``, and tests/deployctl/render/test_render_alerts_every_rule.py collects all of them to check that
every rendered alert has a case where it fires and one where it stays silent."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.render import promtool_rule_tests


@dataclass(frozen=True)
class RuleCases:
    """``tests``: promtool test groups (interval, input_series, alert_rule_test) over render_alerts(``cfg``)."""

    label: str
    cfg: Any
    tests: list[dict]

    def checks(self) -> list[tuple[str, bool]]:
        """(alertname, fires) for every alert_rule_test: fires is False where exp_alerts is empty."""
        return [(t["alertname"], bool(t["exp_alerts"])) for g in self.tests for t in g["alert_rule_test"]]


def rendered_rules(cfg) -> dict:
    """The parsed prometheus/alerts.rules.yaml of ``cfg``."""
    from deployctl.render.targets import render_alerts

    return yaml.safe_load(render_alerts(cfg).content)


def alert_names(cfg) -> list[str]:
    return [r["alert"] for g in rendered_rules(cfg)["groups"] for r in g["rules"]]


def expected(rules: dict, alertname: str, value: str = "", **labels: str) -> dict:
    """promtool's expected alert: the rule's labels plus ``labels`` (the first rule of that name whose labels agree
    with ``labels``), its annotations with ``{{ $labels.NAME }}`` and ``{{ $value }}`` filled."""
    rule = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == alertname
                and all(r["labels"].get(k, v) == v for k, v in labels.items()))
    all_labels = {**rule["labels"], **labels}
    annotations = {}
    for k, v in rule["annotations"].items():
        for name, val in all_labels.items():
            v = v.replace("{{ $labels.%s }}" % name, val)
        annotations[k] = re.sub(r"\{\{ \$labels\.\w+ \}\}", "", v.replace("{{ $value }}", value))  # absent: ""
    return {"exp_labels": all_labels, "exp_annotations": annotations}


def run_rule_cases(tmp_path: Path, cases: RuleCases):
    """Render ``cases.cfg``'s rules, check them (`promtool check rules`) and run ``cases.tests`` on them
    (`promtool test rules`); returns the test run's ValidationResult (ok, output)."""
    from deployctl.render.targets import render_alerts
    from deployctl.render.validate import check_alert_rules

    name = "".join(c if c.isalnum() else "-" for c in cases.label)
    rules_path = tmp_path / f"{name}.rules.yaml"
    rules_path.write_text(render_alerts(cases.cfg).content)
    checked = check_alert_rules(rules_path)
    assert checked.ok, checked.output
    return promtool_rule_tests(tmp_path / f"{name}.test.yaml", rules_path, cases.tests)
