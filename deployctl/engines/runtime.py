"""deployctl-runtime, the bundled server (runtime/; its settings go into runtime.yaml, read by
``python -m deployctl_runtime serve --config``; metrics: runtime/deployctl_runtime/server/metrics.py)."""
from deployctl.engines.base import RESPONSES_ROUTES, MiB, Adapter, Flag, Metrics, Sleep, Switch

_P = "deployctl_runtime_"

ADAPTER = Adapter(
    public_routes=RESPONSES_ROUTES,  # the service's routes, /v1/responses included (the router passes only these)
    kind="deployctl-runtime",
    distribution=None,  # the release's own wheel (built from runtime/), installed by rollout.release
    module="deployctl_runtime",
    # who the process is (release, replica, instance, pid): deployctl asks it host-side before every control call
    control_routes=("/identity",),
    image=None,  # built from the release's Dockerfile
    argv=("{python}", "-m", "deployctl_runtime", "serve"),
    flags={name: Flag("--" + name.replace("_", "-")) for name in (
        "model", "served_model_name", "host", "port", "dtype", "max_model_len", "max_num_seqs",
        "max_num_batched_tokens", "gpu_memory_utilization", "block_size")}
    | {"enable_prefix_caching": Switch("--enable-prefix-caching", "--no-enable-prefix-caching"),
       "enable_chunked_prefill": Switch("--enable-chunked-prefill", "--no-enable-chunked-prefill")},
    api_key_env="DEPLOYCTL_RUNTIME_API_KEY",
    ready_route="/readyz",
    live_route="/healthz",
    metrics_route="/metrics",
    metrics=Metrics(_P, {
        "ttft": _P + "time_to_first_token_seconds",
        "tpot": _P + "time_per_output_token_seconds",
        "itl": _P + "inter_token_latency_seconds",
        "e2e": _P + "e2e_request_latency_seconds",
        "queue_time": _P + "request_queue_time_seconds",
        "kv_usage": _P + "kv_cache_usage_ratio",
        "waiting": _P + "num_requests_waiting",
        "running": _P + "num_requests_running",
        "preemptions": _P + "num_preemptions_total",
        "success": _P + "request_success_total",
        "rejected": _P + "request_rejected_total",
        "generation_tokens": _P + "generation_tokens_total",  # server/generation.py: each chunk's new tokens
    }),
    ready_log="ready: serving model",
    drain="SIGTERM: /readyz answers 503 and new requests 503 while in-flight requests finish, up to "
          "server.drain_timeout_s; then it exits",
    config_file=True,
    # runtime/deployctl_runtime/server/sleep.py: always on (no flag), behind the API key.
    sleep=Sleep(
        sleep_route="POST /sleep?level=1", wake_route="POST /wake_up", state_route="GET /is_sleeping",
        keeps="level 1: the weights are copied to pinned host RAM (kept in place on CPU), the KV cache is freed and "
              "the prefix cache starts empty after the wake; CUDA graphs are captured again at the wake",
        # ESTIMATE, not measured here (no GPU): the CUDA context of one process (hundreds of MiB on recent GPUs:
        # CUDA C++ Programming Guide, "Lazy Loading") plus what the caching allocator keeps after empty_cache();
        # bench/gpu_check.sh measures the real figure.
        gpu_residue_bytes=512 * MiB,
        residue_source="estimate: one CUDA context + allocator residue after torch.cuda.empty_cache() "
                       "(measure with bench/gpu_check.sh)",
    ),
    error_finish='finish_reason="error"',  # runtime/deployctl_runtime/server/metrics.py request_success
)
