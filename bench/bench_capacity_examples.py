"""The `deployctl plan --profile` examples of docs/capacity.md, run for real (no GPU: --gpu-memory gives NVML's total).

Usage: python bench/bench_capacity_examples.py
1. A 7B (Llama-2-7B shape: 32 layers, 32 KV heads, fp16) with a 16k context and 8 users at the profile
   prompt=9000/14000, output=600/2000 on one H100 80GB, vLLM: does not fit; then with --kv-cache-dtype fp8.
2. Llama-3.1-70B on 8×H100 (tensor_parallel_size 8, one host) from tests/data/capacity_published_vectors.json,
   at prompt=2000/6000, output=300/1000 and 200 users.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
H100 = "85520809984"


def _run(cfg: Path, *args: str) -> None:
    cmd = ["deployctl", "plan", "-c", cfg.name, "--gpu-memory", H100, *args]
    print("$ " + " ".join(cmd))
    proc = subprocess.run([sys.executable, "-m", "deployctl", *cmd[1:]], cwd=cfg.parent, capture_output=True,
                          text=True, env={"COLUMNS": "120", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    print(proc.stdout + proc.stderr + f"(exit {proc.returncode})\n")


def main() -> None:
    vectors = json.loads((REPO / "tests" / "data" / "capacity_published_vectors.json").read_text())["cases"]
    llama70 = next(c for c in vectors if c["name"] == "Llama-3.1-70B vllm TP8 H100-80GB")["config"]
    llama2 = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "hidden_size": 4096, "intermediate_size": 11008, "vocab_size": 32000,
              "max_position_embeddings": 16384, "torch_dtype": "float16"}
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape, engine, profile in (
                ("7b", llama2, "{kind: vllm, version: 0.33.0, max_model_len: 16384, max_num_seqs: 16}",
                 "prompt=9000/14000,output=600/2000,concurrency=8"),
                ("70b", llama70, "{kind: vllm, version: 0.33.0, tensor_parallel_size: 8, max_model_len: 8192, max_num_seqs: 256}",
                 "prompt=2000/6000,output=300/1000,concurrency=200")):
            d = Path(tmp) / name
            (d / "model").mkdir(parents=True)
            (d / "model" / "config.json").write_text(json.dumps(shape))
            gpus = "[0, 1, 2, 3, 4, 5, 6, 7]" if name == "70b" else "[0]"
            cfg = d / "deploy.yaml"
            cfg.write_text(f"service: {{name: llm-{name}}}\nmodel: {{path: {d / 'model'}}}\nengine: {engine}\n"
                           f"hosts:\n  - {{name: gpu-a, address: 10.0.0.11, deploy_root: /opt/llm, gpus: {gpus}}}\n")
            _run(cfg, "--profile", profile)
            if name == "7b":
                _run(cfg, "--profile", profile, "--kv-cache-dtype", "fp8")


if __name__ == "__main__":
    main()
