"""Releases, the deploy lock and the shared state on real directories through the Host layer (address: local):
atomic `current` switch, pruning that spares current and previous, lock ownership and staleness, generation
counter and merged history."""
from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone

import pytest

from deployctl.config import HostConfig
from deployctl.hosts import Host
from deployctl.rollout import release
from deployctl.rollout.lock import DeployLock, LockHeld
from deployctl.rollout.state import RolloutState, StateStore


@pytest.fixture
def hosts(tmp_path):
    out = [Host.from_config(HostConfig(name=n, address="local", deploy_root=str(tmp_path / n), launcher="process"))
           for n in ("a", "b")]
    yield out
    for h in out:
        h.close()


def _fake_release(host, rid):
    d = os.path.join(host.config.deploy_root, "releases", rid)
    os.makedirs(d)
    with open(os.path.join(d, "release.json"), "w") as f:
        json.dump({"id": rid}, f)


def test_switch_and_prune(hosts):
    h = hosts[0]
    ids = [f"20261130T00000{i}Z-0000000{i}" for i in range(6)]
    for rid in ids:
        _fake_release(h, rid)
    release.switch_current(h, ids[1])
    assert release.current_release(h) == ids[1]
    release.switch_current(h, ids[2])
    assert os.readlink(os.path.join(h.config.deploy_root, "current")) == f"releases/{ids[2]}"
    assert not os.path.exists(os.path.join(h.config.deploy_root, "current.new"))
    gone = release.prune(h, keep=2, protect={ids[0]})
    assert gone == [ids[1], ids[3]]
    assert release.list_releases(h) == [ids[0], ids[2], ids[4], ids[5]]
    with pytest.raises(Exception):
        release.switch_current(h, "20991231T000000Z-missing0")  # no such release: current unchanged
    assert release.current_release(h) == ids[2]


def test_lock_owner_stale_and_release(hosts):
    first = DeployLock(hosts, command="deploy")
    first.acquire()
    second = DeployLock(hosts, command="deploy")
    with pytest.raises(LockHeld) as err:
        second.acquire(break_stale=True)  # live owner: never broken as stale
    assert "another deploy holds the lock on a" in str(err.value) and "(deploy)" in str(err.value)
    assert "in progress" in str(err.value)
    assert not second.held
    # --break-lock removes even a live owner's lock; the first owner's release then leaves the new lock alone
    told = []
    second.acquire(break_lock=True, on_break=lambda host, owner, why: told.append((host, owner["pid"])))
    assert told == [("a", os.getpid()), ("b", os.getpid())]
    first.release()
    assert [i.owner["token"] for i in first.inspect()] == [second.record["token"]] * 2
    second.release()
    assert first.inspect() == []

    # a lock left by a dead process on this machine
    dead = {"owner": "x@y", "machine": socket.gethostname(), "pid": 2 ** 22 + 4242, "command": "deploy",
            "started": datetime.now(timezone.utc).isoformat(), "token": "t"}
    for h in hosts:
        os.makedirs(os.path.join(h.config.deploy_root, "state"), exist_ok=True)
        with open(os.path.join(h.config.deploy_root, "state", "lock"), "w") as f:
            f.write(json.dumps(dead) + "\n")
    infos = first.inspect()
    assert len(infos) == 2 and all(i.stale and "not running" in i.why_stale for i in infos)
    with pytest.raises(LockHeld) as err:
        DeployLock(hosts, command="deploy").acquire()
    assert "stale" in str(err.value) and "--break-lock" in str(err.value)
    broken = []
    third = DeployLock(hosts, command="rollback")
    third.acquire(break_stale=True, on_break=lambda host, owner, why: broken.append(host))
    assert broken == ["a", "b"]
    assert [i.owner["command"] for i in third.inspect()] == ["rollback", "rollback"]
    third.release()
    assert third.inspect() == []


def test_state_generation_and_history_merge(hosts):
    store = StateStore(hosts)
    assert store.read_control().generation == 0
    c1 = store.send("deploy")
    c2 = store.send("rollback", reason="r1")
    assert (c1.generation, c2.generation, store.read_control().command) == (1, 2, "rollback")
    st = RolloutState(release="r2", from_release="r1", generation=1, weight=5)
    store.write_rollout(st)
    assert store.read_rollout().weight == 5
    store.append_history("deploy", release="r2", result="ok")
    rec = store.append_history("rollback", release="r1", result="ok")
    # one host missed a record (it was down): the merged history still has every record once
    path = os.path.join(hosts[1].config.deploy_root, "state", "history.jsonl")
    lines = open(path).read().splitlines()
    open(path, "w").write(lines[0] + "\n")
    hist = store.read_history()
    assert [h["action"] for h in hist] == ["deploy", "rollback"] and hist[-1]["id"] == rec["id"]


def test_upload_writes_an_immutable_release_dir(tmp_path, hosts):
    from deployctl.config import parse_config
    from deployctl.render import render_release

    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.sha256").write_text("ab" * 32 + "  model.safetensors\n")
    h = hosts[0]
    cfg = parse_config(f"""
service: {{name: svc}}
model: {{path: {model}}}
engine: {{device: cpu}}
hosts: [{{name: a, address: local, deploy_root: {h.config.deploy_root}, launcher: process}}]
""")
    wheel = tmp_path / "deployctl_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 not really a wheel")
    info = release.make_release_info(cfg, wheel, (model / "manifest.sha256").read_text())
    rdir = release.upload(h, cfg, info, wheel, render_release(cfg, cfg.hosts[0], info.id, api_key="s3cret-key"))
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in sorted(tmp_path.joinpath(rdir).iterdir())}
    assert modes["runtime.env"] == "0o600" and modes["launch.sh"] == "0o755" and wheel.name in modes
    assert (tmp_path / rdir / "model.manifest.sha256").read_text() == (model / "manifest.sha256").read_text()
    meta = json.loads((tmp_path / rdir / "release.json").read_text())
    assert meta["id"] == info.id and meta["model_manifest_hash"] == info.model_manifest_hash
    assert meta["config_hash"] and meta["deployctl_version"] and meta["runtime_wheel_sha256"] == info.runtime_wheel_sha256
    assert wheel.name in (tmp_path / rdir / "manifest.sha256").read_text()
    assert not any(p.name.endswith((".partial", ".tar")) for p in (tmp_path / rdir).parent.iterdir())
    before = (tmp_path / rdir / "runtime.env").stat().st_mtime_ns
    assert release.upload(h, cfg, info, wheel, []) == rdir  # present: never rewritten
    assert (tmp_path / rdir / "runtime.env").stat().st_mtime_ns == before


def test_rollout_state_is_replaced_atomically_and_a_damaged_copy_is_named(hosts):
    store = StateStore(hosts)
    store.write_rollout(RolloutState(release="r1", generation=1))
    path = os.path.join(hosts[1].config.deploy_root, "state", "rollout.json")
    before = os.stat(path).st_ino
    store.write_rollout(RolloutState(release="r2", generation=2))
    assert os.stat(path).st_ino != before  # a new file renamed over the old one: a reader sees one or the other
    assert os.listdir(os.path.dirname(path)) == ["rollout.json"]  # no temp file left behind
    with open(path, "w") as f:
        f.write('{"release": "r2", "gener')
    from deployctl.rollout.state import StateUnreadable

    with pytest.raises(StateUnreadable) as err:
        store.read_rollout()
    assert err.value.exit_code == 4 and str(err.value).startswith(f"b: {path} is not a valid rollout record")
    told = []
    assert store.read_rollout(on_bad=told.append).release == "r2" and told and told[0].startswith("b: ")


def test_the_next_upload_removes_leftovers_of_a_killed_one(hosts, tmp_path):
    """A killed upload leaves releases/<id>.partial (half extracted) and releases/<id>.tar: they are not
    releases (not listed, never counted by keep_releases) and the next upload removes them."""
    from deployctl.config import parse_config
    from deployctl.render import RenderedFile

    h = hosts[0]
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.sha256").write_text("0" * 64 + "  config.json\n")
    cfg = parse_config(f"""
service: {{name: svc}}
model: {{path: {model}}}
engine: {{device: cpu}}
hosts: [{{name: a, address: local, deploy_root: {h.config.deploy_root}, launcher: process}}]
""")
    _fake_release(h, "20261130T000000Z-00000000")
    rel = os.path.join(h.config.deploy_root, "releases")
    os.makedirs(os.path.join(rel, "20261130T010000Z-11111111.partial", "sub"))
    with open(os.path.join(rel, "20261130T010000Z-11111111.tar"), "wb") as f:
        f.write(b"\0" * 4096)
    with open(os.path.join(rel, "20261130T020000Z-22222222.tar"), "wb") as f:
        f.write(b"\0" * 10)
    # the transports' own temp names of a put killed mid-way: SFTP's .<name>.tmp-<hex>, the local mkstemp's
    for temp in (".20261130T010000Z-11111111.tar.tmp-ab12cd34", ".20261130T020000Z-22222222.tar.k3x9_q"):
        with open(os.path.join(rel, temp), "wb") as f:
            f.write(b"\0" * 8192)
    assert release.list_releases(h) == ["20261130T000000Z-00000000"]
    wheel = tmp_path / "deployctl_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    info = release.ReleaseInfo("20261130T030000Z-33333333", "2026-11-30T03:00:00Z", "c" * 64, "m" * 64, wheel.name,
                               "w" * 64, "0.1.0")
    rdir = release.upload(h, cfg, info, wheel, [RenderedFile("release.json", "{}"), RenderedFile("runtime.yaml", "")])
    assert sorted(os.listdir(rel)) == ["20261130T000000Z-00000000", "20261130T030000Z-33333333"]
    assert os.path.exists(os.path.join(rdir, "release.json"))
    assert release.remove_leftovers(h) == []


def test_a_live_holders_heartbeat_keeps_its_lock_fresh_past_the_bound(hosts, monkeypatch):
    """Issue 28: a canary paused for 24 h outlived the lock's 6 h age and a resume broke it. The holder refreshes
    the file (its mtime) while it holds it; staleness is a dead owner or a heartbeat older than the bound."""
    import time

    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", "2")  # a heartbeat every 0.5 s
    first = DeployLock(hosts, command="deploy")
    first.acquire()
    try:
        time.sleep(3.5)  # past the bound since the lock was taken: only the heartbeat keeps it fresh
        infos = first.inspect()
        assert [i.stale for i in infos] == [False, False], infos
        assert all(i.owner["heartbeat_age_s"] <= 1 for i in infos), infos
        with pytest.raises(LockHeld, match=r"\[in progress\]"):
            DeployLock(hosts, command="deploy").acquire(break_stale=True)
    finally:
        first.release()
    # a holder that stopped beating: on another machine (killed there), or here with its pid now another
    # process's (this one's, alive): stale once the file is older than the bound, whatever `started` says
    now = datetime.now(timezone.utc).isoformat()
    for machine in ("elsewhere", socket.gethostname()):
        rec = {"owner": "x@y", "machine": machine, "pid": os.getpid(), "command": "deploy", "started": now,
               "token": "t"}
        for h in hosts:
            path = os.path.join(h.config.deploy_root, "state", "lock")
            with open(path, "w") as f:
                f.write(json.dumps(rec) + "\n")
            os.utime(path, (time.time() - 10, time.time() - 10))
        infos = first.inspect()
        assert all(i.stale and "no heartbeat for 1" in i.why_stale and "DEPLOYCTL_LOCK_MAX_AGE_S 2" in i.why_stale
                   for i in infos), infos


def test_a_restarted_runner_breaks_the_stale_lock_of_its_own_earlier_start_only(hosts):
    """A detached runner killed after it took the lock and before its journal's start: its restart is a fresh deploy
    again (no --break-lock), and the stale lock it finds is its own spawn's: broken. Another spawn's stays."""
    from deployctl.rollout.runner import RunnerStart

    dead = {"owner": "x@y", "machine": socket.gethostname(), "pid": 2 ** 22 + 4243, "command": "deploy",
            "started": datetime.now(timezone.utc).isoformat(), "token": "t", "runner": "spawn-1"}
    for h in hosts:
        os.makedirs(os.path.join(h.config.deploy_root, "state"), exist_ok=True)
        with open(os.path.join(h.config.deploy_root, "state", "lock"), "w") as f:
            f.write(json.dumps(dead) + "\n")
    with pytest.raises(LockHeld, match="stale"):
        DeployLock(hosts, command="deploy", runner=RunnerStart("spawn-2")).acquire()
    again = DeployLock(hosts, command="deploy", runner=RunnerStart("spawn-1", "deployctl-rollout-s.service"))
    again.acquire()
    try:
        assert [i.owner["unit"] for i in again.inspect()] == ["deployctl-rollout-s.service"] * 2
    finally:
        again.release()
