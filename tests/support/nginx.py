"""A real nginx under its own prefix on a free loopback port, configured by deployctl's own renderers.

Fixture ``nginx_router`` yields an unstarted ``NginxRouter``: put ``router.router_config()`` under ``router:`` in
the deploy.yaml of the test, then ``router.start(cfg)`` (renders the main nginx.conf with ``render_nginx_main`` and,
unless given, an all-stable upstream conf with ``render_nginx``), ``router.write_upstream(text)`` +
``router.reload()`` to change the split, ``router.access_entries()`` to read the JSON access log, ``router.stop()``.
pid, error log, temp paths and the access log all live under the prefix; the nginx is stopped after the test.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support.ports import free_port

__all__ = ["NginxRouter", "free_port", "nginx_router", "nginx_binary"]


def nginx_binary() -> str:
    """Path of the nginx executable; fails the test with the install command when it is missing."""
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if path is None:
        pytest.fail("nginx is not installed: run tests/setup.sh (apt-get install -y nginx)")
    return path


def _shutting_down(pid: int) -> bool:
    try:
        return b"shutting down" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # already gone
        return True


class NginxRouter:
    """One nginx master (``daemon off``) under ``prefix`` listening on 127.0.0.1:``port``."""

    def __init__(self, prefix: Path, port: int | None = None):
        self.prefix = Path(prefix)
        self.port = port or free_port()
        self.conf_path = self.prefix / "nginx.conf"
        self.upstream_conf = self.prefix / "conf.d" / "router.conf"
        self.access_log = self.prefix / "logs" / "access.json"
        self.error_log = self.prefix / "logs" / "error.log"
        self.pid_file = self.prefix / "nginx.pid"
        self.proc: subprocess.Popen | None = None
        for d in ("conf.d", "logs", "temp"):
            (self.prefix / d).mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def router_config(self) -> dict:
        """The deploy.yaml ``router:`` mapping for this nginx."""
        return {"kind": "nginx", "host": "local", "listen": self.port, "listen_address": "127.0.0.1",
                "upstream_conf": str(self.upstream_conf), "nginx_conf": str(self.conf_path),
                "nginx_prefix": str(self.prefix), "access_log": str(self.access_log)}

    def _nginx(self, *args: str, timeout: float = 15) -> subprocess.CompletedProcess:
        return subprocess.run([nginx_binary(), "-p", str(self.prefix), "-c", str(self.conf_path), *args],
                              capture_output=True, text=True, timeout=timeout)

    def write_upstream(self, text: str) -> None:
        tmp = self.upstream_conf.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.upstream_conf)

    def test_config(self) -> subprocess.CompletedProcess:
        """``nginx -t`` on the current files (returncode 0 when valid; the messages are on stderr)."""
        return self._nginx("-t")

    def start(self, cfg, upstream_text: str | None = None) -> "NginxRouter":
        from deployctl.render import render_nginx, render_nginx_main

        user = "root" if os.geteuid() == 0 else None  # workers must reach a prefix under a 0700 tmp dir
        self.conf_path.write_text(render_nginx_main(cfg, prefix=str(self.prefix), include_path=str(self.upstream_conf),
                                                    user=user))
        keys_file = Path(str(self.upstream_conf) + ".keys")
        if cfg.server.api_key_env and not keys_file.exists():
            # a keyed router includes its keys file: until a deploy writes the real keys (it drops this deploy-sourced
            # stand-in, deployctl.render.keys.synced), it accepts a random key no client has
            from deployctl.render import keys

            stand_in = f"sk-nginx-fixture-{os.urandom(8).hex()}"
            keys_file.write_text(keys.render(cfg.service.name.replace("-", "_"),
                                             keys.KeysFile((keys.Key(stand_in, "deploy", "-"),), stand_in)))
            keys_file.chmod(0o600)
        if upstream_text is None and not self.upstream_conf.exists():
            upstream_text = render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0)
        if upstream_text is not None:
            self.write_upstream(upstream_text)
        checked = self.test_config()
        if checked.returncode != 0:
            raise AssertionError(f"nginx -t failed:\n{checked.stderr}")
        self.proc = subprocess.Popen([nginx_binary(), "-p", str(self.prefix), "-c", str(self.conf_path),
                                      "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited with {self.proc.returncode}: {self.proc.stderr.read().decode()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nginx did not listen on {self.port} within 10 s; see {self.error_log}")

    def _workers(self) -> set[int]:
        assert self.proc is not None
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return {int(p) for p in path.read_text().split()} if path.exists() else set()

    def reload(self, timeout: float = 10) -> None:
        """``nginx -s reload``; returns once a new worker runs and every old worker is gone or shutting down
        (old workers finish their open streams; they accept no new connections)."""
        before = self._workers()
        done = self._nginx("-s", "reload")
        if done.returncode != 0:
            raise AssertionError(f"nginx -s reload failed: {done.stderr}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self._workers()
            if now - before and all(_shutting_down(pid) for pid in now & before):
                return
            time.sleep(0.02)
        raise AssertionError(f"nginx did not switch workers within {timeout} s; see {self.error_log}")

    def access_entries(self) -> list[dict]:
        """The JSON access log lines written so far."""
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]

    def wait_entries(self, since: int, until, timeout_s: float = 10.0) -> list[dict]:
        """The access-log lines after the first ``since``, read again until ``until(lines)`` holds or timeout_s
        passes. nginx writes a line when it finalizes the request, which can be after the client has read the whole
        response, so a line a test counts on can land a moment after the client returns."""
        deadline = time.monotonic() + timeout_s
        while True:
            entries = self.access_entries()[since:]
            if until(entries) or time.monotonic() > deadline:
                return entries
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None


@pytest.fixture
def nginx_router(tmp_path):
    """An unstarted NginxRouter under tmp_path/nginx; stopped after the test."""
    router = NginxRouter(tmp_path / "nginx")
    try:
        yield router
    finally:
        router.stop()
