"""deploy.yaml's schema: the frozen pydantic models it is loaded into (shape: ../shared/examples/deploy.yaml).

Loaded once by deployctl.config.load (``load_config``); the sections with their own module: ``router:``
(config/router.py), ``rollout:`` (config/rollout.py), ``logs:`` (config/logs.py), ``engine.server``
(config/openai_server.py).
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from deployctl.errors import ConfigError
from deployctl.config.autoscale import AutoscaleConfig
from deployctl.config.fields import MAX_SECONDS, ByteSize, _Frozen
from deployctl.config.hosts import HostConfig  # noqa: F401  (re-exported: deployctl.config.models.HostConfig)
from deployctl.config.logs import LogsConfig
from deployctl.config.rollout import RolloutConfig
from deployctl.config.router import RouterConfig
from deployctl.config.openai_server import OpenAIServerConfig
from deployctl.config.weights import WeightsFields

# An OCI image reference (registry[:port]/path[:tag][@digest]): written after FROM in the Dockerfile.
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$"


class ServiceConfig(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    """The service's name: systemd unit, nginx upstream, state directory and k8s object names."""


class ModelConfig(WeightsFields):
    path: str = Field("", description=(
        "The model directory on each host; derived as <store>/<name>/<version> when model.source is set."))
    manifest: str = "manifest.sha256"
    """The sha256sum-format manifest of the weight files, relative to model.path (`deployctl manifest` writes it)."""
    served_name: Optional[str] = None
    """The model name clients send; default: the model directory's basename."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations dtype; auto: the checkpoint's torch_dtype."""

    @property
    def name(self) -> str:
        """The model name clients send: served_name, else the model directory's basename (with model.source: the
        source's name, deployctl.config.weights.source_name, not the version directory's)."""
        if self.served_name:
            return self.served_name
        if self.source:
            from deployctl.config.weights import source_name
            return source_name(self.source)
        return Path(self.path).name

    @model_validator(mode="before")
    @classmethod
    def _path_from_source(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("source"):
            if isinstance(data, dict) and not data.get("path"):
                raise ValueError("model.path is required (or model.source with model.version)")
            return data
        if not data.get("version"):
            raise ValueError("model.source needs model.version (the directory each host fetches into)")
        from deployctl.config.weights import source_name
        derived = f"{str(data.get('store') or '/srv/models').rstrip('/')}/{source_name(data['source'])}/{data['version']}"
        if data.get("path") and data["path"].rstrip("/") != derived:
            raise ValueError(f"model.path {data['path']} disagrees with model.source: a fetched version lives in "
                             f"{derived}; drop model.path")
        return dict(data, path=derived)


class EngineConfig(_Frozen):
    kind: str = "deployctl-runtime"
    """Which inference server runs (deployctl.engines.KINDS): deployctl-runtime, vllm, sglang, transformers, openai."""
    version: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
    """The engine's pinned version (pip version on the hosts, image tag for the container targets); default: the
    bundled runtime's own wheel, required for the other engines.
    """
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """Tensor-parallel degree: GPUs per engine (hosts[].gpu is the first of them)."""
    extra_args: list[str] = Field(default_factory=list)
    """flags deployctl does not model, passed as they are"""
    device: Literal["cuda", "cpu"] = "cuda"
    """The device the engine runs on; cpu for tests and the demo."""
    max_model_len: int = Field(8192, ge=2)
    """Longest sequence (prompt + output tokens) the engine accepts."""
    max_num_seqs: int = Field(64, gt=0)
    """Most sequences the engine runs at once (`deployctl bench --apply` sets it below the measured knee)."""
    max_num_batched_tokens: int = Field(8192, gt=0)
    """Most tokens one engine step schedules (chunked prefill's chunk budget)."""
    gpu_memory_utilization: float = Field(0.90, gt=0, le=1)
    """Share of the GPU's memory the engine may take (weights, reserve and KV pool)."""
    block_size: int = Field(16, gt=0, le=1024)
    """Tokens per KV-cache block; a power of two."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of a prompt prefix already computed."""
    enable_chunked_prefill: bool = True
    """Split long prefills into chunks scheduled beside decodes."""
    num_gpu_blocks_override: Optional[int] = Field(None, gt=0)
    """A fixed number of KV blocks instead of the one computed from the memory budget."""
    kv_cache_memory: Optional[ByteSize] = None
    """KV pool budget in bytes on CPU (the runtime's --kv-cache-memory); on CUDA the budget is total ×
    gpu_memory_utilization − weights − runtime_overhead.
    """
    runtime_overhead: ByteSize = 1536 * 1024 * 1024
    """The bundled runtime's reserve in the capacity plan on CUDA (it measures its activation peak and CUDA graphs at
    start; vLLM and SGLang are planned from their reserve parts, deployctl.engines.reserve).
    """
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    """KV cache element type (vLLM --kv-cache-dtype; SGLang --kv-cache-dtype fp8_e4m3): fp8 halves bf16's
    bytes/token.
    """
    enforce_eager: bool = False
    """No CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph): the plan's CUDA-graph reserve is 0."""
    server: Optional[OpenAIServerConfig] = None
    """engine.kind openai: the server's command template, routes, metrics and stop (config/openai_server.py)"""
    env: dict[str, str] = Field(default_factory=dict)
    """The engine process's own variables (engines/processenv.py), all written to the release's 0600 runtime.env:
    plain ones, names whose values come from deployctl's environment (HF_TOKEN), and one cache directory per host
    shared by every release (HF hub, torch.compile/inductor, Triton, vLLM's compile cache).
    """
    secret_env: list[str] = Field(default_factory=list)
    """Names of variables whose values come from deployctl's environment (HF_TOKEN), written to runtime.env."""
    cache_dir: Optional[str] = None
    """One cache directory per host shared by every release (HF hub, torch.compile/inductor, Triton, vLLM's compile
    cache); default: none set.
    """
    install_timeout_s: float = Field(1800, gt=0, le=MAX_SECONDS)
    """seconds for a host to pip-install a pinned engine into its shared venv (rollout/release.py ENGINE_INSTALL:
    once per host and version; vLLM with its torch is several GB)
    """

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        from deployctl.engines.validate import check_kind

        return check_kind(v)

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: list[str], info) -> list[str]:
        from deployctl.engines.validate import check_extra_args

        return check_extra_args(info.data.get("kind", ""), v)

    @model_validator(mode="after")
    def _process_env(self) -> "EngineConfig":
        from deployctl.engines.processenv import check_env

        check_env(self.env, self.secret_env, self.cache_dir)
        return self

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("block_size must be a power of two (8, 16, 32, …)")  # the caller adds "(got V)"
        return v


ENGINE_STALL_TIMEOUT_S = 120.0  # the bundled runtime's own default (--engine-stall-timeout-s) is the same


class ServerConfig(_Frozen):
    bind: str = "127.0.0.1"
    """Address the runtime listens on."""
    port: int = Field(8080, ge=1, le=65535)
    """Port the runtime listens on (hosts[].server_port overrides it per host)."""
    api_key_env: Optional[str] = None
    """Name of the environment variable holding the API key the runtime requires; default: no key."""
    next_api_key_env: Optional[str] = None
    """During a key rotation: a second key the runtime accepts beside api_key_env's (deployctl's own probes send
    api_key_env's). docs/runbook-api-key-rotation.md
    """
    request_timeout_s: float = Field(120, gt=0, le=MAX_SECONDS)
    """Longest a request may take before the runtime ends it."""
    max_queued_requests: int = Field(256, gt=0)
    """Requests the runtime queues beyond max_num_seqs before it answers 429."""
    max_prompt_tokens: Optional[int] = Field(None, gt=0)
    """Per-request caps (the runtime's --max-prompt-tokens / --max-completion-tokens: 400 above them; an omitted
    max_tokens defaults to min(remaining context, max_completion_tokens)). The plan sizes a request's worst case
    on them.
    """
    max_completion_tokens: Optional[int] = Field(None, gt=0)
    """Cap on a request's max_tokens; default: max_model_len minus the prompt."""
    drain_timeout_s: float = Field(30, gt=0, le=MAX_SECONDS)
    """On stop, seconds the runtime lets in-flight requests finish before it exits."""
    startup_timeout_s: float = Field(600, gt=0, le=MAX_SECONDS)
    """Longest expected start (weights load + KV allocation + warm-up): systemd TimeoutStartSec, the k8s startup
    probe budget and the container healthcheck's start period.
    """
    log_prompts: bool = False
    """Write prompts and completions to the runtime's log (off: only counts and timings)."""
    sse_keepalive_s: float = Field(15, ge=0, le=MAX_SECONDS)
    """The runtime's SSE comment interval while a stream waits (queue, long prefill); 0: off. Below
    request_timeout_s, so below nginx's proxy_read_timeout (request_timeout_s + 30 s).
    """
    engine_stall_timeout_s: float = Field(ENGINE_STALL_TIMEOUT_S, ge=0, le=MAX_SECONDS)
    """The bundled runtime's progress watchdog: with requests open and no engine step completed for this long it
    answers 503 engine_stalled and exits 4 (its supervisor restarts it); the systemd unit's WatchdogSec= is this
    plus render.release.WATCHDOG_MARGIN_S (the runtime pings WATCHDOG=1 from its engine loop). 0: both off.
    """

    @model_validator(mode="after")
    def _keepalive_below_timeout(self) -> "ServerConfig":
        if self.sse_keepalive_s >= self.request_timeout_s:
            raise ValueError(f"server.sse_keepalive_s {self.sse_keepalive_s:g} is not below server.request_timeout_s "
                             f"{self.request_timeout_s:g}: the router's read timeout would cut waiting streams; "
                             "set it lower (default 15) or 0 to turn it off")
        return self

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.bind).is_loopback
        except ValueError:
            return self.bind == "localhost"


# Free space on a host's filesystems: the rendered disk alerts fire below DISK_WARN_BYTES (warning) and
# DISK_FAIL_BYTES (critical) on node_exporter's filesystem series; preflight warns when a deploy would leave less
# than DISK_WARN_BYTES (whether a deploy fits at all is deployctl/preflight/disk.py's rule).
DISK_FAIL_BYTES = 1 * 2**30
DISK_WARN_BYTES = 5 * 2**30


class SloConfig(_Frozen):
    """Service-level objectives behind the rendered Prometheus alert rules (seconds, shares 0–1, minutes)."""

    ttft_p99_s: float = Field(2.0, gt=0)
    """P99 time to first token"""
    tpot_p99_s: float = Field(0.1, gt=0)
    """P99 time per output token after the first"""
    max_error_rate: float = Field(0.01, gt=0, le=1)
    """Largest share of failed requests the service should have: the error-rate alerts' threshold."""
    max_kv_cache_usage: float = Field(0.85, gt=0, le=1)
    """Highest KV-cache usage (0–1): the KV alert's threshold; a canary over it fails its analysis window."""
    max_rejected_length_share: float = Field(0.001, gt=0, le=1)
    """Highest share of requests rejected for their length (prompt + max_tokens over max_model_len) before an alert."""
    prometheus_job: Optional[str] = None
    """the scrape job of the runtimes; default: service.name"""
    e2e_p99_s: Optional[float] = Field(None, gt=0)
    """P99 arrival-to-last-token; None: no E2E alert (E2E grows with the answer's length, so only a service whose
    answers have a known bound has a useful objective)
    """
    down_for_m: int = Field(5, ge=1, le=1440)
    """a runtime (or the whole service) down this long alerts"""
    prometheus_node_job: str = Field("node", pattern=r"^[A-Za-z0-9_:.-]{1,128}$")
    """node_exporter's job (disk alerts)"""
    prometheus_router_job: str = Field("mtail", pattern=r"^[A-Za-z0-9_:.-]{1,128}$")
    """mtail over the router's log"""
    prometheus_gpu_job: str = Field("dcgm", pattern=r"^[A-Za-z0-9_:.-]{1,128}$")
    """dcgm-exporter (CUDA hosts)"""


class ContainerConfig(_Frozen):
    """Container and Kubernetes targets."""

    image: Optional[str] = Field(None, pattern=IMAGE_PATTERN)
    """The image the container targets build and run; default: deployctl/<service>:<release_id>."""
    base_image: Optional[str] = Field(None, pattern=IMAGE_PATTERN)
    """The image the Dockerfile starts FROM; default: a CUDA runtime image on cuda, python slim on cpu."""
    namespace: str = Field("default", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Kubernetes namespace of the rendered manifests."""


class CapacityConfig(_Frozen):
    """`deployctl plan --profile`: the share of the KV pool's sessions kept free (the guides' 20–30% margin);
    usable sessions per replica = floor(sessions × (1 − margin))."""

    margin: float = Field(0.25, ge=0, lt=1)
    """Headroom the capacity plan adds on top of the traffic profile (0.25: plan for 25% more)."""


class DeployConfig(_Frozen):
    service: ServiceConfig
    """The service's identity."""
    model: ModelConfig
    """The checkpoint served."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Which inference server runs and its settings."""
    server: ServerConfig = Field(default_factory=ServerConfig)
    """The runtime's listener, limits and keys."""
    hosts: list[HostConfig] = Field(min_length=1)
    """The GPU hosts the service runs on (at least one)."""
    router: Optional[RouterConfig] = None
    """The nginx router in front of the hosts; default: none."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Canary steps, analysis, standby and releases kept."""
    slo: SloConfig = Field(default_factory=SloConfig)
    """The service's latency and error objectives (alerts, analysis, bench)."""
    container: ContainerConfig = Field(default_factory=ContainerConfig)
    """The container image settings for --target container|k8s|k8s-rollout."""
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    """The capacity plan's settings."""
    logs: LogsConfig = Field(default_factory=LogsConfig)
    """The runtime's log rotation."""
    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig,
                                       description="`deployctl autoscale` and the rendered KEDA ScaledObject.")

    @model_validator(mode="before")
    @classmethod
    def _replicas(cls, data: Any) -> Any:
        from deployctl.config.replicas import expand_replicas

        return expand_replicas(data)

    @model_validator(mode="after")
    def _cross_checks(self) -> "DeployConfig":
        names = [h.name for h in self.hosts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"hosts: duplicate host name {dup[0]!r}; give every host a unique name")
        from deployctl.config.replicas import check_shared_machines
        from deployctl.engines.validate import check_engine_config

        check_engine_config(self)
        check_shared_machines(self)
        if self.server.next_api_key_env and not self.server.api_key_env:
            raise ValueError("server.next_api_key_env needs server.api_key_env: the next key is accepted beside the "
                             "current one; set server.api_key_env")
        if self.server.next_api_key_env and self.engine.kind != "deployctl-runtime":
            raise ValueError(f"server.next_api_key_env: engine {self.engine.kind} takes one API key; two keys at once "
                             "need the bundled runtime (engine.kind: deployctl-runtime), or rotate with a restart")
        if not self.server.is_loopback and not self.server.api_key_env:
            raise ValueError(
                f"server.bind {self.server.bind} is not loopback and server.api_key_env is not set; "
                "set server.api_key_env or bind 127.0.0.1"
            )
        return self

    def router_host(self) -> Optional[HostConfig]:
        """The host nginx runs on, as a HostConfig (a hosts: entry, local, or the router's own address)."""
        if self.router is None:
            return None
        for h in self.hosts:
            if h.name == self.router.host:
                return h
        address = "local" if self.router.host == "local" else self.router.host
        return HostConfig(name=f"router-{self.router.host}" if address != "local" else "router", address=address,
                          user=self.router.user, port=self.router.port, ssh_key=self.router.ssh_key,
                          deploy_root=self.hosts[0].deploy_root, launcher="process")

    def host(self, name: str) -> HostConfig:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ConfigError(f"no host named {name!r} in deploy.yaml", fix=f"use one of: {', '.join(h.name for h in self.hosts)}")
