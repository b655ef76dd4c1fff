"""The engine process's own environment from deploy.yaml: ``engine.env`` (plain variables: ``HF_HUB_OFFLINE``,
``NCCL_*``, ``VLLM_*``), ``engine.secret_env`` (names of variables such as ``HF_TOKEN`` whose values are read from
deployctl's environment when a release is rendered, never from deploy.yaml) and ``engine.cache_dir`` (one
directory per host for the engine's caches, shared by every release, so a rollback or a new release of the same
engine reuses the compiled kernels and downloaded files instead of rebuilding them).

All of them go into the release's 0600 runtime.env beside the API key (read by systemd's EnvironmentFile=,
launch.sh, compose's env_file and the k8s Secret), so each target gets them from one place. Values are limited to
characters that mean the same to systemd and to ``sh`` (launch.sh sources the file): no spaces, quotes or ``$``.

Cache variables (``cache_env``), each a directory under ``engine.cache_dir``: ``XDG_CACHE_HOME`` (the base the
others default to: vLLM's ``VLLM_CACHE_ROOT`` is ``$XDG_CACHE_HOME/vllm``, vllm/envs.py; huggingface_hub's
``HF_HOME`` is ``$XDG_CACHE_HOME/huggingface``; FlashInfer's JIT cache), then explicitly ``HF_HOME``,
``VLLM_CACHE_ROOT`` (vLLM's torch.compile cache, which also sets ``TORCHINDUCTOR_CACHE_DIR`` beneath it:
vllm/compilation/compiler_interface.py), ``TORCHINDUCTOR_CACHE_DIR`` (SGLang's and transformers' torch.compile)
and ``TRITON_CACHE_DIR`` (Triton's compiled kernels; default ``~/.triton/cache``, triton/knobs.py).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# no ~ (sh expands it, systemd's EnvironmentFile= does not) and no % (systemd expands specifiers in ExecStartPre=)
VALUE = re.compile(r"^[A-Za-z0-9._+/=:,@-]*$")
VALUE_CHARS = "letters, digits and . _ + / = : , @ -"
# set by deployctl itself on every engine (gpu_env, the unit, the runtime's key variable)
RESERVED = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED", "DEPLOYCTL_RUNTIME_API_KEY"})
# launch.sh sources runtime.env (set -a) into its own shell: its variables, and the shell's own, stay its own
# (tests/deployctl/engines/test_engines_process_env_names.py checks this list against the template)
LAUNCHER_NAMES = frozenset({
    "BACKOFF_S", "CHILD_PID_FILE", "CONFIG_ERROR_EXIT", "DEPLOYCTL_LAUNCH_PORT", "ENGINE_CMD", "GPU_WAIT_S",
    "LOG_BACKUPS", "LOG_CHECK_S", "LOG_FILE", "LOG_MAX_BYTES", "MAX_BACKOFF_S", "MAX_FAILURES", "PID_FILE",
    "RELEASE_DIR", "STABLE_AFTER_S", "STOP_TIMEOUT_S", "KillMode",
    # the engine's marker (hostscripts/snippets.py SH_ENGINE_PIDS) and where launch.sh keeps it
    "DEPLOYCTL_INSTANCE", "DEPLOYCTL_INSTANCE_PORT", "INSTANCE_PORT", "INSTANCE_ROOT", "RUN_DIR",
    "child", "d", "deadline", "delay", "failures", "i", "keeper", "killer", "m", "pgid", "pid", "rc", "s", "size",
    "sleeper", "started", "stopping", "supervisor", "left", "left_s", "msg", "n", "other", "p", "pids", "standby",
    "stop_at",
    "IFS", "PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "OLDPWD", "PWD"})
CACHE_SUBDIRS = {"XDG_CACHE_HOME": "", "HF_HOME": "huggingface", "VLLM_CACHE_ROOT": "vllm",
                 "TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton"}


def check_name(name: object, where: str) -> str:
    """``name`` when it is a variable name deploy.yaml may set; raises ValueError naming ``where`` and the fix."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"{where}: {name!r} is not an environment variable name (letters, digits and _, not "
                         "starting with a digit)")
    if name in RESERVED:
        raise ValueError(f"{where}: {name} is set by deployctl (from hosts[].gpus, or the API key); remove it "
                         "(hosts[].gpus chooses the GPUs, server.api_key_env the key)")
    if name in LAUNCHER_NAMES:
        raise ValueError(f"{where}: {name} is a variable of the shell that starts the engine (launch.sh sources "
                         "runtime.env); it would change how the engine is started or stopped: remove it")
    return name


def check_env(env: dict, secret_names: list, cache_dir: Optional[str]) -> None:
    """engine.env, engine.secret_env and engine.cache_dir together. Raises ValueError (the key and the fix)."""
    for name, value in env.items():
        check_name(name, "engine.env")
        if not isinstance(value, str) or not VALUE.match(value):
            raise ValueError(f"engine.env.{name}: the value has characters deployctl will not put in an env file "
                             f"that systemd and sh both read; use {VALUE_CHARS} only (quote numbers in YAML)")
    for name in secret_names:
        check_name(name, "engine.secret_env")
    both = sorted(set(env) & set(secret_names))
    if both:
        raise ValueError(f"engine.env and engine.secret_env both name {both[0]}; a secret's value comes from "
                         "deployctl's environment: keep it in secret_env only")
    if cache_dir is not None:
        if not cache_dir.startswith("/") or not VALUE.match(cache_dir) or not cache_dir.strip("/"):
            raise ValueError(f"engine.cache_dir {cache_dir!r}: an absolute path below / of {VALUE_CHARS} only")
        taken = sorted(set(CACHE_SUBDIRS) & (set(env) | set(secret_names)))
        if taken:
            which = "engine.env" if taken[0] in env else "engine.secret_env"
            raise ValueError(f"{which} sets {taken[0]}, which engine.cache_dir sets to "
                             f"{cache_env(cache_dir)[taken[0]]}; drop one of them")


def cache_env(cache_dir: Optional[str]) -> dict[str, str]:
    """The cache variables (module doc) for ``cache_dir``; {} when None."""
    if cache_dir is None:
        return {}
    root = cache_dir.rstrip("/") or "/"
    return {k: (f"{root}/{sub}" if sub else root) for k, sub in CACHE_SUBDIRS.items()}


def secret_values(names: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """{name: value} of engine.secret_env from ``environ``. Raises ConfigError (exit 3) naming the first unset
    variable, or one whose value cannot go into the env file (the value is never shown)."""
    from deployctl.errors import ConfigError

    out = {}
    for name in names:
        value = environ.get(name)
        if not value:
            raise ConfigError(f"engine.secret_env names {name} but {name} is not set in deployctl's environment "
                              "(or is empty)",
                              fix=f"export {name}=<value> before rendering or deploying (it is written only to the "
                                  "0600 runtime.env)")
        if not VALUE.match(value):
            raise ConfigError(f"the value of {name} ({len(value)} characters) has characters outside {VALUE_CHARS}",
                              fix=f"check {name}: tokens such as HF_TOKEN are letters, digits and _ only")
        out[name] = value
    return out


def process_env(engine, deployctl_sets: set[str], environ: Mapping[str, str], kind: str) -> dict[str, str]:
    """engine.cache_dir's, engine.env's and engine.secret_env's variables for an engine whose other variables
    (``deployctl_sets``: the names of the adapter's, keep-alive's, sleep mode's and the API key's) deployctl
    sets. Raises ConfigError (exit 3) when deploy.yaml sets one of those, or a secret is unset."""
    from deployctl.errors import ConfigError

    own = {**cache_env(engine.cache_dir), **engine.env}
    clash = sorted((set(own) | set(engine.secret_env)) & deployctl_sets)
    if clash:
        raise ConfigError(f"engine.env / engine.secret_env sets {clash[0]}, which deployctl itself sets for {kind}",
                          fix=f"remove {clash[0]} from deploy.yaml's engine section")
    return {**own, **secret_values(list(engine.secret_env), environ)}
