"""engine.* in deploy.yaml: bad input is one line naming the key and the fix, exit 3, before any host is touched
(the hosts here are unroutable addresses: a deploy that tried SSH would hang or exit 4). And no module outside
deployctl/engines spells the bundled runtime's metric names."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import paths

REPO = paths.REPO
BASE = """service: {{name: x}}
model: {{path: /nonexistent/model}}
engine: {engine}
server: {{bind: 127.0.0.1, port: 8000}}
hosts:
  - {{name: gpu-a, address: 10.255.255.1, user: deploy, deploy_root: /opt/x, gpus: [0, 1]}}
"""

CASES = {
    "unknown kind": ("{kind: vlm}", ["engine.kind", "set engine.kind to one of deployctl-runtime, vllm, sglang, transformers"]),
    "TP above the host's GPUs": ("{kind: vllm, version: 0.33.0, tensor_parallel_size: 4}",
                                 ["engine.tensor_parallel_size 4 is more than the 2 GPU(s) of host 'gpu-a'", "hosts[0].gpus"]),
    "extra_args duplicates a setting": ("{kind: vllm, version: 0.33.0, extra_args: ['--max-model-len=4096']}",
                                        ["engine.extra_args", "--max-model-len duplicates", "set engine.max_model_len instead"]),
    "extra_args duplicates a switch": ("{kind: sglang, version: 0.5.23, extra_args: ['--disable-radix-cache']}",
                                       ["--disable-radix-cache duplicates", "engine.enable_prefix_caching"]),
    "extra_args carries the key": ("{kind: vllm, version: 0.33.0, extra_args: ['--api-key', 'sk-x']}",
                                   ["--api-key would put the API key on the command line", "server.api_key_env"]),
    "foreign engine without a version": ("{kind: sglang}", ["engine.version is required for engine.kind sglang"]),
    "transformers with TP": ("{kind: transformers, version: 5.24.0, device: cpu, tensor_parallel_size: 2}",
                             ["transformers has no tensor parallelism"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_engine_settings_exit_3_before_any_host(tmp_path, name):
    engine, needles = CASES[name]
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(BASE.format(engine=engine))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["deploy", "--yes"], ["preflight"]):
        p = subprocess.run([sys.executable, "-m", "deployctl", *argv, "-c", str(cfg)], env=env, capture_output=True,
                           text=True, timeout=30)
        err = p.stderr.strip()
        assert p.returncode == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, (p.returncode, err)
        assert str(cfg) in err and all(n in err for n in needles), err


def test_no_runtime_metric_name_outside_the_engine_adapters():
    offenders = []
    for root in ("deployctl", "templates", "runbooks"):
        for path in (REPO / root).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".j2", ".yaml") and "engines" not in path.parts:
                for n, line in enumerate(path.read_text().splitlines(), 1):
                    if re.search(r"deployctl_runtime_[a-z]", line):
                        offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}")
    assert not offenders, "metric names belong in deployctl/engines/runtime.py:\n" + "\n".join(offenders)


TAG_CASES = {  # engine.version -> what the one line says (vLLM's image tag is v<version>)
    "0.33.0+cu128": ["engine.version '0.33.0+cu128' gives image tag 'v0.33.0+cu128', not a valid Docker tag",
                     "'+' is not allowed", "set container.image"],
    "latest": ["engine.version 'latest' moves with every push of vllm/vllm-openai", "pin a release version"],
}


@pytest.mark.parametrize("version", list(TAG_CASES))
def test_container_targets_need_a_pinned_valid_image_tag(tmp_path, version):
    """No registry is reachable here: the tag is checked against the Docker reference grammar and the moving tags,
    not looked up. A pip local version (``+cu128``) is a fine pip pin for the systemd target."""
    from deployctl.config import parse_config

    engine = f"{{kind: vllm, version: '{version}', tensor_parallel_size: 2}}"
    text = BASE.format(engine=engine)
    if version != "latest":
        assert parse_config(text).engine.version == version  # the systemd / process targets take it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cfg, out = tmp_path / "deploy.yaml", tmp_path / "out"
    runs = []
    cfg.write_text(text)
    runs.append(["render", "--target", "container", "--out", str(out)])  # the target chosen at render
    with_section = tmp_path / "deploy-container.yaml"
    with_section.write_text(text + "container: {namespace: llm}\n")  # a container deploy.yaml: refused at load
    runs.append(["plan", "--gpu-memory", "80GiB"])
    for argv, path in zip(runs, (cfg, with_section)):
        p = subprocess.run([sys.executable, "-m", "deployctl", *argv, "-c", str(path)], env=env, capture_output=True,
                           text=True, timeout=30)
        err = p.stderr.strip()
        assert p.returncode == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, p.returncode, err)
        assert all(n in err for n in TAG_CASES[version]), err
    assert not out.exists()  # nothing written


def test_a_pinned_version_gives_the_official_image_at_its_tag():
    from deployctl.config import parse_config
    from deployctl.engines.command import image

    for kind, version, want in (("vllm", "0.33.0", "vllm/vllm-openai:v0.33.0"),
                                ("sglang", "0.5.23", "lmsysorg/sglang:v0.5.23")):
        text = BASE.format(engine=f"{{kind: {kind}, version: {version}}}") + "container: {namespace: llm}\n"
        assert image(parse_config(text)) == want
