"""engine.env, engine.secret_env and engine.cache_dir (issue 26) rendered for every target: the variables in the
0600 runtime.env (the secret's value in no other file), the cache directory made by the unit before the start,
bind-mounted by compose and a node hostPath in the pod; each tree through the field's own checkers
(systemd-analyze verify, docker compose's schema where render validates it, kubernetes-validate). Refusals name
the key and the fix; an unset secret is exit 3 before anything is written. The run that shows the variables in the
engine's /proc/PID/environ is tests/deployctl/engines/test_engines_secret_log.py."""
from __future__ import annotations

import pytest
import yaml

from deployctl.config import parse_config
from deployctl.errors import ConfigError
from deployctl.render import render_all
from deployctl.render.validate import validate_tree
from support import paths
from support.render import assert_config_refused

KEY = {"LLM_API_KEY": "sk-engine-env-0123456789"}
TOKEN = "hf_renderTOKEN0123456789abcdefghij"
CACHE = "/var/cache/deployctl/llama-8b"


def _doc(**engine) -> dict:
    doc = yaml.safe_load((paths.DATA / "engines" / "deploy-vllm.yaml").read_text())
    doc["engine"].update({"env": {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "1"}, "secret_env": ["HF_TOKEN"],
                          "cache_dir": CACHE}, **engine)
    return doc


@pytest.mark.parametrize("target", ["systemd", "container", "k8s"])
def test_variables_go_to_the_env_file_and_the_cache_dir_to_every_target(tmp_path, monkeypatch, target):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cfg = parse_config(yaml.safe_dump(_doc()), "d.yaml")
    out = tmp_path / "out"
    render_all(cfg, out, target=target, release_id="r1", env=KEY)
    results = validate_tree(cfg, out)
    assert results and all(r.ok for r in results), [(r.tool, r.output) for r in results if not r.ok]
    envs = list(out.rglob("runtime.env"))
    assert envs
    plain = {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "1", "XDG_CACHE_HOME": CACHE, "HF_HOME": f"{CACHE}/huggingface",
             "VLLM_CACHE_ROOT": f"{CACHE}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/torchinductor",
             "TRITON_CACHE_DIR": f"{CACHE}/triton"}
    for env in envs:
        text = env.read_text().splitlines()
        assert oct(env.stat().st_mode & 0o777) == "0o600"
        assert f"HF_TOKEN={TOKEN}" in text and any(t.endswith("=" + KEY["LLM_API_KEY"]) for t in text)
        lines = {f"{k}={v}" for k, v in plain.items()}
        # the k8s Secret holds the secrets only: the pod spec carries the plain variables
        assert not lines & set(text) if target == "k8s" else lines <= set(text)
    leaked = [str(p) for p in out.rglob("*") if p.is_file() and p.name != "runtime.env" and TOKEN in p.read_text()]
    assert not leaked, leaked
    if target == "systemd":
        unit = next(out.rglob("llama-8b.service")).read_text()
        assert f"ExecStartPre=+/bin/sh -c 'mkdir -p {CACHE} && chown deploy {CACHE}'" in unit  # User=deploy
        assert f"  mkdir -p {CACHE} 2>/dev/null || echo \"launch.sh: cannot create engine.cache_dir {CACHE}" in \
            next(out.rglob("launch.sh")).read_text()
    elif target == "container":
        vol = yaml.safe_load(next(out.rglob("compose.yaml")).read_text())["services"]["runtime"]["volumes"]
        assert {"type": "bind", "source": CACHE, "target": CACHE, "bind": {"create_host_path": True}} in vol
    else:
        docs = [d for p in out.rglob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d]
        pod = next(d for d in docs if d.get("kind") == "Deployment")["spec"]["template"]["spec"]
        assert {"name": "engine-cache", "hostPath": {"path": CACHE, "type": "DirectoryOrCreate"}} in pod["volumes"]
        runtime = pod["containers"][0]
        assert {"name": "engine-cache", "mountPath": CACHE} in runtime["volumeMounts"]
        from_secret = {e["name"] for e in runtime["env"] if "valueFrom" in e}
        assert from_secret == {"HF_TOKEN", "VLLM_API_KEY"}  # vLLM reads its key from VLLM_API_KEY
        assert plain.items() <= {e["name"]: e.get("value") for e in runtime["env"] if "value" in e}.items()


def test_an_unset_secret_is_exit_3_naming_it_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cfg = parse_config(yaml.safe_dump(_doc()), "d.yaml")
    with pytest.raises(ConfigError) as exc:
        render_all(cfg, tmp_path / "out", target="systemd", release_id="r1", env=KEY)
    assert "engine.secret_env names HF_TOKEN but HF_TOKEN is not set" in exc.value.message
    assert "export HF_TOKEN=" in exc.value.fix and exc.value.exit_code == 3
    assert not (tmp_path / "out").exists()


def test_a_name_deployctl_sets_for_the_engine_is_refused_at_render(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    doc = _doc(env={"VLLM_API_KEY": "x"})  # the name vLLM reads its key from: deployctl writes it
    with pytest.raises(ConfigError) as exc:
        render_all(parse_config(yaml.safe_dump(doc), "d.yaml"), tmp_path / "out", target="systemd",
                   release_id="r1", env=KEY)
    assert "VLLM_API_KEY, which deployctl itself sets for vllm" in exc.value.message
    assert "sk-engine-env" not in exc.value.message  # the key is never shown


@pytest.mark.parametrize("engine,says", [
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "CUDA_VISIBLE_DEVICES is set by deployctl"),
    ({"env": {"NCCL_DEBUG": "WARN INFO"}}, "engine.env.NCCL_DEBUG: the value has characters"),
    ({"env": {"NCCL_DEBUG": "$(id)"}}, "engine.env.NCCL_DEBUG: the value has characters"),
    ({"env": {"1BAD": "x"}}, "'1BAD' is not an environment variable name"),
    ({"env": {"HF_TOKEN": "x"}}, "engine.env and engine.secret_env both name HF_TOKEN"),
    ({"env": {"HF_HOME": "/data/hf"}}, "engine.env sets HF_HOME, which engine.cache_dir sets to"),
    ({"cache_dir": "relative/cache"}, "engine.cache_dir 'relative/cache': an absolute path"),
    ({"cache_dir": "/"}, "engine.cache_dir '/': an absolute path below /"),
    ({"cache_dir": "/var/cache/%h"}, "engine.cache_dir '/var/cache/%h'"),  # systemd would expand %h
    ({"env": {"X": "~/foo"}}, "engine.env.X: the value has characters"),  # sh expands ~, systemd does not
    ({"env": {"ENGINE_CMD": "/bin/echo"}}, "ENGINE_CMD is a variable of the shell that starts the engine"),
    ({"env": {"PID_FILE": "/tmp/x"}}, "PID_FILE is a variable of the shell that starts the engine"),
    ({"env": {"IFS": ","}}, "IFS is a variable of the shell that starts the engine"),
    ({"secret_env": ["HF_TOKEN", "HF_HOME"]}, "engine.secret_env sets HF_HOME, which engine.cache_dir sets"),
    # vLLM's dev mode (its /sleep, /collective_rpc routes) only with a standby, on every target (the pods too)
    ({"env": {"VLLM_SERVER_DEV_MODE": "1"}}, "engine.env sets VLLM_SERVER_DEV_MODE, which turns on vllm's sleep "
                                             "mode; deployctl sets it when the release keeps a sleeping standby: "
                                             "remove it and set rollout.standby_s"),
])
def test_bad_engine_env_is_refused_naming_the_key(tmp_path, engine, says):
    assert_config_refused(_doc(**engine), says, tmp_path)


def test_the_launcher_names_refused_are_every_variable_launch_sh_assigns():
    import re

    from deployctl.engines.processenv import LAUNCHER_NAMES, RESERVED

    text = (paths.REPO / "templates" / "launch.sh.j2").read_text()
    assigned = {m.group(1) for m in re.finditer(r"(?:^|[\s;(])(?:local\s+)?([A-Za-z_][A-Za-z0-9_]*)=", text, re.M)}
    assert assigned <= LAUNCHER_NAMES | RESERVED, sorted(assigned - LAUNCHER_NAMES - RESERVED)
