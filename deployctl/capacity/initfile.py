"""`deployctl init`: a commented deploy.yaml filled in from a model's config.json."""
from __future__ import annotations

import re
from pathlib import Path

from deployctl.capacity.modelinfo import load_model_config

_TEMPLATE = """\
# deploy.yaml for {name}: one service, its hosts, and how to roll it out.
# Written by `deployctl init {model_dir}`. Check it with `deployctl plan` and `deployctl preflight`.
service:
  name: {service}

model:
  path: {model_path}                 # on each host; weights are never copied per release
  manifest: manifest.sha256          # relative to model.path (`deployctl manifest {model_dir}` writes it)
  served_name: {name}
  dtype: {dtype}                     # auto | float32 | bfloat16 | float16

engine:
  device: {device}                        # cuda | cpu
  max_model_len: {max_model_len}                # prompt + completion tokens of one request (model limit: {max_pos})
  max_num_seqs: {max_num_seqs}                  # requests batched at once
  max_num_batched_tokens: {max_batched}        # token budget of one step (chunked prefill)
  gpu_memory_utilization: 0.90       # share of GPU memory for weights + activations + KV cache
  block_size: 16
  enable_prefix_caching: true
  enable_chunked_prefill: true
{cpu_budget}
server:
  bind: 127.0.0.1                    # a non-loopback address needs api_key_env
  port: {port}
  api_key_env: LLM_API_KEY           # read from deployctl's environment, shipped in a 0600 env file
  request_timeout_s: 120
  max_queued_requests: 256

hosts:                               # `address: local` runs on this machine without SSH
  - name: {host_name}
    address: {host_address}
    port: 22
    deploy_root: {deploy_root}
    python: {python}
    launcher: {launcher}                # systemd | process
    gpu: 0

rollout:
  canary_hosts: 1
  steps: [5, 25, 50, 100]            # canary weight in percent; or per step {{weight: 5, pause: 24h}}
  pause_s: 300                       # per step without its own pause, while analysis runs (300, 5m, 24h)
  analysis:
    interval_s: 30
    min_requests: 20                 # fewer canary requests than this: inconclusive
    max_error_rate: 0.01             # 5xx share on the canary
    max_p99_ttft_ratio: 2.0          # canary P99 TTFT / stable P99 TTFT
    max_p99_tpot_ratio: 2.0
  keep_releases: 5
  standby_s: 86400                   # the previous release stays asleep this long after a promotion: a rollback
                                     # wakes it in seconds (engines with a sleep mode); 0: off, a cold start
"""


def render_init(model_dir: Path, *, device: str = "cuda", host_address: str = "local", port: int = 8080,
                python: str = "python3", deploy_root: str | None = None) -> str:
    """deploy.yaml text for ``model_dir``. max_model_len is min(8192, max_position_embeddings).
    Raises ConfigError when config.json is missing or unusable."""
    model_dir = model_dir.resolve()
    shape = load_model_config(model_dir)
    name = model_dir.name
    service = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63] or "llm"
    max_pos = shape.max_position_embeddings
    max_model_len = min(8192, max_pos) if max_pos else 8192
    dtype = shape.torch_dtype if shape.torch_dtype in ("float32", "bfloat16", "float16") else "auto"
    if device == "cpu":
        dtype = "float32"
    return _TEMPLATE.format(
        name=name, service=service, model_dir=model_dir, model_path=model_dir, dtype=dtype, device=device,
        max_model_len=max_model_len, max_pos=max_pos or "unknown",
        max_num_seqs=64 if device == "cuda" else 8,
        max_batched=max(max_model_len, 2048),
        cpu_budget="  kv_cache_memory: 512MiB             # KV pool budget on CPU\n" if device == "cpu" else "",
        port=port, host_name="local" if host_address == "local" else host_address.split(".")[0],
        host_address=host_address, deploy_root=deploy_root or f"/opt/deployctl/{service}", python=python,
        launcher="process" if device == "cpu" else "systemd",
    )
