"""Hugging Face ``transformers serve`` (transformers/cli/serve.py, routes: transformers/cli/serving/server.py of
the pinned version). A real foreign engine that runs on CPU: deployctl's end-to-end tests deploy it.

Facts (transformers 5.24): no /metrics (canary analysis judges it by active probes), SSE streams end without
``data: [DONE]``, unknown request fields get 422, no API key (bind loopback behind the router), no
served-model-name (it answers 400 "Server is pinned to DIR" unless the request names DIR: model.served_name must be
model.path), ~400 MB RSS for the tiny model with 64 blocks, and the
paged cache defaults to ~60% of RAM, so ``--cb-num-blocks`` is always rendered (base.Adapter.explicit_cache).
"""
from deployctl.engines.base import Adapter, Flag, Metrics

ADAPTER = Adapter(
    kind="transformers",
    distribution="transformers",
    module="transformers",
    image="huggingface/transformers-pytorch-gpu",
    argv=("{python}", "-m", "transformers.cli.transformers", "serve"),  # the `transformers` console script
    flags={
        "model": Flag(positional=True),
        "host": Flag("--host"),
        "port": Flag("--port"),
        "dtype": Flag("--dtype"),
        "device": Flag("--device"),
        "max_num_batched_tokens": Flag("--cb-max-batch-tokens"),
        "block_size": Flag("--cb-block-size"),
        "num_gpu_blocks": Flag("--cb-num-blocks"),
    },
    api_key_env=None,
    ready_route="/health",
    live_route="/health",
    metrics_route=None,
    metrics=Metrics(None, {}),
    fixed_args=("--continuous-batching", "--log-level", "info"),
    ready_log="Application startup complete.",
    # cli/serve.py: uvicorn.Config without timeout_graceful_shutdown, so uvicorn waits for every open request
    drain="SIGTERM: uvicorn stops accepting connections and waits for in-flight requests (no bound of its own); "
          "server.drain_timeout_s bounds it through the SIGKILL after TimeoutStopSec",
    sse_done=False,
    explicit_cache=True,
    model_name_is_path=True,
    keep_alive_fixed_s=5.0,
    sleep=None,  # no way to park the model: a standby is a stopped release, a rollback to it a cold start  # transformers/cli/serve.py: uvicorn.Config without timeout_keep_alive (uvicorn's 5 s)
)
