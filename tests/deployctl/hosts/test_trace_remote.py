"""$DEPLOYCTL_TRACE_REMOTE: one JSON line per remote command (host, seconds, exit code, the command), so that a
fleet step's round trips can be counted (bench/bench_fleet.py). A command's input (a rendered file) never goes in."""
from __future__ import annotations

import json

from deployctl.config import HostConfig
from deployctl.hosts import Host


def test_each_remote_command_is_one_line_with_its_seconds_and_exit(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("DEPLOYCTL_TRACE_REMOTE", str(trace))
    host = Host.from_config(HostConfig(name="h1", address="local", deploy_root=str(tmp_path / "root")))
    try:
        host.run(["sleep", "0.2"])
        host.run("cat >/dev/null; exit 3", check=False, input="sk-secret-input")
    finally:
        host.close()
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["host"], r["exit"]) for r in recs] == [("h1", 0), ("h1", 3)]
    assert recs[0]["cmd"] == "sleep 0.2" and recs[0]["s"] >= 0.2 and recs[1]["s"] < recs[0]["s"]
    assert "sk-secret-input" not in trace.read_text()
    monkeypatch.delenv("DEPLOYCTL_TRACE_REMOTE")
    Host.from_config(HostConfig(name="h2", address="local", deploy_root=str(tmp_path / "r2"))).run(["true"])
    assert len(trace.read_text().splitlines()) == 2  # unset: nothing written
