"""Keep-alive between nginx and the engines behind it: the one home for how the two idle timeouts relate.

nginx keeps idle HTTP/1.1 connections to every upstream server (``keepalive`` + ``keepalive_timeout`` in the
upstream block) and sends later requests on them. The engine closes a connection idle for its own keep-alive
timeout (uvicorn's ``timeout_keep_alive``: 5 s unless set). When the engine's is the shorter, nginx can send a
request on a connection the engine is closing at that moment, and the client gets a 502. So the engine's timeout is
rendered longer than nginx's, by a margin that outlasts one request write and nginx's millisecond timers::

    engine ≥ max(nginx × 1.25, nginx + 0.25 s)

- An engine whose timeout is set from deploy.yaml (the bundled runtime's runtime.yaml ``keep_alive_timeout_s``;
  vLLM / SGLang by ``Adapter.keep_alive_env``): nginx = router.keepalive_timeout_s (default 60 s, nginx's own
  default), engine = the bound above (75 s by default; whole seconds for an env var read as an integer).
- An engine with a fixed timeout (``Adapter.keep_alive_fixed_s``: transformers serve runs uvicorn's 5 s): nginx is
  lowered to min(router.keepalive_timeout_s, engine / 1.25, engine − 0.25 s) (4 s for transformers).
The runtime's own default (deployctl_runtime server config, 75 s) is the rendered default; a test checks it.

One nginx upstream block serves every host behind the router, so while a mixed fleet runs (stable on one engine,
canary on another, or a rollback to a release on another engine) nginx's value is the smallest one any of those
engines needs: ``keepalive(cfg, also=("transformers",))``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

RATIO = 1.25
MARGIN_S = 0.25
DEFAULT_NGINX_S = 60.0  # nginx's keepalive_timeout default (ngx_http_upstream_module)


@dataclass(frozen=True)
class KeepAlive:
    """Idle timeouts in seconds: ``nginx_s`` (upstream keepalive_timeout), ``engine_s`` (the engine's)."""

    nginx_s: float
    engine_s: float

    @property
    def nginx_directive(self) -> str:
        """The keepalive_timeout value as nginx takes it: whole seconds ("60s"), else milliseconds ("400ms")."""
        ms = max(1, round(self.nginx_s * 1000))
        return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def engine_timeout_for(nginx_s: float) -> float:
    """The shortest engine keep-alive safe behind an nginx keepalive_timeout of ``nginx_s``."""
    return max(nginx_s * RATIO, nginx_s + MARGIN_S)


def _nginx_for(a, want: float) -> float:
    """nginx's keepalive_timeout for engine adapter ``a`` when deploy.yaml asks for ``want`` seconds."""
    fixed = a.keep_alive_fixed_s
    return want if fixed is None else min(want, fixed / RATIO, fixed - MARGIN_S)


def keepalive(cfg, also=()) -> KeepAlive:
    """The pair for ``cfg`` (a DeployConfig, duck-typed: engines sit below config) and its engine (module doc);
    ``also``: engine kinds of other releases behind the same router now (their needs lower ``nginx_s`` too)."""
    from deployctl.engines import adapter_for, of

    a = of(cfg)
    want = cfg.router.keepalive_timeout_s if cfg.router is not None else DEFAULT_NGINX_S
    nginx = min(_nginx_for(adapter_for(cfg, k), want) for k in {cfg.engine.kind, *also})
    if a.keep_alive_fixed_s is not None:
        return KeepAlive(nginx, a.keep_alive_fixed_s)
    engine = engine_timeout_for(want)
    if a.keep_alive_env:  # read as whole seconds (vLLM, SGLang)
        engine = float(math.ceil(engine))
    return KeepAlive(nginx, engine)


def keepalive_env(cfg) -> dict[str, str]:
    """The env var setting the engine's keep-alive (``Adapter.keep_alive_env``), or {}."""
    from deployctl.engines import of

    a = of(cfg)
    return {a.keep_alive_env: str(int(keepalive(cfg).engine_s))} if a.keep_alive_env else {}
