"""The stand-in engine (tests/support/standin_engine) on the sshd fleet with real nginx: deployctl deploys it through
its ordinary path (DEPLOYCTL_RUNTIME_WHEEL, upload, pip install on the host, launch.sh, verify, analysis,
router), and it answers what the deploy and real clients ask: the openai client's chat and streamed completions
through nginx, the release header, /metrics read by the canary analysis, a drain on SIGTERM with no failed request."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import assert_consistent_on

pytestmark = [pytest.mark.timeout(300)]


def test_standin_fleet_deploys_a_canary_and_serves_openai_clients_through_nginx(rollout_env):
    import openai

    env = rollout_env(2, engine="standin", steps=[50, 100], pause_s=3,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    assert_consistent_on(env, v1)
    rel = json.loads((Path(env.host(env.names[0])["deploy_root"]) / "releases" / v1 / "release.json").read_text())
    assert rel["runtime_wheel"].startswith("deployctl_runtime-0.1.0+standin-"), rel["runtime_wheel"]

    client = openai.OpenAI(base_url=env.url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny-chat", prompt="hi", max_tokens=3,
                                                                    stream=True) if c.choices]
    assert len(pieces) == 3 and all(pieces), pieces
    assert [m.id for m in client.models.list()] == ["tiny-chat"]

    env.cfg["engine"]["max_num_seqs"] = 6  # a new release: another config hash
    env.write()
    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=1).start()
    try:
        r = env.cli("deploy", "--yes")
    finally:
        traffic.stop()
    assert r.returncode == 0, r.stderr
    v2 = env.current(env.names[0])
    assert v2 != v1
    assert_consistent_on(env, v2)
    assert "analysis at 50%: pass" in r.stderr, r.stderr[-2000:]  # judged on the stand-in's /metrics
    ok, failed = traffic.snapshot()
    assert not failed, (dict(failed), r.stderr[-2000:])
    assert ok.get(v1) and ok.get(v2), dict(ok)  # both releases answered clients, none failed during the drains
