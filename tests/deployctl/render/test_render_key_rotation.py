"""Two API keys at once during a rotation (server.api_key_env + server.next_api_key_env): the rendered runtime.env
carries both, and the real runtime started with it accepts both (no request fails while clients move from the
old key to the new one) and refuses any other. Bad rotation settings are config errors naming the fix."""
from __future__ import annotations

import httpx
import openai
import pytest

from deployctl.errors import ConfigError
from deployctl.render.targets import api_key_from_env, render_files
from support.render import make_config
from support.runtime import make_tiny_model, serve_runtime

OLD, NEW = "sk-old-0123456789abcdef", "sk-new-fedcba9876543210"
ROTATING = {"server": {"api_key_env": "LLM_API_KEY", "next_api_key_env": "LLM_NEXT_API_KEY"}}


def _runtime_env(cfg, env) -> dict[str, str]:
    files = render_files(cfg, target="systemd", release_id="r1", api_key=api_key_from_env(cfg, env))
    text = next(f.content for f in files if f.path == "hosts/gpu-a/runtime.env")
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_both_keys_are_accepted_while_clients_move_over(tmp_path):
    cfg = make_config(**ROTATING, engine={"device": "cpu", "max_model_len": 128, "max_num_seqs": 4})
    env = _runtime_env(cfg, {"LLM_API_KEY": OLD, "LLM_NEXT_API_KEY": NEW})
    assert env["DEPLOYCTL_RUNTIME_API_KEY"] == f"{OLD},{NEW}"
    model = make_tiny_model(tmp_path / "m")
    with serve_runtime(model, tmp_path / "serve.log", "--max-model-len", "128", "--kv-cache-memory", "8MiB",
                       env={"DEPLOYCTL_RUNTIME_API_KEY": env["DEPLOYCTL_RUNTIME_API_KEY"]}) as url:
        answers = []
        for key in (OLD, OLD, NEW, OLD, NEW, NEW):  # clients switching over, some still on the old key
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            answers.append(client.completions.create(model=client.models.list().data[0].id, prompt="hi",
                                                     max_tokens=1).usage.completion_tokens)
        assert answers == [1] * 6
        r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {OLD},{NEW}"})
        assert r.status_code == 401  # the joined string is no key
        log = (tmp_path / "serve.log").read_text()
        assert OLD not in log and NEW not in log


def test_rotation_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match="next_api_key_env needs server.api_key_env"):
        make_config(server={"api_key_env": None, "bind": "127.0.0.1", "next_api_key_env": "LLM_NEXT_API_KEY"})
    with pytest.raises(ConfigError, match="engine vllm takes one API key"):
        make_config(**ROTATING, engine={"kind": "vllm", "version": "0.8.5"})
    cfg = make_config(**ROTATING)
    with pytest.raises(ConfigError, match="server.next_api_key_env is LLM_NEXT_API_KEY but LLM_NEXT_API_KEY is not set"):
        api_key_from_env(cfg, {"LLM_API_KEY": OLD})
    with pytest.raises(ConfigError, match="holds a comma"):
        api_key_from_env(cfg, {"LLM_API_KEY": OLD, "LLM_NEXT_API_KEY": "a,b"})
