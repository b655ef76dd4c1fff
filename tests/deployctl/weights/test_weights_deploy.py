"""A deploy with model.source: s3://... on the sshd fleet with the stand-in engine (issue 43): the hosts fetch the
version before anything else, the release serves it from <store>/<name>/<version>, and release.json names it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx

from support.s3store import CREDS


def test_deploy_fetches_the_model_version_and_records_it(s3, rollout_env, tmp_path):
    endpoint, client, log = s3
    env = rollout_env(3, engine="standin", service="weights-deploy", steps=[100], pause_s=0)
    src = Path(env.cfg["model"]["path"])
    for f in sorted(src.iterdir()):
        client.put_object(Bucket="models", Key=f"standin-chat/{f.name}", Body=f.read_bytes())
    store = tmp_path / "store"
    env.cfg["model"] = {"source": "s3://models/standin-chat", "version": "2026-12-01", "store": str(store),
                        "fetch_parallel_hosts": 1, "quantization": "fp8",
                        "s3": {"endpoint": endpoint, "access_key_env": "WX_KEY", "secret_key_env": "WX_SECRET"}}
    env.write()
    r = env.cli("deploy", "--yes", env=CREDS)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "fetching model 2026-12-01 from s3://models/standin-chat" in out and "verified" in out
    assert CREDS["WX_SECRET"] not in out
    published = store / "standin-chat" / "2026-12-01"
    assert json.loads((published / ".deployctl-model.json").read_text())["source"] == "s3://models/standin-chat"
    for name in env.names:
        rid = env.current(name)
        info = json.loads((Path(env.host(name)["deploy_root"]) / "releases" / rid / "release.json").read_text())
        assert (info["model_version"], info["model_source"], info["model_quantization"]) == \
            ("2026-12-01", "s3://models/standin-chat", "fp8")
    started = [h for h in env.history() if h["action"] == "deploy" and h["result"] == "started"]
    assert started[-1]["model_fetch"].startswith("model 2026-12-01: on 3 hosts, verified;")
    models = httpx.get(env.runtime_url(env.names[0]) + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "standin-chat"
    # two more versions in turn with rollout.keep_releases 2, model.keep_versions 2: v1's release is pruned, then
    # v1 itself (no kept release uses it); the two newest stay
    env.cfg["rollout"] = {**env.cfg.get("rollout", {}), "keep_releases": 2}
    for version in ("2026-12-02", "2026-12-03"):
        env.cfg["model"]["version"] = version
        env.write()
        r = env.cli("deploy", "--yes", env=CREDS)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "pruned model versions no kept release uses: 2026-12-01" in r.stdout + r.stderr
    assert sorted(p.name for p in (store / "standin-chat").iterdir()) == ["2026-12-02", "2026-12-03"]
    # the previous release's version lost from the store: a rollback says so before it starts; --fetch refetches it
    shutil.rmtree(store / "standin-chat" / "2026-12-02")
    before = env.current(env.names[0])
    r = env.cli("rollback", env=CREDS)
    assert r.returncode != 0 and "serves model version 2026-12-02, which was pruned from gpu-a, gpu-b, gpu-c" in r.stderr
    assert env.current(env.names[0]) == before
    r = env.cli("rollback", "--fetch", env=CREDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (store / "standin-chat" / "2026-12-02" / ".deployctl-model.json").exists()
    assert env.current(env.names[0]) != before
    # without the credentials the deploy stops before anything changes, naming the variables
    r = env.cli("deploy", "--yes", env={"WX_KEY": "", "WX_SECRET": ""})
    assert r.returncode != 0 and "$WX_KEY and $WX_SECRET are not both set" in r.stderr
