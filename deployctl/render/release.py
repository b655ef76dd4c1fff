"""Rendering of release files, router config and the other targets from templates/ (the only jinja2 import).

Templates render with ``StrictUndefined``: a template that uses a name the context lacks fails with a
``ConfigError`` (exit 3) naming the template, its line and the variable. Output is a pure function of the
inputs (no clock, no host facts), so the same deploy.yaml and release id give the same bytes.

``DEPLOYCTL_TEMPLATES`` may name a directory whose files override the shipped templates of the same name.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from deployctl import settings
from deployctl.config import layout
from deployctl.config.models import ENGINE_STALL_TIMEOUT_S
from deployctl.errors import ConfigError
from deployctl.hostscripts.snippets import SH_ALIVE, SH_ENGINE_PIDS, SH_OURS
from deployctl.engines.keepalive import keepalive

if TYPE_CHECKING:  # pydantic models are imported lazily by callers
    from deployctl.config import DeployConfig, HostConfig

RESTART_SEC = 5  # systemd RestartSec / first launcher backoff: the old process must free the port and GPU memory
START_LIMIT_BURST = 5  # starts within START_LIMIT_INTERVAL_S before systemd (and launch.sh) give up
START_LIMIT_INTERVAL_S = 600
# The runtime's exit code for bad settings (runtime/deployctl_runtime/server/cli.py run_serve: 2 on a config error):
# systemd's RestartPreventExitStatus and launch.sh never restart it, since every retry would fail the same way.
CONFIG_ERROR_EXIT = 2
GPU_WAIT_S = 120  # bounded wait for the GPU before start (cuda only)
STOP_MARGIN_S = 15  # TimeoutStopSec = engines.command.stop_wait_s (drain + the engine's exit) + this
# systemd WatchdogSec = server.engine_stall_timeout_s + this: the runtime's own watchdog (503 engine_stalled to the
# open requests, exit 4, restarted) acts first; systemd's SIGABRT catches an engine loop wedged where that cannot
WATCHDOG_MARGIN_S = 30
READ_TIMEOUT_MARGIN_S = 30  # nginx proxy_read_timeout = request_timeout_s + this
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:,=-]+$")  # interpolated unquoted into systemd and sh
_SAFE_KEY = re.compile(r"^[A-Za-z0-9._~+/=:,-]+$")


@dataclass(frozen=True)
class RenderedFile:
    """One rendered file: ``path`` relative to its target directory, text ``content``, POSIX ``mode``."""

    path: str
    content: str
    mode: int = 0o644

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


def _environment():
    import jinja2

    from deployctl.resources import templates_dir

    search = [str(templates_dir())]
    override = settings.current().templates
    if override:
        search.insert(0, str(override))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    # A YAML/JSON scalar, ASCII with \u escapes: YAML reads U+2028, U+0085 as line breaks and refuses U+007F raw.
    env.filters["q"] = lambda v: json.dumps(v, ensure_ascii=True)
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


def render_template(name: str, context: Mapping[str, Any]) -> str:
    """Render templates/``name`` with ``context``. Raises ConfigError (exit 3) naming template, line and variable."""
    import jinja2

    try:
        return _environment().get_template(name).render(**context)
    except jinja2.UndefinedError as exc:
        where, line = _template_frame(exc, name)
        m = re.search(r"has no attribute '([^']+)'", str(exc)) or re.search(r"'([^']+)' is undefined", str(exc))
        var = m.group(1) if m else str(exc)
        raise ConfigError(
            f"template {where}{f' line {line}' if line else ''}: undefined variable {var!r} ({exc})",
            fix="fix the template or give the variable a value in deployctl/render.py",
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"template {exc.name or name} line {exc.lineno}: syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise ConfigError(f"template {exc.name} not found", fix="reinstall deployctl or fix DEPLOYCTL_TEMPLATES") from None


def _template_frame(exc: BaseException, default: str) -> tuple[str, int | None]:
    """The innermost template file and line in ``exc``'s traceback (jinja2 maps frames to template lines)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.endswith(".j2"):
            return Path(frame.filename).name, frame.lineno
    return default, None


def _safe_path(value: str, what: str) -> str:
    if not _SAFE_PATH.match(value):
        raise ConfigError(
            f"{what} {value!r} has characters deployctl will not put in a unit file or shell script",
            fix="use letters, digits and . _ / + @ : , = - only",
        )
    return value


def config_text(cfg: DeployConfig) -> str:
    """The configuration that defines a release: deploy.yaml as validated (pydantic's JSON), plus
    $DEPLOYCTL_RUNTIME_FAULT when set (it changes the release's runtime.env)."""
    return cfg.model_dump_json() + (settings.current().runtime_fault or "")


def new_release_id(cfg: DeployConfig, *, runtime_version: str, manifest: str, when: datetime | None = None) -> str:
    """A release's name, ``YYYYmmddTHHMMSSZ-<8 hex>``: the UTC time ``when`` (default now), then the first 8 hex
    digits of sha256 over deployctl's version, ``runtime_version`` (the deployctl-runtime version shipped),
    ``config_text(cfg)`` and the model manifest's text, NUL-separated. `deployctl render` and `deployctl deploy`
    both name releases with it: the same inputs at the same second give the same id."""
    from deployctl import __version__

    when = when or datetime.now(timezone.utc)
    parts = (__version__, runtime_version, config_text(cfg), manifest)
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]
    return f"{when.astimezone(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{digest}"


def runtime_args(cfg: DeployConfig, host: HostConfig, release_id: str, extra: Mapping[str, Any] | None = None) -> dict:
    """The runtime.yaml mapping: serve flags (dashes as underscores) plus release_id; ``extra`` adds or overrides."""
    e = cfg.engine
    args: dict[str, Any] = {
        "model": cfg.model.path, "served_model_name": cfg.model.name, "host": cfg.server.bind,
        "port": layout.configured_port(cfg, host), "device": e.device, "dtype": cfg.model.dtype,
        "max_model_len": e.max_model_len, "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens, "block_size": e.block_size,
        "gpu_memory_utilization": e.gpu_memory_utilization, "enable_prefix_caching": e.enable_prefix_caching,
        "enable_chunked_prefill": e.enable_chunked_prefill, "max_queued_requests": cfg.server.max_queued_requests,
        "request_timeout_s": cfg.server.request_timeout_s, "drain_timeout_s": cfg.server.drain_timeout_s,
        "log_requests": cfg.server.log_prompts, "sse_keepalive_s": cfg.server.sse_keepalive_s,
        "keep_alive_timeout_s": keepalive(cfg).engine_s,  # longer than nginx's upstream keepalive_timeout
    }
    for key in ("max_prompt_tokens", "max_completion_tokens"):  # only when set: older runtime.yaml files stay as they were
        if getattr(cfg.server, key) is not None:
            args[key] = getattr(cfg.server, key)
    # only when it differs from the runtime's own default (the same 120 s): runtime.yaml files stay as they were
    if cfg.server.engine_stall_timeout_s != ENGINE_STALL_TIMEOUT_S:
        args["engine_stall_timeout_s"] = cfg.server.engine_stall_timeout_s
    if e.num_gpu_blocks_override is not None:
        args["num_gpu_blocks_override"] = e.num_gpu_blocks_override
    if e.kv_cache_memory is not None:
        args["kv_cache_memory"] = e.kv_cache_memory
    args["release_id"] = release_id
    if host.replica is not None:  # which replica this engine is: GET /identity, checked before every control call
        args["replica_index"] = host.replica
    for key, value in (extra or {}).items():
        if not re.match(r"^[a-z][a-z0-9_]*$", key):
            raise ConfigError(f"runtime argument {key!r} is not a serve flag name", fix="use lower_snake_case names")
        args[key] = value
    return args


def watchdog_sec(cfg: DeployConfig) -> int:
    """The systemd unit's WatchdogSec= in whole seconds: ceil(server.engine_stall_timeout_s) + WATCHDOG_MARGIN_S for
    the bundled runtime (the only engine that sends WATCHDOG=1, from its engine loop); 0 (no watchdog, Type=exec)
    for the other engines or a stall timeout of 0. A unit with a watchdog is Type=notify with NotifyAccess=main: its
    start completes at the runtime's READY=1, so the model load is bounded by TimeoutStartSec, never by the
    watchdog."""
    from deployctl.engines import adapter

    stall = cfg.server.engine_stall_timeout_s
    if stall <= 0 or adapter(cfg.engine.kind).kind != "deployctl-runtime":
        return 0
    return math.ceil(stall) + WATCHDOG_MARGIN_S


def _check_api_key(api_key: str | None) -> None:
    if api_key is not None and (not api_key or not _SAFE_KEY.match(api_key)):
        # Never echo the key itself.
        raise ConfigError(
            f"the API key ({len(api_key)} characters) is empty or has characters outside letters, digits and ._~+/=:,-",
            fix="generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        )


def release_context(cfg: DeployConfig, host: HostConfig, release_id: str, api_key: str | None = None, *,
                    standby: bool | None = None, gpu_pinning: dict | None = None) -> dict[str, Any]:
    """Names shared by the per-host templates (unit, launcher, container files), the engine's command and env
    (deployctl.engines.command.render_context) included; ``standby`` False leaves the sleep mode off (container and
    k8s targets), None renders it when rollout.standby_s > 0 (engines.command.standby_args); ``gpu_pinning`` (the
    release's GPU record, deployctl.render.gpupin.pinning) pins CUDA_VISIBLE_DEVICES by UUID when it says so."""
    from deployctl.engines.command import render_context as engine_context, stop_wait_s

    # It is a directory name, a Docker tag and a Kubernetes label value: the last is the strictest (<= 63
    # characters, alphanumeric at both ends).
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", release_id):
        raise ConfigError(f"release id {release_id!r} is not a valid name",
                          fix="use at most 63 letters, digits and . _ -, starting and ending with a letter or digit")
    _safe_path(host.deploy_root, f"hosts[{host.name}].deploy_root")
    _safe_path(host.python, f"hosts[{host.name}].python")
    _safe_path(cfg.model.path, "model.path")
    _safe_path(cfg.model.manifest, "model.manifest")
    is_cuda = cfg.engine.device == "cuda"
    return {
        "service": cfg.service, "model": cfg.model, "engine": cfg.engine, "server": cfg.server, "host": host,
        "release_id": release_id, "release_dir": layout.release_dir(host, release_id), "is_cuda": is_cuda,
        "log_file": layout.log_file(host), "pid_file": layout.pid_file(host),
        "child_pid_file": layout.child_pid_file(host),
        # the model manifest's sha256 at each start: what the running runtime loaded (deployctl.rollout.fleetcheck)
        "model_manifest_file": f"{cfg.model.path.rstrip('/')}/{cfg.model.manifest}",
        "loaded_manifest_file": layout.shared_dir(host, "run", "runtime.model.sha256"),
        "run_user": host.user if host.user and host.user != "root" else None,
        "restart_sec": RESTART_SEC, "max_backoff_s": 60, "stable_after_s": 60,
        "start_limit_burst": START_LIMIT_BURST, "start_limit_interval_s": START_LIMIT_INTERVAL_S,
        "gpu_wait_s": GPU_WAIT_S, "config_error_exit": CONFIG_ERROR_EXIT,
        "timeout_start_s": math.ceil(cfg.server.startup_timeout_s) + (GPU_WAIT_S if is_cuda else 0),
        "timeout_stop_s": stop_wait_s(cfg) + STOP_MARGIN_S,
        "port": layout.configured_port(cfg, host), "sh_alive": SH_ALIVE, "sh_ours": SH_OURS,
        "sh_engine_pids": SH_ENGINE_PIDS, "logs": cfg.logs,
        "log_cap_units": layout.log_cap_units(cfg, host), "watchdog_sec": watchdog_sec(cfg),
    } | engine_context(cfg, host, release_dir=layout.release_dir(host, release_id),
                       port=layout.configured_port(cfg, host), api_key=api_key, standby=standby,
                       gpu_pinning=gpu_pinning)


def render_release(cfg: DeployConfig, host: HostConfig, release_id: str, *, api_key: str | None,
                   extra_runtime_args: dict | None = None, standby: bool | None = None,
                   gpu_pinning: dict | None = None) -> list[RenderedFile]:
    """The files of ``<deploy_root>/releases/<release_id>/`` for ``host``: runtime.yaml, ``<service>.service``,
    runtime.env (0600, the only file holding the API key), launch.sh (0755), release.json and manifest.sha256
    (sha256sum format over the others except runtime.env). ``gpu_pinning`` (deploy: from the host's preflight
    facts, deployctl.render.gpupin.pinning): the engine's CUDA_VISIBLE_DEVICES by UUID when it says so, and
    release.json's ``gpu_pinning``; None (offline render) leaves both as before: by index, no record.
    Raises ConfigError (exit 3)."""
    from deployctl.engines.command import KEYED_MAIN, keyed_main

    _check_api_key(api_key)
    if standby is not False:  # the SSH targets: a standby's sleep mode may need a dev mode (loopback only)
        from deployctl.engines.validate import check_dev_mode_bind

        check_dev_mode_bind(cfg)
    ctx = release_context(cfg, host, release_id, api_key, standby=standby, gpu_pinning=gpu_pinning)
    ctx["runtime_args"] = runtime_args(cfg, host, release_id, extra_runtime_args)
    ctx["api_key"] = api_key
    ctx["where"] = host.name
    info = {"release_id": release_id, "service": cfg.service.name, "host": host.name, "launcher": host.launcher,
            "model_path": cfg.model.path, "model_manifest": cfg.model.manifest, "served_model_name": cfg.model.name,
            "device": cfg.engine.device, "port": layout.configured_port(cfg, host), "engine_kind": cfg.engine.kind,
            "engine_version": cfg.engine.version, "engine_distribution": ctx["adapter"].distribution,
            "tensor_parallel_size": cfg.engine.tensor_parallel_size, "gpus": host.gpu_ids}
    if gpu_pinning is not None:
        info["gpu_pinning"] = gpu_pinning
    files = [RenderedFile("runtime.yaml", render_template("runtime.yaml.j2", ctx))] if ctx["adapter"].config_file else []
    if ctx["adapter"].api_key_flag:
        files.append(RenderedFile(KEYED_MAIN, keyed_main(cfg)))
    files += [
        RenderedFile(layout.unit_name(cfg, host), render_template("runtime.service.j2", ctx)),
        RenderedFile(layout.log_cap_units(cfg, host)[0], render_template("runtime-logs.service.j2", ctx)),
        RenderedFile(layout.log_cap_units(cfg, host)[1], render_template("runtime-logs.timer.j2", ctx)),
        RenderedFile("runtime.env", render_template("runtime.env.j2", ctx), 0o600),
        RenderedFile("launch.sh", render_template("launch.sh.j2", ctx), 0o755),
        RenderedFile("release.json", json.dumps(info, indent=2, sort_keys=True) + "\n"),
    ]
    return files + [release_manifest(files)]


def release_manifest(files: Iterable[RenderedFile], extra: Mapping[str, str] | None = None) -> RenderedFile:
    """manifest.sha256 in ``sha256sum`` format over ``files`` (runtime.env excluded: it holds the secret) and
    ``extra`` ({relative path: sha256 hex}, e.g. the runtime wheel), sorted by path."""
    sums = {f.path: f.sha256 for f in files if f.path not in ("runtime.env", "manifest.sha256")}
    sums.update(extra or {})
    return RenderedFile("manifest.sha256", "".join(f"{sums[p]}  {p}\n" for p in sorted(sums)))


# --------------------------------------------------------------------------------------------------
# Router


def split_weights(canary_weight: int, num_stable: int, num_canary: int) -> tuple[int, int]:
    """(stable server weight, canary server weight) so that the canary share of requests is ``canary_weight``%.

    Each canary server gets pct × num_stable, each stable server (100 − pct) × num_canary, both divided by
    their gcd; 0 means the group takes no traffic (rendered ``down``: nginx rejects weight=0). A group with no
    live server gives all traffic to the other group."""
    if not 0 <= canary_weight <= 100:
        raise ConfigError(f"canary weight {canary_weight} is outside 0..100", fix="use a percentage")
    if num_canary == 0:
        return (1 if num_stable else 0), 0
    if num_stable == 0:
        return 0, 1
    stable, canary = (100 - canary_weight) * num_canary, canary_weight * num_stable
    g = math.gcd(stable, canary)
    return stable // g, canary // g


def _upstream_address(host: HostConfig) -> str:
    return layout.url_host(layout.network_address(host))


def _check_ports(cfg: DeployConfig, hosts: list[HostConfig], listen_port: int) -> None:
    """Two routed runtimes on one address and port (the second cannot bind; nginx would list one server twice),
    or the router listening on a runtime's port on its own machine: ConfigError (exit 3)."""
    seen: dict[tuple[str, int], str] = {}
    for h in hosts:
        key = (_upstream_address(h), layout.service_port(cfg, h))
        if key in seen:
            raise ConfigError(f"hosts {seen[key]!r} and {h.name!r} both run the runtime on {key[0]}:{key[1]}",
                              fix=f"give hosts[{h.name}].server_port another port")
        seen[key] = h.name
    router_host = cfg.router_host()
    if router_host is not None:
        clash = seen.get((_upstream_address(router_host), listen_port))
        if clash:
            raise ConfigError(f"router.listen {listen_port} is the runtime port of host {clash!r} on the router's "
                              "machine", fix=f"pick another router.listen or hosts[{clash}].server_port")


def access_log_path(cfg: DeployConfig) -> str:
    """nginx's JSON access log on the router host: router.access_log, else /var/log/nginx/<service>.access.json
    (what canary analysis and the router's mtail program read). Raises ConfigError for a path nginx would misread."""
    path = (cfg.router.access_log if cfg.router else None) or f"/var/log/nginx/{cfg.service.name}.access.json"
    _safe_path(path, "router.access_log")
    return path


def render_nginx(cfg: DeployConfig, *, stable: list[HostConfig], canary: list[HostConfig], canary_weight: int,
                 drained: set[str] = frozenset(), engines: frozenset[str] = frozenset()) -> str:
    """The router conf included inside nginx's ``http {}``: JSON log_format, one weighted upstream, and an
    SSE-safe server. ``drained`` host names are rendered ``down``; ``engines``: kinds of other releases behind the
    router now besides ``cfg.engine.kind`` (the upstream keepalive_timeout suits all: deployctl.engines.keepalive).
    Raises ConfigError (exit 3)."""
    from deployctl.render.edge import check_exposure

    check_exposure(cfg)  # no public router without a key
    names = [h.name for h in stable] + [h.name for h in canary]
    if not names:
        raise ConfigError("the router needs at least one stable or canary host", fix="list hosts in deploy.yaml")
    both = sorted({n for n in names if names.count(n) > 1})
    if both:
        raise ConfigError(f"host {both[0]!r} is both stable and canary (or listed twice)", fix="give each host one role")
    unknown = sorted(set(drained) - set(names))
    if unknown:
        raise ConfigError(f"drained host {unknown[0]!r} is not routed", fix=f"use one of: {', '.join(names)}")
    w_stable, w_canary = split_weights(canary_weight, sum(h.name not in drained for h in stable),
                                       sum(h.name not in drained for h in canary))
    servers = []
    for role, group, weight in (("stable", stable, w_stable), ("canary", canary, w_canary)):
        for h in group:
            params = " down" if h.name in drained or weight == 0 else ("" if weight == 1 else f" weight={weight}")
            servers.append({"host": h.name, "role": role + (", drained" if h.name in drained else ""),
                            "address": _upstream_address(h), "port": layout.service_port(cfg, h), "params": params})
    from deployctl.render.edge import edge_context, with_server_limits

    servers = with_server_limits(cfg, servers)  # router.max_conns_per_host (deployctl.render.edge)
    from deployctl.render.failover import failover_context, with_failover

    servers = with_failover(cfg, servers)  # router.max_fails / fail_timeout_s (deployctl.render.failover)
    router = cfg.router
    listen_port = router.listen if router else 80
    _check_ports(cfg, stable + canary, listen_port)
    listen_addr = router.listen_address if router else None
    if listen_addr and ":" in listen_addr:
        listen_addr = f"[{listen_addr}]"
    access_log = access_log_path(cfg)
    base = cfg.service.name.replace("-", "_")
    ctx = {"service": cfg.service, "server": cfg.server, "servers": servers, "stable": stable, "canary": canary,
           "canary_weight": canary_weight, "upstream_name": f"deployctl_{base}",
           "log_format_name": f"deployctl_{base}_json", "keepalive": min(max(16, cfg.engine.max_num_seqs), 128),
           "keepalive_timeout": keepalive(cfg, also=engines).nginx_directive,
           "listen": f"{listen_addr}:{listen_port}" if listen_addr else str(listen_port), "access_log": access_log,
           "client_max_body_size": "16m",
           "proxy_read_timeout_s": math.ceil(cfg.server.request_timeout_s) + READ_TIMEOUT_MARGIN_S}
    ctx |= edge_context(cfg, base, ctx["listen"])  # TLS and limits
    ctx |= failover_context()  # proxy_next_upstream
    from deployctl.render.edge import routes_context

    ctx |= routes_context(cfg, base, engines)  # default-deny: the service's routes pass, health is status only
    return render_template("nginx-upstream.conf.j2", ctx)


def render_nginx_main(cfg: DeployConfig, *, prefix: str, include_path: str, user: str | None = None) -> str:
    """A standalone nginx.conf for ``nginx -p PREFIX -c CONF``: pid, error log and the five temp paths under
    ``prefix``, and ``include include_path`` inside http {}. ``user`` sets the worker user (when run as root)."""
    _safe_path(str(prefix), "nginx prefix")
    _safe_path(str(include_path), "nginx include path")
    ctx = {"service": cfg.service, "prefix": str(prefix).rstrip("/"), "include_path": str(include_path), "user": user}
    return render_template("nginx-main.conf.j2", ctx)
