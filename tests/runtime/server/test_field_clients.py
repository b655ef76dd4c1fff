"""Field benchmark clients against the real runtime, as a user would run it: guidellm (installed by
tests/setup_test_venvs.sh in its own venv, .venv-guidellm) with its default backend check — GET /health, the model list,
a test request — and no workaround flags. Every request must succeed (issue 17: its backend check used to fail
on the runtime's missing /health before the first request); and vLLM's own `vllm bench serve` (.venv-engines) with
its `--min-p` flag (issue 45)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from support.paths import REPO

from .conftest import running

GUIDELLM = REPO / ".venv-guidellm" / "bin" / "guidellm"


@pytest.fixture(scope="module")
def named_server(tiny_model, tmp_path_factory):
    # guidellm loads the tokenizer named by the model id from its working directory: serve the model as "tiny"
    # from a directory called tiny
    work = tmp_path_factory.mktemp("guidellm")
    (work / "tiny").symlink_to(tiny_model, target_is_directory=True)
    for srv in running(["--model", str(work / "tiny"), "--max-model-len", "512", "--served-model-name", "tiny"]):
        yield srv, work


@pytest.mark.slow
def test_guidellm_runs_against_the_runtime_with_its_default_backend_check(named_server):
    if not GUIDELLM.exists():
        pytest.fail(f"{GUIDELLM} is missing: run `bash tests/setup_test_venvs.sh` (it installs guidellm in .venv-guidellm)")
    srv, work = named_server
    out = work / "guidellm.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [str(GUIDELLM), "run", "--backend", f"kind=openai_http,target={srv.url},model=tiny",
         "--profile", "kind=concurrent,streams=2", "--constraint", "kind=max_requests,count=6",
         "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16", "--tokenizer", "kind=huggingface_auto",
         "--output", f"kind=json,path={out}", "--disable-console"],
        cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    totals = json.loads(out.read_text())["benchmarks"][0]["metrics"]["request_totals"]
    assert totals == {"successful": 6, "errored": 0, "incomplete": 0, "total": 6}, totals


VLLM = REPO / ".venv-engines" / "bin" / "vllm"


@pytest.mark.slow
def test_vllm_bench_serve_with_its_own_min_p_flag_is_served(named_server):
    """`vllm bench serve --min-p 0.1` (vLLM's own benchmark client, its documented flag; the runtime used to refuse
    min_p and the client printed only "Bad Request"): every request succeeds."""
    if not VLLM.exists():
        pytest.fail(f"{VLLM} is missing: run `bash tests/setup_test_venvs.sh` (it installs vLLM in .venv-engines)")
    srv, work = named_server
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run(
        [str(VLLM), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
         "--base-url", srv.url, "--model", "tiny", "--tokenizer", str(work / "tiny"), "--dataset-name", "random",
         "--random-input-len", "16", "--random-output-len", "8", "--num-prompts", "8", "--min-p", "0.1",
         "--temperature", "0.8", "--save-result", "--result-dir", str(work), "--result-filename", "vllm.json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((work / "vllm.json").read_text())
    assert (result["completed"], result["failed"]) == (8, 0), {k: result[k] for k in ("completed", "failed")}
    assert result["total_output_tokens"] > 0
