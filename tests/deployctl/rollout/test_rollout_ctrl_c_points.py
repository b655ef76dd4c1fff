"""Ctrl-C at many points of a canary (issue 31). One SIGINT lands, after a small random delay, just after each
phase of a deploy starts — the plan (nothing changed yet), the upload, the canary's drain, its switch and restart,
just after it, the first weight step, the analysis pause — and every time: the deploy exits 130 within a bounded time (a hang is
the failure this guards against: the abort once waited forever on a lock the signal had left held inside paramiko),
the fleet serves one release, `status` tells the truth, and no request through nginx fails.

The seed is printed; DEPLOYCTL_TEST_SEED replays a run."""
from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from deployctl.demo.run import Traffic
from support.rollout import assert_consistent_on, rollout_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# (marker in the deploy's progress on stderr, what has changed by then)
POINTS = [
    ("plan: ", "nothing"),
    ("uploading release", "the upload"),
    ("traffic: ", "the canary drained"),
    ("switching to", "the canary's restart"),
    ("ready in", "just after the canary's restart"),
    ("step 1/2", "the first weight step"),
    ("analysis at 10%", "the analysis pause"),
]
EXIT_BOUND_S = 180  # far above the abort's own work (one restart of the canary): only a hang gets near it


class _Lines:
    """The deploy's stderr, read line by line in a thread (so the test can wait for a marker)."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc):
        for line in proc.stderr:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def wait(self, marker: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cv:
            while not any(marker in ln for ln in self.lines):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def text(self) -> str:
        self._t.join(timeout=10)
        with self._cv:
            return "".join(self.lines)


def test_ctrl_c_at_every_phase_of_a_canary_exits_130_and_leaves_one_release(rollout_env):
    seed = int(os.environ.get("DEPLOYCTL_TEST_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    print(f"\nseed {seed}")
    env = rollout_env(2, engine="standin", steps=[10, 100], pause_s=600,
                      analysis={"interval_s": 2, "min_requests": 5, "min_p99_delta_s": 0.5})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    outcomes = []
    try:
        for marker, what in POINTS:
            delay = rng.uniform(0.0, 0.6)
            deploy = env.popen("deploy", "--yes", "--canary", "10")
            lines = _Lines(deploy)
            assert lines.wait(marker, 300), f"no {marker!r} in the deploy's output:\n{lines.text()[-3000:]}"
            time.sleep(delay)
            deploy.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            try:
                deploy.wait(timeout=EXIT_BOUND_S)
            except Exception:
                deploy.kill()
                raise AssertionError(f"Ctrl-C during {what} (+{delay:.2f} s): the deploy did not exit within "
                                     f"{EXIT_BOUND_S} s (hung):\n{lines.text()[-3000:]}")
            took = time.monotonic() - t0
            err = lines.text()
            last = err.strip().splitlines()[-1]
            outcomes.append(f"{what} +{delay:.2f} s: exit {deploy.returncode} after {took:.1f} s: {last[:90]}")
            assert deploy.returncode == 130, f"Ctrl-C during {what}:\n{err[-3000:]}"
            assert "Traceback" not in err, err[-3000:]
            assert "Ctrl-C: stopping at the next safe point" in err
            assert ("deploy interrupted before anything changed" in last
                    or (f"deploy interrupted: traffic back on {v1}" in last and "deployctl status" in last)), last
            assert_consistent_on(env, v1)
            st = env.status()
            assert st["lock"] is None, st["lock"]
            rows = {h["host"]: h for h in st["hosts"]}
            assert all(h["current_release"] == v1 and h["healthy"] and h["weight"] == 50.0 for h in rows.values()), rows
            if "before anything changed" not in last:
                assert rollout_state(env)["status"] == "interrupted"
                assert env.history()[-1]["result"] == "interrupted"
        r = env.cli("promote")  # an interrupted rollout is over: nothing is left to promote
        assert r.returncode == 0 and "no rollout in progress" in r.stdout, r.stdout + r.stderr
    finally:
        traffic.stop()
        print("\n".join(outcomes))
    ok, failed = traffic.snapshot()
    print(f"traffic: {dict(ok)}; failed {dict(failed)}; retried {traffic.retried}")
    assert not failed
