"""The AnalysisTemplate's PromQL run by the real `promtool test rules` on synthetic series of every window in
tests/data/analysis_cases.yaml: Successful, Failed or Inconclusive as deployctl deploy's judge says on the same
numbers (tests/deployctl/rollout/test_analysis_cases.py reads the same table).

Each Prometheus metric of the rendered template becomes two alert expressions, its query under its
successCondition and under its failureCondition (``result[0] <= 0.01`` → ``(query) <= 0.01``). Argo's verdict for
one measurement of every metric (failureLimit 0): Failed when any failure condition holds, Successful when every
success condition holds, Inconclusive otherwise (a NaN answer meets neither).
"""
from __future__ import annotations

import re

import pytest
import yaml

from deployctl.render.analysis import HASH_LABEL
from deployctl.render.targets import render_files
from deployctl.render.validate import run_rule_tests
from support.analysis_cases import CASES, config, e2e, kv
from support.render import API_KEY

CONDITION = re.compile(r"^result\[0\] (<=|>=|<|>) ([0-9.eE+-]+)$")
STEP_S, WINDOW_S = 15, 60
ALERT = {"pass": "AnalysisSuccessful", "fail": "AnalysisFailed"}


def _template(cfg) -> dict:
    files = {f.path: f for f in render_files(cfg, target="k8s-rollout", release_id="r1", api_key=API_KEY)}
    return yaml.safe_load(files["k8s/analysis-template.yaml"].content)


def _expr(query: str, condition: str) -> str:
    m = CONDITION.match(condition)
    assert m, f"condition {condition!r} has no PromQL translation here"
    return f"({query.strip()}) {m.group(1)} {m.group(2)}"


def _rules(template: dict, names: set[str]) -> dict:
    prom = [m for m in template["spec"]["metrics"] if "prometheus" in m["provider"]]
    assert {m["name"] for m in prom} == names
    args = {"canary-hash": "canaryhash", "stable-hash": "stablehash"}

    def q(m):
        text = m["provider"]["prometheus"]["query"]
        return re.sub(r"\{\{args\.([a-z-]+)\}\}", lambda a: args[a.group(1)], text)

    failed = " or ".join(_expr(q(m), m["failureCondition"]) for m in prom)
    success = " and ".join(_expr(q(m), m["successCondition"]) for m in prom)
    return {"groups": [{"name": "analysis", "rules": [{"alert": ALERT["fail"], "expr": failed},
                                                       {"alert": ALERT["pass"], "expr": success}]}]}


def _counter(name: str, labels: dict, total: float) -> dict:
    """Flat at 0, then rising by total/4 per 15 s step over the last 60 s before the 2 m evaluation."""
    rise = total / (WINDOW_S // STEP_S)
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": f"0x4 {rise}+{rise}x3"}


def _series(cfg, side: dict | None, hash_: str) -> list[dict]:
    """The engine's series for one side: its request counters (success + rejected, or the e2e histogram's count
    where it has no success counter) and TTFT/TPOT histograms with every sample in one bucket [0, p/0.99], so that
    histogram_quantile(0.99) is p."""
    from deployctl.engines import adapter

    if side is None:
        return []
    a = adapter(cfg.engine.kind)
    m = a.metrics
    base = {"namespace": cfg.container.namespace, "deployctl_service": cfg.service.name, HASH_LABEL: hash_}
    samples = side["requests"] - side["errors"]
    if cfg.engine.kind == "vllm":  # every finished request by finished_reason; the errors are "error"
        out = [_counter(m["success"], {**base, "finished_reason": "stop"}, samples),
               _counter(m["success"], {**base, "finished_reason": "error"}, side["errors"])]
    else:
        out = [_counter(m["success"], base, samples)] if m["success"] else [_counter(m["e2e"] + "_count", base, samples)]
    if cfg.engine.kind == "sglang":  # every HTTP response by endpoint and status code
        route = {**base, "endpoint": "/v1/chat/completions", "method": "POST"}
        out += [_counter(a.error_share.counter, {**route, "status_code": "200"}, samples),
                _counter(a.error_share.counter, {**route, "status_code": "500"}, side["errors"]),
                _counter(a.error_share.counter, {**base, "endpoint": "/health", "method": "GET", "status_code": "503"},
                         side["errors"] * 10)]  # not an OpenAI route: no part of the share
    if m["rejected"]:
        out.append(_counter(m["rejected"], {**base, "reason": "internal"}, side["errors"]))
    for role in ("ttft", "tpot", "e2e"):
        if not m[role]:
            continue
        le = (e2e(side) if role == "e2e" else side[f"{role}_p99_s"]) / 0.99
        for bound in (repr(le), "+Inf"):
            out.append(_counter(m[role] + "_bucket", {**base, "le": bound}, samples))
        out.append(_counter(m[role] + "_count", base, samples))
    if m["kv_usage"]:
        body = ", ".join(f'{k}="{v}"' for k, v in base.items())
        out.append({"series": f"{m['kv_usage']}{{{body}}}", "values": f"{kv(side)}x8"})
    return out


SLO = {"p99-ttft-slo", "p99-tpot-slo", "p99-e2e-slo", "kv-usage"}
ENGINES = {  # engine.kind -> (its engine settings, the Prometheus metrics its template has)
    "deployctl-runtime": ({}, {"error-rate", "p99-ttft-ratio", "p99-tpot-ratio", *SLO}),
    "vllm": ({"version": "0.33.0"}, {"error-rate", "p99-ttft-ratio", "p99-tpot-ratio", *SLO}),
    "sglang": ({"version": "0.5.23"}, {"error-rate", "p99-ttft-ratio", "p99-tpot-ratio", *SLO}),
}


@pytest.mark.parametrize("kind", list(ENGINES))
def test_analysis_template_promql_gives_the_table_verdicts(tmp_path, kind):
    """One promtool run per engine, a named test group per case. vLLM's error share is
    vllm:request_success_total{finished_reason="error"} over all of it, SGLang's the 5xx of its OpenAI routes in
    sglang:http_responses_total (Adapter.error_share): every case, the ones decided by errors alone included."""
    engine, names = ENGINES[kind]
    cfg = config(engine={"kind": kind, **engine})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules(_template(cfg), names)))
    cases = [c for c in CASES if "error-rate" in names or not c.get("errors_decide")]
    groups = []
    for case in cases:
        series = _series(cfg, case["canary"], "canaryhash") + _series(cfg, case["stable"], "stablehash")
        tests = [{"alertname": name, "eval_time": "2m",
                  "exp_alerts": [{"exp_labels": {}}] if case["verdict"] == v else []} for v, name in ALERT.items()]
        groups.append({"name": f"{case['name']}: {case['verdict']}", "interval": f"{STEP_S}s",
                       "input_series": series, "alert_rule_test": tests})
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": f"{STEP_S}s", "tests": groups}))
    result = run_rule_tests(tmp_path / "test.yaml")
    assert result.ok, f"{kind}: a case's PromQL verdict differs from the table\n{result.output}"
    assert len(cases) == len(CASES)
