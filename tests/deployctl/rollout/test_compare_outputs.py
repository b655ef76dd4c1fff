"""`deployctl compare-outputs`, the golden-output check the k8s-rollout AnalysisTemplate's Job runs: a real runtime
on CPU with the tiny model answers the golden prompts; the same release agrees with itself (exit 0), a canary that
does not answer fails (exit 1). One server for the module."""
from __future__ import annotations

import pytest

from support.cli import run_cli
from support.render import write_config
from support.runtime import make_tiny_model, serve_runtime

KEY = "sk-compare-outputs-test"


ARGS = ("--max-model-len", "128", "--kv-cache-memory", "8MiB", "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return d, make_tiny_model(d)


@pytest.fixture(scope="module")
def runtime_url(tiny):
    with serve_runtime(tiny[1], tiny[0] / "runtime.log", *ARGS, env={"DEPLOYCTL_RUNTIME_API_KEY": KEY}) as url:
        yield url


@pytest.fixture
def deploy_yaml(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The capital of France is"}\n{"prompt": "One, two, three,"}\n')
    return write_config(tmp_path / "deploy.yaml", model={"path": "/models/tiny", "served_name": "tiny"},
                        rollout={"analysis": {"outputs": {"prompts": str(prompts), "max_tokens": 6, "timeout_s": 30}}})


def test_the_same_release_agrees_with_itself(runtime_url, deploy_yaml):
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", runtime_url, "--stable-url", runtime_url,
                "--no-chat", "--json", env={"LLM_API_KEY": KEY})
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    report = json.loads(r.stdout)
    assert (report["result"], report["mode"], report["compared"], report["identical"]) == ("pass", "exact", 2, 2)


def test_a_canary_whose_answers_differ_fails(runtime_url, tiny, deploy_yaml):
    """The same weights, but every output token replaced (the runtime's repeat_token fault): a wrong canary."""
    import json

    with serve_runtime(tiny[1], tiny[0] / "faulty.log", *ARGS,
                       env={"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_RUNTIME_FAULT": "repeat_token=7"}) as faulty:
        r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", faulty, "--stable-url", runtime_url,
                    "--no-chat", "--json", env={"LLM_API_KEY": KEY})
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["result"] == "fail" and report["compared"] == 2 and report["identical"] == 0, report


def test_a_canary_that_does_not_answer_fails(runtime_url, deploy_yaml):
    from support.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", dead, "--stable-url", runtime_url,
                "--no-chat", env={"LLM_API_KEY": KEY})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "golden outputs" in r.stderr


def test_a_bad_mode_is_a_usage_error(deploy_yaml):
    r = run_cli("compare-outputs", "-c", str(deploy_yaml), "--canary-url", "http://a:1", "--stable-url", "http://b:1",
                "--mode", "fuzzy")
    assert r.returncode == 2 and "--mode 'fuzzy' is not exact, prefix or skip" in r.stderr
