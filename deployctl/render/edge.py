"""The router's edge settings as nginx template context: TLS (``router.tls``), the per-host connection limit
(``router.max_conns_per_host``) and per-client limits (``router.limits``), and the JSON bodies of the router's
own errors (OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``).

- TLS: TLSv1.2 and TLSv1.3 with Mozilla's "intermediate" cipher list (ssl-config.mozilla.org, v5.7, without the
  DHE suites, which nginx only offers with an ssl_dhparam file), HTTP/2, session cache without tickets, HSTS.
  Plain HTTP on ``tls.http_listen`` answers 308 to ``https://server_name`` when ``redirect_http``, else nothing
  listens there.
- ``max_conns``: nginx's ``max_conns=N`` on every upstream server, counted across workers through a shared
  ``zone`` (without one each worker counts alone). When every server is at its limit nginx finds "no live
  upstreams" and answers 502 with ``$upstream_addr`` set to the upstream's name; that case becomes 429 with
  Retry-After (``router_over_capacity``; nginx says the same when every server is marked failed by max_fails, and
  the two cannot be told apart there); other router 502s become a JSON 502.
- limits: ``limit_req`` (rate per client, ``burst`` with nodelay) and ``limit_conn`` (open requests per client),
  both answered 429 with Retry-After (``rate_limit_exceeded``). The runtime's own 429s pass through untouched
  (``proxy_intercept_errors`` stays off).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

TLS_PROTOCOLS = "TLSv1.2 TLSv1.3"
TLS_CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
               "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")
HSTS_MAX_AGE_S = 63072000  # two years, Mozilla's recommendation
UPSTREAM_ZONE_SIZE = "64k"  # the upstream's shared state: a few hundred servers


def _error_body(message: str, type_: str, code: str) -> str:
    """A JSON error in OpenAI's shape, safe inside nginx's single-quoted ``return`` (no ', $, \\ or newline)."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    if set(body) & set("'$\\\n"):
        raise ValueError(f"router error body {body!r} has a character nginx would interpret")
    return body


# The health paths a load balancer in front of the router asks: each answers on the edge with a status and no body
# (200 when a runtime behind it is ready, 503 when none is); the runtimes' own health routes and their detail
# (model, device, dtype, KV pool) stay on the hosts.
EDGE_HEALTH_PATHS = ("/health", "/healthz", "/readyz")
_PATH = re.compile(r"/[A-Za-z0-9_./-]+")


def routes_context(cfg: DeployConfig, base: str, engines: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The router's default-deny: the exact paths it passes (deployctl.engines.router_passed_paths of the fleet's
    engines: ``cfg``'s and ``engines``, the kinds of other releases behind it now), the status-only health
    paths (EDGE_HEALTH_PATHS, answered from the current engine's ready route by an ``auth_request`` subrequest),
    and the JSON 404 every other path gets: metrics, tokenizer, docs, dev and control routes never leave the hosts.
    nginx matches ``location =`` on the decoded, dot-resolved, slash-merged URI and case-sensitively, and each
    passed path is sent to the runtime as that exact path (``proxy_pass`` with the URI), so no spelling reaches
    another route. With ``server.api_key_env`` the router checks the key on every passed route (``keys``: the 0600
    keys file of deployctl.render.keys, included here; 401 in OpenAI's shape without an accepted key) and sends
    the engine's own key upstream in place of the client's. Raises ValueError for a path with a character nginx
    would interpret."""
    from deployctl.engines import of, router_passed_paths

    current = of(cfg)
    passed = router_passed_paths([current, *sorted(engines - {cfg.engine.kind})])
    ready = current.ready_route
    bad = [p for p in (*passed, ready) if not _PATH.fullmatch(p) or "/." in p or "//" in p]
    if bad:
        raise ValueError(f"route {bad[0]!r} has characters the router's locations would interpret")
    shown = ", ".join(passed)
    keyed = None
    if cfg.router is not None and cfg.server.api_key_env:
        from deployctl.config import layout
        from deployctl.render.keys import variables

        id_var, auth_var = variables(base)
        path = layout.router_keys_path(cfg)
        if not _PATH.fullmatch(path):
            raise ValueError(f"router keys file {path!r} has characters nginx would interpret")
        keyed = {"file": path, "id_var": id_var, "auth_var": auth_var,
                 "unauthorized_body": _error_body("missing or wrong API key (Authorization: Bearer <key>)",
                                                  "authentication_error", "invalid_api_key")}
    return {"passed_routes": passed, "keys": keyed, "health_paths": EDGE_HEALTH_PATHS, "ready_route": ready,
            "ready_location": f"/_deployctl_{base}_ready",
            "not_found_body": _error_body(f"not found: this router serves {shown} only", "not_found_error",
                                          "route_not_served")}


def check_exposure(cfg: DeployConfig) -> None:
    """Render refuses a router published beyond loopback (config.router.RouterConfig.exposure) without an API
    key (``server.api_key_env``): nginx forwards what it accepts to a runtime, so a loopback engine behind a public
    router is public. Preflight's api_key check says the same about the key's variable at deploy time.
    Raises ConfigError (exit 3)."""
    from deployctl.errors import ConfigError

    public = cfg.router.exposure() if cfg.router is not None else None
    if public and not cfg.server.api_key_env:
        raise ConfigError(f"the router publishes the service on {public} and server.api_key_env is not set: anyone "
                          "who reaches it could use the GPUs",
                          fix="set server.api_key_env to the variable holding the key (the router checks it), or "
                              "router.listen_address: 127.0.0.1")


def rate(requests_per_s: float) -> str:
    """nginx's rate syntax: whole requests per second as ``Nr/s``, else per minute ``Nr/m`` (at least 1r/m)."""
    if float(requests_per_s).is_integer():
        return f"{int(requests_per_s)}r/s"
    return f"{max(1, round(requests_per_s * 60))}r/m"


def with_server_limits(cfg: DeployConfig, servers: list[dict]) -> list[dict]:
    """``servers`` (render_nginx's upstream entries) with `` max_conns=N`` appended to each one's params."""
    n = cfg.router.max_conns_per_host if cfg.router else None
    if n is None:
        return servers
    return [{**s, "params": f"{s['params']} max_conns={n}"} for s in servers]


def edge_context(cfg: DeployConfig, base: str, listen: str) -> dict[str, Any]:
    """Template names for the TLS and limit blocks of nginx-upstream.conf.j2. ``base`` is the service name as an
    nginx identifier, ``listen`` the rendered ``ADDRESS:PORT`` (or ``PORT``) of the API server."""
    router = cfg.router
    ctx: dict[str, Any] = {"server_name": (router.server_name if router else None) or "_", "tls": None,
                           "upstream_zone": None, "limits": None, "retry_after_s": router.retry_after_s if router else 1,
                           "over_capacity_body": None, "bad_gateway_body": None, "limited_body": None,
                           "edge_name": f"deployctl_{base}"}
    if router is None:
        return ctx
    tls = router.tls
    if tls is not None:
        port = router.listen
        http_listen = listen.rsplit(":", 1)[0] + f":{tls.http_listen}" if ":" in listen else str(tls.http_listen)
        ctx["tls"] = {"certificate": tls.certificate, "key": tls.key, "protocols": TLS_PROTOCOLS,
                      "ciphers": TLS_CIPHERS, "hsts_max_age_s": HSTS_MAX_AGE_S,
                      "session_cache": f"deployctl_{base}_tls:10m",
                      "redirect_listen": http_listen if tls.redirect_http else None,
                      "redirect_to": f"https://{router.server_name}{'' if port == 443 else f':{port}'}"}
    if router.max_conns_per_host is not None:
        ctx["upstream_zone"] = f"deployctl_{base}_upstream {UPSTREAM_ZONE_SIZE}"
        ctx["over_capacity_body"] = _error_body(
            f"every runtime behind the router is at its limit of {router.max_conns_per_host} concurrent requests "
            f"(router.max_conns_per_host); retry after {router.retry_after_s} s",
            "rate_limit_error", "router_over_capacity")
        ctx["bad_gateway_body"] = _error_body("the router could not get an answer from a runtime", "server_error",
                                              "bad_gateway")
    lim = router.limits
    if lim is not None and (lim.requests_per_s is not None or lim.connections is not None):
        key = "$binary_remote_addr" if lim.key == "remote_addr" else "$http_authorization"
        ctx["limits"] = {
            "req_zone": (f"{key} zone=deployctl_{base}_req:{lim.zone_size} rate={rate(lim.requests_per_s)}"
                         if lim.requests_per_s is not None else None),
            # nginx refuses burst=0: without a burst every request over the rate is refused, nodelay is moot
            "req": (f"zone=deployctl_{base}_req" + (f" burst={lim.burst} nodelay" if lim.burst else "")
                    if lim.requests_per_s is not None else None),
            "conn_zone": f"{key} zone=deployctl_{base}_conn:{lim.zone_size}" if lim.connections is not None else None,
            "conn": f"deployctl_{base}_conn {lim.connections}" if lim.connections is not None else None,
        }
        who = "client address" if lim.key == "remote_addr" else "API key"
        ctx["limited_body"] = _error_body(f"too many requests for this {who} (router.limits); retry after "
                                          f"{router.retry_after_s} s", "rate_limit_error", "rate_limit_exceeded")
    return ctx


def probe_instance_regex(cfg: DeployConfig) -> str:
    """The ``instance`` label regex of a blackbox_exporter probe of the router: ``https://SERVER_NAME`` with an
    optional port and path (a wildcard server_name matches any one label). Prometheus regexes are RE2, anchored."""
    name = re.escape(cfg.router.server_name).replace(r"\*", "[^/:.]+", 1)
    return rf"https://{name}(:[0-9]+)?(/.*)?"
