"""Checks: rules over one host's facts (from deployctl/hostscripts/probe.py, plus ``facts["weights"]``, the
weights.VerifyReport as JSON). Each returns a Check with pass/warn/fail, a message naming the values,
and a fix. Pure functions of (config, host config, facts, environment): recorded fact files replay them.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Optional

from deployctl import settings
from deployctl.capacity import CapacityPlan, plan_capacity, verdict
from deployctl.config import DeployConfig, HostConfig, layout
from deployctl.errors import DeployctlError
from deployctl.preflight.drivers import driver_verdict
from deployctl.config.units import format_bytes

MiB = 2**20
DISK_FAIL_BYTES = 1 * 2**30  # releases (wheel, config) and logs need at least this under deploy_root
DISK_WARN_BYTES = 5 * 2**30
WARN_ONLY_WEIGHT_ISSUES = {"unlisted", "incomplete_leftover"}


@dataclass(frozen=True)
class Check:
    """One rule's outcome. status: "pass" | "warn" | "fail"; fix is None when nothing is to be done."""

    name: str
    status: str
    message: str
    fix: Optional[str] = None

    def to_json(self) -> dict:
        return asdict(self)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def check_driver(cfg: DeployConfig, facts: dict) -> Check:
    """The NVIDIA driver exists and supports the CUDA version of the runtime's torch build (C14)."""
    if cfg.engine.device == "cpu":
        return Check("nvidia_driver", "pass", "skipped: device is cpu")
    nv = facts.get("nvidia") or {}
    if not nv.get("available"):
        error = nv.get("error") or "unknown error"
        if error.startswith("nvidia-ml-py"):
            return Check("nvidia_driver", "fail", f"cannot query the NVIDIA driver: {error}",
                         "install nvidia-ml-py in the runtime environment (hosts[].python)")
        return Check("nvidia_driver", "fail", f"NVIDIA driver not found (NVML: {error})",
                     "install the NVIDIA driver (nvidia-smi must work), or set engine.device: cpu")
    torch = facts.get("torch") or {}
    torch_cuda = torch.get("cuda") if torch.get("ok") else None
    status, message, fix = driver_verdict(nv["driver_version"], nv.get("cuda_version"), torch_cuda)
    if torch_cuda and torch.get("version"):
        message = message.replace("the runtime's torch is", f"the runtime's torch {torch['version']} is")
    return Check("nvidia_driver", status, message, fix)


def check_torch(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """torch imports in the runtime environment's python and, when device is cuda, can use CUDA."""
    t = facts.get("torch") or {}
    py = t.get("python") or host.python
    if not t.get("ok"):
        return Check("torch", "fail", f"torch is not importable by {py}: {t.get('error', 'no answer')}",
                     f"install the runtime (deployctl-runtime, torch) into the environment of {py} (hosts[].python)")
    if cfg.engine.device == "cpu":
        return Check("torch", "pass", f"torch {t['version']} in {py} (device is cpu)")
    if not t.get("cuda"):
        return Check("torch", "fail", f"torch {t['version']} in {py} is a CPU-only build; engine.device is cuda",
                     "install a CUDA build of torch in the runtime environment, or set engine.device: cpu")
    if not t.get("cuda_available"):
        why = "; ".join(t.get("warnings") or []) or "torch.cuda.is_available() is False"
        return Check("torch", "fail", f"torch {t['version']} (CUDA {t['cuda']}) in {py} cannot use CUDA: {why}",
                     "fix the NVIDIA driver (see nvidia_driver) and check CUDA_VISIBLE_DEVICES")
    if host.gpu >= int(t.get("device_count") or 0):
        return Check("torch", "fail", f"hosts[{host.name}].gpu is {host.gpu} but torch sees {t.get('device_count')} GPU(s)",
                     "set the host's gpu to an index torch can see")
    return Check("torch", "pass", f"torch {t['version']} (CUDA {t['cuda']}) in {py}; CUDA usable, {t['device_count']} GPU(s)")


def plan_from_facts(cfg: DeployConfig, host: HostConfig, facts: dict):
    """The capacity plan (deployctl.capacity.sizing, the one code path) for this host: config.json from the
    host's model dir, weights bytes from its safetensors headers, GPU memory from NVML facts.
    Returns (SizedPlan, None) or (None, reason)."""
    from deployctl.capacity.sizing import size_plan

    model = facts.get("model") or {}
    if not model.get("config"):
        return None, f"no config.json in {cfg.model.path} on {host.name} ({model.get('error') or 'model dir missing'})"
    gpu_total = None
    if cfg.engine.device == "cuda" and cfg.engine.num_gpu_blocks_override is None:
        gpu = _gpu(facts, host)
        if gpu is None:
            nv = facts.get("nvidia") or {}
            return None, f"GPU {host.gpu} memory unknown on {host.name} (NVML: {nv.get('error') or 'no such GPU'})"
        gpu_total = int(gpu["memory_total"])
    with tempfile.TemporaryDirectory(prefix="deployctl-plan-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(model["config"]))
        sized = size_plan(cfg.engine, None, model_config=path, dtype=cfg.model.dtype, gpu_memory=gpu_total)
    if model.get("weights_bytes"):
        inputs = replace(sized.inputs, weights_bytes=int(model["weights_bytes"]))
        sized = replace(sized, inputs=inputs, plan=plan_capacity(inputs), weights_source="safetensors headers on host")
    return sized, None


def check_capacity(sized, reason: Optional[str]) -> Check:
    """capacity.verdict on the host's plan (C01)."""
    if sized is None:
        return Check("capacity", "warn", f"skipped: {reason}", "fix the checks above, then re-run preflight")
    status, message = verdict(sized.plan)
    fix = None
    if status != "pass":
        p = sized.plan
        fix = (f"set engine.max_model_len <= {p.max_feasible_model_len}, or give the KV cache more memory"
               if status == "fail" else f"set engine.max_num_seqs to {p.max_feasible_num_seqs}, or add memory")
    return Check("capacity", status, message, fix)


def _gpu(facts: dict, host: HostConfig) -> Optional[dict]:
    for gpu in (facts.get("nvidia") or {}).get("gpus") or []:
        if gpu.get("index") == host.gpu:
            return gpu
    return None


def _service_pids(facts: dict) -> set:
    return set((facts.get("service") or {}).get("pids") or [])


def check_gpu_memory(cfg: DeployConfig, host: HostConfig, facts: dict, sized) -> Check:
    """Free VRAM covers weights + KV pool + overhead; memory held by other processes is named.
    Memory held by this service's running release counts as free (the rollout replaces it)."""
    if cfg.engine.device == "cpu":
        return Check("gpu_memory", "pass", "skipped: device is cpu")
    gpu = _gpu(facts, host)
    if gpu is None:
        n = len((facts.get("nvidia") or {}).get("gpus") or [])
        return Check("gpu_memory", "fail", f"GPU {host.gpu} not found on {host.name} ({n} GPU(s) visible to NVML)",
                     "set the host's gpu index to an existing GPU, or fix the driver")
    if sized is None:
        return Check("gpu_memory", "warn", "skipped: no capacity plan for this host", "fix the capacity check first")
    p = sized.plan
    overhead = sized.inputs.runtime_overhead_bytes
    need = p.weights_bytes + overhead + p.kv_pool_bytes
    ours = _service_pids(facts)
    others = [proc for proc in gpu.get("processes") or [] if proc["pid"] not in ours]
    ours_bytes = sum(proc.get("used_memory") or 0 for proc in gpu.get("processes") or [] if proc["pid"] in ours)
    available = int(gpu["memory_free"]) + ours_bytes
    named = ", ".join(f"pid {o['pid']} ({o.get('name') or '?'}) {_mib(o['used_memory']) if o.get('used_memory') else '? MiB'}"
                      for o in others)
    head = f"GPU {host.gpu} ({gpu.get('name')}, {_mib(gpu['memory_total'])})"
    parts = f"weights {_mib(p.weights_bytes)} + KV pool {_mib(p.kv_pool_bytes)} + overhead {_mib(overhead)}"
    if available < need:
        total = int(gpu["memory_total"])
        util = int(available / total * 100) / 100
        fix = f"stop {'those processes' if others else 'what holds the memory'}"
        if cfg.engine.num_gpu_blocks_override is None and util * total > p.weights_bytes + overhead:
            fix += f", or set engine.gpu_memory_utilization <= {util:.2f} (a smaller KV cache; re-run `deployctl plan`)"
        elif cfg.engine.num_gpu_blocks_override is None:
            fix += f" (weights + overhead alone need {_mib(p.weights_bytes + overhead)}), or use a larger GPU"
        return Check("gpu_memory", "fail",
                     f"{head} has {_mib(available)} free; the plan needs {_mib(need)} ({parts})"
                     + (f"; held by other processes: {named}" if others else ""), fix)
    if others:
        return Check("gpu_memory", "warn", f"{head}: {_mib(available)} free covers {_mib(need)} ({parts}), "
                     f"but other processes share the GPU: {named}", "make sure they will not grow, or move them")
    return Check("gpu_memory", "pass", f"{head}: {_mib(available)} free covers {_mib(need)} ({parts})")


def check_port(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """The service port is free on the bind address (a listener of our own running release is fine)."""
    port = facts.get("port") or {}
    number = layout.service_port(cfg, host)
    where = f"port {number} on {cfg.server.bind} on {host.name}"
    if port.get("free"):
        return Check("port", "pass", f"{where} is free")
    holders = port.get("holders") or []
    ours = _service_pids(facts)
    foreign = [h for h in holders if h.get("pid") not in ours]
    if holders and not foreign:
        return Check("port", "pass", f"{where} is held by the running release (pid {holders[0]['pid']}), which the rollout replaces")
    if foreign:
        h = foreign[0]
        if h.get("pid") is None:
            return Check("port", "fail", f"{where} is held by a listener at {h['address']} of a process deployctl cannot see",
                         f"run `ss -ltnp 'sport = :{number}'` as root to find it, stop it, or set server.port")
        cmd = f": {h['cmdline']}" if h.get("cmdline") else ""
        return Check("port", "fail", f"{where} is held by pid {h['pid']} ({h.get('name')}{cmd})",
                     f"stop it (kill {h['pid']}) or set server.port to a free port")
    return Check("port", "fail", f"cannot bind {cfg.server.bind}:{number} on {host.name}: {port.get('bind_error')}",
                 "set server.bind to an address of this host, or server.port to a free port")


def check_disk(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """Free space under deploy_root (releases, logs)."""
    disks = {d["role"]: d for d in facts.get("disk") or []}
    d = disks.get("deploy_root")
    if d is None:
        return Check("disk", "warn", "no disk facts for deploy_root", None)
    free = int(d["free_bytes"])
    note = "" if d.get("exists") else f" (does not exist yet; checked {d['checked_path']})"
    msg = f"{format_bytes(free)} free under {d['path']}{note}"
    fix = f"free space on the filesystem of {d['checked_path']} or move deploy_root"
    if free < DISK_FAIL_BYTES:
        return Check("disk", "fail", f"only {msg}; at least {format_bytes(DISK_FAIL_BYTES)} is needed", fix)
    if free < DISK_WARN_BYTES:
        return Check("disk", "warn", f"only {msg}", fix)
    return Check("disk", "pass", msg)


_WEIGHT_FIXES = {
    "git_lfs_pointer": "run `git lfs pull` in the model directory (or download with `huggingface-cli download`)",
    "size_mismatch": "re-download the named files (the download was cut short)",
    "sha256_mismatch": "re-download the named files",
    "missing": "copy the missing files into the model directory",
    "missing_shard": "download the missing shards named by the index",
    "no_manifest": "run `deployctl manifest MODEL_DIR` on a known-good copy and ship manifest.sha256 with the weights",
    "bad_manifest": "rewrite it with `deployctl manifest MODEL_DIR` on a known-good copy",
    "bad_header": "re-download the named files",
    "incomplete_leftover": "delete the *.incomplete leftovers (and re-download if a file is missing)",
    "unlisted": "regenerate the manifest if these files belong to the model",
}


def check_weights(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """The model directory verifies against its manifest (C15): full sha256 of every file, sanity of
    safetensors headers, no git-lfs pointers, no missing shards, no leftovers."""
    w = facts.get("weights")
    if w is None:
        return Check("weights", "warn", "skipped: weights not verified", "run preflight without --skip-weights")
    if w.get("error"):
        return Check("weights", "fail", f"cannot verify {cfg.model.path} on {host.name}: {w['error']}", None)
    issues = w.get("issues") or []
    summary = (f"{w['files_total']} files, {format_bytes(w['bytes_total'])} in {w['model_dir']} "
               f"({w['files_hashed']} hashed, {w['files_cached']} from cache, {w['duration_s']:.2f} s)")
    if not issues:
        return Check("weights", "pass", f"{summary} match {w['manifest']}")
    kinds = list(dict.fromkeys(i["kind"] for i in issues))
    status = "warn" if set(kinds) <= WARN_ONLY_WEIGHT_ISSUES else "fail"
    shown = "; ".join(i["message"] for i in issues[:6]) + (f"; and {len(issues) - 6} more" if len(issues) > 6 else "")
    return Check("weights", status, shown, "; ".join(_WEIGHT_FIXES.get(k, k) for k in kinds))


def check_chat_template(cfg: DeployConfig, facts: dict) -> Check:
    """The model has a chat template (the runtime serves /v1/chat/completions)."""
    model = facts.get("model") or {}
    if model.get("chat_template"):
        return Check("chat_template", "pass", f"chat template from {model['chat_template']}")
    return Check("chat_template", "warn",
                 f"no chat template in {cfg.model.path} (tokenizer_config.json has no chat_template); "
                 "POST /v1/chat/completions will answer 400",
                 "add chat_template to tokenizer_config.json, or have clients use /v1/completions")


def check_api_key(cfg: DeployConfig, environ: Mapping[str, str]) -> Check:
    """The API key env var is set when the service binds a non-loopback address."""
    var = cfg.server.api_key_env
    if var and environ.get(var):
        return Check("api_key", "pass", f"API key from ${var} is set")
    if cfg.server.is_loopback:
        if var:
            return Check("api_key", "warn", f"server.api_key_env is {var} but ${var} is not set; the service will run without a key",
                         f"export {var}=... before deploying")
        return Check("api_key", "pass", f"bind {cfg.server.bind} is loopback; no API key needed")
    return Check("api_key", "fail", f"server.bind {cfg.server.bind} is not loopback and ${var} is not set in deployctl's environment",
                 f"export {var}=... (it is shipped in a 0600 env file), or bind 127.0.0.1")


# The names run_checks gives its checks, in its order (runbooks name one with ``check: {preflight: NAME}``).
PREFLIGHT_CHECKS = ("nvidia_driver", "torch", "gpu_memory", "capacity", "port", "disk", "weights", "chat_template",
                    "api_key")


def run_checks(cfg: DeployConfig, host: HostConfig, facts: dict, environ: Optional[Mapping[str, str]] = None) -> list[Check]:
    """All checks for one host, in a fixed order. ``facts["error"]`` (the probe failed) gives one
    "reach" check instead."""
    if facts.get("error"):
        error = facts["error"] if host.name in facts["error"] else f"{host.name}: {facts['error']}"
        return [Check("reach", "fail", error, facts.get("fix"))]
    environ = settings.environ() if environ is None else environ
    try:
        sized, reason = plan_from_facts(cfg, host, facts)
        capacity = check_capacity(sized, reason)
    except DeployctlError as err:  # e.g. max_model_len above max_position_embeddings
        sized, capacity = None, Check("capacity", "fail", err.message, err.fix)
    return [
        check_driver(cfg, facts),
        check_torch(cfg, host, facts),
        check_gpu_memory(cfg, host, facts, sized),
        capacity,
        check_port(cfg, host, facts),
        check_disk(cfg, host, facts),
        check_weights(cfg, host, facts),
        check_chat_template(cfg, facts),
        check_api_key(cfg, environ),
    ]


__all__ = ["Check", "PREFLIGHT_CHECKS", "run_checks", "plan_from_facts", "CapacityPlan"]
