"""Issue 39: a control call reaches only the engine it means. Two replicas of a service on one machine (the bundled
runtime on CPU, releases r7 and r8): with the run files' ports swapped, a sleep meant for replica 0 (r7) on the port
where replica 1 (r8) serves is refused before anything is sent, naming both instances, and r8 stays awake; a wake of
a standby record that points at the other replica's port is refused the same way; the right call goes through. An
engine without the /identity route is taken only from the supervisor deployctl started on that port: a stranger
holding the port is named and nothing is sent to it. Local hosts (the transport is not the point)."""
from __future__ import annotations

import http.server
import json
import socket
import threading

import httpx
import pytest

from deployctl.config import parse_config
from deployctl.hosts.host import Host
from deployctl.rollout import standby as rollout_standby
from deployctl.service import identity
from deployctl.service.engine import Engine
from support.runtime import make_tiny_model, serve_runtime


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are free on loopback (replicas listen on server_port + i)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
        finally:
            t.close()
    raise AssertionError("no two consecutive free ports")


def _cfg(tmp_path, model, port: int):
    text = json.dumps({"service": {"name": "svc"}, "model": {"path": str(model)}, "engine": {"device": "cpu"},
                       "server": {"bind": "127.0.0.1"},
                       "hosts": [{"name": "m", "address": "local", "deploy_root": str(tmp_path / "root"),
                                  "launcher": "process", "server_port": port, "replicas": 2}]})
    return parse_config(text, "deploy.yaml")


def test_a_sleep_on_a_swapped_port_is_refused_naming_both_instances(tmp_path):
    model = make_tiny_model(tmp_path)
    p = _two_free_ports()
    cfg = _cfg(tmp_path, model, p)
    r0, r1 = (Host.from_config(h) for h in cfg.hosts)
    assert (r0.config.replica, r1.config.replica) == (0, 1)
    common = ("--max-model-len", "128", "--kv-cache-memory", "1MiB")
    with serve_runtime(model, tmp_path / "r7.log", *common, "--release-id", "r7", "--replica-index", "0",
                       port=p), \
            serve_runtime(model, tmp_path / "r8.log", *common, "--release-id", "r8", "--replica-index", "1",
                          port=p + 1) as url8:
        found = Engine(r1, cfg, p + 1).identity()
        assert (found.release, found.replica, found.source) == ("r8", 1, "route") and found.instance and found.pid
        # replica 0's run files say it serves on p + 1 (swapped): the sleep meant for r7 is refused there
        with pytest.raises(identity.IdentityMismatch) as e:
            Engine(r0, cfg, p + 1, release="r7").sleep()
        msg = str(e.value)
        assert f"m-r0: refusing to sleep the engine on port {p + 1}: expected m-r0's engine, release r7, replica 0, " \
               f"found release r8, replica 1, instance {found.instance[:12]}, pid {found.pid} (release and replica " \
               f"differ); nothing was sent to it" in msg, msg
        assert httpx.get(url8 + "/is_sleeping", timeout=10).json()["is_sleeping"] is False
        # a standby record of replica 0 that points at replica 1's port: the wake is refused the same way
        rec = rollout_standby.Standby("r7", p + 1, 0.0, 2e9)
        with pytest.raises(identity.IdentityMismatch, match="refusing to wake the engine"):
            rollout_standby.wake(r0, cfg, rec)
        # the right engine: the call goes through
        s = Engine(r1, cfg, p + 1, release="r8").sleep()
        assert s.ok and httpx.get(url8 + "/is_sleeping", timeout=10).json()["is_sleeping"] is True
        assert Engine(r1, cfg, p + 1, release="r8").wake().ok


class _Stranger(http.server.BaseHTTPRequestHandler):
    """A server that answers everything 200 and has no /identity: not an engine deployctl started."""

    hits: list = []

    def do_GET(self):  # noqa: N802
        self.hits.append(("GET", self.path))
        self.send_response(404 if self.path == "/identity" else 200)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        self.hits.append(("POST", self.path))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


def test_an_engine_without_identity_must_hold_the_port_from_our_supervisor(tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stranger)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = parse_config(json.dumps({
            "service": {"name": "svc"}, "model": {"path": str(tmp_path)}, "engine": {"device": "cpu"},
            "server": {"bind": "127.0.0.1"},
            "hosts": [{"name": "h", "address": "local", "deploy_root": str(tmp_path / "root"), "launcher": "process",
                       "server_port": port}]}), "deploy.yaml")
        host = Host.from_config(cfg.hosts[0])
        with pytest.raises(identity.IdentityMismatch) as e:
            Engine(host, cfg, port, release="r7").sleep()
        import os

        assert f"found pid {os.getpid()} (" in str(e.value) and "holding the port; nothing was sent" in str(e.value)
        assert ("POST", "/sleep?level=1") not in _Stranger.hits and ("GET", "/identity") in _Stranger.hits
    finally:
        srv.shutdown()
