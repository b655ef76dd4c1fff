"""Model weights by version to every host (issue 43), on real parts: moto's S3 server on loopback (the S3 wire
protocol, presigned GETs), the sshd fleet, a seeded safetensors checkpoint, a real tmpfs for the small disk."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from deployctl.config.models import ModelConfig
from deployctl.hosts import Host
from deployctl.hostscripts.weights import write_manifest
from deployctl.weights import fetch as wfetch
from deployctl.weights.keep import versions_to_prune
from deployctl.weights.sources import plan
from support.ports import free_port

CREDS = {"WX_KEY": "AKIATESTKEY", "WX_SECRET": "test-secret-value"}


class AccessLog(logging.Handler):
    """werkzeug's request lines from moto's server: (method, path, status)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str, int]] = []

    def emit(self, record):
        text = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())  # werkzeug colours 206 and errors
        m = re.search(r'"(GET|HEAD|PUT|POST) (\S+) HTTP/[\d.]+" (\d+)', text)
        if m:
            self.lines.append((m.group(1), m.group(2).split("?")[0], int(m.group(3))))

    def gets(self, key: str) -> list[int]:
        return [st for meth, path, st in self.lines if meth == "GET" and path.endswith(key)]


@pytest.fixture(scope="module")
def s3():
    from moto.server import ThreadedMotoServer
    import boto3

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=True)
    log = AccessLog()
    wlog = logging.getLogger("werkzeug")
    wlog.addHandler(log)
    wlog.setLevel(logging.INFO)
    server.start()
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id=CREDS["WX_KEY"], aws_secret_access_key=CREDS["WX_SECRET"])
    client.create_bucket(Bucket="models")
    yield f"http://127.0.0.1:{port}", client, log
    wlog.removeHandler(log)
    server.stop()


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

    # 5. versions kept: v1, v2, v3 in turn with keep_versions 2 and no kept release using v1: v1 is pruned
    v3 = checkpoint(tmp_path / "v3", seed=3)
    upload(client, v3, "tiny")
    m3 = model_cfg(endpoint, "v3", keep_versions=2)
    wfetch.fetch_to_hosts(hosts[:1], m3, plan(m3, CREDS))
    listed = wfetch.list_versions(hosts[0], m3)
    assert [v["version"] for v in listed] == ["v1", "v2", "v3"]
    assert all(v["verified_at"] and v["bytes"] > 0 for v in listed)
    assert versions_to_prune(listed, "v3", in_use=("v1",), keep=2) == []  # a kept release still uses v1
    gone = versions_to_prune(listed, "v3", in_use=(), keep=2)
    assert gone == ["v1"]
    assert wfetch.prune_versions(hosts[0], m3, gone) == ["v1"]
    assert sorted(p.name for p in stores[0].iterdir()) == ["v2", "v3"]
