"""The router's failover settings as nginx template context: passive health (``max_fails``/``fail_timeout`` on
every upstream server) and which failures go to the next server (``proxy_next_upstream``).

nginx's rules (ngx_http_upstream_module, ngx_http_proxy_module docs): ``error``/``timeout`` cover establishing the
connection, passing the request and reading the response header; a request with a non-idempotent method (POST)
is passed to the next server only when it has not been sent to an upstream yet, unless ``non_idempotent`` is
given. So ``proxy_next_upstream error timeout http_503`` without ``non_idempotent`` retries a POST only when its
connection failed (the host is down: nothing reached a model), and GETs (/v1/models, /health) on 503 too;
a completion that reached a model is never sent twice, and nothing is retried once bytes went to the client.
``max_fails`` unsuccessful attempts within ``fail_timeout`` mark the server unavailable for ``fail_timeout``
(error, timeout and invalid headers always count; http_503 counts as it is listed). ``proxy_next_upstream_tries
2`` bounds a request to two servers; ``proxy_next_upstream_timeout`` bounds the time spent trying.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

NEXT_UPSTREAM = "error timeout http_503"
NEXT_UPSTREAM_TRIES = 2
NEXT_UPSTREAM_TIMEOUT_S = 10


def with_failover(cfg: DeployConfig, servers: list[dict]) -> list[dict]:
    """``servers`` (render_nginx's upstream entries) with `` max_fails=N fail_timeout=Ts`` appended."""
    r = cfg.router
    max_fails, timeout = (r.max_fails, r.fail_timeout_s) if r else (1, 10)
    return [{**s, "params": f"{s['params']} max_fails={max_fails} fail_timeout={timeout}s"} for s in servers]


def failover_context() -> dict[str, Any]:
    """Template names for the failover lines of the location block."""
    return {"next_upstream": NEXT_UPSTREAM, "next_upstream_tries": NEXT_UPSTREAM_TRIES,
            "next_upstream_timeout_s": NEXT_UPSTREAM_TIMEOUT_S}
