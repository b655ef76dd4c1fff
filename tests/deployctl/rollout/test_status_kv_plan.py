"""`status` shows plan vs actual KV per host (issue 44) on a loopback sshd fleet with real nginx and the stand-in
engine: the stand-in logs the bundled runtime's "KV cache: ..." line (DEPLOYCTL_STANDIN_KV_POOL in engine.env);
at each start deploy records it beside the release (allocated.json) with the plan from the host's own facts, and
status compares: the plan's own pool is within ±10%, a pool 15% smaller is flagged; the real bundled runtime
allocates exactly the plan."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(300)]

# a llama-shaped config: 2 layers × 2 KV heads × head_dim 16 × float32 = 512 bytes of KV per token
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 256, "torch_dtype": "float32", "tie_word_embeddings": False}


@pytest.fixture
def standin_model(tmp_path) -> Path:
    """tests/support/rollout.py's stand-in model with a config.json the capacity plan can size."""
    d = tmp_path / "model" / "standin-chat"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(MODEL) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}"
                                                                          "{% endfor %}"}) + "\n")
    (d / "manifest.sha256").write_text("".join(f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}\n"
                                               for n in ("config.json", "tokenizer_config.json")))
    return d


def test_status_shows_plan_vs_engine_and_flags_a_pool_15_percent_smaller(rollout_env, standin_model):
    from deployctl.capacity.sizing import size_plan

    env = rollout_env(1, engine="standin", steps=[100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 0})
    plan = size_plan(env.load().engine, standin_model, dtype="float32").plan
    assert (plan.kv_bytes_per_token, plan.num_blocks) == (512, 1024)  # 8 MiB kv_cache_memory / (16 × 512)
    name = env.names[0]

    env.cfg["engine"]["env"] = {"DEPLOYCTL_STANDIN_KV_POOL": f"{plan.num_blocks}:16:512"}
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    rel = env.current(name)
    rec = json.loads((Path(env.host(name)["deploy_root"]) / "releases" / rel / "allocated.json").read_text())
    assert rec["actual"]["kv_tokens"] == plan.kv_pool_tokens and rec["plan"]["kv_tokens"] == plan.kv_pool_tokens
    row = env.status()["hosts"][0]["kv_plan_vs_actual"]
    assert (row["diff_tokens_pct"], row["diff_bytes_pct"], row["flagged"]) == (0.0, 0.0, False)

    smaller = int(plan.num_blocks * 0.85)
    env.cfg["engine"]["env"] = {"DEPLOYCTL_STANDIN_KV_POOL": f"{smaller}:16:512"}
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    assert env.current(name) != rel
    row = env.status()["hosts"][0]["kv_plan_vs_actual"]
    assert row["flagged"] and row["diff_tokens_pct"] == round(100 * (smaller - 1024) / 1024, 1)
    assert row["actual"]["kv_tokens"] == smaller * 16 and row["plan"]["kv_tokens"] == 1024 * 16
    out = env.cli("status")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith(f"{name}: KV plan"))
    assert "16,384 tokens / 8.0 MiB" in line and "-15.0% tokens" in line and "OFF PLAN (over ±10%)" in line, line
    print(line)


def test_the_bundled_runtime_allocates_the_plan_status_says_so(rollout_env):
    """The real bundled runtime (CPU, kv_cache_memory 8 MiB) on the loopback fleet: its own "KV cache:" line,
    recorded at the start, equals the plan deployctl sizes from the host's facts."""
    env = rollout_env(1, steps=[100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 0})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    row = env.status()["hosts"][0]["kv_plan_vs_actual"]
    assert row["format"] == "deployctl-runtime (kv_sizing.KVPlan.summary)"
    assert row["actual"] == row["plan"] and row["plan"]["kv_tokens"] > 0
    assert (row["diff_tokens_pct"], row["flagged"]) == (0.0, False)
