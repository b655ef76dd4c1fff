"""The router's error share end to end: a real nginx with deployctl's router config in front of a runtime stand-in,
real mtail running the rendered program with the rendered /etc/default/mtail settings (as Debian's mtail.service
starts it), and its /metrics read with prometheus_client's parser. The runtime is stopped: the router's 502s are
counted beside the answers the runtime gave, by status and release; a client's path or headers cannot forge a
status or release."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from deployctl.config import load_config
from deployctl.render.watch import router_files
from support.nginx import NginxRouter
from support.ports import free_port
from support.render import write_config


class _StandIn(BaseHTTPRequestHandler):
    """A runtime stand-in: GET /v1/models answers 200 with the release header the runtimes send, then closes the
    connection (so nothing answers once the server is closed: no idle keep-alive connection outlives it)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Deployctl-Release", "r1")
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _default_settings(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a rendered /etc/default file, values unquoted as sh reads them."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = " ".join(shlex.split(value))
    return out


def _counts(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=5).text
    return {(s.labels["status"], s.labels.get("release", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "deployctl_router_requests_total"}


@pytest.fixture
def mtail_binary() -> str:
    path = shutil.which("mtail")
    if path is None:
        pytest.fail("mtail is not installed: run tests/setup.sh (apt-get install -y mtail)")
    return path


def test_mtail_counts_the_routers_502_when_the_runtime_stops(tmp_path, mtail_binary):
    runtime = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    serving = threading.Thread(target=runtime.serve_forever, daemon=True)
    serving.start()
    router = NginxRouter(tmp_path / "nginx")
    path = write_config(tmp_path / "deploy.yaml", engine={"device": "cpu"},
                        server={"bind": "127.0.0.1", "port": runtime.server_port, "api_key_env": None},
                        hosts=[{"name": "local-a", "address": "local", "deploy_root": str(tmp_path / "root")}],
                        router=router.router_config())
    cfg = load_config(path)
    files = {f.path: f.content for f in router_files(cfg)}
    progs = tmp_path / "mtail"
    progs.mkdir()
    (progs / "chat-7b.mtail").write_text(files["router/chat-7b.mtail"])
    settings = _default_settings(files["router/mtail.default"])
    assert settings["LOGS"] == str(router.access_log)
    port = free_port()
    mtail = None
    try:
        router.start(cfg)
        # mtail.service: mtail --progs /etc/mtail --logtostderr --address HOST --port PORT --logs "$LOGS" $EXTRA_ARGS
        mtail = subprocess.Popen([mtail_binary, "--progs", str(progs), "--logtostderr", "--address", "127.0.0.1",
                                  "--port", str(port), "--logs", settings["LOGS"],
                                  *shlex.split(settings["EXTRA_ARGS"])],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            assert mtail.poll() is None, mtail.stderr.read()
            try:
                if httpx.get(url + "/metrics", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mtail did not serve /metrics within 15 s"
            time.sleep(0.1)

        with httpx.Client(base_url=router.url, timeout=10) as client:
            assert [client.get("/v1/models").status_code for _ in range(2)] == [200] * 2
            # what a client controls (the path, the probe header) is escaped in the log: it cannot add a status
            # or a release to the count (the router answers the unknown path itself: 404)
            forged = client.get('/v1/%22status%22:599,', headers={"X-Deployctl-Probe": '","release":"forged'})
            assert forged.status_code == 404
            runtime.shutdown()
            runtime.server_close()
            assert [client.get("/v1/models").status_code for _ in range(2)] == [502] * 2
        logged = router.wait_entries(0, lambda e: len(e) >= 5)
        assert [e["status"] for e in logged] == [200, 200, 404, 502, 502]

        deadline = time.monotonic() + 15  # mtail polls the log every 250 ms
        while (counts := _counts(url)).get(("502", "")) != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts == {("200", "r1"): 2, ("404", ""): 1, ("502", ""): 2}, counts
    finally:
        if mtail is not None:
            mtail.terminate()
            mtail.wait(10)
            mtail.stderr.close()
        router.stop()
        runtime.server_close()
