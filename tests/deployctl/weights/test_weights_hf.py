"""model.source hf://org/name@revision (issue 43) against a tiny hub on loopback: HF_ENDPOINT points the installed
huggingface_hub at it; it answers the routes huggingface_hub calls (GET /api/models/{repo}/revision/{rev}?blobs=true
for the file list and sizes; HEAD and GET /{repo}/resolve/{rev}/{file}); a real sshd host then GETs the resolve URLs
itself and verifies every file against the repository's manifest.sha256."""
from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import threading
from pathlib import Path

import pytest

from deployctl.config.models import ModelConfig
from deployctl.errors import ConfigError
from deployctl.hosts import Host
from deployctl.hostscripts.weights import write_manifest
from deployctl.weights import fetch as wfetch
from deployctl.weights.sources import plan

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """(endpoint, repo dir, request log [(method, path)]) of a one-repo hub: org/tiny at revision v1."""
    import huggingface_hub.constants as hfc

    monkeypatch.setattr(hfc, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # hf_hub_download's cache: the test's
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "model-00001.bin").write_bytes(hashlib.sha256(b"w").digest() * 4000)
    (repo / "config.json").write_text('{"model_type": "llama"}\n')
    assert write_manifest(repo)[1] == []
    log: list = []

    class Hub(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_a):
            pass

        def _answer(self, body_too: bool) -> None:
            path = self.path.split("?")[0]
            log.append((self.command, self.path))
            if path == "/api/models/org/tiny/revision/v1" and body_too:
                body = json.dumps({"id": "org/tiny", "sha": COMMIT, "siblings": [
                    {"rfilename": f.name, "size": f.stat().st_size} for f in sorted(repo.iterdir())]}).encode()
                headers = {"Content-Type": "application/json"}
            elif path.startswith("/org/tiny/resolve/v1/") and (repo / path.rsplit("/", 1)[1]).is_file():
                body = (repo / path.rsplit("/", 1)[1]).read_bytes()
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(body).hexdigest()}"'}
            else:
                body, headers = b'{"error": "Repository Not Found"}', {"X-Error-Code": "RepoNotFound"}
                self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body_too:
                self.wfile.write(body)

        def do_GET(self):
            self._answer(True)

        def do_HEAD(self):
            self._answer(False)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", repo, log
    server.shutdown()
    server.server_close()


def test_hf_source_lists_resolves_and_a_host_verifies(hub, ssh_fleet):
    endpoint, repo, log = hub
    m = ModelConfig(source="hf://org/tiny@v1", version="v1", store="models")
    p = plan(m, {"HF_ENDPOINT": endpoint})
    sizes = {f.name: f.stat().st_size for f in repo.iterdir() if f.name != "manifest.sha256"}
    assert {f["path"]: f["size"] for f in p.files} == sizes
    assert all(f["url"] == f"{endpoint}/org/tiny/resolve/v1/{f['path']}" for f in p.files)
    assert ("GET", "/api/models/org/tiny/revision/v1?blobs=true") in log  # listed at the revision, through the mirror

    (host,) = [Host.from_config(c) for c in ssh_fleet(1).host_configs()]
    (done,) = wfetch.fetch_to_hosts([host], m, p)
    got = Path(done.path)
    assert got == Path(host.config.deploy_root) / "models" / "tiny" / "v1"
    assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=got).returncode == 0
    assert sorted(p for meth, p in log if meth == "GET" and "/resolve/" in p) == sorted(
        [f"/org/tiny/resolve/v1/{n}" for n in sizes] + ["/org/tiny/resolve/v1/manifest.sha256"])

    with pytest.raises(ConfigError, match=r"hf://org/tiny@v9") as err:  # a revision the hub does not have
        plan(m.model_copy(update={"source": "hf://org/tiny@v9"}), {"HF_ENDPOINT": endpoint})
    assert "HF_ENDPOINT" in (err.value.fix or "")
