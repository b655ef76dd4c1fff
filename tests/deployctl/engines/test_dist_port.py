"""A distributed-init port per replica (issue 39): two multi-GPU replicas on one machine get their own rendezvous
port (SGLang ``--nccl-port``, vLLM ``VLLM_PORT``), checked by the pinned engines' own code in .venv-engines (SGLang's
argument parser, vLLM's envs module); every port deployctl allocates on a machine (server_port, spare_port,
dist_port) is refused at config load when two host entries there share it, naming both owners."""
from __future__ import annotations

import json
import subprocess

import pytest

from deployctl.engines.command import dist_port, engine_env, settings_argv
from deployctl.errors import ConfigError
from support.paths import REPO
from support.render import make_config

HELPER = REPO / "tests" / "support" / "engine_argparse.py"
ENGINES_PY = next((p for p in (REPO / ".venv-engines" / "bin" / "python",
                               REPO.parent / "main" / ".venv-engines" / "bin" / "python") if p.exists()), None)


def replicas(kind: str, tp: int = 2, **host):
    version = {"vllm": "0.33.0", "sglang": "0.5.23"}[kind]
    # no standby: vLLM's dev mode needs a loopback bind (engines.validate.check_dev_mode_bind)
    return make_config(engine={"kind": kind, "version": version, "tensor_parallel_size": tp}, rollout={"standby_s": 0},
                       hosts=[{"name": "gpu-a", "address": "10.0.0.11", "user": "deploy", "gpus": [0, 1, 2, 3],
                               "replicas": 4 // tp, "deploy_root": "/opt/deployctl/chat-7b",
                               "python": "/opt/deployctl/venv/bin/python", **host}])


def _engines(args: list[str], *, stdin: str = "", env: dict | None = None) -> str:
    if ENGINES_PY is None:
        pytest.fail(".venv-engines is missing: run `bash tests/setup_test_venvs.sh`")
    r = subprocess.run([str(ENGINES_PY), *args], input=stdin, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu", "HOME": "/tmp", **(env or {})})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_each_sglang_replica_gets_its_own_nccl_port_and_sglangs_parser_takes_it():
    cfg = replicas("sglang")
    assert [h.name for h in cfg.hosts] == ["gpu-a-r0", "gpu-a-r1"]
    argvs = [settings_argv(cfg, h, 8080 + i) for i, h in enumerate(cfg.hosts)]
    parsed = json.loads(_engines([str(HELPER), "sglang"], stdin=json.dumps(argvs)))
    assert [p["options"]["--nccl-port"] for p in parsed] == [["nccl_port", 28080], ["nccl_port", 28081]]
    assert [p["options"]["--tp-size"] for p in parsed] == [["tp_size", 2], ["tp_size", 2]]
    # hosts[].dist_port moves it; replica i takes dist_port + i, as its server_port is server_port + i
    moved = replicas("sglang", dist_port=31000)
    assert [dist_port(moved, h) for h in moved.hosts] == [31000, 31001]


def test_each_vllm_replica_gets_its_own_vllm_port_as_vllm_reads_it():
    cfg = replicas("vllm")
    envs = [engine_env(cfg, None, host=h) for h in cfg.hosts]
    assert [e["VLLM_PORT"] for e in envs] == ["28080", "28081"]
    assert "--nccl-port" not in settings_argv(cfg, cfg.hosts[0], 8080)
    code = "import vllm.envs as e; print(e.VLLM_PORT)"
    assert [_engines(["-c", code], env={"VLLM_PORT": e["VLLM_PORT"]}) for e in envs] == ["28080", "28081"]
    # the port reaches the env file the unit and launch.sh read
    from deployctl.render import render_release

    env_file = {f.path: f.content for f in render_release(cfg, cfg.hosts[1], "r1", api_key="k-0123456789")}["runtime.env"]
    assert "VLLM_PORT=28081" in env_file


def test_one_gpu_engines_get_no_dist_port():
    cfg = replicas("sglang", tp=1)
    assert dist_port(cfg, cfg.hosts[0]) is None
    assert "--nccl-port" not in settings_argv(cfg, cfg.hosts[0], 8080)
    assert "VLLM_PORT" not in engine_env(replicas("vllm", tp=1), None, host=cfg.hosts[0])


def test_a_port_shared_by_two_entries_on_one_machine_is_refused_naming_both_owners():
    base = {"address": "10.0.0.11", "user": "deploy", "python": "/opt/deployctl/venv/bin/python"}
    tp2 = {"kind": "sglang", "version": "0.5.23", "tensor_parallel_size": 2}
    with pytest.raises((ConfigError, ValueError)) as err:
        make_config(engine=tp2,
                    hosts=[{"name": "a", "gpus": [0, 1], "deploy_root": "/opt/a", "dist_port": 31000, **base},
                           {"name": "b", "gpus": [2, 3], "deploy_root": "/opt/b", "server_port": 31000,
                            "dist_port": 31010, **base}])
    text = str(err.value)
    assert "hosts 'a' and 'b' run on one machine (10.0.0.11) and both use port 31000" in text
    assert "(a's dist_port, b's server_port); give each its own server_port" in text
    # entries written out by hand: a's default rendezvous port (server_port 8080 + 20000) is b's server_port
    with pytest.raises((ConfigError, ValueError)) as err:
        make_config(engine=tp2,
                    hosts=[{"name": "a", "gpus": [0, 1], "deploy_root": "/opt/a", **base},
                           {"name": "b", "gpus": [2, 3], "deploy_root": "/opt/b", "server_port": 28080, **base}])
    assert "both use port 28080 (a's dist_port, b's server_port)" in str(err.value)
    with pytest.raises((ConfigError, ValueError)) as err:
        make_config(hosts=[{"name": "a", "deploy_root": "/opt/a", "server_port": 8080, "spare_port": 8090, **base},
                           {"name": "b", "deploy_root": "/opt/b", "server_port": 8090, **base}])
    assert "both use port 8090 (a's spare_port, b's server_port)" in str(err.value)
    with pytest.raises((ConfigError, ValueError)) as err:
        replicas("sglang", dist_port=8080)
    assert "its dist_port 8080 is also its server_port" in str(err.value)
    # two machines may use the same ports
    make_config(hosts=[{"name": "a", "deploy_root": "/opt/a", **base},
                       {**base, "name": "b", "deploy_root": "/opt/b", "address": "10.0.0.12"}])


def test_preflight_checks_each_allocated_port_is_free_or_ours():
    """The probe binds each of the host's other allocated ports for real (gather.more_ports -> probe more_ports);
    a stranger listening on the dist port fails naming it, our own engine's listener passes."""
    import os
    import socket

    from deployctl.hostscripts.probe import collect
    from deployctl.preflight.checks import check_allocated_ports
    from deployctl.preflight.gather import more_ports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
    cfg = make_config(engine={"kind": "sglang", "version": "0.5.23", "tensor_parallel_size": 2},
                      server={"bind": "127.0.0.1"},
                      hosts=[{"name": "gpu-a", "address": "10.0.0.11", "user": "deploy", "gpus": [0, 1],
                              "deploy_root": "/opt/deployctl/chat-7b", "python": "/opt/deployctl/venv/bin/python",
                              "dist_port": taken}])
    host = cfg.hosts[0]
    assert more_ports(cfg, host) == [["0.0.0.0", taken, "dist_port"]]
    params = {"sections": ["service", "more_ports"], "deploy_root": "/nonexistent",
              "more_ports": more_ports(cfg, host)}
    facts = collect(params)
    assert check_allocated_ports(host, facts).status == "pass"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", taken))
        s.listen()
        facts = collect(params)
        c = check_allocated_ports(host, facts)
        assert c.status == "fail" and f"dist_port {taken} on 0.0.0.0 on gpu-a is held by pid {os.getpid()}" in c.message
        assert "hosts[gpu-a].dist_port" in c.fix
        facts["service"] = {"pids": [os.getpid()]}  # our own engine holds it
        assert check_allocated_ports(host, facts).status == "pass"
