"""One host (no canary possible: a verified in-place switch, the previous release restored on failure), and C13:
a completion streamed from the real runtime through the rendered nginx arrives spread out, ending data: [DONE]."""
from __future__ import annotations

import socket
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def _stream(url: str) -> tuple[list[float], list[str]]:
    body = {"model": "tiny-chat", "prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
            "temperature": 0, "stream": True}
    times, lines = [], []
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data:"):
                times.append(time.monotonic() - t0)
                lines.append(line)
    return times, lines


def test_single_host_in_place_and_streaming_through_nginx(rollout_env):
    env = rollout_env(1)
    host = env.names[0]
    gate = {"DEPLOYCTL_SKIP_PREFLIGHT": "0"}
    # the preflight gate: the runtime's port held by a stranger stops the deploy before anything changes
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", env.host(host)["server_port"]))
        holder.listen()
        r = env.cli("deploy", "--yes", env=gate)
    assert r.returncode == 1, r.stderr
    assert f"preflight failed on {host}: port" in r.stderr and "nothing was changed" in r.stderr
    assert env.current(host) is None
    # the first release streams a token every 25 ms at least (test-only fault), so spreading is measurable
    r = env.cli("deploy", "--yes", env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=25", **gate})
    assert r.returncode == 0, r.stderr
    assert "preflight passed" in r.stderr
    v1 = env.current(host)

    direct_t, direct = _stream(env.runtime_url(host))
    via_t, via = _stream(env.url)
    assert via[-1] == "data: [DONE]" and direct[-1] == "data: [DONE]"
    assert len(via) >= 20  # 40 tokens; a chunk may carry several when a UTF-8 character spans tokens
    gaps = [b - a for a, b in zip(via_t, via_t[1:-1])]
    spread = sum(g > 0.01 for g in gaps)
    print(f"\nC13: first chunk direct {direct_t[0] * 1000:.0f} ms, via nginx {via_t[0] * 1000:.0f} ms; "
          f"{spread} of {len(gaps)} gaps over 10 ms; last chunk at {via_t[-1]:.2f} s")
    assert spread >= 0.8 * len(gaps)  # not clumped: (almost) every chunk arrives on its own
    assert via_t[-2] - via_t[0] >= 39 * 0.025 * 0.8  # the 40 tokens' delays, not one burst at the end

    r = env.cli("deploy", "--yes", "--canary", "5")
    assert r.returncode == 0, r.stderr
    assert "no canary possible" in r.stderr
    v2 = env.current(host)
    assert v2 != v1 and env.release_served(host) == v2

    r = env.cli("deploy", "--yes", env={"DEPLOYCTL_RUNTIME_FAULT": "fail_start=1"})
    assert r.returncode == 6, r.stderr
    assert f"traffic back on {v2}" in r.stderr.strip().splitlines()[-1]
    assert env.current(host) == v2 and env.release_served(host) == v2
    assert httpx.get(env.url + "/v1/models", timeout=10).headers["x-deployctl-release"] == v2
