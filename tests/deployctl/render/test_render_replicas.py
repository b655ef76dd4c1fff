"""``hosts[].replicas`` (issue 26): 2 replicas × TP 2 of vLLM on one 4-GPU host render side by side: each its own
unit name, port, deploy_root and CUDA_VISIBLE_DEVICES slice, the vLLM command with its own port (through vLLM's
parser in tests/deployctl/engines/test_engines_parsers.py's venv when it is there), and one nginx upstream server
per replica; overlapping GPU ids, ports or roots of entries on one machine are exit 3 naming both. The run on the
sshd fleet is tests/deployctl/rollout/test_rollout_replicas.py."""
from __future__ import annotations


import pytest
import yaml

from deployctl.config import parse_config
from deployctl.render import render_all
from deployctl.render.validate import validate_tree
from support import paths
from support.render import assert_config_refused

KEY = {"LLM_API_KEY": "sk-replicas-0123456789"}


def _doc() -> dict:
    doc = yaml.safe_load((paths.DATA / "engines" / "deploy-vllm.yaml").read_text())
    doc["hosts"] = [dict(doc["hosts"][0], gpus=[0, 1, 2, 3], replicas=2)]
    return doc


def test_two_replicas_of_tp2_on_one_host_render_side_by_side(tmp_path):
    cfg = parse_config(yaml.safe_dump(_doc()), "d.yaml")
    assert [(h.name, h.deploy_root, h.server_port, h.gpu_ids) for h in cfg.hosts] == [
        ("gpu-a-r0", "/opt/deployctl/llama-8b/r0", 8000, [0, 1]),
        ("gpu-a-r1", "/opt/deployctl/llama-8b/r1", 8001, [2, 3])]
    out = tmp_path / "out"
    render_all(cfg, out, target="systemd", release_id="r1", env=KEY)
    results = validate_tree(cfg, out)  # systemd-analyze verify on both units, nginx -t on the upstream
    assert sum(r.tool == "systemd-analyze verify" for r in results) == 2 * 3 + 2  # each: the unit, the log cap service and timer; the autoscale service and timer
    assert all(r.ok for r in results), [(r.tool, r.output) for r in results if not r.ok]
    for i, (gpus, port) in enumerate((("0,1", 8000), ("2,3", 8001))):
        d = out / "hosts" / f"gpu-a-r{i}"
        unit = (d / f"llama-8b-r{i}.service").read_text().splitlines()
        assert f"Environment=CUDA_VISIBLE_DEVICES={gpus}" in unit
        exec_start = next(line for line in unit if line.startswith("ExecStart="))
        assert f"/opt/deployctl/llama-8b/r{i}/releases/r1/engine/bin/python" in exec_start
        assert f" --port {port} " in exec_start and " --tensor-parallel-size 2 " in exec_start
        # each replica's log cap is its own: the timer starts that replica's service
        assert f"Unit=llama-8b-r{i}-logs.service" in (d / f"llama-8b-r{i}-logs.timer").read_text()
    upstream = next(out.rglob("router/*.conf")).read_text()
    assert "10.0.0.11:8000" in upstream and "10.0.0.11:8001" in upstream


@pytest.mark.parametrize("change,says", [
    (lambda d: d["hosts"][0].update(gpus=[0, 1, 2]), "needs 4 GPU ids in hosts[0].gpus"),
    (lambda d: d["hosts"].append(dict(d["hosts"][0], name="gpu-x", replicas=1, gpus=[3, 4],
                                      deploy_root="/opt/x", server_port=9000)), "both list GPU 3"),
    (lambda d: d["hosts"].append(dict(d["hosts"][0], name="gpu-x", replicas=1, gpus=[4, 5],
                                      deploy_root="/opt/x", server_port=8001)), "both use port 8001"),
])
def test_entries_on_one_machine_may_not_overlap(tmp_path, change, says):
    doc = _doc()
    change(doc)
    assert_config_refused(doc, says, tmp_path)
