"""API key rotation with no failed request (docs/runbook-api-key-rotation.md), on two ``address: local`` hosts
behind a real nginx: with both keys accepted (server.next_api_key_env) clients move from the old key to the new
one through the router, then `deployctl deploy` drops the old key while they keep sending requests. Every request
of the clients succeeds; afterwards the old key gets 401 and the new one 200."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from deployctl.demo.run import Traffic
from support.nginx import NginxRouter
from support.rollout import local_tiny_config

pytestmark = pytest.mark.slow

OLD, NEW = "sk-rot-old-0123456789", "sk-rot-new-9876543210"


def _wait_answers(traffic: Traffic, n: int, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while sum(traffic.snapshot()[0].values()) < n and time.monotonic() < deadline:
        time.sleep(0.05)


class KeyedTraffic(Traffic):
    """demo.run.Traffic (answers counted per release, failures per status, one resend of a request that went out
    on an idle keep-alive connection nginx had just closed) with the client's current API key on every request."""

    key = OLD


def test_clients_move_to_the_next_key_and_the_old_one_is_dropped_without_a_failed_request(tmp_path, rollout_model, rollout_cache,
                                                                   rollout_python):
    router = NginxRouter(tmp_path / "nginx")
    cfg = local_tiny_config(tmp_path, "rot", rollout_model, rollout_python, ["a", "b"], api_key_env="ROT_KEY") | {
        "router": router.router_config(),
        "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0,
                    "analysis": {"interval_s": 1, "min_requests": 5, "min_p99_delta_s": 0.5,
                                 "inconclusive_limit": 0}},
        "slo": {"ttft_p99_s": 30.0, "tpot_p99_s": 2.0},
    }
    path = tmp_path / "deploy.yaml"
    env = {**os.environ, "DEPLOYCTL_CACHE": str(rollout_cache), "DEPLOYCTL_SKIP_PREFLIGHT": "1",
           "DEPLOYCTL_VERIFY_TIMEOUT_S": "90", "ROT_KEY": OLD}

    def deploy(**extra_env: str) -> None:
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        r = subprocess.run([sys.executable, "-m", "deployctl", "deploy", "--yes", "-c", str(path)],
                           env={**env, **extra_env}, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-3000:]

    traffic = None
    try:
        from deployctl.config import load_config

        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        router.start(load_config(path))
        # v1 as step 2 leaves it: both keys accepted (the deploy that adds the next key is a deploy like the one
        # below, whose clients' key both releases accept; one of the two is enough, each costs four runtime starts)
        cfg["server"]["next_api_key_env"] = "ROT_NEXT_KEY"
        deploy(ROT_NEXT_KEY=NEW)
        traffic = KeyedTraffic(router.url, "tiny-chat", workers=1, completion_workers=1).start()
        _wait_answers(traffic, 20)
        traffic.key = NEW  # step 3: the clients move over, through the same router
        _wait_answers(traffic, 40)
        # step 4: the new key becomes the current one (deployctl's own probes send it now) and the old is dropped,
        # while the clients keep sending the new key as the runtimes restart one by one
        del cfg["server"]["next_api_key_env"]
        deploy(ROT_KEY=NEW)
        traffic.stop()
        ok, failed = traffic.snapshot()
        print(f"\ntraffic through nginx during the rotation: {dict(ok)}, failed {dict(failed)}, "
              f"retried {traffic.retried}")
        assert not failed and sum(ok.values()) > 20, (ok, failed)
        assert len(ok) == 2  # answered by v1 and v2
        for key, status in ((OLD, 401), (NEW, 200)):
            r = httpx.get(router.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert r.status_code == status, (key, r.status_code, r.text)
        assert r.headers.get("x-deployctl-release") in ok
    finally:
        if traffic is not None:
            traffic.stop()
        for h in cfg["hosts"]:
            for name in ("runtime.pid", "runtime.child.pid"):
                try:
                    os.killpg(int((Path(h["deploy_root"]) / "shared" / "run" / name).read_text().split()[0]),
                              signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        router.stop()
