"""End to end with a foreign engine (issue 14): the sshd fleet behind real nginx, on CPU. Release 1 runs the bundled
runtime; release 2 switches the engine to Hugging Face ``transformers serve`` (the pinned version is the one
installed here, so nothing downloads) for the same model: canaried at 5% with analysis (transformers has no
/metrics: judged on its readiness and the router's error rate), promoted to 100%, then rolled back to the runtime,
with every request through nginx answered 200. release.json and ``status`` carry the engine and its version."""
from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # two transformers starts of ~40 s each on 2 cores


def test_switch_engine_to_transformers_canary_promote_and_rollback(rollout_env):
    env = rollout_env(2, steps=[5, 100], pause_s=4, analysis={"interval_s": 2, "min_requests": 1})
    model = env.cfg["model"]["path"]
    env.cfg["model"]["served_name"] = model  # transformers serve answers only to its model path
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])

    tf_version = version("transformers")
    env.cfg["engine"] = {"kind": "transformers", "version": tf_version, "device": "cpu", "max_model_len": 256,
                         "max_num_seqs": 4, "max_num_batched_tokens": 256, "block_size": 16}
    env.write()
    traffic = Traffic(env.url, model, workers=1, completion_workers=2).start()
    try:
        deploy = env.popen("deploy", "--yes", "--canary", "5")
        wait_for(lambda: rollout_state(env).get("weight") == 5, 240, "the transformers canary at 5%", deploy)
        v2 = rollout_state(env)["release"]
        canary = next(n for n in env.names if env.current(n) == v2)
        rdir = Path(env.host(canary)["deploy_root"]) / "releases" / v2
        info = json.loads((rdir / "release.json").read_text())
        assert (info["engine_kind"], info["engine_version"]) == ("transformers", tf_version)
        assert f"transformers=={tf_version} host env" in (rdir / "engine" / ".deployctl-installed").read_text()
        out, err = deploy.communicate(timeout=420)
        assert deploy.returncode == 0, err[-3000:]
        assert [env.current(n) for n in env.names] == [v2, v2]
        st = env.status()
        assert all((h["engine"], h["engine_version"], h["healthy"]) == ("transformers", tf_version, True)
                   for h in st["hosts"]), st["hosts"]

        r = env.cli("rollback")
        assert r.returncode == 0, r.stderr
        assert [env.current(n) for n in env.names] == [v1, v1]
        st = env.status()
        assert all((h["engine"], h["healthy"]) == ("deployctl-runtime", True) for h in st["hosts"]), st["hosts"]
    finally:
        traffic.stop()
    ok, failures = traffic.snapshot()
    assert sum(ok.values()) > 50 and not failures, (ok, failures)
