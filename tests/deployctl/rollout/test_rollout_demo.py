"""`deployctl demo` end to end: tiny model, two local hosts behind a local nginx, release 1, release 2 with a 5%
canary and analysis under traffic, promotion, rollback; every request through nginx answered; nothing left running."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_the_main_job_end_to_end(tmp_path, rollout_cache):
    work = tmp_path / "demo"
    env = {**os.environ, "DEPLOYCTL_CACHE": str(rollout_cache)}
    r = subprocess.run([sys.executable, "-m", "deployctl", "demo", "--workdir", str(work), "--pause", "6"],
                       capture_output=True, text=True, timeout=600, env=env)
    print(r.stderr[-3000:], r.stdout)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    m = re.search(r"at 5% release 2 answered ([\d.]+)% of (\d+) requests; rollback took ([\d.]+) s; "
                  r"failed requests: (\d+)", out)
    assert m, out
    share, total, failed = float(m.group(1)), int(m.group(2)), int(m.group(4))
    assert total > 50 and 1.0 <= share <= 10.0 and failed == 0
    for word in ("analysis at 5%: pass", "step 2/2: canary weight 100%", "rolling back to", "stopped the runtimes",
                 "at 5%: outputs: 16/16 prompts identical", "at 100%: outputs: 16/16 prompts identical",
                 "functional: 12/12 cases pass (chat)"):  # the closing validate run
        assert word in r.stderr
    # both hosts ended on release 1, their history tells the story, and nothing is left running
    hosts = work / "hosts"
    currents = {os.path.basename(os.readlink(hosts / h / "current")) for h in ("host-a", "host-b")}
    assert len(currents) == 1
    hist = [json.loads(x) for x in (hosts / "host-a" / "state" / "history.jsonl").read_text().splitlines()]
    assert [(h["action"], h["result"]) for h in hist if h["result"] != "started"] == [
        ("deploy", "ok"), ("deploy", "ok"), ("rollback", "ok")]
    for h in ("host-a", "host-b"):
        assert not (hosts / h / "shared" / "run" / "runtime.pid").exists()
    assert not (work / "nginx" / "nginx.pid").exists()


def test_demo_refuses_a_used_workdir(tmp_path):
    (tmp_path / "deploy.yaml").write_text("# an earlier demo\n")
    r = subprocess.run([sys.executable, "-m", "deployctl", "demo", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not empty" in r.stderr and "Traceback" not in r.stderr
