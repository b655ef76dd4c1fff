"""Issue 39: DeployctlEngineStalled — requests running or waiting through 2 minutes and no generated token in
them — for the bundled runtime, vLLM and SGLang, each over its own adapter's metric names, run by the real
`promtool test rules`: it fires on a stalled series, and never on an idle engine, a slow but moving one, or a
request that has only just arrived. It links a shipped runbook."""
from __future__ import annotations

import pytest
import yaml

from deployctl.engines import adapter
from deployctl.render.targets import render_alerts
from support.alerts import RuleCases, rendered_rules, run_rule_cases
from support.render import make_config

ENGINES = {"deployctl-runtime": {}, "vllm": {"kind": "vllm", "version": "0.33.0"},
           "sglang": {"kind": "sglang", "version": "0.5.23"}}


def _series(name: str, instance: str, values: str, **labels: str) -> dict:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return {"series": f'{name}{{job="chat-7b",instance="{instance}"{extra}}}', "values": values}


def _stalled_rule(cfg) -> dict:
    return next(r for g in rendered_rules(cfg)["groups"] for r in g["rules"] if r.get("alert") == "DeployctlEngineStalled")


def stall_cases(kind: str) -> RuleCases:
    """Engine ``kind``'s own series: a stall fires; idle, slow-but-moving and only-just-open engines do not."""
    cfg = make_config(engine=ENGINES[kind])
    rule = _stalled_rule(cfg)
    m = adapter(cfg.engine.kind).metrics
    running, waiting, tokens = m["running"], m["waiting"], m["generation_tokens"]
    label = {"model_name": "m"}  # vLLM and SGLang label their series by model; the rule sums them per instance
    series = [
        # a: tokens until minute 5, then none while one request runs and two wait: stalled
        _series(running, "a", "1x30", **label), _series(waiting, "a", "2x30", **label),
        _series(tokens, "a", "0+50x5 250x25", **label),
        # b: idle: nothing open, no tokens
        _series(running, "b", "0x30", **label), _series(waiting, "b", "0x30", **label),
        _series(tokens, "b", "100x30", **label),
        # c: slow but moving: one request, one token a minute
        _series(running, "c", "1x30", **label), _series(waiting, "c", "0x30", **label),
        _series(tokens, "c", "0+1x30", **label),
        # d: idle for 10 minutes, then a request that gets no token: not at once, stalled once 2 minutes have passed
        _series(running, "d", "0x10 1x20", **label), _series(waiting, "d", "0x30", **label),
        _series(tokens, "d", "7x30", **label),
    ]

    def fired(*instances: str) -> list[dict]:
        out = []
        for i in instances:
            desc = rule["annotations"]
            out.append({"exp_labels": {**rule["labels"], "instance": i},
                        "exp_annotations": {**desc, "summary": desc["summary"].replace("{{ $labels.instance }}", i)}})
        return out

    tests = [{"interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": "4m", "alertname": "DeployctlEngineStalled", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "DeployctlEngineStalled", "exp_alerts": []},  # tokens in the window: not yet
        {"eval_time": "9m", "alertname": "DeployctlEngineStalled", "exp_alerts": fired("a")},
        {"eval_time": "11m", "alertname": "DeployctlEngineStalled", "exp_alerts": fired("a")},  # d: only just open
        {"eval_time": "14m", "alertname": "DeployctlEngineStalled", "exp_alerts": fired("a", "d")},
    ]}]
    return RuleCases(f"stall-{kind}", cfg, tests)


def rule_cases() -> list[RuleCases]:
    return [stall_cases(kind) for kind in sorted(ENGINES)]


@pytest.mark.parametrize("kind", sorted(ENGINES))
def test_engine_stalled_fires_on_a_stall_only(tmp_path, kind):
    cases = stall_cases(kind)
    m = adapter(cases.cfg.engine.kind).metrics
    expr = _stalled_rule(cases.cfg)["expr"]
    assert m["running"] in expr and m["waiting"] in expr and m["generation_tokens"] in expr
    result = run_rule_cases(tmp_path, cases)
    assert result.ok, result.output


def test_engine_stalled_links_a_shipped_runbook_and_is_left_out_without_the_metrics(tmp_path):
    from deployctl.resources import runbooks_dir

    rules = yaml.safe_load(render_alerts(make_config()).content)
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "DeployctlEngineStalled")
    assert (runbooks_dir() / f"{rule['annotations']['runbook']}.yaml").is_file()
    assert f"deployctl runbook run {rule['annotations']['runbook']}" in rule["annotations"]["description"]
    text = render_alerts(make_config(engine={"kind": "transformers", "version": "5.0.0"},
                                      model={"served_name": "/models/llm-7b-chat"},
                                      server={"api_key_env": None, "bind": "127.0.0.1"})).content
    assert "DeployctlEngineStalled" not in text  # transformers serve exports no metrics
