"""The capacity plan: known shapes, the worked example, C01 at plan level, and bad input."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.capacity import CapacityInputs, kv_bytes_per_token, num_kv_blocks, plan_capacity, verdict
from deployctl.capacity.modelinfo import parse_model_config
from support.cli import repo_env
from support.paths import DATA, SHARED
GiB = 2**30

# Published config.json shapes (the models' own configs on their hubs).
CONFIGS = {
    "Llama-2-7B": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       hidden_size=4096, intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096,
                       torch_dtype="float16"),
    "Llama-3-8B": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       hidden_size=4096, intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                       torch_dtype="bfloat16"),
    "Mistral-7B-v0.1": dict(model_type="mistral", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            hidden_size=4096, intermediate_size=14336, vocab_size=32000,
                            max_position_embeddings=32768, torch_dtype="bfloat16"),
    "Qwen2.5-7B": dict(model_type="qwen2", num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       hidden_size=3584, intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
                       torch_dtype="bfloat16"),
    "Qwen3-30B-A3B (MoE)": dict(model_type="qwen3_moe", num_hidden_layers=48, num_attention_heads=32,
                                num_key_value_heads=4, head_dim=128, hidden_size=2048, intermediate_size=6144,
                                moe_intermediate_size=768, num_experts=128, vocab_size=151936,
                                max_position_embeddings=40960, torch_dtype="bfloat16"),
    "Llama-3-70B": dict(model_type="llama", num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        hidden_size=8192, intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192,
                        torch_dtype="bfloat16"),
}


def _known_shapes_table() -> dict[str, tuple[int, float]]:
    """(KV bytes/token, params in B) per model, read from ../shared/models/known-shapes.md."""
    rows = {}
    for line in (SHARED / "models" / "known-shapes.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in CONFIGS:
            rows[cells[0]] = (int(cells[6].split()[0].replace(",", "")), float(cells[5].split()[0]))
    return rows


@pytest.mark.skipif(not (SHARED / "models" / "known-shapes.md").exists(), reason="shared/ not beside the checkout")
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_known_shapes_kv_bytes_and_params(name):
    expected_kv, expected_params_b = _known_shapes_table()[name]
    shape = parse_model_config(CONFIGS[name])
    assert kv_bytes_per_token(shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim, 2) == expected_kv
    # parameter estimate from the config within 2% of the published count
    assert shape.estimated_num_params() / 1e9 == pytest.approx(expected_params_b, rel=0.02)


def test_capacity_vectors_pin_the_formula():
    for v in json.loads((DATA / "capacity_vectors.json").read_text()):
        per_token = kv_bytes_per_token(v["num_hidden_layers"], v["num_key_value_heads"], v["head_dim"], v["dtype_bytes"])
        blocks = num_kv_blocks(per_token, v["block_size"], v["budget_bytes"], v["num_gpu_blocks_override"])
        assert (per_token, blocks, blocks * v["block_size"]) == (
            v["expect"]["kv_bytes_per_token"], v["expect"]["num_blocks"], v["expect"]["kv_pool_tokens"]), v["name"]


def _worked_example(gpu_bytes: int) -> CapacityInputs:
    shape = parse_model_config(CONFIGS["Llama-2-7B"])
    return CapacityInputs(num_hidden_layers=32, num_key_value_heads=32, head_dim=128, dtype_bytes=2,
                          weights_bytes=shape.estimated_num_params() * 2, block_size=16, max_model_len=8192,
                          max_num_seqs=8, gpu_memory_bytes=gpu_bytes, gpu_memory_utilization=0.9,
                          runtime_overhead_bytes=int(1.5 * GiB))


def test_worked_example_7b_fp16_on_40gb():
    plan = plan_capacity(_worked_example(40 * 10**9))
    assert plan.kv_bytes_per_token == 512 * 1024  # 0.5 MiB per token
    assert plan.kv_bytes_per_request == 4 * GiB  # per 8,192-token request
    assert plan.kv_bytes_all_requests == 32 * GiB  # 8 concurrent requests
    assert 46e9 < plan.peak_bytes < 50e9  # "about 48 GB"
    assert not plan.fits and plan.fits_one
    assert plan.max_feasible_num_seqs in (4, 5)  # "4–5 requests"
    status, message = verdict(plan)
    assert status == "warn" and "lower max_num_seqs" in message
    roomy = plan_capacity(_worked_example(80 * 10**9))
    assert roomy.fits
    # C33: the largest max_num_seqs that fits, not the configured 8 (it was reported as min(configured, fit))
    assert roomy.max_feasible_num_seqs == roomy.kv_pool_tokens // 8192 > 8


def _model_dir(tmp_path: Path, name: str = "Llama-3-8B", **changes) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**CONFIGS[name], **changes}))
    return d


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", *args], capture_output=True, text=True)


def test_c01_a_plan_refuses_naming_both_numbers(tmp_path):
    d = _model_dir(tmp_path)
    proc = _plan_cli("--model-config", str(d), "--max-model-len", "4096", "--block-size", "16",
                     "--num-gpu-blocks-override", "229", "--max-num-seqs", "8", "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["kv_pool_tokens"] == 3664 and doc["fits"] is False and doc["max_feasible_model_len"] == 3664
    assert doc["status"] == "fail"
    for needle in ("4096", "3664", "229 blocks", "16 tokens", "131072 bytes/token", "largest feasible max_model_len is 3664"):
        assert needle in doc["message"]


def test_c01_b_warns_half_concurrency(tmp_path):
    d = _model_dir(tmp_path)
    proc = _plan_cli("--model-config", str(d), "--max-model-len", "8192", "--num-gpu-blocks-override", "2048",
                     "--max-num-seqs", "8", "--json")
    doc = json.loads(proc.stdout)
    assert doc["kv_pool_tokens"] == 32768 and doc["status"] == "warn"
    assert "0.50×" in doc["message"] and doc["max_concurrency"] == 4.0 and doc["max_feasible_num_seqs"] == 4


def test_plan_json_keys_and_table(tmp_path):
    d = _model_dir(tmp_path)
    proc = _plan_cli("--model-config", str(d), "--gpu-memory", "80GiB", "--max-model-len", "8192", "--max-num-seqs", "32", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("kv_bytes_per_token", "weights_bytes", "kv_pool_bytes", "kv_pool_tokens", "max_model_len",
                "max_num_seqs", "max_concurrency", "fits", "max_feasible_model_len", "max_feasible_num_seqs"):
        assert key in doc
    assert isinstance(doc["kv_pool_bytes"], int) and doc["kv_pool_bytes"] % (16 * 131072) == 0
    assert doc["max_concurrency"] == doc["kv_pool_tokens"] / 8192
    human = _plan_cli("--model-config", str(d), "--gpu-memory", "80GiB", "--max-model-len", "8192", "--max-num-seqs", "32")
    assert "KV bytes / token" in human.stdout and "131,072" in human.stdout


def test_weights_from_safetensors_headers(tmp_path):
    import torch
    from safetensors.torch import save_file

    d = _model_dir(tmp_path, num_hidden_layers=2)
    save_file({"a": torch.zeros(1000, 10, dtype=torch.bfloat16), "b": torch.zeros(5, dtype=torch.float32)},
              str(d / "model.safetensors"))
    doc = json.loads(_plan_cli("--model-config", str(d), "--gpu-memory", "24GiB", "--max-model-len", "4096",
                               "--json").stdout)
    assert doc["weights_bytes"] == 1000 * 10 * 2 + 5 * 4


@pytest.mark.parametrize("case,args,needle", [
    ("missing config.json", ["--model-config", "{tmp}/nowhere"], "no such file"),
    ("no layers key", ["--model-config", "{nolayers}"], "no 'num_hidden_layers' key"),
    ("zero size", ["--model-config", "{model}", "--max-model-len", "0"], "max_model_len"),
    ("negative seqs", ["--model-config", "{model}", "--max-num-seqs", "-3"], "max_num_seqs"),
    ("negative gpu memory", ["--model-config", "{model}", "--gpu-memory", "-5GiB"], "--gpu-memory"),
    ("utilization above 1", ["--model-config", "{model}", "--gpu-memory-utilization", "1.2"], "gpu_memory_utilization"),
    ("utilization zero", ["--model-config", "{model}", "--gpu-memory-utilization", "0"], "gpu_memory_utilization"),
    ("above max_position_embeddings", ["--model-config", "{model}", "--max-model-len", "16384"],
     "above the model's max_position_embeddings 8192"),
])
def test_bad_input_one_line_exit_3(tmp_path, case, args, needle):
    model = _model_dir(tmp_path)
    nolayers = tmp_path / "nolayers.json"
    nolayers.write_text(json.dumps({k: v for k, v in CONFIGS["Llama-3-8B"].items() if k != "num_hidden_layers"}))
    argv = [a.format(tmp=tmp_path, model=model, nolayers=nolayers) for a in args]
    proc = _plan_cli(*argv, "--gpu-memory", "80GiB") if "--gpu-memory" not in argv else _plan_cli(*argv)
    assert proc.returncode == 3, (case, proc.stdout, proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and needle in lines[0], (case, proc.stderr)
    assert "Traceback" not in proc.stderr


def test_init_writes_loadable_commented_config(tmp_path):
    d = _model_dir(tmp_path, name="Llama-2-7B")
    out = tmp_path / "deploy.yaml"
    proc = subprocess.run([sys.executable, "-m", "deployctl", "init", str(d), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from deployctl.config import load_config

    cfg = load_config(out)
    assert cfg.engine.max_model_len == 4096  # bounded by max_position_embeddings
    assert cfg.model.served_name == "model" and cfg.model.dtype == "float16"
    assert re.search(r"#", out.read_text())
    again = subprocess.run([sys.executable, "-m", "deployctl", "init", str(d), "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "--force" in again.stderr


# -- regressions (from test_plan_edge_cases.py): `deployctl plan` flags the runtime would refuse are refused by the plan too (one formula, one set of inputs).

ENV = repo_env()
CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
          "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("dtype", ["int8", "float64", "float8_e4m3fn", "fp16"])
def test_dtype_the_runtime_cannot_serve_is_refused(tmp_path, dtype):
    # `--dtype int8` used to plan with 1-byte KV entries although deploy.yaml and the runtime accept only
    # auto | float32 | bfloat16 | float16: a plan for a deployment that cannot exist
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    proc = subprocess.run([sys.executable, "-m", "deployctl", "plan", "--model-config", str(tmp_path),
                           "--gpu-memory", "80GiB", "--dtype", dtype, "--json"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and proc.stdout == "", (proc.returncode, proc.stdout)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert dtype in err and "bfloat16" in err and "auto" in err, err
