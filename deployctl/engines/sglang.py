"""SGLang's server (``python -m sglang.launch_server``; flags: sglang/srt/server_args.py, metrics:
sglang/srt/metrics/collector.py of the pinned version)."""
from deployctl.engines.base import RESPONSES_ROUTES, GiB, Adapter, ErrorShare, Flag, Metrics, Sleep, Switch

ADAPTER = Adapter(
    public_routes=RESPONSES_ROUTES,  # the service's routes, /v1/responses included (the router passes only these)
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
        # arg_groups/fields/schedule.py: --chunked-prefill-size is the most tokens one prefill chunk takes (vLLM's
        # per-step budget); --max-prefill-tokens is only a floor-bounded hint ("the real bound will be the maximum
        # of this value and the model's maximum context length"). With chunked prefill off SGLang takes -1 there.
        "max_num_batched_tokens": Flag("--chunked-prefill-size", only_if="enable_chunked_prefill"),
        # SGLang's static fraction covers weights + KV pool (not activations): see engines/capacity.py.
        "gpu_memory_utilization": Flag("--mem-fraction-static"),
        "block_size": Flag("--page-size"),
        "enable_prefix_caching": Switch(None, "--disable-radix-cache"),
        "enable_chunked_prefill": Switch(None, "--chunked-prefill-size=-1"),
        "tensor_parallel_size": Flag("--tp-size"),
        # server_args.py --kv-cache-dtype choices: auto, fp8_e5m2, fp8_e4m3, ... (no bare "fp8")
        "kv_cache_dtype": Flag("--kv-cache-dtype", values={"fp8": "fp8_e4m3"}),
        "enforce_eager": Switch("--disable-cuda-graph", None),
    },
    # arg_groups/fields/parallel.py nccl_port: "The port for NCCL distributed environment setup. Defaults to a
    # random port" (server_args.py PortArgs.init_new: get_free_port_below_ephemeral, 22000-29999)
    dist_port_flag="--nccl-port",
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
        # not sglang:generation_tokens_total: metrics/collector.py adds a request's tokens to it in
        # observe_one_finished_request, when the request ends, so a long answer looks like no progress;
        # observe_inter_token_latency adds each batch of new tokens to the histogram's buckets as they arrive, so
        # its _count grows by every token after a request's first
        "generation_tokens": "sglang:inter_token_latency_seconds_count",
    }),
    fixed_args=("--enable-metrics",),
    # observability/http_request_metrics.py: sglang:http_responses_total{endpoint=<path>, status_code="500", ...}
    # for every HTTP response; the OpenAI routes' 5xx are the server's errors
    error_share=ErrorShare("sglang:http_responses_total", 'endpoint=~"/v1/.*", status_code=~"5.."',
                           'endpoint=~"/v1/.*"'),
    ready_log="The server is fired up and ready to roll!",
    drain="SIGTERM to the main process: /health answers 503 and the tokenizer manager waits for every in-flight "
          "request (managers/tokenizer_manager.py SignalHandler.sigterm_handler, sigterm_watchdog: no bound of its "
          "own, polled every 5 s), then stops the schedulers (up to 15 s) and exits; the schedulers must not get "
          "the signal themselves (KillMode=mixed); server.drain_timeout_s bounds it through the SIGKILL after "
          "TimeoutStopSec",
    sigterm_drains=True,
    # the drain loop's 5 s poll + _SCHEDULER_EXIT_TIMEOUT_SECS (15 s) for the schedulers to release the GPUs
    stop_overhead_s=20,
    # entrypoints/http_server.py: /health runs a one-token generation and answers 503 only after
    # HEALTH_CHECK_TIMEOUT (SGLANG_HEALTH_CHECK_TIMEOUT, default 20 s) without a token, polling every 1 s
    probe_timeout_s=25,
    # sglang/srt/entrypoints/http_server.py: control routes served without any flag (weights, cache, profiler,
    # sessions, LoRA, generation pause); the router refuses them all.
    control_routes=("/flush_cache", "/update_weights_from_disk", "/update_weights_from_tensor",
                    "/update_weights_from_distributed", "/update_weights_from_ipc", "/init_weights_update_group",
                    "/destroy_weights_update_group", "/begin_weight_update", "/end_weight_update",
                    "/update_weight_version", "/get_weights_by_name", "/send_weights_to_remote_instance",
                    "/init_weights_send_group_for_remote_instance", "/start_profile", "/stop_profile",
                    "/configure_logging", "/set_internal_state", "/set_trace_level", "/abort_request",
                    "/pause_generation", "/continue_generation", "/slow_down", "/freeze_gc",
                    "/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter",
                    "/start_expert_distribution_record", "/stop_expert_distribution_record",
                    "/dump_expert_distribution_record", "/open_session", "/close_session", "/pd_role_switch",
                    "/get_server_info", "/server_info", "/weights_checker", "/hicache/storage-backend",
                    "/add_external_corpus", "/remove_external_corpus"),
    # http_server.py /release_memory_occupation and /resume_memory_occupation (GET or POST), enabled by
    # ServerArgs.enable_memory_saver (arg_groups/fields/exec_.py, torch_memory_saver); enable_weights_cpu_backup
    # keeps the weights in host RAM across the release (else they are gone and must be reloaded from disk).
    sleep=Sleep(
        sleep_route="POST /release_memory_occupation", wake_route="POST /resume_memory_occupation",
        state_route=None,
        keeps="weights copied to host RAM (--enable-weights-cpu-backup), KV cache and CUDA graph memory released "
              "(torch_memory_saver); the radix cache is flushed",
        enable_flags=("--enable-memory-saver", "--enable-weights-cpu-backup"),
        # ESTIMATE: SGLang publishes no figure; torch_memory_saver releases weights, KV and graph pools, leaving
        # the CUDA context and NCCL/allocator state of the scheduler process (about 1 GiB assumed).
        gpu_residue_bytes=1 * GiB,
        residue_source="estimate: CUDA context + NCCL/allocator state of the scheduler process; SGLang gives no "
                       "figure (measure on a GPU)",
    ),
)
