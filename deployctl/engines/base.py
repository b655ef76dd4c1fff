"""The shape of an engine adapter: how deployctl drives one inference server (declarative, no I/O).

Every engine module in this package defines one ``ADAPTER = Adapter(...)``. Nothing outside this package
spells an engine's flag or metric name: render, analysis, alert rules, runbooks and status ask the adapter.

- ``flags``: shared setting -> how the engine spells it on its command line (``Flag``), or absent when the
  engine has no such setting. Shared settings use vLLM's names (``SETTINGS``).
- ``metrics``: role -> Prometheus metric name (histograms without ``_bucket``; counters with ``_total`` as
  scraped), or None when the engine does not export it (``METRIC_ROLES``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

# The settings deploy.yaml models for every engine (vLLM's flag names, dashes as underscores).
SETTINGS = ("model", "served_model_name", "host", "port", "dtype", "device", "max_model_len", "max_num_seqs",
            "max_num_batched_tokens", "gpu_memory_utilization", "block_size", "enable_prefix_caching",
            "enable_chunked_prefill", "tensor_parallel_size", "num_gpu_blocks")

# Metric roles: ttft/tpot/itl/e2e/queue_time are histograms (seconds); kv_usage, waiting, running gauges
# (kv_usage 0-1); preemptions, success, rejected counters.
METRIC_ROLES = ("ttft", "tpot", "itl", "e2e", "queue_time", "kv_usage", "waiting", "running", "preemptions",
                "success", "rejected")


@dataclass(frozen=True)
class Flag:
    """A valued flag: ``--name VALUE``. ``positional``: the value alone, right after ``argv``'s subcommand
    (e.g. ``vllm serve MODEL``)."""

    name: str = ""
    positional: bool = False


@dataclass(frozen=True)
class Switch:
    """A boolean setting: ``on`` is rendered for True, ``off`` for False; either may be None (nothing rendered:
    the engine's default is that value). A spelling may carry its value, e.g. SGLang's
    ``--chunked-prefill-size=-1`` to disable chunked prefill."""

    on: Optional[str] = None
    off: Optional[str] = None


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
    drain: str  # what SIGTERM does (text for docs and the unit's comment)
    # SIGTERM lets in-flight requests finish (False: it cuts them, so a pod waits out the drain in preStop, after
    # its endpoints stopped sending it new requests, before the signal)
    sigterm_drains: bool = True
    stop_signal: str = "SIGTERM"
    image_tag: str = "{version}"  # the image tag for engine.version
    # The engine takes its key only as this flag: engine_main.py adds it inside the process (command.py).
    api_key_flag: Optional[str] = None
    sse_done: bool = True  # streams end with ``data: [DONE]``
    extra_env: Mapping[str, str] = field(default_factory=dict)  # always in the env file (no secrets)
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

    def has(self, setting: str) -> bool:
        return setting in self.flags

    def flag_names(self) -> set[str]:
        """Every option spelling this adapter renders (``--x`` names), for the extra_args duplicate check."""
        out: set[str] = set()
        for f in self.flags.values():
            if isinstance(f, Flag) and f.name:
                out.add(f.name)
            elif isinstance(f, Switch):
                out.update(x for x in (f.on, f.off) if x)
        out.update(a for a in self.fixed_args if a.startswith("--"))
        return out

    def sample_body(self, model: str) -> dict:
        """The sample inference sent before traffic: one short, greedy chat completion (fields every
        OpenAI-compatible engine accepts: transformers serve answers 422 to unknown ones)."""
        return {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": self.sample_max_tokens, "temperature": 0}
