"""Detached, resumable rollouts on the sshd fleet with real nginx and the stand-in engine (issue 28):
`deploy --detach` returns at once and the launching shell exits; `rollout watch` follows the runner from another
process; the runner is killed with SIGKILL in the middle of a weight step; `status` says the deploy is gone and
resumable; `deploy --resume --detach` continues it from the journal; `promote` from a third shell ends the pause;
`rollout watch` exits with the rollout's exit code (0); every host serves the new release and no request through
nginx failed. Then a resume with deploy.yaml changed under it rolls back, and says why."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import assert_consistent_on, rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _control(env) -> Path:
    return Path(os.environ["DEPLOYCTL_STATE"]) / env.cfg["service"]["name"]


def _journal(env) -> list[dict]:
    p = _control(env) / "journal.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def test_detached_deploy_killed_mid_step_is_resumed_and_watched_to_its_exit_code(rollout_env):
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": 600}, {"weight": 100, "pause": 0}],
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    env.cfg["engine"]["max_num_seqs"] = 6  # v2: another config
    env.write()
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        r = env.cli("deploy", "--detach", "--yes", timeout=60)  # the launching shell: it exits at once
        assert r.returncode == 0, r.stderr
        assert "detached: the rollout runs as pid" in r.stdout and "rollout watch" in r.stdout, r.stdout
        runner = int((_control(env) / "runner.pid").read_text())
        watch = env.popen("rollout", "watch")  # another shell follows it
        wait_for(lambda: rollout_state(env).get("weight") == 50 and rollout_state(env).get("status") == "running",
                 240, "the detached deploy at its 50% step")
        wait_for(lambda: any(r.get("what") == "window" for r in _journal(env)), 60, "an analysis window")
        os.kill(runner, signal.SIGKILL)  # mid-step: the 600 s analysis pause at 50%
        out, err = watch.communicate(timeout=60)
        assert watch.returncode == 4, err[-2000:]
        assert "step 1/2: canary weight 50%" in err and "ended without finishing" in err, err[-2000:]
        assert "deployctl deploy --resume" in err

        st = env.status()
        assert st["rollout"]["status"] == "running" and st["rollout"]["weight"] == 50
        assert st["journal"]["resumable"] and st["journal"]["open_step"] == "weight:0", st["journal"]
        assert st["journal"]["open_step_label"] == "weight step 1/2 (50%)"
        text = env.cli("status").stdout
        assert "is not running any more" in text and "deploy --resume" in text, text
        assert "stopped in weight step 1/2 (50%)" in " ".join(text.split()), text
        checked = env.cli("status", "--check")  # a canary nobody runs is a fault, unlike a live one
        assert checked.returncode == 1 and "but nobody runs it" in checked.stderr, checked.stderr
        v2 = rollout_state(env)["release"]
        assert {env.release_served(n) for n in env.names} == {v1, v2}  # canary on v2, stable on v1: the split

        r = env.cli("deploy", "--resume", "--detach", timeout=60)
        assert r.returncode == 0, r.stderr
        watch = env.popen("rollout", "watch")
        wait_for(lambda: any(r.get("kind") == "resume" for r in _journal(env))
                 and rollout_state(env).get("weight") == 50 and rollout_state(env).get("pid") != runner,
                 120, "the resumed deploy back in its 50% step")
        p = env.cli("promote")  # a third shell steers the detached runner
        assert p.returncode == 0, p.stderr
        out, err = watch.communicate(timeout=300)
        assert watch.returncode == 0, err[-3000:]
        assert "resuming " + v2 + " from the journal at weight step 1/2 (50%)" in err, err[-3000:]
        assert f"release {v2} serves all traffic" in err
    finally:
        traffic.stop()
    assert_consistent_on(env, v2)
    kinds = [(r["kind"], r.get("step")) for r in _journal(env)]
    assert kinds.count(("begin", "weight:0")) == 2 and ("end", "batch:0") in kinds and kinds[-1] == ("finish", None)
    assert env.cli("deploy", "--resume").returncode == 1  # finished: nothing to resume
    ok, failed = traffic.snapshot()
    assert not failed, dict(failed)
    assert ok.get(v1) and ok.get(v2), dict(ok)

    # a resume that cannot continue: deploy.yaml changed while the deploy was dead -> roll back, saying why
    env.cfg["engine"]["max_num_seqs"] = 5
    env.write()
    r = env.cli("deploy", "--detach", "--yes", timeout=60)
    assert r.returncode == 0, r.stderr
    runner = int((_control(env) / "runner.pid").read_text())
    wait_for(lambda: rollout_state(env).get("weight") == 50, 240, "the third deploy at 50%")
    os.kill(runner, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{runner}").exists() or "Z" in Path(f"/proc/{runner}/stat").read_text().split()[2],
             30, "the runner gone")
    env.cfg["engine"]["max_num_seqs"] = 4
    env.write()
    r = env.cli("deploy", "--resume", timeout=300)
    assert r.returncode == 6, r.stderr
    assert "cannot continue at weight step 1/2 (50%): deploy.yaml changed since the deploy started" in r.stderr, r.stderr[-2000:]
    assert f"traffic back on {v2}" in r.stderr
    assert_consistent_on(env, v2)
    # watch from another shell now tells how the killed runner's deploy ended (it said 'ended without finishing;
    # run deploy --resume' and exited 4, and that resume then said there was nothing to resume)
    w = env.cli("rollout", "watch", timeout=60)
    assert w.returncode == 6, w.stderr[-2000:]
    assert "the deploy it ran was finished since by pid" in w.stderr and "(exit 6)" in w.stderr, w.stderr[-2000:]
