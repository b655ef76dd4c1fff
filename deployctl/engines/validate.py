"""Engine settings checked before any host is touched (deploy.yaml load, and the model shape at plan/render/deploy).

Each check raises ``ValueError`` (inside config validation: pydantic adds the file, line and key) or
``ConfigError`` (exit 3) with one line that names the key and the fix. ``cfg`` is a DeployConfig, ``shape`` a
model shape with ``num_attention_heads`` (duck-typed: engines sit below config).
"""
from __future__ import annotations

import re
from typing import Sequence

from deployctl.engines import KINDS, SETTINGS, adapter, of
from deployctl.engines.base import DEFAULT_UNRENDERED
from deployctl.errors import ConfigError


# One extra_args item: a --flag, --flag=value or a bare value, in characters safe unquoted in a unit and sh.
_ARG = re.compile(r"^[A-Za-z0-9_./+@:,=%-]{1,200}$")
# Flags that would put a secret on the command line (visible in ps and /proc): the env file carries the key.
_SECRET_FLAGS = ("--api-key", "--api-key-file")
# Settings deploy.yaml models under another key than engine.<setting>.
_SETTING_KEYS = {"model": "model.path", "served_model_name": "model.served_name", "host": "server.bind",
                 "port": "server.port (or hosts[].server_port)", "dtype": "model.dtype",
                 "num_gpu_blocks": "engine.num_gpu_blocks_override", "shutdown_timeout": "server.drain_timeout_s"}


def _on_router_machine(cfg, h) -> bool:
    """Host ``h`` runs on the router's machine (or there is no router), so a loopback bind still reaches nginx."""
    rh = cfg.router_host()
    if rh is None:
        return True
    return rh.is_local if h.is_local else (not rh.is_local and rh.address == h.address)


def check_dev_mode_bind(cfg) -> None:
    """An engine whose sleep routes need a dev mode (``Sleep.enable_env``: vLLM's VLLM_SERVER_DEV_MODE=1, which
    also mounts /collective_rpc, /reset_prefix_cache, /server_info and /sleep with no key check) keeps a sleeping
    standby only on a loopback ``server.bind``: on another address those routes answer anyone who reaches the
    host, whatever the router refuses. The fix named depends on where the router runs: ``server.bind: 127.0.0.1``
    when every host is on the router's machine (nginx reaches them on loopback), else ``rollout.standby_s: 0``
    (a loopback engine on another machine is out of the router's reach). Called by the SSH targets' render (the
    container and k8s renders keep no standby). Raises ConfigError (exit 3)."""
    a = of(cfg)
    if a.sleep is None or not a.sleep.enable_env or cfg.rollout.standby_s <= 0 or cfg.server.is_loopback:
        return
    env = ", ".join(f"{k}={v}" for k, v in a.sleep.enable_env.items())
    why = (f"server.bind {cfg.server.bind} with rollout.standby_s {cfg.rollout.standby_s:g}: {cfg.engine.kind}'s sleep "
           f"mode needs {env}, whose dev routes (/collective_rpc, /sleep, /reset_prefix_cache, /server_info) check "
           "no API key and would answer anyone who reaches the host's engine port")
    away = [h.name for h in cfg.hosts if not _on_router_machine(cfg, h)]
    if not away:
        raise ConfigError(why, fix="set server.bind: 127.0.0.1 (the router on this machine reaches it there), or "
                                   "rollout.standby_s: 0 (no sleeping standby, no dev mode)")
    raise ConfigError(why, fix=f"set rollout.standby_s: 0 (no sleeping standby, no dev mode); server.bind 127.0.0.1 "
                               f"would leave host {away[0]!r} out of reach of the router on {cfg.router.host}")


def check_kind(kind: str) -> str:
    """``kind`` when it is one of KINDS. Raises ValueError naming the allowed kinds."""
    if kind not in KINDS:
        raise ValueError(f"not an engine deployctl deploys; set engine.kind to one of {', '.join(KINDS)}")
    return kind


def check_extra_args(kind: str, args: Sequence[str]) -> list[str]:
    """``args`` when every item is safe and none repeats a modelled setting or passes a secret.
    Raises ValueError naming the flag and the deploy.yaml key to use instead."""
    if kind not in KINDS:
        return list(args)  # check_kind reports it
    a = adapter(kind)
    if args and a.config_file:
        raise ValueError(f"only for foreign engines; {kind} takes only the modelled settings "
                         "(remove engine.extra_args or set engine.kind)")
    modelled = {}
    for setting, flag in a.flags.items():
        names = [flag.name] if hasattr(flag, "name") else [flag.on, flag.off]
        for n in names:
            if n:
                modelled[n.split("=", 1)[0]] = setting
    for item in args:
        if not _ARG.match(item):
            raise ValueError(f"item {item!r} has characters deployctl will not put on a command "
                             "line; use letters, digits and _ . / + @ : , = % - only")
        name = item.split("=", 1)[0]
        if name in _SECRET_FLAGS:
            raise ValueError(f"{name} would put the API key on the command line; "
                             "set server.api_key_env instead (the key travels in the 0600 env file)")
        if name in modelled:
            key = _SETTING_KEYS.get(modelled[name], f"engine.{modelled[name]}")
            raise ValueError(f"{name} duplicates a setting deployctl models; remove it and set "
                             f"{key} instead")
        if name in a.fixed_args:
            raise ValueError(f"{name} is always rendered for {kind}; remove it")
        if a.sleep is not None and name in a.sleep.enable_flags:
            raise ValueError(f"{name} is rendered by deployctl when the release keeps a sleeping standby; remove it "
                             "and set rollout.standby_s (seconds; 0 turns the standby off)")
    return list(args)


def check_engine_settings(engine) -> None:
    """The settings ``engine`` (an EngineConfig) sets away from their default that its kind has no flag for (e.g.
    kv_cache_dtype fp8 on deployctl-runtime, whose KV cache is the serving dtype). The one home of the rule for
    deploy.yaml (check_engine_config) and `plan`'s overrides (capacity.sizing.override_engine). Raises ValueError
    (one line: the key, the value, the fix)."""
    if engine.kind not in KINDS:
        return  # check_kind reports it
    a = adapter(engine.kind)
    for setting, default in DEFAULT_UNRENDERED.items():
        if getattr(engine, setting) != default and not a.has(setting):
            raise ValueError(f"engine.{setting} {getattr(engine, setting)!r}: {engine.kind} has no such setting; "
                             "remove it or use engine.kind vllm or sglang")


def check_engine_config(cfg) -> None:
    """Cross-key checks of ``engine`` against ``hosts`` and ``server``. Raises ValueError (one line: key, fix)."""
    e = cfg.engine
    check_server_spec(cfg)
    a = of(cfg)
    if a.distribution and not e.version:
        raise ValueError(f"engine.version is required for engine.kind {e.kind}: pin the {a.distribution} version "
                         "the hosts run (e.g. the pip version, also the image tag)")
    check_container_image(cfg)
    if a.config_file and e.version:
        raise ValueError(f"engine.version does not apply to {e.kind} (its version is the release's wheel); "
                         "remove engine.version")
    check_engine_settings(e)
    sleep_env = sorted(set(a.sleep.enable_env if a.sleep else ()) & (set(e.env) | set(e.secret_env)))
    if sleep_env:
        # the same rule as extra_args' sleep flags: deployctl turns sleep mode on for a standby on the SSH targets
        # only (vLLM's dev mode mounts its /reset_prefix_cache, /sleep, /collective_rpc routes: never in a pod)
        raise ValueError(f"engine.env sets {sleep_env[0]}, which turns on {e.kind}'s sleep mode; deployctl sets it "
                         "when the release keeps a sleeping standby: remove it and set rollout.standby_s (seconds; "
                         "0 turns the standby off)")
    for key in ("max_prompt_tokens", "max_completion_tokens"):
        value = getattr(cfg.server, key)
        if value is not None and not a.config_file:
            raise ValueError(f"server.{key} {value}: only deployctl-runtime enforces it ({e.kind} has no such flag); "
                             "remove it, or cap max_tokens at the router/client")
        if value is not None and value >= e.max_model_len:
            raise ValueError(f"server.{key} {value} is not below engine.max_model_len {e.max_model_len}; lower it "
                             "(or raise max_model_len)")
    tp = e.tensor_parallel_size
    if tp > 1 and not a.has("tensor_parallel_size"):
        raise ValueError(f"engine.tensor_parallel_size {tp}: {e.kind} has no tensor parallelism; set it to 1 or "
                         "use engine.kind vllm or sglang")
    if tp > 1 and e.device != "cuda":
        raise ValueError(f"engine.tensor_parallel_size {tp} needs engine.device cuda (got {e.device})")
    if e.kind in ("vllm", "sglang") and e.device != "cuda":
        raise ValueError(f"engine.device {e.device}: deployctl runs {e.kind} on cuda hosts; set engine.device cuda "
                         "or use engine.kind transformers / deployctl-runtime on CPU")
    for i, h in enumerate(cfg.hosts):
        ids = h.gpu_ids
        if len(set(ids)) != len(ids):
            raise ValueError(f"hosts[{i}].gpus {ids} lists a GPU twice; give each GPU id once")
        if tp > len(ids):
            raise ValueError(f"engine.tensor_parallel_size {tp} is more than the {len(ids)} GPU(s) of host "
                             f"{h.name!r} ({ids}); list {tp} GPU ids in hosts[{i}].gpus or lower "
                             "engine.tensor_parallel_size")
    if a.model_name_is_path and cfg.model.name != cfg.model.path:
        raise ValueError(f"model.served_name must be the model path for {e.kind} (it answers only requests naming "
                         f"the directory it loaded); set model.served_name: {cfg.model.path}")
    if a.api_key_env is None and a.api_key_flag is None and cfg.server.api_key_env:
        raise ValueError(f"server.api_key_env is set but {e.kind} cannot check API keys; unset it and bind "
                         "server.bind 127.0.0.1 behind the router, or use another engine.kind")


def check_server_spec(cfg) -> None:
    """``engine.server`` is given exactly for ``engine.kind: openai``, and says where its metrics are when it names
    any. Raises ValueError (one line: key, fix)."""
    e = cfg.engine
    spec = getattr(e, "server", None)
    if e.kind == "openai" and spec is None:
        raise ValueError("engine.kind openai needs engine.server: at least its command (a list of words with "
                         "{model}, {host}, {port} placeholders), e.g. command: [{python}, -m, my_server, --port, "
                         "'{port}']")
    if e.kind != "openai" and spec is not None:
        raise ValueError(f"engine.server describes a generic server, but engine.kind is {e.kind} (deployctl knows its "
                         "command, routes and metrics); remove engine.server or set engine.kind: openai")
    if spec is None:
        return
    if spec.metrics and not spec.metrics_route:
        raise ValueError("engine.server.metrics names metrics but engine.server.metrics_route is unset; set the "
                         "route the server exports them on (e.g. /metrics) or remove engine.server.metrics")
    if spec.error_share and not spec.metrics_route:
        raise ValueError("engine.server.error_share needs engine.server.metrics_route (the route it is scraped on)")
    if "port" not in of(cfg).uses:
        raise ValueError("engine.server.command has no {port} placeholder: deployctl gives every host (and a "
                         "rollback's spare port) its port; put the server's port flag with '{port}' in the command")
    if spec.distribution and not e.version:
        raise ValueError(f"engine.version is required with engine.server.distribution {spec.distribution}: pin "
                         "the version each release installs")


# A tag in the Docker reference grammar (github.com/distribution/reference, regexp.go: ``tag = [\w][\w.-]{0,127}``).
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
MOVING_TAGS = ("latest", "nightly", "main", "stable")  # tags that move: a rollback could not restore the engine


def image_tag(kind, version) -> str:
    """The image tag engine.version gives engine ``kind``'s official image (``Adapter.image_tag``; ``kind``: an
    engine kind or an Adapter, e.g. ``engines.of(cfg)`` for engine.kind openai, whose image is engine.server's). Raises
    ValueError (one line naming engine.version and the fix) when it is missing, a moving tag, or not a valid tag
    in the Docker reference grammar (e.g. a pip local version such as ``0.33.0+cu128``: ``+`` is not allowed)."""
    a = kind if not isinstance(kind, str) else adapter(kind)
    kind = a.kind
    if not a.image:
        raise ValueError(f"engine.server.image is unset: a container target of engine.kind {kind} needs the image "
                         "the server runs from (its tag is engine.version)")
    if not version:
        raise ValueError(f"engine.version is required for a container target of {kind}: set it to the "
                         f"{a.image} tag to run (its release version, e.g. 0.33.0)")
    if str(version).lower() in MOVING_TAGS:
        raise ValueError(f"engine.version {version!r} moves with every push of {a.image}: a rollback could not "
                         "bring the engine back; pin a release version (e.g. 0.33.0)")
    tag = a.image_tag.format(version=version)
    if not _TAG.match(tag):
        bad = "".join(sorted({c for c in tag if not (c.isalnum() or c in "_.-")}))
        raise ValueError(f"engine.version {version!r} gives image tag {tag!r}, not a valid Docker tag ({bad!r} is "
                         "not allowed: letters, digits, '_', '.', '-', at most 128); drop the local part (e.g. "
                         "+cu128) or set container.image to the full image reference")
    return tag


def check_container_image(cfg) -> None:
    """For deploy.yaml with a ``container:`` section and a foreign engine without ``container.image``: the engine's
    image tag must be valid (``image_tag``). Raises ValueError."""
    if "container" in cfg.model_fields_set and not cfg.container.image and of(cfg).image:
        image_tag(of(cfg), cfg.engine.version)


def check_tp_heads(tp: int, num_attention_heads: int) -> None:
    """The attention heads must split evenly across the TP ranks (vLLM 0.33.0 refuses otherwise at start:
    vllm/config/model.py ``ModelConfig.verify_with_parallel_config``). Raises ConfigError (exit 3)."""
    if num_attention_heads % tp:
        ok = [d for d in (1, 2, 4, 8, 16, 32, 64) if num_attention_heads % d == 0 and d < tp]
        raise ConfigError(f"engine.tensor_parallel_size {tp} does not divide the model's {num_attention_heads} "
                          "attention heads", fix=f"set engine.tensor_parallel_size to {' or '.join(map(str, ok))}")


def settings_of(kind: str) -> list[str]:
    """The shared settings (base.SETTINGS) engine ``kind`` takes on its command line or config file."""
    a = adapter(kind)
    return [s for s in SETTINGS if a.has(s)]
