"""vLLM's OpenAI-compatible server (``vllm serve``; flags: vllm/engine/arg_utils.py, routes and API key:
vllm/entrypoints/openai/api_server.py, metrics: vllm/v1/metrics/loggers.py of the pinned version)."""
from deployctl.engines.base import Adapter, Flag, Metrics, Switch

ADAPTER = Adapter(
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
    },
    # api_server.py: `args.api_key or envs.VLLM_API_KEY` guards every /v1 route.
    api_key_env="VLLM_API_KEY",
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
    }),
    ready_log="Application startup complete.",
    drain="SIGTERM: uvicorn stops accepting connections and lets in-flight requests finish, then the engine "
          "core and its workers exit; SIGKILL after TimeoutStopSec",
)
