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

from deployctl.engines import adapter
from deployctl.engines.base import Flag, Switch


# The env var holding the key for engines with api_key_flag (read by engine_main.py, then removed from os.environ).
KEYED_ENV = "DEPLOYCTL_ENGINE_API_KEY"
KEYED_MAIN = "engine_main.py"
ENGINE_ENV_DIR = "engine"  # <release>/engine: the venv (system site packages) holding the pinned engine


def engine_python(cfg, host, release_dir: str) -> str:
    """The interpreter that runs the engine: host.python for the bundled runtime, else the release's venv."""
    if adapter(cfg.engine.kind).config_file:
        return host.python
    return f"{release_dir}/{ENGINE_ENV_DIR}/bin/python"


def num_gpu_blocks(cfg) -> int:
    """KV blocks for an engine that must be told (Adapter.explicit_cache): engine.num_gpu_blocks_override, else
    max_num_seqs × ceil(max_model_len / block_size) (every request at full length fits at once)."""
    e = cfg.engine
    if e.num_gpu_blocks_override:
        return e.num_gpu_blocks_override
    return e.max_num_seqs * math.ceil(e.max_model_len / e.block_size)


def setting_values(cfg, host, port: int) -> dict[str, Any]:
    """base.SETTINGS -> the value deploy.yaml gives it for ``host``."""
    e = cfg.engine
    return {"model": cfg.model.path, "served_model_name": cfg.model.name, "host": cfg.server.bind, "port": port,
            "dtype": cfg.model.dtype, "device": e.device, "max_model_len": e.max_model_len,
            "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
            "gpu_memory_utilization": e.gpu_memory_utilization, "block_size": e.block_size,
            "enable_prefix_caching": e.enable_prefix_caching, "enable_chunked_prefill": e.enable_chunked_prefill,
            "tensor_parallel_size": e.tensor_parallel_size, "num_gpu_blocks": num_gpu_blocks(cfg)}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_argv(cfg, host, port: int) -> list[str]:
    """The settings as the engine's flags (positional model first), fixed flags, then engine.extra_args."""
    a = adapter(cfg.engine.kind)
    values = setting_values(cfg, host, port)
    head: list[str] = []
    out: list[str] = []
    for setting, spell in a.flags.items():
        if setting == "num_gpu_blocks" and not (a.explicit_cache or cfg.engine.num_gpu_blocks_override):
            continue
        value = values[setting]
        if isinstance(spell, Switch):
            flag = spell.on if value else spell.off
            if flag:
                out.append(flag)
        elif spell.positional:
            head.append(_fmt(value))
        else:
            out += [spell.name, _fmt(value)]
    return head + out + list(a.fixed_args) + list(cfg.engine.extra_args)


def engine_argv(cfg, host, *, release_dir: str, port: int,
                api_key: Optional[str] = None) -> list[str]:
    """The full command that starts the engine on ``host`` from ``release_dir`` (not for the bundled runtime,
    whose settings live in runtime.yaml)."""
    a = adapter(cfg.engine.kind)
    py = engine_python(cfg, host, release_dir)
    head = [part.format(python=py, bin=py.rsplit("/", 1)[0]) for part in a.argv]
    if api_key and a.api_key_flag and head[1:2] == ["-m"]:
        # python -m MOD ... -> python <release>/engine_main.py MOD ... (the key is added inside the process)
        head = [head[0], f"{release_dir}/{KEYED_MAIN}", *head[2:]]
    return head + settings_argv(cfg, host, port)


def engine_env(cfg, api_key: Optional[str]) -> dict[str, str]:
    """The 0600 env file's variables: the adapter's fixed ones and the API key under the name the engine (or
    engine_main.py) reads."""
    a = adapter(cfg.engine.kind)
    from deployctl.engines.keepalive import keepalive_env

    env: dict[str, str] = {**a.extra_env, **keepalive_env(cfg)}
    if api_key:
        env[a.api_key_env or KEYED_ENV] = api_key
    return env


def gpu_env(cfg, host) -> dict[str, str]:
    """CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's default order is fastest-first; NVML's, and so nvidia-smi's and
    hosts[].gpus', is PCI bus order: CUDA programming guide, "CUDA Environment Variables") and
    CUDA_VISIBLE_DEVICES=hosts[].gpus on cuda; empty on cpu. Set by the unit and launch.sh."""
    if cfg.engine.device != "cuda":
        return {}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, host.gpu_ids))}


def keyed_main(cfg) -> str:
    """engine_main.py for engines with api_key_flag: runs ``python engine_main.py MODULE ARGS`` as
    ``python -m MODULE ARGS --flag KEY`` with the key from the env file (sys.argv changes inside the process;
    the kernel's cmdline stays without it)."""
    a = adapter(cfg.engine.kind)
    return ("# Rendered by deployctl: starts the engine module with its API key flag filled in from the env file,\n"
            "# so the key is never on a command line.\nimport os, runpy, sys\n\n"
            f"key = os.environ.pop({KEYED_ENV!r}, '')\nmodule = sys.argv[1]\n"
            f"sys.argv = [module] + sys.argv[2:] + ([{a.api_key_flag!r}, key] if key else [])\n"
            "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def render_context(cfg, host, *, release_dir: str, port: int,
                   api_key: Optional[str]) -> dict[str, Any]:
    """Names the per-host templates use for the engine: ``engine_cmd`` (sh words), ``exec_start`` (systemd),
    ``engine_env`` (the env file's variables), ``gpu_env`` (unit and launch.sh), ``gpu_list`` ("0,1"), ``engine_label``, the adapter."""
    import shlex

    a = adapter(cfg.engine.kind)
    if a.config_file:
        argv = [host.python, "-m", "deployctl_runtime", "serve", "--config", f"{release_dir}/runtime.yaml"]
        label = "deployctl runtime"
    else:
        argv = engine_argv(cfg, host, release_dir=release_dir, port=port, api_key=api_key)
        label = f"{a.kind} {cfg.engine.version}"
    return {"adapter": a, "engine_argv": argv, "engine_cmd": shlex.join(argv), "exec_start": " ".join(argv),
            "engine_env": engine_env(cfg, api_key), "gpu_env": gpu_env(cfg, host), "gpu_list": ",".join(map(str, host.gpu_ids)),
            "engine_label": label}


def container_argv(cfg, host, *, port: int) -> list[str]:
    """The engine's command inside its official image (``python3`` and the console scripts on PATH); an
    engine with api_key_flag runs through keyed_main's source with ``python3 -c``."""
    a = adapter(cfg.engine.kind)
    head = [part.replace("{bin}/", "").format(python="python3") for part in a.argv]
    if a.api_key_flag and head[1:2] == ["-m"]:
        head = [head[0], "-c", keyed_main(cfg), *head[2:]]
    return head + settings_argv(cfg, host, port)


def image(cfg) -> str:
    """The engine's official image at the pinned tag (``Adapter.image_tag`` with engine.version). Raises
    ConfigError (exit 3) when engine.version gives no valid, pinned tag (validate.image_tag)."""
    from deployctl.engines.validate import image_tag
    from deployctl.errors import ConfigError

    try:
        tag = image_tag(cfg.engine.kind, cfg.engine.version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return f"{adapter(cfg.engine.kind).image}:{tag}"
