"""The shape of an engine adapter: how deployctl drives one inference server (declarative, no I/O).

Every engine module in this package defines one ``ADAPTER = Adapter(...)``. Nothing outside this package
spells an engine's flag or metric name: render, analysis, alert rules, runbooks and status ask the adapter.

- ``flags``: shared setting -> how the engine spells it on its command line (``Flag``), or absent when the
  engine has no such setting. Shared settings use vLLM's names (``SETTINGS``).
- ``metrics``: role -> Prometheus metric name (histograms without ``_bucket``; counters with ``_total`` as
  scraped), or None when the engine does not export it (``METRIC_ROLES``).
- ``sleep``: how the engine parks a loaded model without ending its process (``Sleep``), or None: a standby of
  that engine is a stopped process and a rollback to it is a cold start.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

# The settings deploy.yaml models for every engine (vLLM's flag names, dashes as underscores). shutdown_timeout:
# whole seconds SIGTERM waits for in-flight requests, ceil(server.drain_timeout_s).
SETTINGS = ("model", "served_model_name", "host", "port", "dtype", "device", "max_model_len", "max_num_seqs",
            "max_num_batched_tokens", "gpu_memory_utilization", "block_size", "enable_prefix_caching",
            "enable_chunked_prefill", "tensor_parallel_size", "num_gpu_blocks", "kv_cache_dtype", "enforce_eager",
            "shutdown_timeout")
# Settings rendered only when they differ from this default (older renders stay byte-identical).
DEFAULT_UNRENDERED = {"kv_cache_dtype": "auto", "enforce_eager": False}

# Metric roles: ttft/tpot/itl/e2e/queue_time are histograms (seconds); kv_usage, waiting, running gauges
# (kv_usage 0-1); preemptions, success, rejected counters; generation_tokens a counter that grows while output
# tokens come out (each step or streamed chunk, not only when a request ends: the engine-stall alert reads it).
METRIC_ROLES = ("ttft", "tpot", "itl", "e2e", "queue_time", "kv_usage", "waiting", "running", "preemptions",
                "success", "rejected", "generation_tokens")


@dataclass(frozen=True)
class Flag:
    """A valued flag: ``--name VALUE``. ``positional``: the value alone, right after ``argv``'s subcommand
    (e.g. ``vllm serve MODEL``). ``only_if``: a boolean setting that must be on for the flag to be rendered
    (e.g. SGLang's chunk size only while chunked prefill is on)."""

    name: str = ""
    positional: bool = False
    values: Optional[Mapping[str, str]] = field(default=None, hash=False, compare=False)  # deploy.yaml value -> the engine's
    only_if: Optional[str] = None


@dataclass(frozen=True)
class Switch:
    """A boolean setting: ``on`` is rendered for True, ``off`` for False; either may be None (nothing rendered:
    the engine's default is that value). A spelling may carry its value, e.g. SGLang's
    ``--chunked-prefill-size=-1`` to disable chunked prefill."""

    on: Optional[str] = None
    off: Optional[str] = None


@dataclass(frozen=True)
class ErrorShare:
    """How the engine counts requests that failed on the server's side: one Prometheus counter (as scraped, with
    ``_total``) and the label matchers, PromQL syntax without braces, that select the failed ones (``errors``) and
    all of them (``total``, "" for every series). The canary analysis judges errors / total."""

    counter: str
    errors: str
    total: str = ""


@dataclass(frozen=True)
class Metrics:
    """Prometheus metric names per role (None: the engine has no such metric). ``prefix`` is the common prefix
    (``bench --metrics-prefix``)."""

    prefix: Optional[str]
    names: Mapping[str, Optional[str]] = field(default_factory=dict)

    def __getitem__(self, role: str) -> Optional[str]:
        if role not in METRIC_ROLES:
            raise KeyError(f"unknown metric role {role!r}; one of {', '.join(METRIC_ROLES)}")
        return self.names.get(role)


GiB = 1024 ** 3
MiB = 1024 ** 2

# The inference routes a client reaches through the router (OpenAI's chat and completions, and the model list):
# nginx passes exactly these paths and answers 404 to every other one (deployctl.render.edge).
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")
# ... and OpenAI's Responses API, where the engine serves it (the bundled runtime; vLLM 0.33's
# entrypoints/openai/responses/api_router.py; SGLang 0.5.23's srt/entrypoints/http_server.py)
RESPONSES_ROUTES = OPENAI_ROUTES + ("/v1/responses",)


@dataclass(frozen=True)
class Sleep:
    """An engine's sleep mode: routes on its port (reached from the host only, never through the router), what
    turns it on, what a sleep keeps, and what a sleeping process still holds on the GPU.

    - ``sleep_route`` / ``wake_route``: ``"METHOD /path"`` (the sleep route with its level, e.g. ``?level=1``);
      ``state_route``: ``"GET /path"`` answering ``{"is_sleeping": bool}``, or None when the engine has none.
    - ``enable_flags`` rendered on the command line and ``enable_env`` put in the env file when the release keeps a
      standby (``rollout.standby_s`` > 0); the bundled runtime needs neither.
    - ``keeps``: what survives a sleep, in words (level 1: weights copied to host RAM, the KV cache discarded).
    - ``weights_in_host_ram``: a sleeping process holds a copy of its weights in host RAM (the host must have the
      weights' bytes free).
    - ``gpu_residue_bytes``: bytes a sleeping process still holds per GPU (CUDA context, allocator, graph pools);
      ``residue_source`` says where the figure comes from and whether it is an estimate.
    - ``control_routes``: every control/dev route the engine serves when sleep mode is on (host-only: the router
      passes ``Adapter.public_routes`` only)."""

    sleep_route: str
    wake_route: str
    state_route: Optional[str]
    keeps: str
    gpu_residue_bytes: int
    residue_source: str
    enable_flags: tuple[str, ...] = ()
    enable_env: Mapping[str, str] = field(default_factory=dict)
    weights_in_host_ram: bool = True
    control_routes: tuple[str, ...] = ()

    @staticmethod
    def _split(route: str) -> tuple[str, str]:
        method, _, path = route.partition(" ")
        return method, path

    @property
    def sleep(self) -> tuple[str, str]:
        """(method, path with query) of the sleep route."""
        return self._split(self.sleep_route)

    @property
    def wake(self) -> tuple[str, str]:
        return self._split(self.wake_route)

    @property
    def state(self) -> Optional[tuple[str, str]]:
        return self._split(self.state_route) if self.state_route else None

    def paths(self) -> tuple[str, ...]:
        """Every path (no query) of the sleep mode, reached on the host only: the sleep routes and control_routes."""
        out = [self.sleep[1].split("?")[0], self.wake[1].split("?")[0]]
        if self.state:
            out.append(self.state[1].split("?")[0])
        out += [r for r in self.control_routes if r not in out]
        return tuple(out)


@dataclass(frozen=True)
class Adapter:
    """One engine. Routes are paths on the engine's port; ``argv`` is the command before the settings
    (relative to the engine's environment: ``{python}`` is its interpreter, ``{bin}`` its bin/ directory)."""

    kind: str
    distribution: Optional[str]  # pip distribution pinned by engine.version (None: the bundled runtime wheel)
    module: str  # import name whose __version__ preflight reads on the host
    image: Optional[str]  # official container image repository
    argv: tuple[str, ...]
    flags: Mapping[str, Union[Flag, Switch]]
    api_key_env: Optional[str]  # env var the engine reads its API key from (never a command-line flag)
    ready_route: str
    live_route: str
    metrics_route: Optional[str]
    metrics: Metrics
    ready_log: str  # a line its start-up log prints once it serves (substring)
    drain: str  # what SIGTERM does, from the pinned source (text for docs and the unit's comment)
    # SIGTERM lets in-flight requests finish (False: it cuts them, so a pod waits out the drain in preStop, after
    # its endpoints stopped sending it new requests, before the signal). An engine whose drain needs a flag
    # (vLLM's --shutdown-timeout) has it in ``flags`` under "shutdown_timeout", rendered on every start.
    sigterm_drains: bool = True
    # Seconds the engine takes after its drain to exit (workers' teardown, a drain loop's poll): TimeoutStopSec,
    # compose's stop_grace_period and the pod's grace add it to server.drain_timeout_s (render.release).
    stop_overhead_s: int = 0
    # Seconds one readiness/liveness probe may take (k8s timeoutSeconds, compose's healthcheck, deployctl's
    # readiness poll): more than the engine's own bound when its health route runs a generation.
    probe_timeout_s: int = 5
    # Its own server-side error count (None: none besides METRIC_ROLES' rejected counter, or no /metrics).
    error_share: Optional[ErrorShare] = None
    stop_signal: str = "SIGTERM"
    image_tag: str = "{version}"  # the image tag for engine.version
    # The engine takes its key only as this flag: engine_main.py adds it inside the process (command.py).
    api_key_flag: Optional[str] = None
    sse_done: bool = True  # streams end with ``data: [DONE]``
    # the label selector of the ``success`` counter's requests that ended with an error mid-generation (None: the
    # engine does not count them apart); the error-share alert adds them to its rejections
    error_finish: Optional[str] = None
    extra_env: Mapping[str, str] = field(default_factory=dict)  # always in the env file (no secrets)
    # The port a multi-GPU start (tensor_parallel_size > 1) rendezvouses on, so that two replicas on one machine do
    # not race for the engine's default (torch's 29500, a random pick): a flag (``dist_port_flag``) or an env var
    # (``dist_port_env``) of the engine, rendered with engines.command.dist_port; both None: the engine has none.
    dist_port_flag: Optional[str] = None
    dist_port_env: Optional[str] = None
    fixed_args: tuple[str, ...] = ()  # always rendered after the settings (e.g. a cache size)
    # The engine sizes its KV cache from the num_gpu_blocks flag only: always rendered, from
    # engine.num_gpu_blocks_override or enough blocks for max_num_seqs requests of max_model_len.
    explicit_cache: bool = False
    # Clients must name the model by the path it was loaded from (no served-model-name flag).
    model_name_is_path: bool = False
    config_file: bool = False  # settings go into runtime.yaml, not the command line (the bundled runtime)
    sample_max_tokens: int = 4
    # Its HTTP keep-alive timeout (deployctl.engines.keepalive): set by this env var (whole seconds), or fixed at
    # keep_alive_fixed_s seconds (not settable); neither: from the config file (the bundled runtime).
    keep_alive_env: Optional[str] = None
    keep_alive_fixed_s: Optional[float] = None
    # Sleep mode (a standby that keeps its process), or None: a standby is a stopped release (cold start).
    sleep: Optional[Sleep] = None
    # Control routes the engine serves whatever its settings (host-only, like sleep.control_routes: the router passes
    # only public_routes).
    control_routes: tuple[str, ...] = ()
    # The routes the router passes to this engine (exact paths, any query): the service's inference routes. Every
    # other path (health, metrics, tokenizer, dev and control routes) answers 404 at the edge.
    public_routes: tuple[str, ...] = OPENAI_ROUTES
    # Settings the command template of ``argv`` names as ``{setting}`` placeholders (engine.kind openai: the
    # command is declared in deploy.yaml and ``flags`` is empty); filled in by engines.command.
    uses: tuple[str, ...] = ()

    def router_refused_paths(self) -> tuple[str, ...]:
        """The engine's sleep and dev/control routes (the router answers 404 to them, as to every path outside
        ``public_routes``): deployctl reaches them from the host side only (deployctl.service.engine)."""
        out = list(self.control_routes)
        if self.sleep is not None:
            out += [p for p in self.sleep.paths() if p not in out]
        return tuple(out)

    def has(self, setting: str) -> bool:
        return setting in self.flags or setting in self.uses

    def flag_names(self) -> set[str]:
        """Every option spelling this adapter renders (``--x`` names), for the extra_args duplicate check."""
        out: set[str] = set()
        for f in self.flags.values():
            if isinstance(f, Flag) and f.name:
                out.add(f.name)
            elif isinstance(f, Switch):
                out.update(x for x in (f.on, f.off) if x)
        out.update(a for a in self.fixed_args if a.startswith("--"))
        if self.sleep is not None:
            out.update(self.sleep.enable_flags)
        if self.dist_port_flag:
            out.add(self.dist_port_flag)
        return out

    def sample_body(self, model: str) -> dict:
        """The sample inference sent before traffic: one short, greedy chat completion (fields every
        OpenAI-compatible engine accepts: transformers serve answers 422 to unknown ones)."""
        return {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": self.sample_max_tokens, "temperature": 0}
