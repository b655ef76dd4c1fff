"""The disk rule (deployctl.preflight.disk) over probe facts: each part of what a deploy needs counts, leftovers of
interrupted uploads count as free, the model path is judged on its own filesystem. Fleet behaviour (a real tmpfs,
the deploy refused before upload, the leftovers removed) is tests/deployctl/rollout/test_rollout_disk.py."""
from __future__ import annotations

from deployctl.config import parse_config
from deployctl.preflight.checks import check_disk
from deployctl.preflight.disk import ENGINE_VENV_BYTES, MARGIN_FLOOR_BYTES, margin, verdicts

MiB, GiB = 2**20, 2**30


def cfg(engine: str = "{device: cpu}"):
    return parse_config(f"""
service: {{name: chat}}
model: {{path: /models/m}}
engine: {engine}
hosts: [{{name: a, address: 10.0.0.1, deploy_root: /srv/chat}}]
""")


def space(free: int, *, model_free: int | None = None, venv=None, leftovers=(), declared=None, present=0,
          release_bytes=None) -> dict:
    disk = [{"role": "deploy_root", "path": "/srv/chat", "checked_path": "/srv/chat", "exists": True,
             "free_bytes": free, "total_bytes": 100 * GiB, "device": 1},
            {"role": "model", "path": "/models/m", "checked_path": "/models/m", "exists": True,
             "free_bytes": free if model_free is None else model_free, "total_bytes": 100 * GiB,
             "device": 1 if model_free is None else 2}]
    return {"space": {"disk": disk, "leftovers": [{"name": n, "bytes": b} for n, b in leftovers],
                      "release_bytes": release_bytes, "engine_venv": venv,
                      "model": {"bytes": present, "declared_bytes": declared}}}


def test_each_part_counts_and_leftovers_count_as_free():
    c = cfg()
    payload = 3 * MiB
    need = 2 * payload + margin(2 * payload)
    assert margin(2 * payload) == int(0.6 * MiB) + MARGIN_FLOOR_BYTES
    (v,) = verdicts(c, c.hosts[0], space(need - 1), payload)
    assert not v.ok and v.need.total == need
    assert "release payload 2 × 3.0 MiB" in v.line() and "free" in v.line() and "/srv/chat" in v.line()
    assert "deployctl models prune" in v.fix() and "keep_releases" in v.fix()
    # a leftover of an interrupted upload: its bytes are free once the deploy removes it
    (v,) = verdicts(c, c.hosts[0], space(need - 1, leftovers=[(".R.tar.tmp-ab12cd34", 1 * MiB)]), payload)
    assert v.ok and v.available == need - 1 + MiB and "1 leftover(s)" in v.line()
    # without a measured payload (preflight, status) the current release's size stands in
    (v,) = verdicts(c, c.hosts[0], space(10 * GiB, release_bytes=payload))
    assert v.need.total == need and "current release" in v.line()


def test_engine_venv_counts_until_installed_and_model_on_its_own_filesystem():
    c = cfg("{kind: vllm, version: 0.8.5, device: cuda}")
    (v,) = verdicts(c, c.hosts[0], space(8 * GiB, venv="missing"), MiB)
    assert not v.ok and "vllm==0.8.5 venv 10.0 GiB" in v.line() and v.need.total > ENGINE_VENV_BYTES["vllm"]
    for there in ("shared", "host env"):
        (v,) = verdicts(c, c.hosts[0], space(8 * GiB, venv=there), MiB)
        assert v.ok and "venv" not in v.line()
    # the model still being copied: on deploy_root's filesystem a part of its need, else judged on its own
    (v,) = verdicts(c, c.hosts[0], space(8 * GiB, venv="shared", declared=16 * GiB, present=6 * GiB), MiB)
    assert not v.ok and "model 10.0 GiB still to copy" in v.line()
    root, model = verdicts(c, c.hosts[0], space(8 * GiB, model_free=9 * GiB, venv="shared", declared=16 * GiB,
                                                 present=6 * GiB), MiB)
    assert root.ok and not model.ok and model.role == "model" and "9.0 GiB free" in model.line()
    # model.source: the weights fetch has its own check (deployctl.weights), not this one
    c2 = parse_config("""
service: {name: chat}
model: {source: "s3://bucket/m", version: v1}
engine: {kind: vllm, version: 0.8.5, device: cuda}
hosts: [{name: a, address: 10.0.0.1, deploy_root: /srv/chat}]
""")
    assert len(verdicts(c2, c2.hosts[0], space(8 * GiB, model_free=1, venv="shared", declared=16 * GiB), MiB)) == 1


def test_preflight_check_fails_naming_both_sizes_and_warns_near_the_alert():
    c = cfg()
    chk = check_disk(c, c.hosts[0], space(40 * MiB, release_bytes=MiB))
    assert chk.status == "fail" and "40.0 MiB free" in chk.message and "needs 66.2 MiB" in chk.message
    chk = check_disk(c, c.hosts[0], space(2 * GiB, release_bytes=MiB))
    assert chk.status == "warn" and "disk alert" in chk.message
    assert check_disk(c, c.hosts[0], space(50 * GiB, release_bytes=MiB)).status == "pass"
