"""Small pieces without a server: chat template sandbox, config merging, fault parsing, serve --help."""
from __future__ import annotations

import subprocess
import sys

import pytest

from deployctl_runtime.server.chat_template import ChatTemplate
from deployctl_runtime.server.config import load_config
from deployctl_runtime.server.errors import APIError
from deployctl_runtime.server.faults import Faults

from .conftest import RUNTIME_DIR

CONTRACT_FLAGS = ["--model", "--host", "--port", "--served-model-name", "--device", "--dtype", "--max-model-len",
                  "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--num-gpu-blocks-override",
                  "--gpu-memory-utilization", "--enable-prefix-caching", "--no-enable-prefix-caching",
                  "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-queued-requests", "--config",
                  "--api-key-file", "--kv-cache-memory", "--release-id", "--metrics-public", "--drain-timeout-s",
                  "--request-timeout-s", "--skip-verify"]


def test_template_renders_and_raise_exception_is_a_400():
    t = ChatTemplate("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
                     "<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    assert t.render([{"role": "user", "content": "hi"}]) == "<user>hi<assistant>"
    with pytest.raises(APIError) as exc:
        t.render([{"role": "tool", "content": "x"}])
    assert exc.value.status == 400 and exc.value.param == "messages" and "no tools" in exc.value.message


def test_template_sandbox_blocks_python_internals():
    t = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(APIError) as exc:
        t.render([{"role": "user", "content": "hi"}])
    assert exc.value.status == 500 and "subclasses" not in exc.value.message.split(":")[0]


def test_config_file_under_flags_and_errors_name_the_key(tmp_path):
    f = tmp_path / "runtime.yaml"
    f.write_text("model: /m\nmax_model_len: 512\nport: 9000\nkv_cache_memory: 64MiB\nenable_prefix_caching: false\n")
    cfg = load_config({"port": 9100, "host": None}, str(f))
    assert (cfg.model, cfg.max_model_len, cfg.port, cfg.kv_cache_memory) == ("/m", 512, 9100, 64 << 20)
    assert cfg.enable_prefix_caching is False and cfg.host == "127.0.0.1"
    f.write_text("model: /m\nmax_num_seqs: lots\n")
    with pytest.raises(ValueError, match="max_num_seqs"):
        load_config({}, str(f))
    f.write_text("model: /m\napi_key: hunter2\n")
    with pytest.raises(ValueError, match="not allowed here"):
        load_config({}, str(f))


def test_fault_env_parsing():
    f = Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": "load_delay_s=3, error_rate=0.5,token_delay_ms=50"})
    assert (f.load_delay_s, f.error_rate, f.token_delay_ms, f.fail_start) == (3.0, 0.5, 50.0, False)
    assert not Faults.from_env({}).active
    with pytest.raises(ValueError, match="unknown item"):
        Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": "explode=1"})
    with pytest.raises(ValueError, match="error_rate"):
        Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": "error_rate=2"})


def test_validate_faults_clamp_garble_and_leak_kv_blocks():
    f = Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": "clamp_max_tokens=4,garble_text=1,leak_kv_blocks=2"})
    assert f.active and f.clamp(16) == 4 and f.clamp(3) == 3 and Faults().clamp(16) == 16
    assert f.rewrite_text("hello") == "\ufffdello" and f.rewrite_text("") == "" and Faults().rewrite_text("a") == "a"

    class Req:  # the scheduler's view of a finished request
        def __init__(self, rid):
            self.request_id, self.status = rid, type("S", (), {"name": "RUNNING"})()

    class Kv:
        def __init__(self):
            self.req_to_blocks, self.freed = {"r": ["b1", "b2", "b3"]}, []

    class Sched:
        def __init__(self, kv):
            self.kv = kv

        def finish(self, req, reason):
            self.kv.freed.extend(self.kv.req_to_blocks.pop(req.request_id, []))

    kv = Kv()
    engine = type("E", (), {})()
    engine.kv, engine.scheduler = kv, Sched(kv)
    f.install(engine)
    engine.scheduler.finish(Req("r"), "length")
    assert kv.freed == ["b1"]  # the last two blocks never go back to the pool


def test_serve_help_lists_contract_flags_and_fault_injection():
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(RUNTIME_DIR), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--help"], capture_output=True,
                         text=True, env=env, timeout=60, check=True).stdout
    missing = [flag for flag in CONTRACT_FLAGS if flag not in out]
    assert missing == []
    assert "DEPLOYCTL_RUNTIME_FAULT" in out and "error_rate" in out and "DEPLOYCTL_RUNTIME_API_KEY" in out


def test_best_of_keeps_the_n_best_per_prompt_by_cumulative_logprob_and_reindexes():
    from deployctl_runtime.server.responses import best_choices
    from deployctl_runtime.server.serving import Choice

    sums = [[-3.0, -1.0, -2.0], [-0.5, -9.0, -0.1]]  # two prompts, best_of 3, n 2
    choices = [Choice(p * 3 + j, None, None, logprobs=[s / 2, s / 2]) for p, row in enumerate(sums)
               for j, s in enumerate(row)]
    picked = [(i, c.index) for i, c in best_choices(choices, per_prompt=3, n=2)]
    assert picked == [(0, 1), (1, 2), (2, 5), (3, 3)]
    assert [i for i, _ in best_choices(choices, per_prompt=3, n=3)] == list(range(6))
