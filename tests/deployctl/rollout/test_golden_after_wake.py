"""Issue 39: engines judged by what they answer wherever they come back. Each release's golden answers are recorded
when it first answers the golden prompts at weight 0 (stable's as the old release's record, a passing canary's as the
new one's); after a standby's wake and after a rollback's cold start the same prompts are asked again on that port
and compared, before the router gives the host any weight.

- A standby woken with one weight zeroed (the runtime's test-only ``zero_weight_on_wake`` fault) answers with HTTP
  200 but not what it answered before it slept: the rollback refuses the wake on every host, stops the woken
  standby, cold-starts the release and compares again (it passes), and no client through nginx sees a wrong answer.
- A release whose answers still differ after the cold start (its record on one host edited: as if that host's
  engine answered otherwise) keeps weight 0 there; the rollback exits 5 naming the host, the prompt and the first
  differing token, and the other host serves.
Real sshd fleet (the first test) or local hosts (the second: the transport is not the point), real nginx, the
runtime on CPU with the tiny model."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from support.nginx import free_port
from support.rollout import served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = [{"role": "user", "content": "Count from one to ten."}]


def _record(env, name: str, release: str) -> Path:
    return Path(env.host(name)["deploy_root"]) / "shared" / "golden" / f"{release}.json"


def _ask(client: httpx.Client, url: str) -> tuple[int, str, str]:
    r = client.post(url + "/v1/chat/completions", json={"model": "tiny-chat", "messages": PROMPT, "max_tokens": 12,
                                                         "temperature": 0})
    text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
    return r.status_code, text, r.headers.get("x-deployctl-release") or "?"


class Clients:
    """Greedy chat requests through nginx in a loop, every answer kept (status, text, release)."""

    def __init__(self, url: str):
        self.url, self.seen, self._stop = url, [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(timeout=60) as c:
            while not self._stop.is_set():
                try:
                    self.seen.append(_ask(c, self.url))
                except httpx.HTTPError as e:
                    self.seen.append((0, type(e).__name__, "?"))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=90)


def _fleet(rollout_env, *, spare: bool):
    env = rollout_env(2, steps=[50, 100], pause_s=0,
                      analysis={"interval_s": 2, "min_requests": 20, "probes": {"requests": 3, "min_samples": 2}})
    if spare:
        for h in env.cfg["hosts"]:
            h["spare_port"] = free_port()
    env.write()
    return env


def test_a_standby_woken_wrong_is_refused_cold_started_and_checked_again(rollout_env):
    env = _fleet(rollout_env, spare=True)
    a, b = env.names
    port = {n: env.host(n)["server_port"] for n in env.names}
    # v1 carries the fault into its runtime.env: it answers right until it is woken from a sleep
    r = env.cli("deploy", "--yes", env={"DEPLOYCTL_RUNTIME_FAULT": "zero_weight_on_wake=1"})
    assert r.returncode == 0, r.stderr
    v1 = env.current(a)
    with httpx.Client(timeout=60) as c:
        status, good, _ = _ask(c, env.url)
    assert status == 200 and good.strip(), good
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v2 = env.current(a)
    assert v2 != v1 and f"golden answers of {v1} recorded" in r.stderr + r.stdout
    for n in env.names:  # both releases' records on every host, v1 asleep on its port as the standby
        assert json.loads(_record(env, n, v1).read_text())["release"] == v1
        assert json.loads(_record(env, n, v2).read_text())["release"] == v2
        assert httpx.get(f"http://127.0.0.1:{port[n]}/is_sleeping", timeout=10).json()["is_sleeping"] is True

    with Clients(env.url) as clients:
        r = env.cli("rollback", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    print(f"rollback: {doc['duration_s']} s, paths {doc['phases']['paths']}, wake_failed {doc['phases'].get('wake_failed')}")
    # the wake was refused on both hosts for its answers, each host cold-started and checked again
    for n in env.names:
        assert "does not give its recorded golden answers" in doc["phases"]["wake_failed"][n], doc["phases"]
        assert doc["phases"]["paths"][n]["path"] == "start", doc["phases"]["paths"]
        assert "recorded golden answers" in doc["phases"]["paths"][n]["why"]
        assert env.current(n) == v1 and served(port[n]) == v1
    cold = [t for batch in doc["phases"]["batches"] if batch.get("mode") is None for t in batch["hosts"].values()]
    assert len(cold) == 2 and all(t["golden_s"] > 0 for t in cold), doc["phases"]["batches"]
    # what the clients got through nginx the whole time: the right answer, from v2 or the cold-started v1
    answers = [s for s in clients.seen if s[0] == 200]
    assert answers and {t for _, t, _ in answers} == {good}, sorted({t for _, t, _ in answers})
    with httpx.Client(timeout=60) as c:
        assert _ask(c, env.url)[1:] == (good, v1)


def test_a_release_whose_answers_still_differ_after_the_cold_start_keeps_weight_0(rollout_env):
    env = _fleet(rollout_env, spare=False)
    env.make_local()
    a, b = env.names
    assert env.cli("deploy", "--yes").returncode == 0
    v1 = env.current(a)
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    # as if b's engine of v1 now answers otherwise: its recorded first answer starts with another token
    p = _record(env, b, v1)
    rec = json.loads(p.read_text())
    first = rec["answers"][0]
    first["token_ids"][0] += 1
    first["tokens"][0] = "<other>"
    p.write_text(json.dumps(rec))
    r = env.cli("rollback")
    assert r.returncode == 5, r.stderr
    err = " ".join(r.stderr.split())
    label = rec["prompts"][0]["id"]
    assert f"{b}: {v1} on port {env.host(b)['server_port']} after the rollback's cold start does not give its " \
           f"recorded golden answers: prompt {label} (" in err, err
    assert "token 0: recorded '<other>'" in err and "(15/16 prompts as recorded)" in err, err
    # b keeps weight 0 (out of the upstream); a serves v1
    conf = env.upstream_conf()
    servers = [ln for ln in conf.splitlines() if ln.strip().startswith("server ")]
    assert any(f":{env.host(a)['server_port']}" in ln and " down" not in ln for ln in servers), conf
    assert not any(f":{env.host(b)['server_port']}" in ln and " down" not in ln for ln in servers), conf
    assert env.current(a) == v1
    with httpx.Client(timeout=60) as c:
        for _ in range(4):
            assert _ask(c, env.url)[2] == v1
