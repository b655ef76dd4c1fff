"""`deployctl plan --profile / --from-log / --bench`: sessions at the traffic profile, replicas and GPUs after the
margin, the bench knee as a cap, and bad input (exit 3 / 2 with the number and the fix)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

H100 = 85520809984
LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "hidden_size": 4096, "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 16384,
             "torch_dtype": "float16"}


def _setup(tmp_path, hosts: int = 1, margin: float | None = None):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA2_7B))
    cfg = tmp_path / "deploy.yaml"
    host_lines = "".join(f"  - {{name: h{i}, address: 10.0.0.{i + 1}, deploy_root: /opt/x}}\n" for i in range(hosts))
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: {model}, dtype: float16}}\n"
                   "engine: {kind: vllm, version: 0.33.0, max_model_len: 16384, max_num_seqs: 16}\n"
                   f"hosts:\n{host_lines}" + (f"capacity: {{margin: {margin}}}\n" if margin is not None else ""))
    return cfg


def _plan(cfg, *args):
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(cfg), "--gpu-memory", str(H100), *args],
                          capture_output=True, text=True, timeout=60)


PROFILE = "prompt=9000/14000,output=600/2000,concurrency=8"  # 8 users of a 16k-context 7B


def test_profile_does_not_fit_one_host_and_says_what_to_change(tmp_path):
    proc = _plan(_setup(tmp_path), "--profile", PROFILE, "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    t = doc["traffic"]
    assert t["tokens_per_session_p90"] == 16000 and t["tokens_per_session_mean"] == 9600
    assert t["sessions_at_p90"] == doc["kv_pool_tokens"] / 16000 and t["limited_by"] == "kv cache"
    usable = math.floor(t["sessions_at_p90"] * 0.75)
    assert t["usable_per_replica"] == usable < 8 and t["replicas_needed"] == math.ceil(8 / usable) == 2
    assert t["gpus_needed"] == 2 and t["replicas_configured"] == 1 and t["fits"] is False
    assert "add 1 host(s)" in t["message"] and "kv_cache_dtype fp8" in t["message"]
    assert any(n.startswith("one host: ") and "plan 3 hosts" in n for n in doc["notes"])
    # what to change: fp8 KV halves bytes/token, twice the sessions; one host then fits
    fp8 = _plan(_setup(tmp_path), "--profile", PROFILE, "--kv-cache-dtype", "fp8", "--json")
    assert fp8.returncode == 0, fp8.stderr
    f = json.loads(fp8.stdout)["traffic"]
    assert f["replicas_needed"] == 1 and f["fits"] and f["sessions_at_p90"] == pytest.approx(2 * t["sessions_at_p90"], rel=0.01)
    # a second host fits too; capacity.margin from deploy.yaml is used
    assert _plan(_setup(tmp_path, hosts=2), "--profile", PROFILE).returncode == 0
    tight = json.loads(_plan(_setup(tmp_path, margin=0.0), "--profile", PROFILE, "--json").stdout)["traffic"]
    assert tight["margin"] == 0 and tight["usable_per_replica"] == math.floor(t["sessions_at_p90"])


def test_human_output_names_sessions_per_gpu_and_replicas(tmp_path):
    proc = _plan(_setup(tmp_path), "--profile", PROFILE)
    assert "sessions / GPU" in proc.stdout and "replicas needed" in proc.stdout and "does not fit at the profile" in proc.stdout
    assert "per GPU, tensor_parallel_size 1" in proc.stdout and "CUDA graphs" in proc.stdout


def test_from_log_takes_token_counts_from_the_runtime_access_log(tmp_path):
    prompts, outputs = list(range(100, 1100, 100)), [50] * 9 + [500]  # 10 requests
    lines = [f"INFO deployctl_runtime.access request_id=r{i} method=POST path=/v1/completions status=200 "
             f"prompt_tokens={p} completion_tokens={c} ttft_ms=12.0 total_ms=90.0 finish=stop"
             for i, (p, c) in enumerate(zip(prompts, outputs))]
    lines.append("INFO deployctl_runtime.access request_id=bad method=POST path=/v1/completions status=400 "
                 "prompt_tokens=99999 completion_tokens=0 ttft_ms=- total_ms=1.0 finish=-")
    log = tmp_path / "access.log"
    log.write_text("\n".join(["INFO startup"] + lines) + "\n")
    doc = json.loads(_plan(_setup(tmp_path), "--from-log", str(log), "--concurrency", "4", "--json").stdout)
    p = doc["traffic"]["profile"]
    # nearest-rank P90 of 10 values is the 9th; the 400 is not counted
    assert (p["prompt_mean"], p["prompt_p90"], p["output_mean"], p["output_p90"]) == (550, 900, 95, 50)
    assert p["peak_concurrency"] == 4 and "10 requests" in p["source"]
    assert doc["traffic"]["tokens_per_session_p90"] == 900 + 95  # P90 output below its mean: the mean


def test_bench_knee_caps_the_sessions(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"knee": {"concurrency": 3, "criterion": "objectives"}, "levels": []}))
    doc = json.loads(_plan(_setup(tmp_path, hosts=4), "--profile", PROFILE, "--bench", str(bench), "--json").stdout)
    t = doc["traffic"]
    assert t["knee"] == 3 and t["limited_by"] == "bench knee" and t["sessions_per_replica"] == 3
    assert t["usable_per_replica"] == 2 and t["replicas_needed"] == 4 and t["fits"]


@pytest.mark.parametrize("args,code,needles", [
    (["--profile", "prompt=15000/16000,output=500/1000,concurrency=8"], 3,
     ["17000 tokens is longer than max_model_len 16384", "raise engine.max_model_len to at least 17000"]),
    (["--profile", "prompt=0,output=100,concurrency=8"], 3, ["mean prompt tokens must be positive, got '0'"]),
    (["--profile", "prompt=100,output=100,concurrency=-2"], 3, ["peak concurrent requests must be positive, got '-2'"]),
    (["--profile", "prompt=100/50,output=100,concurrency=2"], 3, ["P90 prompt tokens 50 is below the mean 100"]),
    (["--profile", "prompt=100,output=100"], 3, ["no concurrency=N part", "--concurrency N"]),
    (["--profile", "prompts=100,output=100,concurrency=1"], 3, ["'prompts=100' is not prompt=MEAN[/P90[/P99]]"]),
    (["--from-log", "{empty}", "--concurrency", "2"], 3, ["no request lines", "access log"]),
    (["--from-log", "{empty}"], 3, ["no request lines"]),
    (["--profile", "prompt=1,output=1,concurrency=1", "--concurrency", "0"], 3, ["--concurrency must be a positive", "got 0"]),
    (["--profile", "prompt=1,output=1,concurrency=1", "--from-log", "{empty}"], 2, ["--profile and --from-log"]),
    (["--bench", "{notbench}", "--profile", "prompt=1,output=1,concurrency=1"], 3, ["not a deployctl bench result"]),
    (["--margin", "0.2"], 2, ["need a traffic profile"]),
])
def test_bad_traffic_input(tmp_path, args, code, needles):
    empty = tmp_path / "empty.log"
    empty.write_text("INFO startup\nINFO ready: serving model\n")
    notbench = tmp_path / "nb.json"
    notbench.write_text("{}")
    proc = _plan(_setup(tmp_path), *[a.format(empty=empty, notbench=notbench) for a in args])
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def _runtime_cfg(tmp_path, server: str):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA2_7B))
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: {model}, dtype: float16}}\n"
                   "engine: {max_model_len: 16384, max_num_seqs: 16}\n"
                   f"server: {server}\nhosts:\n  - {{name: h0, address: 10.0.0.1, deploy_root: /opt/x}}\n")
    return cfg


def test_server_caps_size_the_plan_and_refuse_a_profile_above_them(tmp_path):
    cfg = _runtime_cfg(tmp_path, "{max_prompt_tokens: 6000, max_completion_tokens: 1000}")
    doc = json.loads(_plan(cfg, "--json").stdout)
    note = next(n for n in doc["notes"] if n.startswith("server caps"))
    assert "at most 7000 tokens" in note and f"{doc['kv_pool_tokens'] // 7000} such requests" in note
    t = json.loads(_plan(cfg, "--profile", "prompt=3000/5000,output=800/4000,concurrency=2", "--json").stdout)["traffic"]
    assert t["tokens_per_session_p90"] == 5000 + 1000  # outputs end at max_completion_tokens
    bad = _plan(cfg, "--profile", "prompt=3000/9000,output=100,concurrency=2")
    assert bad.returncode == 3 and "P90 prompt 9000 tokens is above server.max_prompt_tokens 6000" in bad.stderr
    assert "raise server.max_prompt_tokens to at least 9000" in bad.stderr


def test_server_caps_render_into_runtime_yaml_and_are_refused_elsewhere(tmp_path):
    from deployctl.config import load_config
    from deployctl.errors import ConfigError
    from deployctl.render.release import runtime_args

    cfg = load_config(_runtime_cfg(tmp_path, "{max_completion_tokens: 1000}"))
    args = runtime_args(cfg, cfg.hosts[0], "r1")
    assert args["max_completion_tokens"] == 1000 and "max_prompt_tokens" not in args
    plain = load_config(_runtime_cfg(tmp_path, "{port: 8080}"))
    assert "max_completion_tokens" not in runtime_args(plain, plain.hosts[0], "r1")
    text = _setup(tmp_path).read_text() + "server: {max_completion_tokens: 1000}\n"
    (tmp_path / "v.yaml").write_text(text)
    with pytest.raises(ConfigError, match="server.max_completion_tokens 1000: only deployctl-runtime enforces it"):
        load_config(tmp_path / "v.yaml")
    with pytest.raises(ConfigError, match="server.max_prompt_tokens 16384 is not below engine.max_model_len 16384"):
        load_config(_runtime_cfg(tmp_path, "{max_prompt_tokens: 16384}"))


def test_json_profile_refuses_unknown_keys_as_the_inline_form_does(tmp_path):
    """Issue 44: a JSON key the profile does not know was ignored (prompt_p99 became the mean, exit 0)."""
    cfg = _setup(tmp_path)
    doc = {"prompt_mean": 2000, "prompt_p95": 7000, "output_mean": 300, "peak_concurrency": 4}
    as_json = _plan(cfg, "--profile", json.dumps(doc))
    inline = _plan(cfg, "--profile", "prompt=2000,prompt_p95=7000,output=300,concurrency=4")
    assert as_json.returncode == inline.returncode == 3, (as_json.stderr, inline.stderr)
    for proc, part in ((as_json, "'prompt_p95'"), (inline, "'prompt_p95=7000'")):
        err = proc.stderr.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert f"--profile: {part} is not prompt=MEAN[/P90[/P99]], output=MEAN[/P90[/P99]] or concurrency=N" in err
        assert "prompt_p99" in err  # the JSON keys are named


def test_p99_sizes_the_pool_and_the_plan_says_so(tmp_path):
    cfg = _setup(tmp_path)
    p90 = json.loads(_plan(cfg, "--profile", "prompt=2300/4000,output=300/600,concurrency=4", "--json").stdout)["traffic"]
    assert p90["sized_at"] == "P90" and p90["tokens_per_session_tail"] == 4600
    for spec in ('{"prompt_mean": 2300, "prompt_p90": 4000, "prompt_p99": 7000, "output_mean": 300, '
                 '"output_p90": 600, "output_p99": 1000, "peak_concurrency": 4}',
                 "prompt=2300/4000/7000,output=300/600/1000,concurrency=4"):
        proc = _plan(cfg, "--profile", spec, "--json")
        assert proc.returncode == 0, proc.stderr
        t = json.loads(proc.stdout)["traffic"]
        assert t["sized_at"] == "P99" and t["tokens_per_session_tail"] == 8000 and t["tokens_per_session_p90"] == 4600
        assert t["sessions_at_tail"] == pytest.approx(p90["sessions_at_tail"] * 4600 / 8000)
        assert "P99 8000 tokens" in t["message"]
    human = _plan(cfg, "--profile", "prompt=2300/4000/7000,output=300/600/1000,concurrency=4")
    assert "the pool is sized at P99" in human.stdout, human.stdout
    bad = _plan(cfg, "--profile", "prompt=2300/4000/3000,output=300,concurrency=4")
    assert bad.returncode == 3 and "P99 prompt tokens 3000 is below the P90 4000" in bad.stderr, bad.stderr
