"""The router's JSON access log, counted per host for canary analysis (deployctl.rollout.analysis).

Each upstream attempt of a request counts against the server that answered it; a 5xx (502 from a dead backend
included) is an error. Client traffic is what reached a runtime through the router less deployctl's own requests
(the ``X-Deployctl-Probe`` header, logged as ``probe``). Of it, only generation requests (``GENERATION_ROUTES``)
show that the canary served users: a GET of /v1/models or /health carries no tokens, so it gives no latency sample
and proves nothing about the release's answers (``rollout.analysis.min_client_requests`` counts generations only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from deployctl.config import DeployConfig
from deployctl.config.layout import network_address, service_port

# Client errors that count against a release (analysis' 4xx share): a route or model the release does not know
# (404: e.g. a changed model.served_name), a body it refuses (400, 422). Not 401/403/429: the client's key or the
# router's limiter decided those, whatever the release.
CLIENT_ERRORS = frozenset({400, 404, 422})

# The OpenAI-compatible generation routes (POST): the bundled runtime serves these two
# (runtime/deployctl_runtime/server/app.py), as do vLLM, SGLang and transformers serve.
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions")


@dataclass
class HostCount:
    """One host's client requests in a window: ``requests`` (every route), ``errors`` (5xx among them),
    ``generations`` (POSTs of GENERATION_ROUTES among them), ``client_errors`` (CLIENT_ERRORS among them)."""

    requests: int = 0
    errors: int = 0
    generations: int = 0
    client_errors: int = 0


def upstream_map(cfg: DeployConfig) -> dict[str, str]:
    """``"address:port"`` (and ``":port"`` as a fallback key) -> host name, as nginx logs upstream_addr."""
    out: dict[str, str] = {}
    for h in cfg.hosts:
        port = service_port(cfg, h)
        out[f"{network_address(h)}:{port}"] = h.name
        out.setdefault(f":{port}", h.name)
    return out


def _split(v) -> list[str]:
    if v is None:
        return []
    # several attempts: "a:p, b:p"; an internal redirect adds " : "
    return [p.strip() for p in str(v).replace(" : ", ", ").split(",") if p.strip()]


def is_generation(rec: dict) -> bool:
    """The access-log record is a generation request (POST of a GENERATION_ROUTES path)."""
    uri = str(rec.get("uri") or "").rstrip("/")
    return str(rec.get("request_method") or "").upper() == "POST" and uri in GENERATION_ROUTES


def count_access_log(text: str, addr_to_host: dict[str, str]) -> dict[str, HostCount]:
    """Per host HostCount from JSON access log lines. Lines that are not JSON are skipped.

    Keys read: ``upstream_addr`` (``"a:p, b:p"`` when nginx tried several), ``upstream_status`` (one status per
    attempt), ``status``, ``request_method`` and ``uri``. A request that reached no upstream is not counted (it is
    the router's own answer), nor one marked ``probe`` (the X-Deployctl-Probe header of deployctl's own requests)."""
    counts: dict[str, HostCount] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("probe"):  # deployctl's own probe (X-Deployctl-Probe): not user traffic
            continue
        addrs = _split(rec.get("upstream_addr") or rec.get("upstream"))
        statuses = _split(rec.get("upstream_status"))
        final = str(rec.get("status", ""))
        generation = is_generation(rec)
        for i, addr in enumerate(addrs):
            host = addr_to_host.get(addr) or addr_to_host.get(":" + addr.rsplit(":", 1)[-1])
            if host is None:
                continue
            st = statuses[i] if i < len(statuses) else (final if i == len(addrs) - 1 else "502")
            c = counts.setdefault(host, HostCount())
            c.requests += 1
            c.generations += generation
            if not st.isdigit() or int(st) >= 500:
                c.errors += 1
            elif int(st) in CLIENT_ERRORS:
                c.client_errors += 1
    return counts
