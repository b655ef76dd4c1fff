"""Every object of the k8s targets against its own project's schema: core objects with kubernetes-validate (strict),
Argo Rollouts, Prometheus Operator and Gateway API objects with the CRD schemas of the @kubernetes-models packages
(run by node; tests/setup.sh installs them into .node/), strict too: a misspelt field fails."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployctl.render.targets import render_files
from deployctl.render.validate import check_k8s_manifest
from support.render import API_KEY, make_config


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("k8s-rollout")
    paths = {}
    for f in render_files(make_config(), target="k8s-rollout", release_id="r1", api_key=API_KEY):
        if f.path.startswith("k8s/") and f.path.endswith(".yaml"):
            paths[f.path] = out / f.path.replace("/", "_")
            paths[f.path].write_text(f.content)
    return paths


def test_every_rendered_object_validates_against_its_schema(rendered):
    kinds = set()
    for path in rendered.values():
        result = check_k8s_manifest(path)
        assert result.ok, f"{path.name}: {result.output}"
        kinds |= {d["kind"] for d in yaml.safe_load_all(path.read_text()) if d}
    assert {"Rollout", "AnalysisTemplate", "PrometheusRule", "PodMonitor", "Service", "ConfigMap"} <= kinds


@pytest.mark.parametrize("file,field,wrong", [
    ("k8s/analysis-template.yaml", "successCondition:", "sucessCondition:"),
    ("k8s/analysis-template.yaml", "inconclusiveLimit:", "inconclusiveLimt:"),
    ("k8s/rollout.yaml", "canaryService:", "canarySvc:"),
    ("k8s/rollout.yaml", "podTemplateHashValue:", "podTemplateHash:"),
    ("k8s/pod-monitor.yaml", "podMetricsEndpoints:", "podMetricEndpoints:"),
    ("k8s/prometheus-rule.yaml", "expr:", "expression:"),
])
def test_a_wrong_field_name_fails_the_schema_check(rendered, tmp_path, file, field, wrong):
    text = rendered[file].read_text()
    assert field in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(field, wrong, 1))
    result = check_k8s_manifest(bad)
    assert not result.ok and wrong.rstrip(":") in result.output, result.output


def test_a_wrong_type_fails_the_crd_schema(rendered, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(rendered["k8s/analysis-template.yaml"].read_text().replace("failureLimit: 0", "failureLimit: [0]", 1))
    result = check_k8s_manifest(bad)
    assert not result.ok and "failureLimit" in result.output, result.output
