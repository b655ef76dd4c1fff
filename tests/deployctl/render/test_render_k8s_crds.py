"""Every object of the k8s targets against its own project's schema: core objects with kubernetes-validate (strict),
Argo Rollouts, Prometheus Operator, Gateway API and KEDA objects with the CRD schemas of the @kubernetes-models packages
(run by node; tests/setup_test_venvs.sh installs them into .node/), strict too: a misspelt field fails."""
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
    assert {"Rollout", "AnalysisTemplate", "PrometheusRule", "PodMonitor", "Service", "ConfigMap", "HTTPRoute",
            "InferencePool", "ScaledObject"} <= kinds


@pytest.mark.parametrize("file,field,wrong", [
    ("k8s/analysis-template.yaml", "successCondition:", "sucessCondition:"),
    ("k8s/analysis-template.yaml", "inconclusiveLimit:", "inconclusiveLimt:"),
    ("k8s/rollout.yaml", "canaryService:", "canarySvc:"),
    ("k8s/rollout.yaml", "podTemplateHashValue:", "podTemplateHash:"),
    ("k8s/pod-monitor.yaml", "podMetricsEndpoints:", "podMetricEndpoints:"),
    ("k8s/prometheus-rule.yaml", "expr:", "expression:"),
    ("k8s/http-route.yaml", "backendRefs:", "backendRef:"),
    ("k8s/http-route.yaml", "parentRefs:", "parents:"),
    ("k8s/scaledobject.yaml", "minReplicaCount:", "minReplicas:"),
    ("k8s/scaledobject.yaml", "scaleTargetRef:", "scaleTarget:"),
    # InferencePool has no published schema: this is the weaker check, against the fields of the extension's API
    # reference as transcribed in deployctl/render/poolschema.py
    ("k8s/inference-pool.yaml", "targetPorts:", "targetPort:"),
    ("k8s/inference-pool.yaml", "endpointPickerRef:", "extensionRef:"),
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


def test_http_route_weights_carry_the_canary_split(tmp_path):
    from deployctl.render.gateway import http_route

    route = http_route(make_config(), 25)
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [
        ("chat-7b-stable", 75), ("chat-7b-canary", 25)]
    path = tmp_path / "route.yaml"
    path.write_text(yaml.safe_dump(route))
    assert check_k8s_manifest(path).ok


def test_inference_pools_select_the_tracks_argo_labels(rendered):
    pools = [d for d in yaml.safe_load_all(rendered["k8s/inference-pool.yaml"].read_text()) if d]
    ro = yaml.safe_load(rendered["k8s/rollout.yaml"].read_text())["spec"]["strategy"]["canary"]
    for pool, track in zip(pools, ("stable", "canary")):
        assert pool["spec"]["selector"]["matchLabels"]["deployctl/track"] == track
        assert ro[f"{track}Metadata"]["labels"] == {"deployctl/track": track}
        assert pool["spec"]["targetPorts"] == [{"number": 8080}]


@pytest.mark.parametrize("kind,queued,running,kv", [
    ("vllm", "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    ("sglang", "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
])
def test_endpoint_picker_metric_names_come_from_the_engine_adapter(kind, queued, running, kv):
    """The model server protocol's gauges (queue length, running requests, KV-cache utilization) under the names
    the extension's docs list for vLLM and SGLang; the bundled runtime's come from its adapter the same way."""
    from deployctl.render.gateway import epp_metric_flags

    assert epp_metric_flags(kind) == {"--total-queued-requests-metric": queued,
                                      "--total-running-requests-metric": running,
                                      "--kv-cache-usage-percentage-metric": kv}
    assert epp_metric_flags("transformers") == {}


def test_prometheus_rule_carries_the_plain_rules_and_the_pod_monitor_scrapes_the_pods():
    files = {f.path: f.content for f in render_files(make_config(), target="k8s", release_id="r1", api_key=API_KEY)}
    rule = yaml.safe_load(files["k8s/prometheus-rule.yaml"])
    assert rule["spec"]["groups"] == yaml.safe_load(files["prometheus/alerts.rules.yaml"])["groups"]
    monitor = yaml.safe_load(files["k8s/pod-monitor.yaml"])["spec"]
    pod = yaml.safe_load(files["k8s/deployment.yaml"])["spec"]["template"]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    endpoint = monitor["podMetricsEndpoints"][0]
    assert endpoint["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "7s"  # a quarter of the 30 s window
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"deployctl_service", "rollouts_pod_template_hash"}


def test_scaledobject_follows_deploy_yaml_autoscale_and_validates(tmp_path):
    files = {f.path: f.content for f in render_files(
        make_config(autoscale={"min_hosts": 2, "max_hosts": 6, "scale_out_kv_usage": 0.8, "cooldown_s": "10m"}),
        target="k8s", release_id="r1", api_key=API_KEY)}
    doc = yaml.safe_load(files["k8s/scaledobject.yaml"])
    spec = doc["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-7b"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (2, 6, 600)
    triggers = {t["name"]: t["metadata"] for t in spec["triggers"]}
    assert triggers["kv-cache"]["threshold"] == "0.8"
    assert "deployctl_runtime_num_requests_waiting" in triggers["waiting"]["query"]
    path = tmp_path / "scaledobject.yaml"
    path.write_text(files["k8s/scaledobject.yaml"])
    result = check_k8s_manifest(path)
    assert result.ok and "ScaledObject: checked against the keda.sh/v1alpha1 CRD schema" in " ".join(result.notes), \
        (result.output, result.notes)
