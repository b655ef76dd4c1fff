"""Container and Kubernetes targets: manifests pass kubernetes-validate (and fail it when wrong), probes are
sized to the model load, the key comes from a Secret, the weights are mounted read-only and never baked in."""
from __future__ import annotations

import yaml

import pytest

from deployctl.errors import ConfigError
from deployctl.render.targets import render_files
from deployctl.render.validate import check_compose, check_k8s_manifest
from support.render import API_KEY, make_config


def _by_path(target: str, **sections):
    cfg = make_config(**sections)
    return {f.path: f for f in render_files(cfg, target=target, release_id="r1", api_key=API_KEY)}


def _write(tmp_path, f):
    path = tmp_path / f.path.replace("/", "_")
    path.write_text(f.content)
    return path


def test_deployment_validates_and_carries_probes_gpu_and_secret(tmp_path):
    files = _by_path("k8s", server={"startup_timeout_s": 900})
    for name in ("k8s/deployment.yaml", "k8s/service.yaml", "k8s/configmap.yaml"):
        result = check_k8s_manifest(_write(tmp_path, files[name]))
        assert result.ok, result.output
    dep = yaml.safe_load(files["k8s/deployment.yaml"].content)
    assert dep["kind"] == "Deployment" and dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    start = c["startupProbe"]
    assert start["httpGet"]["path"] == "/readyz" and start["periodSeconds"] * start["failureThreshold"] >= 900
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["env"] == [{"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
                        {"name": "DEPLOYCTL_RUNTIME_API_KEY", "valueFrom": {"secretKeyRef": {
                            "name": "chat-7b-api-key", "key": "DEPLOYCTL_RUNTIME_API_KEY"}}}]
    model_mount = next(m for m in c["volumeMounts"] if m["name"] == "model")
    assert model_mount == {"name": "model", "mountPath": "/models/llm-7b-chat", "readOnly": True}
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30  # above the drain timeout
    cm = yaml.safe_load(files["k8s/configmap.yaml"].content)
    runtime = yaml.safe_load(cm["data"]["runtime.yaml"])
    assert runtime["host"] == "0.0.0.0" and runtime["release_id"] == "r1"
    assert cm["metadata"]["name"] == dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert all(API_KEY not in f.content for p, f in files.items() if p != "k8s/runtime.env")


def test_wrong_manifest_fails_kubernetes_validate_with_the_field_path(tmp_path):
    files = _by_path("k8s")
    bad = files["k8s/deployment.yaml"].content.replace("periodSeconds: 10\n", "periodSeconds: ten\n", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    result = check_k8s_manifest(path)
    assert not result.ok and "startupProbe.periodSeconds" in result.output and "'ten'" in result.output


def test_argo_rollout_has_canary_steps_and_a_valid_pod_template(tmp_path):
    files = _by_path("k8s-rollout", rollout={"steps": [10, 50, 100], "pause_s": 120})
    result = check_k8s_manifest(_write(tmp_path, files["k8s/rollout.yaml"]))
    assert result.ok and result.notes, result.output
    ro = yaml.safe_load(files["k8s/rollout.yaml"].content)
    assert ro["apiVersion"] == "argoproj.io/v1alpha1" and ro["kind"] == "Rollout"
    analysis = {"analysis": {"templates": [{"templateName": "chat-7b-canary"}], "args": [
        {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}},
        {"name": "stable-hash", "valueFrom": {"podTemplateHashValue": "Stable"}}]}}
    assert ro["spec"]["strategy"]["canary"]["steps"] == [{"setWeight": 10}, analysis, {"setWeight": 50}, analysis]
    template = yaml.safe_load(files["k8s/analysis-template.yaml"].content)
    assert {m["name"]: m["count"] for m in template["spec"]["metrics"]} == {  # 120 s pause / 30 s interval
        "error-rate": 4, "p99-ttft-ratio": 4, "p99-tpot-ratio": 4, "p99-ttft-slo": 4, "p99-tpot-slo": 4,
        "kv-usage": 4, "golden-outputs": 1}
    broken = files["k8s/rollout.yaml"].content.replace("setWeight: 10", "setWeight: 110")
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    assert "setWeight: 0..100, got 110" in check_k8s_manifest(path).output


def test_argo_rollout_steps_with_their_own_pause_pass_their_measurement_count(tmp_path):
    """rollout.steps with different pauses: the AnalysisTemplate's count is an argument each Rollout step sets
    (Argo's count is an int-or-string); both documents validate against Argo's schema."""
    files = _by_path("k8s-rollout", rollout={"steps": [{"weight": 10, "pause": "4m"}, {"weight": 50, "pause": "1m"},
                                                       100], "analysis": {"interval_s": 30}})
    for path in ("k8s/rollout.yaml", "k8s/analysis-template.yaml"):
        result = check_k8s_manifest(_write(tmp_path, files[path]))
        assert result.ok, result.output
    ro = yaml.safe_load(files["k8s/rollout.yaml"].content)
    counts = [a["value"] for s in ro["spec"]["strategy"]["canary"]["steps"] if "analysis" in s
              for a in s["analysis"]["args"] if a["name"] == "measurements"]
    assert counts == ["8", "2"]
    template = yaml.safe_load(files["k8s/analysis-template.yaml"].content)
    assert {m["count"] for m in template["spec"]["metrics"] if m["name"] != "golden-outputs"} == {"{{args.measurements}}"}


def test_k8s_needs_a_pod_reachable_bind():
    with pytest.raises(ConfigError, match="server.bind is 127.0.0.1"):
        _by_path("k8s", server={"bind": "127.0.0.1", "api_key_env": None})


def test_container_files(tmp_path):
    files = _by_path("container")
    compose = yaml.safe_load(files["hosts/gpu-b/compose.yaml"].content)
    svc = compose["services"]["runtime"]
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["1"], "capabilities": ["gpu"]}]
    assert svc["volumes"][0]["read_only"] is True and svc["volumes"][0]["source"] == "/models/llm-7b-chat"
    assert "/readyz" in " ".join(svc["healthcheck"]["test"]) and svc["healthcheck"]["start_period"] == "600s"
    assert check_compose(_write(tmp_path, files["hosts/gpu-b/compose.yaml"])).ok
    no_gpu = files["hosts/gpu-b/compose.yaml"].content.replace("read_only: true", "read_only: false")
    (tmp_path / "c.yaml").write_text(no_gpu)
    assert "not read_only" in check_compose(tmp_path / "c.yaml").output
    docker = files["hosts/gpu-b/Dockerfile"].content
    instructions = [line.split()[0] for line in docker.splitlines() if line and not line.startswith((" ", "#"))]
    assert instructions[0] == "FROM" and "HEALTHCHECK" in instructions and "USER" in instructions
    copies = [line for line in docker.splitlines() if line.startswith(("COPY", "ADD"))]
    assert all("/models" not in line and "safetensors" not in line for line in copies)  # weights never baked in
    assert API_KEY not in docker and files["hosts/gpu-b/runtime.env"].mode == 0o600


@pytest.mark.parametrize("kind,extra", [("deployctl-runtime", {}), ("vllm", {"version": "0.11.0"}),
                                        ("sglang", {"version": "0.5.23"})])
def test_termination_grace_covers_the_engines_drain(kind, extra):
    """The runtime and vLLM finish in-flight requests after SIGTERM; SGLang cuts them, so its pod waits out
    server.drain_timeout_s in preStop (endpoints no longer send it requests) before the signal. Either way the grace
    period covers preStop plus the drain."""
    from deployctl.engines import adapter

    files = _by_path("k8s-rollout", engine={"kind": kind, **extra}, server={"drain_timeout_s": 40})
    spec = yaml.safe_load(files["k8s/rollout.yaml"].content)["spec"]["template"]["spec"]
    prestop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    drains = adapter(kind).sigterm_drains
    assert prestop == (5 if drains else 45)
    assert spec["terminationGracePeriodSeconds"] >= prestop + 40 + 10


def test_the_analysis_job_reads_the_same_deploy_yaml_and_prompts(tmp_path):
    """The golden-output Job's ConfigMap holds deploy.yaml as rendered (its thresholds: one home) and the prompt
    file, at the path the Job mounts; the Job runs compare-outputs against the canary and stable Services."""
    from deployctl.config import parse_config

    prompts = tmp_path / "golden.jsonl"
    prompts.write_text('{"prompt": "Hello"}\n')
    files = _by_path("k8s-rollout", rollout={"analysis": {"outputs": {"prompts": str(prompts), "min_prefix_share": 0.8}}})
    data = yaml.safe_load(files["k8s/analysis-config.yaml"].content)["data"]
    assert data["prompts.jsonl"] == '{"prompt": "Hello"}\n'
    cfg = parse_config(data["deploy.yaml"], "analysis-config.yaml")
    assert cfg.rollout.analysis.outputs.prompts == "/etc/deployctl/prompts.jsonl"
    assert cfg.rollout.analysis.outputs.min_prefix_share == 0.8 and cfg.service.name == "chat-7b"
    template = yaml.safe_load(files["k8s/analysis-template.yaml"].content)
    job = next(m for m in template["spec"]["metrics"] if m["name"] == "golden-outputs")["provider"]["job"]
    pod = job["spec"]["template"]["spec"]
    cmd = pod["containers"][0]["command"]
    assert cmd[:4] == ["deployctl", "compare-outputs", "--config", "/etc/deployctl/deploy.yaml"]
    assert cmd[cmd.index("--canary-url") + 1] == "http://chat-7b-canary.default.svc:8080"
    assert pod["volumes"][0]["configMap"]["name"] == "chat-7b-analysis-config"
    assert pod["containers"][0]["env"][0]["name"] == "LLM_API_KEY"  # what compare-outputs reads (server.api_key_env)
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigError, match="missing.jsonl"):
        _by_path("k8s-rollout", rollout={"analysis": {"outputs": {"prompts": str(missing)}}})
