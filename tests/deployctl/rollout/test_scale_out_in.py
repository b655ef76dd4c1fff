"""Issue 42, scale out and in, and the warm pool: under steady traffic through real nginx a `pool: warm` host is
scaled out (release installed from the fleet, started, verified, warmed up off the router: its weight stays 0
until then, then ramps through partial shares to an equal one), scaled in (drained, out of the router, its engine
asleep as the pool's) with no failed request, and scaled out again by a wake checked against the release's golden
answers; `scale warm` starts a purged pool host once and keeps it asleep. Real sshd fleet, real nginx, the stand-in engine."""
from __future__ import annotations

import json
from pathlib import Path
import threading
import time

import httpx
import pytest

from deployctl.demo.run import Traffic
from support.rollout import served, upstream_weights as weights

pytestmark = [pytest.mark.timeout(400)]


def _sleeping(port: str) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/is_sleeping", timeout=10).json()["is_sleeping"]


class Watch:
    """The share of ``port`` in nginx's upstream conf, polled every 20 ms: [(time, share or None when absent)]."""

    def __init__(self, env, port: str):
        self.env, self.port, self.seen, self._stop = env, port, [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            w = weights(self.env.upstream_conf())
            live = sum(w.values())
            share = None if self.port not in w else w[self.port] / live if live else 0.0
            if not self.seen or self.seen[-1][1] != share:
                self.seen.append((time.monotonic(), share))
            time.sleep(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=10)


def test_scale_out_warms_up_then_ramps_scale_in_drains_warm_pool_wakes(rollout_env):
    env = rollout_env(3, engine="standin", steps=[50, 100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    a, b, c = env.names
    env.host(c)["pool"] = "warm"
    env.cfg["autoscale"] = {"window_s": 1, "samples": 2, "cooldown_s": 0}  # min_hosts: 2 by default
    env.write()
    port = {n: str(env.host(n)["server_port"]) for n in env.names}
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    assert f"leaving out {c}: not serving (in the warm pool)" in r.stderr, r.stderr
    env.cfg["engine"]["max_num_seqs"] = 6  # a second release, deployed as a canary: its golden answers recorded
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v2 = env.current(a)
    assert env.current(c) is None and port[c] not in weights(env.upstream_conf())

    # a scale out that fails its golden check (c's copy of the record says otherwise): exit 5, no weight, and
    # history says so (what an operator reads after an autoscale at night)
    golden = Path(env.host(c)["deploy_root"]) / "shared" / "golden" / f"{v2}.json"
    bad = json.loads((Path(env.host(a)["deploy_root"]) / "shared" / "golden" / f"{v2}.json").read_text())
    bad["answers"][0].update(text="not what it says", tokens=["not", "what", "it", "says"], token_ids=None)
    golden.parent.mkdir(parents=True, exist_ok=True)
    golden.write_text(json.dumps(bad))
    r = env.cli("scale", "out", c, "--slow-start", "1")
    assert r.returncode == 5 and "golden answers" in r.stderr, (r.stdout, r.stderr)
    assert port[c] not in weights(env.upstream_conf())
    failed = [x for x in env.history() if x["action"] == "scale-out"][-1]
    assert failed["result"] == "failed" and "golden" in failed["reason"].lower(), failed
    golden.unlink()  # the next scale out copies the peers' record

    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=1).start()
    try:
        t_start = time.monotonic()
        with Watch(env, port[c]) as watch:
            r = env.cli("scale", "out", c, "--slow-start", "1.5", "--json")
        assert r.returncode == 0, r.stderr
        cold = json.loads(r.stdout)
        assert cold["paths"] == {c: "start"} and cold["release"] == v2 and env.current(c) == v2
        assert cold["warmup"][c]["requests"] >= 8 and "golden_s" in cold["timings"][c]
        # weight 0 (not in the conf) until the warm-up ended, then partial shares, then an equal one
        shares = [s for _, s in watch.seen]
        assert shares[0] is None and shares[-1] == pytest.approx(1 / 3), watch.seen
        ramp = [s for s in shares if s is not None]
        assert ramp == sorted(ramp) and any(0 < s < 1 / 3 - 0.01 for s in ramp), watch.seen
        first = next(t for t, s in watch.seen if s) - t_start
        assert first >= cold["to_serving_s"][c] + cold["warmup"][c]["seconds"] - 0.5, (first, cold)
        assert [p for _, p in cold["ramp"]] == sorted(p for _, p in cold["ramp"])
        assert next(h for h in env.status()["hosts"] if h["host"] == c)["serving"] is True

        # the fleet is quiet for three hosts: `autoscale --once` decides in on the last serving host and scales it
        # in through rollout.scale (drained, asleep), the decision and its numbers in history
        r = env.cli("autoscale", "--once", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["action"], out["hosts"]) == ("in", [c]), out
        assert [x for x in env.history() if x["action"] == "autoscale"][-1]["acted"] is True
        assert port[c] not in weights(env.upstream_conf()) and _sleeping(port[c])
        row = next(h for h in env.status()["hosts"] if h["host"] == c)
        assert row["serving"] is False and row["standby"]["asleep"] and row["standby"]["release"] == v2

        r = env.cli("scale", "out", c, "--slow-start", "1", "--json")
        assert r.returncode == 0, r.stderr
        warm = json.loads(r.stdout)
        assert warm["paths"] == {c: "wake"} and "golden_s" in warm["timings"][c] and "wake_s" in warm["timings"][c]
        assert served(int(port[c])) == v2 and weights(env.upstream_conf())[port[c]] == 1
        print(f"to serving: cold {cold['to_serving_s'][c]} s, wake {warm['to_serving_s'][c]} s")
        r = env.cli("scale", "in", a, b, c)
        assert r.returncode != 0 and "would leave no host serving" in r.stderr, r.stderr
        r = env.cli("scale", "in", b, c)
        assert r.returncode != 0 and "below autoscale.min_hosts 2" in r.stderr, r.stderr

        # --purge: engine stopped, releases gone; `scale warm` installs, starts, verifies and puts it to sleep
        assert env.cli("scale", "in", c, "--purge").returncode == 0
        assert env.current(c) is None and served(int(port[c])) is None
        r = env.cli("scale", "warm")
        assert r.returncode == 0, r.stderr
        assert f"{c}: asleep with {v2}" in r.stdout and "golden_s" in r.stdout, r.stdout
        assert _sleeping(port[c]) and port[c] not in weights(env.upstream_conf())
        row = next(h for h in env.status()["hosts"] if h["host"] == c)
        assert row["serving"] is False and row["standby"]["asleep"] and row["standby"]["release"] == v2
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    assert not failed and ok.get(v2), (dict(ok), dict(failed))
    assert [x["action"] for x in env.history() if x["action"].startswith("scale")] == \
        ["scale-out", "scale-out", "scale-in", "scale-out", "scale-in", "scale-warm"]
