"""Model weights by version to every host (issue 43), on real parts: moto's S3 server on loopback (the S3 wire
protocol, presigned GETs), the sshd fleet, a seeded safetensors checkpoint, a real tmpfs for the small disk."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from deployctl.config.models import ModelConfig
from deployctl.errors import CheckFailed
from deployctl.hosts import Host
from deployctl.hostscripts.weights import write_manifest
from deployctl.weights import fetch as wfetch
from deployctl.weights.sources import plan
from support.cli import run_cli
from support.s3store import CREDS

def checkpoint(d: Path, seed: int) -> Path:
    """A real safetensors checkpoint (two seeded shards of 512 KiB) with config.json and manifest.sha256."""
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    for i in range(2):
        save_file({f"layers.{i}.weight": torch.randn(256, 512, generator=g)}, str(d / f"model-0000{i + 1}-of-00002.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}) + "\n")
    write_manifest(d)
    return d


def upload(client, d: Path, prefix: str) -> None:
    for f in sorted(d.iterdir()):
        client.put_object(Bucket="models", Key=f"{prefix}/{f.name}", Body=f.read_bytes())


def model_cfg(endpoint: str, version: str, **kw) -> ModelConfig:
    return ModelConfig(source="s3://models/tiny", version=version, store="models",
                       s3={"endpoint": endpoint, "access_key_env": "WX_KEY", "secret_key_env": "WX_SECRET"}, **kw)


def test_s3_fetch_resume_corrupt_disk_and_versions(s3, ssh_fleet, tmp_path):
    endpoint, client, log = s3
    fleet = ssh_fleet(3)
    hosts = [Host.from_config(c) for c in fleet.host_configs()]
    stores = [Path(c.deploy_root) / "models" / "tiny" for c in fleet.host_configs()]
    v1 = checkpoint(tmp_path / "v1", seed=1)
    upload(client, v1, "tiny")
    m = model_cfg(endpoint, "v1", fetch_parallel_hosts=2)
    assert m.path == "models/tiny/v1"

    # 1. three hosts fetch v1 from S3 (presigned GETs; no credential in the plan the hosts get); each verifies
    p = plan(m, CREDS)
    assert CREDS["WX_SECRET"] not in json.dumps(p.files) and len(p.files) == 3
    seen = {}
    done = wfetch.fetch_to_hosts(hosts, m, p, on_progress=lambda h, b, t: seen.__setitem__(h, (b, t)))
    assert [d.bytes_fetched for d in done] == [p.total_bytes] * 3
    assert all(seen[h.name] == (p.total_bytes, p.total_bytes) for h in hosts)
    for store in stores:
        got = store / "v1"
        assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=got).returncode == 0
        meta = json.loads((got / ".deployctl-model.json").read_text())
        assert meta["source"] == "s3://models/tiny" and meta["manifest_sha256"] == p.manifest_sha256
        assert not list(store.glob(".*partial"))
    shard = "tiny/model-00001-of-00002.safetensors"
    assert log.gets(shard) == [200, 200, 200]  # one GET per host: the source sent each host one copy

    # 2. v2, interrupted at half a file on host 0 (what a killed fetch leaves): the next fetch resumes by Range
    v2 = checkpoint(tmp_path / "v2", seed=2)
    upload(client, v2, "tiny")
    m2 = model_cfg(endpoint, "v2")
    p2 = plan(m2, CREDS)
    big = next(f for f in p2.files if f["path"].startswith("model-00001"))
    partial = stores[0] / ".v2.partial" / big["path"]
    partial.parent.mkdir(parents=True)
    partial.write_bytes((v2 / big["path"]).read_bytes()[: big["size"] // 2])
    n0 = len(log.gets(shard))
    (r0,) = wfetch.fetch_to_hosts(hosts[:1], m2, p2)
    assert r0.resumed == (big["path"],) and r0.bytes_fetched == p2.total_bytes - big["size"] // 2
    assert log.gets(shard)[n0:] == [206]  # a Range GET, answered 206 Partial Content
    assert hashlib.sha256((stores[0] / "v2" / big["path"]).read_bytes()).hexdigest() == big["sha256"]

    # 3. a corrupted object: fetched twice, then the host fails naming the file and both hashes; nothing published
    bad = bytearray((v2 / big["path"]).read_bytes())
    bad[-1] ^= 0xFF
    client.put_object(Bucket="models", Key=shard, Body=bytes(bad))
    p2bad = plan(m2, CREDS)
    n0 = len(log.gets(shard))
    with pytest.raises(wfetch.WeightsFetchFailed) as err:
        wfetch.fetch_to_hosts(hosts[1:2], m2, p2bad)
    info = err.value.failures[hosts[1].name]
    wrong = hashlib.sha256(bytes(bad)).hexdigest()
    assert info["file"] == big["path"] and info["expected"] == big["sha256"] and info["actual"] == wrong
    assert big["path"] in str(err.value) and big["sha256"] in str(err.value) and wrong in str(err.value)
    assert log.gets(shard)[n0:] == [200, 200]
    assert not (stores[1] / "v2").exists() and (stores[1] / "v1" / "manifest.sha256").exists()
    assert not (stores[1] / ".v2.partial" / big["path"]).exists()
    upload(client, v2, "tiny")  # repaired

    # 4. disk too small (a real 1 MiB tmpfs as host 2's store): refused before any byte, naming both sizes
    small = Path(fleet.host_configs()[2].deploy_root) / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("mount tmpfs needs root")
    try:
        m_small = ModelConfig(**{**m2.model_dump(), "store": "small", "path": ""})
        n0 = len(log.lines)
        with pytest.raises(wfetch.WeightsFetchFailed) as err:
            wfetch.fetch_to_hosts(hosts[2:3], m_small, p2)
        info = err.value.failures[hosts[2].name]
        assert info["need"] == p2.total_bytes and info["free"] < p2.total_bytes
        assert f"{p2.total_bytes} bytes to fetch but {info['free']} free" in str(err.value)
        assert [x for x in log.lines[n0:] if x[0] == "GET"] == []
    finally:
        subprocess.run(["umount", str(small)])

    # 5. versions kept, through the CLI: v3 fetched with `models fetch` (keep_versions 2); a kept release's
    # release.json naming v1 keeps v1; once that release is gone, `models prune` deletes v1, the oldest unused
    v3 = checkpoint(tmp_path / "v3", seed=3)
    upload(client, v3, "tiny")
    conf = tmp_path / "deploy.yaml"
    conf.write_text(yaml.safe_dump({
        "service": {"name": "tiny"}, "hosts": fleet.host_yaml()[:1],
        "model": {"source": "s3://models/tiny", "version": "v3", "store": "models", "keep_versions": 2,
                  "s3": {"endpoint": endpoint, "access_key_env": "WX_KEY", "secret_key_env": "WX_SECRET"}}}))
    r = run_cli("models", "fetch", "-c", str(conf), env=CREDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"model v3 from s3://models/tiny: 1 hosts, \d+ bytes fetched", r.stdout)
    assert CREDS["WX_SECRET"] not in r.stdout + r.stderr
    rel = Path(fleet.host_configs()[0].deploy_root) / "releases" / "20261206T000000Z-aaaa"
    rel.mkdir(parents=True)
    (rel / "release.json").write_text(json.dumps({"id": rel.name, "model_version": "v1"}))
    r = run_cli("models", "list", "-c", str(conf), "--json")
    listed = json.loads(r.stdout)["hosts"][hosts[0].name]
    assert [(v["version"], v["releases"]) for v in listed] == [("v1", [rel.name]), ("v2", []), ("v3", [])]
    assert all(v["verified_at"] and v["bytes"] > p.total_bytes // 2 for v in listed)
    r = run_cli("models", "prune", "-c", str(conf), "--json")
    assert json.loads(r.stdout)["pruned"] == {hosts[0].name: []}  # v1 in use, v2 + v3 are the 2 kept
    (rel / "release.json").unlink()
    rel.rmdir()
    r = run_cli("models", "prune", "-c", str(conf), "--json")
    assert json.loads(r.stdout)["pruned"] == {hosts[0].name: ["v1"]}
    assert sorted(p.name for p in stores[0].iterdir()) == ["v2", "v3"]

    # 6. a rollback to a release whose model version was pruned says so before it starts (rollback.py calls this)
    rel.mkdir()
    (rel / "release.json").write_text(json.dumps({"id": rel.name, "model_version": "v1"}))
    with pytest.raises(CheckFailed) as err:
        wfetch.pruned_model_check(hosts[:1], m, rel.name)
    assert f"release {rel.name} serves model version v1, which was pruned from {hosts[0].name}" in str(err.value)
    assert "--fetch" in err.value.fix
    (rel / "release.json").write_text(json.dumps({"id": rel.name, "model_version": "v3"}))
    wfetch.pruned_model_check(hosts[:1], m, rel.name)  # v3 is there: no complaint


def test_https_source_file_server_resumes_by_range(ssh_fleet, tmp_path):
    """model.source http(s)://: the manifest lists the files, a real nginx serves them (plain HTTP on loopback; the
    host code is the same urllib GET for https). A file half there resumes with one Range GET of the other half."""
    from support.fileserver import FileServer

    ckpt = checkpoint(tmp_path / "www" / "tiny", seed=7)
    server = FileServer(tmp_path / "www", tmp_path / "nginx").start()
    try:
        fleet = ssh_fleet(1)
        (host,) = [Host.from_config(c) for c in fleet.host_configs()]
        m = ModelConfig(source=f"{server.url}/tiny/", version="r7", store="models")
        assert m.path == "models/tiny/r7"
        p = plan(m)
        assert sorted(f["path"] for f in p.files) == sorted(f.name for f in ckpt.iterdir() if f.name != "manifest.sha256")
        big = next(f for f in p.files if f["path"].startswith("model-00002"))
        part = Path(fleet.host_configs()[0].deploy_root) / "models" / "tiny" / ".r7.partial" / big["path"]
        part.parent.mkdir(parents=True)
        half = big["size"] // 2
        part.write_bytes((ckpt / big["path"]).read_bytes()[:half])
        (r,) = wfetch.fetch_to_hosts([host], m, p)
        assert r.resumed == (big["path"],) and r.bytes_fetched == p.total_bytes - half
        gets = {uri: (status, sent, rng) for meth, uri, status, sent, rng in server.entries() if meth == "GET"}
        assert gets[f"/tiny/{big['path']}"] == (206, big["size"] - half, f"bytes={half}-")
        published = Path(r.path)
        assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=published).returncode == 0
    finally:
        server.stop()


def test_connection_dropped_at_half_a_file_resumes_in_the_same_run(tmp_path):
    """A server that sends half of a file then drops the connection: the host script resumes with a Range GET
    from the byte it got to, verifies, publishes (run as the host runs it: the script's source on a python -c)."""
    import http.server
    import threading

    from deployctl.hostscripts import fetch as fetch_script
    from deployctl.hostscripts.snippets import module_argv

    ckpt = checkpoint(tmp_path / "ckpt", seed=9)
    name = "model-00001-of-00002.safetensors"
    body = (ckpt / name).read_bytes()
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            rng = self.headers.get("Range")
            seen.append(rng)
            start = int(rng[6:-1]) if rng else 0
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if len(seen) == 1:  # the first answer stops at half and the connection drops
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(2)
                return
            self.wfile.write(body[start:])

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        digest = hashlib.sha256(body).hexdigest()
        plan_body = {"store": str(tmp_path / "store"), "name": "tiny", "version": "v9",
                     "manifest": f"{digest}  {name}\n", "prunable": [],
                     "files": [{"path": name, "url": f"http://127.0.0.1:{srv.server_address[1]}/{name}",
                                "sha256": digest, "size": len(body)}]}
        res = subprocess.run(module_argv("python3", fetch_script, "fetch"), capture_output=True, text=True,
                             env={**os.environ, "DEPLOYCTL_FETCH_PLAN": json.dumps(plan_body)}, timeout=60)
        out = json.loads(res.stdout)
        assert res.returncode == 0 and out["ok"], res.stdout + res.stderr
        assert seen == [None, f"bytes={len(body) // 2}-"]
        assert out["resumed"] == [name] and out["bytes_fetched"] == len(body)
        assert (tmp_path / "store" / "tiny" / "v9" / name).read_bytes() == body
    finally:
        srv.shutdown()


def test_status_check_names_the_host_on_another_model_version(tmp_path):
    """release.json's model_version/source/dtype/quantization are read back by the fleet snapshot and compared."""
    import sys

    from deployctl.config import parse_config
    from deployctl.rollout.fleetcheck import differences, snapshot
    from deployctl.rollout.release import make_release_info

    cfg = parse_config(yaml.safe_dump({
        "service": {"name": "svc"}, "engine": {"device": "cpu"},
        "model": {"source": "s3://models/tiny", "version": "v2", "store": str(tmp_path / "store"), "dtype": "bfloat16",
                  "quantization": "fp8"},
        "hosts": [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "python": sys.executable,
                   "launcher": "process", "server_port": 18100 + i} for i, n in enumerate("abc")]}))
    wheel = tmp_path / "deployctl_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"w")
    info = json.loads(make_release_info(cfg, wheel, "x  config.json\n").to_json())
    assert (info["model_version"], info["model_source"], info["model_dtype"], info["model_quantization"]) == \
        ("v2", "s3://models/tiny", "bfloat16", "fp8")
    for n, version in (("a", "v2"), ("b", "v1"), ("c", "v2")):
        rdir = tmp_path / n / "releases" / "r1"
        rdir.mkdir(parents=True)
        (rdir / "release.json").write_text(json.dumps({**info, "id": "r1", "model_version": version}))
        (rdir / "manifest.sha256").write_text("")
        os.symlink("releases/r1", tmp_path / n / "current")
    rows = [{"host": h.name, **snapshot(Host.from_config(h), cfg)} for h in cfg.hosts]
    assert [r["model_version"] for r in rows] == ["v2", "v1", "v2"] and rows[0]["model_quantization"] == "fp8"
    assert differences(rows) == ["b: model version v1 differs from the rest (v2 on a, c)"]
