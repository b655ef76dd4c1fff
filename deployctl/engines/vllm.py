"""vLLM's OpenAI-compatible server (``vllm serve``; flags: vllm/engine/arg_utils.py, routes and API key:
vllm/entrypoints/openai/api_server.py, metrics: vllm/v1/metrics/loggers.py of the pinned version)."""
from deployctl.engines.base import RESPONSES_ROUTES, GiB, Adapter, ErrorShare, Flag, Metrics, Sleep, Switch

ADAPTER = Adapter(
    public_routes=RESPONSES_ROUTES,  # the service's routes, /v1/responses included (the router passes only these)
    kind="vllm",
    distribution="vllm",
    module="vllm",
    image="vllm/vllm-openai",
    image_tag="v{version}",
    keep_alive_env="VLLM_HTTP_TIMEOUT_KEEP_ALIVE",  # vllm/envs.py (int seconds, default 5)
    # the `vllm` console script's module (a release venv with system site packages has no scripts of its own)
    argv=("{python}", "-m", "vllm.entrypoints.cli.main", "serve"),
    flags={
        "model": Flag(positional=True),
        "served_model_name": Flag("--served-model-name"),
        "host": Flag("--host"),
        "port": Flag("--port"),
        "dtype": Flag("--dtype"),
        "max_model_len": Flag("--max-model-len"),
        "max_num_seqs": Flag("--max-num-seqs"),
        "max_num_batched_tokens": Flag("--max-num-batched-tokens"),
        "gpu_memory_utilization": Flag("--gpu-memory-utilization"),
        "block_size": Flag("--block-size"),
        "enable_prefix_caching": Switch("--enable-prefix-caching", "--no-enable-prefix-caching"),
        "enable_chunked_prefill": Switch("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
        "tensor_parallel_size": Flag("--tensor-parallel-size"),
        "kv_cache_dtype": Flag("--kv-cache-dtype"),  # vllm/config/cache.py CacheDType
        "enforce_eager": Switch("--enforce-eager", None),
        # arg_utils.py: `--shutdown-timeout` (int seconds, default 0 = abort in-flight requests on SIGTERM); the
        # engine core drains for that long (v1/engine/core.py _handle_shutdown: mode "abort" when 0, else "drain").
        "shutdown_timeout": Flag("--shutdown-timeout"),
    },
    # api_server.py: `args.api_key or envs.VLLM_API_KEY` guards every /v1 route.
    api_key_env="VLLM_API_KEY",
    # vllm/envs.py VLLM_PORT ("used in distributed environment to manually set the communication port"): every
    # port vLLM picks for itself (utils/network_utils.py get_open_port, get_open_ports_list: the TCP rendezvous,
    # the DP master ports, up to 5 upward from it) starts there instead of at a random free port. No flag for it:
    # --master-port is multi-node only (config/parallel.py).
    dist_port_env="VLLM_PORT",
    ready_route="/health",
    live_route="/health",
    metrics_route="/metrics",
    metrics=Metrics("vllm:", {
        "ttft": "vllm:time_to_first_token_seconds",
        "tpot": "vllm:request_time_per_output_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
        "queue_time": "vllm:request_queue_time_seconds",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "waiting": "vllm:num_requests_waiting",
        "running": "vllm:num_requests_running",
        "preemptions": "vllm:num_preemptions_total",
        "success": "vllm:request_success_total",
        "rejected": None,
        "generation_tokens": "vllm:generation_tokens_total",  # v1/metrics/loggers.py: each iteration's new tokens
    }),
    # v1/metrics/loggers.py: vllm:request_success counts every finished request by finished_reason;
    # v1/engine/__init__.py FinishReason.ERROR is "always converted to 500 Internal Server Error" (abort: the client)
    error_share=ErrorShare("vllm:request_success_total", 'finished_reason="error"'),
    ready_log="Application startup complete.",
    drain="SIGTERM to the API server: the engine core drains in-flight requests for --shutdown-timeout seconds "
          "(server.drain_timeout_s; vLLM's default 0 aborts them), then the HTTP server and the workers exit; "
          "the TP workers must not get the signal themselves (KillMode=mixed); SIGKILL after TimeoutStopSec",
    # envs.py VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (default 5): the workers' teardown after the drain
    stop_overhead_s=5,
    # Served whatever the flags: profiler, elastic EP and fault-tolerance control routes
    # (vllm/entrypoints/serve/{profile,elastic_ep,fault_tolerance}/api_router.py).
    control_routes=("/start_profile", "/stop_profile", "/scale_elastic_ep", "/is_scaling_elastic_ep",
                    "/fault_tolerance/apply", "/fault_tolerance/status"),
    # vllm/entrypoints/serve/dev/sleep/api_router.py (level 0..2, default 1), mounted only with
    # VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/__init__.py), which also mounts the other dev routes below;
    # vLLM's API key guards /v1 only, so the router must refuse them all.
    sleep=Sleep(
        sleep_route="POST /sleep?level=1", wake_route="POST /wake_up", state_route="GET /is_sleeping",
        keeps="level 1: weights offloaded to host RAM (CuMemAllocator), KV cache discarded; prefix cache empty "
              "after the wake",
        enable_flags=("--enable-sleep-mode",),
        enable_env={"VLLM_SERVER_DEV_MODE": "1"},
        # vLLM's own bound: tests/basic_correctness/test_cumem.py::test_end_to_end asserts a level-1 sleeper uses
        # under 2 GiB ("mostly cudagraph memory pool") for Llama-3.2-1B. An upper bound, not a measurement here.
        gpu_residue_bytes=2 * GiB,
        residue_source="vLLM tests/basic_correctness/test_cumem.py test_end_to_end: a level-1 sleeper under "
                       "2 GiB (CUDA graph pool + CUDA context); upper bound, not measured here",
        control_routes=("/release_kv_cache_memory", "/reset_prefix_cache", "/reset_mm_cache",
                        "/reset_encoder_cache", "/collective_rpc", "/server_info"),
    ),
)
