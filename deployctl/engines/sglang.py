"""SGLang's server (``python -m sglang.launch_server``; flags: sglang/srt/server_args.py, metrics:
sglang/srt/metrics/collector.py of the pinned version)."""
from deployctl.engines.base import Adapter, Flag, Metrics, Switch

ADAPTER = Adapter(
    kind="sglang",
    distribution="sglang",
    module="sglang",
    image="lmsysorg/sglang",
    image_tag="v{version}",
    keep_alive_env="SGLANG_TIMEOUT_KEEP_ALIVE",  # sglang/srt/environ.py (EnvInt, default 5)
    argv=("{python}", "-m", "sglang.launch_server"),
    flags={
        "model": Flag("--model-path"),
        "served_model_name": Flag("--served-model-name"),
        "host": Flag("--host"),
        "port": Flag("--port"),
        "dtype": Flag("--dtype"),
        "max_model_len": Flag("--context-length"),
        "max_num_seqs": Flag("--max-running-requests"),
        "max_num_batched_tokens": Flag("--max-prefill-tokens"),
        # SGLang's static fraction covers weights + KV pool (not activations): see engines/capacity.py.
        "gpu_memory_utilization": Flag("--mem-fraction-static"),
        "block_size": Flag("--page-size"),
        "enable_prefix_caching": Switch(None, "--disable-radix-cache"),
        "enable_chunked_prefill": Switch(None, "--chunked-prefill-size=-1"),
        "tensor_parallel_size": Flag("--tp-size"),
    },
    # arg_groups/fields/serving.py: api_key comes only from --api-key (no env var): engine_main.py adds it.
    api_key_env=None,
    api_key_flag="--api-key",
    ready_route="/health",
    live_route="/health",
    metrics_route="/metrics",
    metrics=Metrics("sglang:", {
        "ttft": "sglang:time_to_first_token_seconds",
        "tpot": "sglang:inter_token_latency_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e": "sglang:e2e_request_latency_seconds",
        "queue_time": None,
        "kv_usage": "sglang:token_usage",
        "waiting": "sglang:num_queue_reqs",
        "running": "sglang:num_running_reqs",
        "preemptions": None,
        "success": None,
        "rejected": None,
    }),
    fixed_args=("--enable-metrics",),
    ready_log="The server is fired up and ready to roll!",
    drain="SIGTERM: the HTTP server shuts down and the scheduler processes are killed with it; in-flight "
          "requests are cut (drain through the router first: deployctl takes a host out of nginx before stopping it)",
    sigterm_drains=False,
)
