"""Acceptance (issues 15 and 28): canary analysis that judges what users see, on the sshd fleet behind real nginx with
the runtime on CPU.

Golden outputs, compared at weight 0 (the canary started and verified, the router sending it nothing yet) and at
every step: a canary whose weights differ slightly (same shapes, one tensor perturbed, written with safetensors) is
aborted at 0% (exit 6) with the first differing tokens side by side. A release that only changes max_num_seqs is
promoted ("16/16 prompts identical" at 0%, 50% and 100%, "no file changed") and, with no user traffic at all, judged
healthy on the active probes. A release that changes only the chat template (tokenizer_config.json) is aborted at 0%
while clients use the service through nginx: its access log shows every request answered by stable and none by the
new release, the message names tokenizer_config.json; with outputs.on_change report the same release is rolled out
and the change recorded (deploy output, status, history). With new weights declared on purpose (on_model_change:
skip), a repeated-token loop (the runtime's test-only repeat_token fault) is still aborted; empty answers are
unit-tested (test_analysis_rules). With no user traffic a slow canary is aborted on the probes; with probes off, quiet
windows stay inconclusive and hold the step; past max_hold (on_hold_timeout pause) it waits until a human aborts it. Each canary deploy
costs 30-40 s here (two runtime restarts; an abort at 0% one): two tests of five and four deploys."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import rollout_state, wait_for

pytestmark = pytest.mark.slow


def model_copy(src: Path, dst: Path, *, perturb: float = 0.0, template: str | None = None) -> Path:
    """A copy of the tiny checkpoint, optionally with one tensor perturbed (same shape) or another chat template,
    with its manifest rewritten (the runtime verifies it at start)."""
    from deployctl.hostscripts.weights import write_manifest

    shutil.copytree(src, dst)
    if perturb:
        import torch
        from safetensors.torch import load_file, save_file

        w = load_file(dst / "model.safetensors")
        name = "model.layers.0.mlp.down_proj.weight"
        w[name] = w[name] + perturb * torch.randn(w[name].shape, generator=torch.Generator().manual_seed(1))
        save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    if template is not None:
        tc = json.loads((dst / "tokenizer_config.json").read_text())
        tc["chat_template"] = template
        (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    (dst / "manifest.sha256").unlink()
    write_manifest(dst)
    return dst


@pytest.fixture
def fleet(rollout_env, rollout_model):
    env = rollout_env(2, steps=[50, 100], pause_s=0,
                      analysis={"interval_s": 2, "min_requests": 20, "probes": {"requests": 3, "min_samples": 2}})
    assert env.cli("deploy", "--yes").returncode == 0

    def canary(model: Path | None = None, fault: str | None = None, pause_s: float = 0, analysis=None, **outputs):
        env.cfg["model"]["path"] = str(model or rollout_model)
        env.cfg["rollout"]["pause_s"] = pause_s
        env.cfg["rollout"]["analysis"].update(outputs=outputs, **(analysis or {}))
        env.write()
        r = env.cli("deploy", "--yes", env={"DEPLOYCTL_RUNTIME_FAULT": fault} if fault else None)
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        print(f"\n{model and model.name} {fault or ''}: exit {r.returncode}: {last[:600]}")
        return r

    return env, canary


def test_drifted_answers_and_templates_are_caught_at_weight_0_and_a_settings_change_is_promoted(
        fleet, rollout_model, tmp_path):
    env, canary = fleet
    v1 = env.current(env.names[0])
    r = canary(model_copy(rollout_model, tmp_path / "perturbed", perturb=0.01))
    assert r.returncode == 6, r.stderr
    assert "output check failed at 0% (before any client traffic) on " + env.names[0] in r.stderr
    assert "prompts identical < min_exact_share 1" in r.stderr and "first difference at token" in r.stderr
    assert " | canary " in r.stderr and "weights changed" in r.stderr
    assert "canary weight 50%" not in r.stderr  # aborted before the first weight step
    assert [env.current(n) for n in env.names] == [v1, v1]
    aborted = env.history()[-1]
    assert aborted["result"] == "aborted" and aborted["verdict"]["kind"] == "outputs"
    diff = aborted["verdict"]["diffs"][0]
    assert diff["stable"] != diff["canary"] and diff["stable"] and diff["canary"]

    # a setting that does not change greedy answers, no user traffic: identical outputs, judged healthy on probes
    # (min_client_requests 0: the operator lets probes alone promote; by default they never do)
    env.cfg["engine"]["max_num_seqs"] = 4
    r = canary(pause_s=4, analysis={"min_client_requests": 0})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("outputs: 16/16 prompts identical on " + env.names[0]) == 3  # at 0%, 50% and 100%
    assert "no file changed" in r.stderr  # same model files, same answers
    assert "analysis at 50%: pass [probes]" in r.stderr and "judged on probes (0 canary requests" in r.stderr
    assert env.nginx.access_entries() == []  # golden prompts and probes go to the hosts, never through nginx
    v2 = env.current(env.names[0])
    assert v2 != v1 and [env.current(n) for n in env.names] == [v2, v2]
    verdicts = env.status()["rollout"]["verdicts"]
    assert any(v.get("source") == "probes" and v["probes"]["canary"]["samples"] >= 2 for v in verdicts)
    assert [(o["weight"], o["identical"], o["total"]) for o in env.history()[-1]["outputs"]] == [
        (0, 16, 16), (50, 16, 16), (100, 16, 16)]
    kept = [v for v in verdicts if v.get("kind") == "outputs"]
    assert [(v["weight"], v["result"], v["identical"], v["total"]) for v in kept] == [
        (0, "pass", 16, 16), (50, "pass", 16, 16), (100, "pass", 16, 16)]

    # only the chat template changes (tokenizer_config.json): caught at weight 0 while clients use the service
    broken = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"  # no roles, no generation prompt
    templated = model_copy(rollout_model, tmp_path / "badtemplate", template=broken)
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        r = canary(templated)
        time.sleep(1)  # the restored split serves a few more requests
    finally:
        traffic.stop()
    assert r.returncode == 6, r.stderr
    assert "output check failed at 0% (before any client traffic) on " + env.names[0] in r.stderr, r.stderr
    # exact agreement required, and release.json's model_files hashes name what changed beside the unchanged weights
    assert "(exact: same weights, engine and dtype; changed: tokenizer_config.json (chat template))" in r.stderr
    new = env.history()[-1]["release"]
    assert new != v2 and [env.current(n) for n in env.names] == [v2, v2]
    served, failed = traffic.snapshot()
    assert served[v2] > 0 and new not in served and not failed, (dict(served), dict(failed))
    releases = {e["release"] for e in env.nginx.access_entries()}  # who answered each client request
    assert v2 in releases and new not in releases, releases  # none reached the canary's new release
    assert "canary weight" not in r.stderr and {env.release_served(n) for n in env.names} == {v2}

    # outputs.on_change report: the same change is recorded with its differences and the deploy goes on
    r = canary(templated, on_change="report")
    assert r.returncode == 0, r.stderr
    assert ("outputs changed at 0% (before any client traffic) on " + env.names[0]) in r.stderr, r.stderr
    assert "outputs.on_change report: recorded, the deploy goes on" in r.stderr
    v3 = env.current(env.names[0])
    assert v3 not in (v2, new) and [env.current(n) for n in env.names] == [v3, v3]
    done = env.history()[-1]
    assert done["result"] == "ok" and done["reason"].startswith("outputs changed at 0% on " + env.names[0])
    first = done["outputs"][0]
    assert (first["weight"], first["result"]) == (0, "changed") and first["diffs"], first
    assert "changed: tokenizer_config.json (chat template)" in first["why"]
    st = env.status()["rollout"]
    assert st["status"] == "done" and "outputs changed at 0%" in st["reason"]
    assert any(v.get("kind") == "outputs" and v["result"] == "changed" for v in st["verdicts"])


def test_loops_slow_quiet_canaries_and_inconclusive_windows(fleet, rollout_model, tmp_path):
    env, canary = fleet
    v1 = env.current(env.names[0])
    # new weights on purpose: agreement skipped, but a loop is still caught
    r = canary(model_copy(rollout_model, tmp_path / "retrained", perturb=0.01), fault="repeat_token=65",
               on_model_change="skip")
    assert r.returncode == 6 and "agreement not checked" in r.stderr and "canary repeats" in r.stderr, r.stderr

    # no user traffic at all, only deployctl's probes reach the hosts: a slow canary is aborted on them
    r = canary(fault="token_delay_ms=250", pause_s=8, enabled=False)
    assert r.returncode == 6 and "analysis failed at 50%: canary probe median T" in r.stderr, r.stderr
    assert "fail [probes]: canary 0 req" in r.stderr

    # probes off and no traffic: every window is inconclusive and holds the step (issue 41); past max_hold,
    # on_hold_timeout pause waits for a human
    env.cfg["engine"]["max_num_seqs"] = 6
    env.cfg["rollout"].update(pause_s=4, max_hold=4, on_hold_timeout="pause")
    env.cfg["rollout"]["analysis"].update(probes={"enabled": False}, outputs={"enabled": False}, min_client_requests=0)
    env.write()
    deploy = env.popen("deploy", "--yes")
    try:
        st = wait_for(lambda: (s := rollout_state(env)).get("status") == "paused" and s, 180, "the paused rollout", deploy)
        assert "without a passing window (max_hold 4s)" in st["reason"], st["reason"]
        assert "rollout.on_hold_timeout pause" in st["reason"], st["reason"]
        assert "0 canary requests < min_requests 20" in st["reason"]
        assert env.status()["rollout"]["status"] == "paused"
        assert env.cli("abort").returncode == 0
        _, err = deploy.communicate(timeout=120)
    finally:
        if deploy.poll() is None:
            deploy.kill()
    assert deploy.returncode == 6 and "paused at 50%" in err and "`deployctl promote` to go on" in err, err
    assert [env.current(n) for n in env.names] == [v1, v1]
