"""`deployctl plan` flags the runtime would refuse are refused by the plan too (one formula, one set of inputs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
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
