"""Checks: rules over one host's facts (from deployctl/hostscripts/probe.py, plus ``facts["weights"]``, the
weights.VerifyReport as JSON). Each returns a Check with pass/warn/fail, a message naming the values,
and a fix. Pure functions of (config, host config, facts, environment): recorded fact files replay them.
Whether the engine fits the host's GPUs (capacity, gpus, gpu_memory) is deployctl.preflight.capacity's; run_checks
runs every check in one order.
"""
from __future__ import annotations

from typing import Mapping, Optional

from deployctl import settings
from deployctl.capacity import CapacityPlan
from deployctl.config import DeployConfig, HostConfig, layout
from deployctl.errors import DeployctlError
from deployctl.preflight.base import Check, service_pids as _service_pids
from deployctl.preflight.capacity import check_capacity, check_gpu_ids, check_gpu_memory, plan_from_facts
from deployctl.preflight.drivers import driver_verdict
from deployctl.preflight.gpuhealth import check_gpu_health
from deployctl.preflight.gpupin import check_gpu_pinning
from deployctl.preflight.gpuprocs import check_gpu_processes
from deployctl.preflight.kvdtype import check_kv_cache_dtype
from deployctl.preflight.shell import check_login_shell
from deployctl.preflight.sshdlimits import check_sshd_limits
from deployctl.preflight.standby import standby_checks
from deployctl.config.models import DISK_WARN_BYTES
from deployctl.config.units import format_bytes

WARN_ONLY_WEIGHT_ISSUES = {"unlisted", "incomplete_leftover"}


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
    if max(host.gpu_ids) >= int(t.get("device_count") or 0):
        return Check("torch", "fail", f"hosts[{host.name}] uses GPU(s) {host.gpu_ids} but torch sees "
                     f"{t.get('device_count')} GPU(s)", "set the host's gpu / gpus to indices torch can see")
    return Check("torch", "pass", f"torch {t['version']} (CUDA {t['cuda']}) in {py}; CUDA usable, {t['device_count']} GPU(s)")


def check_engine(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """The pinned engine (engine.kind at engine.version) is importable in the host's runtime environment or in
    the host's shared venv of that version (rollout/release.py ENGINE_INSTALL), its version as read there by
    importlib.metadata (probe.py ``probe_engine``); neither is a warning: the first release pip-installs it into
    the shared venv. Not run for the bundled runtime: the release installs its own wheel."""
    from deployctl.engines import of

    a = of(cfg)
    if a.distribution is None:
        return Check("engine", "pass", f"{a.kind}: the release installs its own wheel")
    e = facts.get("engine") or {}
    py = e.get("python") or host.python
    want = cfg.engine.version
    fix = (f"install it: {py} -m pip install {a.distribution}=={want} (or change engine.version to what the "
           "hosts run)")
    if e.get("importable") and e.get("version") == want:
        return Check("engine", "pass", f"{a.distribution} {want} importable by {py}")
    shared = e.get("shared") or {}
    if shared.get("importable") and shared.get("version") == want:
        return Check("engine", "pass", f"{a.distribution} {want} in this host's shared engine venv "
                                       f"({shared.get('python')}, installed by an earlier release)")
    have = (f"{a.distribution} {e.get('version')} in {py}; engine.version is {want}" if e.get("importable") else
            f"{a.distribution} is not importable by {py}: {e.get('error') or 'not probed'}")
    venv = f"{layout.engines_dir(host)}/{a.distribution}-{want}"
    return Check("engine", "warn", f"{have}: the first release pip-installs {a.distribution}=={want} into {venv} "
                                   f"(once per host, within engine.install_timeout_s {cfg.engine.install_timeout_s:g} s; "
                                   "the host needs the package index)",
                 f"{fix}; or let the deploy install it")


def check_port(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """The service port is free on the bind address (a listener of our own running release is fine)."""
    port = facts.get("port") or {}
    number = layout.service_port(cfg, host)
    where = f"port {number} on {cfg.server.bind} on {host.name}"
    if port.get("free"):
        return Check("port", "pass", f"{where} is free")
    holders = port.get("holders") or []
    ours = _service_pids(facts)
    sb = facts.get("standby") or {}
    asleep = set(sb.get("pids") or []) if sb.get("port") == number else set()
    foreign = [h for h in holders if h.get("pid") not in ours | asleep]
    if holders and not foreign and any(h.get("pid") in asleep for h in holders):
        return Check("port", "pass", f"{where} is held by this service's sleeping standby of {sb.get('release')} "
                     f"(pid {holders[0]['pid']}, shared/run/standby.json), kept by the last deploy for a rollback; "
                     "the next deploy stops it before it starts there")
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


def check_allocated_ports(host: HostConfig, facts: dict) -> Check:
    """The host's other allocated ports (the probe's ``more_ports``: spare_port, dist_port) are free, or held by
    this service's own engine (the running release's or the sleeping standby's pids); a stranger fails, naming the
    port, its role and the holder."""
    ours = _service_pids(facts) | set((facts.get("service") or {}).get("standby_pids") or []) | set(
        (facts.get("standby") or {}).get("pids") or [])
    said = []
    for p in facts.get("more_ports") or []:
        where = f"{p.get('what')} {p.get('port')} on {p.get('bind')} on {host.name}"
        holders = p.get("holders") or []
        foreign = [h for h in holders if h.get("pid") not in ours]
        if p.get("free") or (holders and not foreign):
            said.append(f"{where} is {'free' if p.get('free') else 'held by this service'}")
            continue
        if foreign:
            h = foreign[0]
            who = (f"pid {h['pid']} ({h.get('name')}{': ' + h['cmdline'] if h.get('cmdline') else ''})"
                   if h.get("pid") is not None else f"a listener at {h['address']} deployctl cannot see")
            return Check("allocated_ports", "fail", f"{where} is held by {who}",
                         f"stop it, or give hosts[{host.name}].{p.get('what')} a free port")
        return Check("allocated_ports", "fail", f"cannot bind {where}: {p.get('bind_error')}",
                     f"give hosts[{host.name}].{p.get('what')} a free port")
    return Check("allocated_ports", "pass", "; ".join(said))


def check_disk(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """Free space under deploy_root (and the model path) against what a deploy puts there: deployctl.preflight.disk
    (the current release's size standing in for the payload, which deploy measures before its upload; the engine
    venv to install; the model still to copy; the margin). Fails when it does not fit; warns when less than
    DISK_WARN_BYTES (the rendered disk alert's threshold) would be left after the deploy."""
    from deployctl.preflight.disk import verdicts

    found = verdicts(cfg, host, facts)
    if not found:
        return Check("disk", "warn", "no disk facts for deploy_root", None)
    bad = [v for v in found if not v.ok]
    if bad:
        return Check("disk", "fail", "; ".join(v.line().split(": ", 1)[1] for v in bad), bad[0].fix())
    root = found[0]
    left = root.available - root.need.total
    msg = f"{root.free_text()} under {root.path}; a deploy needs {root.need.text()}"
    if left < DISK_WARN_BYTES:
        return Check("disk", "warn", f"{msg}: {format_bytes(left)} left after it, under the disk alert's "
                                     f"{format_bytes(DISK_WARN_BYTES)}", root.fix())
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


def router_exposure(cfg: DeployConfig) -> Optional[str]:
    """Where the router publishes the service beyond loopback (config.router.RouterConfig.exposure), or None when
    there is no router or it listens on a loopback address only."""
    return cfg.router.exposure() if cfg.router is not None else None


def check_api_key(cfg: DeployConfig, environ: Mapping[str, str]) -> Check:
    """Nothing is reachable beyond loopback without an API key: the runtime's own bind (``server.bind``) and the
    router's ``listen`` (nginx forwards every request it accepts to a runtime, so a loopback bind behind a public
    router is public). A public router without ``router.limits`` is a warning even with a key: one client can take
    every GPU. The key is ``server.api_key_env``'s: checked by the router (its keys file, deployctl.render.keys) and
    by the runtime on every request; render refuses a public router without server.api_key_env too."""
    var = cfg.server.api_key_env
    keyed = bool(var and environ.get(var))
    public = router_exposure(cfg)
    key_fix = (f"export {var}=... before deploying (it is shipped in a 0600 env file)" if var else
               "set server.api_key_env to the name of a variable holding a key and export it before deploying")
    if not cfg.server.is_loopback and not keyed:
        return Check("api_key", "fail", f"server.bind {cfg.server.bind} is not loopback and ${var} is not set in "
                     "deployctl's environment", f"{key_fix}, or bind 127.0.0.1")
    if public and not keyed:
        why = f"server.api_key_env is {var} but ${var} is not set" if var else "server.api_key_env is not set"
        return Check("api_key", "fail",
                     f"the router publishes the service on {public} and {why}: anyone who reaches it can use the GPUs",
                     f"{key_fix}; or set router.listen_address: 127.0.0.1 to keep the router on loopback")
    if public and cfg.router.limits is None:
        return Check("api_key", "warn", f"API key from ${var} is set; the router publishes the service on {public} "
                     "without per-client limits: one client (or a leaked key) can take every GPU",
                     "set router.limits (requests_per_s, burst, connections; key: api_key limits each key)")
    if keyed:
        return Check("api_key", "pass", f"API key from ${var} is set")
    if var:
        return Check("api_key", "warn", f"server.api_key_env is {var} but ${var} is not set; the service will run "
                     "without a key", f"export {var}=... before deploying")
    if cfg.router is not None:
        return Check("api_key", "pass", f"bind {cfg.server.bind} is loopback and the router listens on "
                     f"{layout.url_host(cfg.router.listen_address)}:{cfg.router.listen} only; no API key needed")
    return Check("api_key", "pass", f"bind {cfg.server.bind} is loopback and no router publishes it; no API key needed")


def check_engine_secrets(cfg: DeployConfig, environ: Mapping[str, str]) -> Check:
    """engine.secret_env's variables are set in deployctl's environment, where the release's runtime.env takes
    them from (engines.processenv.secret_values: its message and fix); the values are never shown."""
    from deployctl.engines.processenv import secret_values

    try:
        secret_values(list(cfg.engine.secret_env), environ)
    except DeployctlError as err:
        return Check("engine_secrets", "fail", err.message, err.fix)
    return Check("engine_secrets", "pass", f"engine.secret_env {', '.join(cfg.engine.secret_env)} set")


# The names run_checks gives its checks, in its order (runbooks name one with ``check: {preflight: NAME}``).
PREFLIGHT_CHECKS = ("nvidia_driver", "torch", "engine", "gpus", "gpu_health", "gpu_pinning", "gpu_memory", "gpu_processes",
                    "kv_cache_dtype",  # fp8 KV on CUDA only
                    "capacity", "port", "allocated_ports", "disk",
                    "weights", "chat_template", "api_key", "engine_secrets",
                    "standby_ram", "spare_port_gpu", "standby_fit",  # hosts with spare_port only
                    "login_shell", "sshd_limits",  # SSH hosts only
                    "serving_hosts")  # on the first serving host's report only (a fleet check)


def check_serving_hosts(cfg: DeployConfig) -> Check:
    """Warn when one host serves (hosts[].pool: serving): the guides ask for at least two instances in production,
    so one can fail, be drained or be replaced while the other serves; a single one is for validation."""
    serving = [h.name for h in cfg.hosts if h.pool != "warm"]
    warm = [h.name for h in cfg.hosts if h.pool == "warm"]
    if len(serving) >= 2:
        return Check("serving_hosts", "pass", f"{len(serving)} serving hosts ({', '.join(serving)})")
    return Check("serving_hosts", "warn",
                 f"one serving host ({', '.join(serving) or 'none'}"
                 + (f"; warm pool: {', '.join(warm)}" if warm else "") + "): a single instance is for validation "
                 "only; a failed, drained or restarted host takes the whole service down",
                 "add a second serving host under hosts: (deployctl plan sizes it) and keep autoscale.min_hosts >= 2")


def run_checks(cfg: DeployConfig, host: HostConfig, facts: dict, environ: Optional[Mapping[str, str]] = None) -> list[Check]:
    """All checks for one host, in a fixed order. ``facts["error"]`` (the probe failed) gives one
    "reach" check instead."""
    if facts.get("error"):
        error = facts["error"] if host.name in facts["error"] else f"{host.name}: {facts['error']}"
        return [Check("reach", "fail", error, facts.get("fix"))]
    environ = settings.environ() if environ is None else environ
    try:
        sized, reason = plan_from_facts(cfg, host, facts)
        capacity = check_capacity(sized, reason, cfg)
    except DeployctlError as err:  # e.g. max_model_len above max_position_embeddings
        sized, capacity = None, Check("capacity", "fail", err.message, err.fix)
    return [
        check_driver(cfg, facts),
        check_torch(cfg, host, facts),
        *([check_engine(cfg, host, facts)] if cfg.engine.kind != "deployctl-runtime" else []),
        *([check_gpu_ids(cfg, host)] if cfg.engine.device == "cuda" else []),
        check_gpu_health(cfg, host, facts),
        check_gpu_pinning(cfg, host, facts),
        check_gpu_memory(cfg, host, facts, sized),
        check_gpu_processes(cfg, host, facts),
        *([check_kv_cache_dtype(cfg, host, facts)]
          if cfg.engine.device == "cuda" and cfg.engine.kv_cache_dtype.startswith("fp8") else []),
        capacity,
        check_port(cfg, host, facts),
        *([check_allocated_ports(host, facts)] if facts.get("more_ports") else []),
        check_disk(cfg, host, facts),
        check_weights(cfg, host, facts),
        check_chat_template(cfg, facts),
        check_api_key(cfg, environ),
        *([check_engine_secrets(cfg, environ)] if cfg.engine.secret_env else []),
        *standby_checks(cfg, host, facts, sized),
        *([check_login_shell(host, facts)] if "login_shell" in facts else []),  # measured over SSH only
        *([check_sshd_limits(cfg, host, facts)] if "sshd" in facts else []),  # read over SSH only
        *([check_serving_hosts(cfg)] if host.name == _first_serving(cfg) else []),
    ]


def _first_serving(cfg: DeployConfig) -> str:
    return next((h.name for h in cfg.hosts if h.pool != "warm"), cfg.hosts[0].name)


__all__ = ["Check", "PREFLIGHT_CHECKS", "run_checks", "CapacityPlan"]
