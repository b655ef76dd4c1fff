"""The functional layer against the tiny runtime on CPU with a fault that breaks answers: each fault fails the
layer, naming the check and the case (the prompt). One runtime per fault, shared by the module."""
from __future__ import annotations

import contextlib
import sys

import pytest

from deployctl.validate.client import Endpoint
from deployctl.validate.functional import run_functional
from support.cli import deployctl
from support.runtime import serve_runtime

CONTEXT = 256
FAULTS = {
    "truncate": "clamp_max_tokens=4",  # every answer silently cut after 4 tokens
    "garble": "garble_text=1",  # U+FFFD at the start of every text delta
    "loop": "repeat_token=300",  # every output token is token 300
}


@pytest.fixture(scope="module")
def faulty(rollout_model, tmp_path_factory):
    """{fault name: base URL} of three runtimes started together (their start-ups overlap)."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, fault in FAULTS.items():
            log = tmp_path_factory.mktemp(f"fault-{name}") / "serve.log"
            urls[name] = stack.enter_context(serve_runtime(
                rollout_model, log, "--max-model-len", str(CONTEXT), "--kv-cache-memory", "8MiB",
                env={"DEPLOYCTL_RUNTIME_FAULT": fault}))
        yield urls


def _layer(url: str):
    return run_functional(Endpoint(url, None, CONTEXT), timeout=60)


def test_clamped_max_tokens_fail_truncation_naming_the_prompt(faulty):
    res = _layer(faulty["truncate"])
    assert res.verdict == "fail"
    assert any(p.startswith("truncation on 'short' (chat)") and "after 4 of max_tokens 16" in p
               for p in res.problems), res.problems
    # the at-the-limit request is cut as well, its prompt + max_tokens (= max_model_len) named
    at = next(c for c in res.details["cases"] if c["id"] == "at-limit")
    assert at["prompt_tokens"] + at["max_tokens"] == CONTEXT
    assert any(p.startswith("truncation on 'at-limit'") and f"(prompt {at['prompt_tokens']} + max_tokens "
               f"{at['max_tokens']})" in p for p in res.problems), res.problems
    # the 400s are still the documented ones: only the answers are wrong
    statuses = {c["id"]: c["checks"].get("status") for c in res.details["cases"]}
    assert statuses["over-long"] == statuses["empty"] == "pass"


def test_garbled_text_fails_invalid_utf8_beyond_what_the_tokens_decode_to(faulty):
    res = _layer(faulty["garble"])
    assert res.verdict == "fail"
    bad = [p for p in res.problems if p.startswith("invalid_utf8 on 'short'")]
    assert bad and "the server garbles the text" in bad[0], res.problems
    assert "invalid_utf8" in res.summary


def test_a_token_loop_fails_repetition(faulty):
    res = _layer(faulty["loop"])
    assert res.verdict == "fail"
    assert any(p.startswith("repetition on 'long'") and "8+ times" in p for p in res.problems), res.problems
    assert any(p.startswith("repetition on 'multi-turn'") for p in res.problems), res.problems


def test_the_command_exits_1_naming_the_failed_layer_and_check(faulty):
    proc = deployctl("validate", "--url", faulty["truncate"], "--layers", "functional", timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAIL functional:" in proc.stdout and "truncation on 'short'" in proc.stdout
    assert "validate: functional failed against" in proc.stderr


def test_deploy_validate_runs_the_functional_layer_on_each_canary_host(faulty, tmp_path, rollout_model):
    """What `deploy --validate functional` calls before the first weight step: the failing host, check and case."""
    from deployctl.config import load_config
    from deployctl.validate.canary import check_hosts
    from support.runbook_fleet import write_deploy_yaml

    port = int(faulty["truncate"].rsplit(":", 1)[1])
    hosts = [{"name": "canary-a", "address": "local", "deploy_root": str(tmp_path / "a"), "python": sys.executable,
              "server_port": port}]
    cfg = load_config(write_deploy_yaml(tmp_path / "deploy.yaml", hosts, port=port, model_path=str(rollout_model)))
    said = []
    why = check_hosts(cfg, ["canary-a"], say=said.append)
    assert why is not None and why.startswith("canary-a: truncation on 'short'"), why
    assert said and "FAIL" in said[0]
    proc = deployctl("deploy", "-c", str(tmp_path / "deploy.yaml"), "--yes", "--validate", "latency", timeout=60)
    assert proc.returncode == 2 and "--validate 'latency'" in proc.stderr
