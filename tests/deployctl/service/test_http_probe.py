"""The host-side HTTP probe (hostscripts.snippets.HTTP_PROBE, run with a real python as deploys run it on a host)
reports why there was no answer as a kind and in words, never as an exception repr; HttpResult.describe turns that
into the status line."""
import json
import socket
import subprocess
import sys

from deployctl.hostscripts.snippets import HTTP_PROBE
from deployctl.service.http import HttpResult
from support.ports import free_port


def probe(url: str, timeout: float = 2.0) -> dict:
    req = {"url": url, "method": "GET", "timeout": timeout, "json": None, "env_file": None}
    out = subprocess.run([sys.executable, "-S", "-c", HTTP_PROBE, json.dumps(req)], capture_output=True, text=True,
                         timeout=30, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_refused_and_timeout_are_kinds_in_words():
    port = free_port()
    d = probe(f"http://127.0.0.1:{port}/readyz")
    assert (d["status"], d["error_kind"]) == (0, "refused")
    assert d["error"] == "Connection refused" and "URLError" not in d["error"] and "Errno" not in d["error"]
    r = HttpResult(0, error=d["error"], error_kind=d["error_kind"])
    assert r.describe("/readyz") == "connection refused"

    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        d = probe(f"http://127.0.0.1:{silent.getsockname()[1]}/readyz", timeout=0.5)
    assert (d["status"], d["error_kind"]) == (0, "timeout"), d
    assert "timed out" in d["error"]


def test_an_http_answer_is_described_by_route_and_status():
    assert HttpResult(503, body="{}").describe("/health") == "/health 503"
