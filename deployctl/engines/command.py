"""The engine's command line and environment for one host (pure: no I/O; rendered into units, launch.sh, images).

``cfg`` is a deployctl.config.DeployConfig and ``host`` one of its hosts (duck-typed: engines sit below config).

``engine_argv(cfg, host, ...)`` spells every shared setting the adapter knows (base.SETTINGS) in the engine's
own flags, then the adapter's fixed flags, then ``engine.extra_args``. The API key is never in it: it travels in
the 0600 env file, read by the engine (``Adapter.api_key_env``) or, for an engine that takes it only as a flag
(``Adapter.api_key_flag``), appended inside the process by the release's ``engine_main.py`` so that it never
shows in ``ps`` or /proc/PID/cmdline.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from deployctl.engines import of
from deployctl.engines.base import DEFAULT_UNRENDERED, Flag, Switch


# The env var holding the key for engines with api_key_flag (read by engine_main.py, then removed from os.environ).
KEYED_ENV = "DEPLOYCTL_ENGINE_API_KEY"
KEYED_MAIN = "engine_main.py"
ENGINE_ENV_DIR = "engine"  # <release>/engine: the venv (system site packages) holding the pinned engine


def engine_python(cfg, host, release_dir: str) -> str:
    """The interpreter that runs the engine: host.python for the bundled runtime, else the release's venv."""
    a = of(cfg)
    if a.config_file or (a.kind == "openai" and not a.distribution):  # a generic server with nothing to install
        return host.python
    return f"{release_dir}/{ENGINE_ENV_DIR}/bin/python"


def num_gpu_blocks(cfg) -> int:
    """KV blocks for an engine that must be told (Adapter.explicit_cache): engine.num_gpu_blocks_override, else
    max_num_seqs × ceil(max_model_len / block_size) (every request at full length fits at once)."""
    e = cfg.engine
    if e.num_gpu_blocks_override:
        return e.num_gpu_blocks_override
    return e.max_num_seqs * math.ceil(e.max_model_len / e.block_size)


def stop_wait_s(cfg) -> int:
    """Whole seconds a stop may take before it is a hang: ceil(server.drain_timeout_s) for in-flight requests plus
    the engine's own exit after the drain (Adapter.stop_overhead_s). The unit's TimeoutStopSec, compose's
    stop_grace_period, the pod's grace and launcher.stop's wait are this plus their margins."""
    return math.ceil(cfg.server.drain_timeout_s) + of(cfg).stop_overhead_s


# hosts[].dist_port's default: the runtime's server_port + DIST_PORT_OFFSET (- where that passes 65535, as SGLang
# derives its own ZMQ port: server_args.py ZMQ_TCP_PORT_DELTA), so every entry and replica on a machine, whose
# server ports differ, gets its own (replica i: server_port + i, so dist port + i)
DIST_PORT_OFFSET = 20000


def dist_port(cfg, host) -> Optional[int]:
    """The distributed-init (rendezvous) port of ``host``'s engine, or None where none is allocated: only a
    multi-GPU start (engine.tensor_parallel_size > 1) of an engine that takes one (Adapter.dist_port_flag /
    dist_port_env). hosts[].dist_port (config/replicas.py gives replica i of an entry dist_port + i), else the
    host's configured server_port (hosts[].server_port, else server.port) + DIST_PORT_OFFSET, or − it above
    65535."""
    a = of(cfg)
    if cfg.engine.tensor_parallel_size <= 1 or not (a.dist_port_flag or a.dist_port_env):
        return None
    if getattr(host, "dist_port", None):
        return host.dist_port
    port = host.server_port or cfg.server.port
    return port + DIST_PORT_OFFSET if port + DIST_PORT_OFFSET <= 65535 else port - DIST_PORT_OFFSET


def setting_values(cfg, host, port: int) -> dict[str, Any]:
    """base.SETTINGS -> the value deploy.yaml gives it for ``host``."""
    e = cfg.engine
    return {"model": cfg.model.path, "served_model_name": cfg.model.name, "host": cfg.server.bind, "port": port,
            "dtype": cfg.model.dtype, "device": e.device, "max_model_len": e.max_model_len,
            "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
            "gpu_memory_utilization": e.gpu_memory_utilization, "block_size": e.block_size,
            "enable_prefix_caching": e.enable_prefix_caching, "enable_chunked_prefill": e.enable_chunked_prefill,
            "tensor_parallel_size": e.tensor_parallel_size, "num_gpu_blocks": num_gpu_blocks(cfg),
            "kv_cache_dtype": e.kv_cache_dtype, "enforce_eager": e.enforce_eager,
            "shutdown_timeout": math.ceil(cfg.server.drain_timeout_s)}


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def command_head(cfg, host, port: int, python: str, *, bin_prefix: bool = True) -> list[str]:
    """The adapter's ``argv`` with ``{python}``, ``{bin}`` and, for a declared command template (engine.kind openai),
    every ``{setting}`` placeholder filled in (setting_values; booleans as true/false, floats with %g).
    ``bin_prefix`` False drops ``{bin}/`` (inside an image the console scripts are on PATH)."""
    a = of(cfg)
    values = {k: _fmt(v) for k, v in setting_values(cfg, host, port).items()}
    out = []
    for part in a.argv:
        if not bin_prefix:
            part = part.replace("{bin}/", "")
        out.append(part.format(python=python, bin=python.rsplit("/", 1)[0], **values))
    return out


def settings_argv(cfg, host, port: int) -> list[str]:
    """The settings as the engine's flags (positional model first), fixed flags, then engine.extra_args."""
    a = of(cfg)
    values = setting_values(cfg, host, port)
    head: list[str] = []
    out: list[str] = []
    for setting, spell in a.flags.items():
        if setting == "num_gpu_blocks" and not (a.explicit_cache or cfg.engine.num_gpu_blocks_override):
            continue
        value = values[setting]
        if setting in DEFAULT_UNRENDERED and value == DEFAULT_UNRENDERED[setting]:
            continue
        if isinstance(spell, Flag) and spell.values:
            value = spell.values.get(value, value)
        if isinstance(spell, Flag) and spell.only_if and not values[spell.only_if]:
            continue
        if isinstance(spell, Switch):
            flag = spell.on if value else spell.off
            if flag:
                out.append(flag)
        elif spell.positional:
            head.append(_fmt(value))
        else:
            out += [spell.name, _fmt(value)]
    dist = dist_port(cfg, host)
    if dist is not None and a.dist_port_flag:
        out += [a.dist_port_flag, str(dist)]
    return head + out + list(a.fixed_args) + list(cfg.engine.extra_args)


def standby_args(cfg, standby: Optional[bool] = None) -> tuple[list[str], dict[str, str]]:
    """The flags and env vars that turn on the engine's sleep mode (``Adapter.sleep``), when the release keeps a
    sleeping standby (``standby``; None: ``engines.standby_enabled(cfg)``, rollout.standby_s > 0). Only the SSH
    targets (systemd unit, launch.sh) keep standbys; container and k8s renders pass False (vLLM's dev mode would
    expose its dev routes in the pod with no router in front)."""
    from deployctl.engines import standby_enabled

    a = of(cfg)
    if a.sleep is None or not (standby_enabled(cfg) if standby is None else standby):
        return [], {}
    return list(a.sleep.enable_flags), dict(a.sleep.enable_env)


def engine_argv(cfg, host, *, release_dir: str, port: int,
                api_key: Optional[str] = None, standby: Optional[bool] = None) -> list[str]:
    """The full command that starts the engine on ``host`` from ``release_dir`` (not for the bundled runtime,
    whose settings live in runtime.yaml); with the sleep-mode flags when the release keeps a standby
    (standby_args)."""
    a = of(cfg)
    head = command_head(cfg, host, port, engine_python(cfg, host, release_dir))
    if api_key and a.api_key_flag and head[1:2] == ["-m"]:
        # python -m MOD ... -> python <release>/engine_main.py MOD ... (the key is added inside the process)
        head = [head[0], f"{release_dir}/{KEYED_MAIN}", *head[2:]]
    argv = settings_argv(cfg, host, port)
    flags = standby_args(cfg, standby)[0]
    n = len(argv) - len(cfg.engine.extra_args)
    return head + argv[:n] + flags + argv[n:]


def engine_env(cfg, api_key: Optional[str], standby: Optional[bool] = None, host=None) -> dict[str, str]:
    """The 0600 env file's variables: the adapter's fixed ones, the sleep-mode ones when the release keeps a
    standby (standby_args), deploy.yaml's engine.cache_dir / env / secret_env ones (engines.processenv; raises
    ConfigError for an unset secret or a name deployctl sets) and the API key under the name the engine (or
    engine_main.py) reads."""
    a = of(cfg)
    from deployctl.engines.keepalive import keepalive_env

    from deployctl import settings
    from deployctl.engines.processenv import process_env

    env: dict[str, str] = {**a.extra_env, **keepalive_env(cfg), **standby_args(cfg, standby)[1]}
    dist = dist_port(cfg, host) if host is not None else None
    if dist is not None and a.dist_port_env:  # the rendezvous port (dist_port), for an engine that reads an env var
        env[a.dist_port_env] = str(dist)
    env |= process_env(cfg.engine, set(env) | {a.api_key_env or KEYED_ENV}, settings.environ(), a.kind)
    if api_key:
        env[a.api_key_env or KEYED_ENV] = api_key
    return env


def secret_names(cfg) -> frozenset[str]:
    """The names among ``engine_env``'s whose values are secrets: the API key's (the engine's own variable, or
    engine_main.py's) and engine.secret_env's. The k8s pod reads only these from its Secret; the rest are plain
    values in the pod spec."""
    a = of(cfg)
    return frozenset({a.api_key_env or KEYED_ENV, *cfg.engine.secret_env})


def gpu_env(cfg, host, pinning: Optional[dict] = None) -> dict[str, str]:
    """CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's default order is fastest-first; NVML's, and so nvidia-smi's and
    hosts[].gpus', is PCI bus order: CUDA programming guide, "CUDA Environment Variables") and
    CUDA_VISIBLE_DEVICES on cuda; empty on cpu. Set by the unit and launch.sh. ``pinning``: the release's GPU record
    (deployctl.render.gpupin.pinning): with ``"by": "uuid"`` CUDA_VISIBLE_DEVICES lists the GPUs' UUIDs
    ("GPU-5c1e...,GPU-9a04...", in hosts[].gpus' order: an index can name another GPU after a reboot or under an
    inherited mask, a UUID cannot); else (None, ``"by": "index"``) hosts[].gpus' indices ("0,1")."""
    if cfg.engine.device != "cuda":
        return {}
    if pinning and pinning.get("by") == "uuid":
        visible = ",".join(d["uuid"] for d in pinning["devices"])
    else:
        visible = ",".join(map(str, host.gpu_ids))
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible}


# engine_main.py's log scrubber: the engine's stdout and stderr (and its children's, which inherit them) pass
# through a forked process that writes them on with every occurrence of the key replaced, holding back only a tail
# that could be the start of the key. SGLang logs its whole server_args, api_key included
# (sglang/srt/entrypoints/engine.py: logger.info(f"server_args=...")), and its schedulers log again.
_SCRUBBER = """
def scrub(key, fds=(1, 2)):
    import select, signal
    k, mark = key.encode(), b'<redacted>'
    pipes = {}
    for fd in fds:
        r, w = os.pipe()
        pipes[r] = [os.dup(fd), b'']
        os.dup2(w, fd)
        os.close(w)
    if os.fork():
        for r, (out, _) in pipes.items():
            os.close(r)
            os.close(out)
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive the engine: write what its last words were
    for fd in fds:
        os.close(fd)
    while pipes:
        for r in select.select(list(pipes), [], [])[0]:
            out, held = pipes[r]
            chunk = os.read(r, 65536)
            data = (held + chunk).replace(k, mark)
            keep = 0 if not chunk else next((n for n in range(min(len(k) - 1, len(data)), 0, -1)
                                             if data.endswith(k[:n])), 0)
            pipes[r][1] = data[len(data) - keep:] if keep else b''
            body = data[:len(data) - keep]
            while body:
                body = body[os.write(out, body):]
            if not chunk:
                del pipes[r]
    os._exit(0)
"""


def keyed_main(cfg) -> str:
    """engine_main.py for engines with api_key_flag: runs ``python engine_main.py MODULE ARGS`` as
    ``python -m MODULE ARGS --flag KEY`` with the key from the env file (sys.argv changes inside the process;
    the kernel's cmdline stays without it), every line it and its children write passing through a scrubber
    that replaces the key with ``<redacted>`` (_SCRUBBER: the engine logs its arguments)."""
    a = of(cfg)
    return ("# Rendered by deployctl: starts the engine module with its API key flag filled in from the env file,\n"
            "# so the key is never on a command line, and keeps the key out of the log the engine writes.\n"
            "import os, runpy, sys\n" + _SCRUBBER +
            f"\nkey = os.environ.pop({KEYED_ENV!r}, '')\nmodule = sys.argv[1]\nif key:\n    scrub(key)\n"
            f"sys.argv = [module] + sys.argv[2:] + ([{a.api_key_flag!r}, key] if key else [])\n"
            "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def render_context(cfg, host, *, release_dir: str, port: int,
                   api_key: Optional[str], standby: Optional[bool] = None,
                   gpu_pinning: Optional[dict] = None) -> dict[str, Any]:
    """Names the per-host templates use for the engine: ``engine_cmd`` (sh words), ``exec_start`` (systemd),
    ``engine_env`` (the env file's variables), ``secret_names`` (which of them are secrets), ``gpu_env`` (unit and
    launch.sh; by UUID with ``gpu_pinning``, gpu_env), ``gpu_list`` ("0,1": the NVML indices nvidia-smi -i waits
    for), ``engine_label``, the adapter."""
    import shlex

    a = of(cfg)
    if a.config_file:
        argv = [host.python, "-m", "deployctl_runtime", "serve", "--config", f"{release_dir}/runtime.yaml"]
        label = "deployctl runtime"
    else:
        argv = engine_argv(cfg, host, release_dir=release_dir, port=port, api_key=api_key, standby=standby)
        label = f"{a.kind} {cfg.engine.version}"
    return {"adapter": a, "engine_argv": argv, "engine_cmd": shlex.join(argv), "exec_start": " ".join(argv),
            "engine_env": engine_env(cfg, api_key, standby, host), "secret_names": secret_names(cfg), "gpu_env": gpu_env(cfg, host, gpu_pinning), "gpu_list": ",".join(map(str, host.gpu_ids)),
            "engine_label": label}


def container_argv(cfg, host, *, port: int) -> list[str]:
    """The engine's command inside its official image (``python3`` and the console scripts on PATH); an
    engine with api_key_flag runs through keyed_main's source with ``python3 -c``."""
    a = of(cfg)
    head = command_head(cfg, host, port, "python3", bin_prefix=False)
    if a.api_key_flag and head[1:2] == ["-m"]:
        head = [head[0], "-c", keyed_main(cfg), *head[2:]]
    return head + settings_argv(cfg, host, port)


def image(cfg) -> str:
    """The engine's official image at the pinned tag (``Adapter.image_tag`` with engine.version). Raises
    ConfigError (exit 3) when engine.version gives no valid, pinned tag (validate.image_tag)."""
    from deployctl.engines.validate import image_tag
    from deployctl.errors import ConfigError

    try:
        tag = image_tag(of(cfg), cfg.engine.version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return f"{of(cfg).image}:{tag}"
