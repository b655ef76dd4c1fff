"""deploy.yaml ``router:``: nginx in front of the runtimes, its TLS and its limits (models only; rendered by
deployctl.render.edge and deployctl.render.release.render_nginx, checked by deployctl.preflight.certs).

Certificate thresholds (CERT_WARN_DAYS, CERT_FAIL_DAYS) are shared by preflight and the rendered expiry alerts:
30 days is when ACME clients such as certbot renew (a certificate still under 30 days means renewal failed at
least once), 7 days leaves a working week to fix it by hand.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

USER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$"  # a login name (POSIX portable, 32 characters)
# A path written unquoted into nginx.conf (no spaces, quotes, ; { } $ or #).
NGINX_PATH_PATTERN = r"^/[A-Za-z0-9_./+@:,=-]+$"
CERT_WARN_DAYS = 30
CERT_FAIL_DAYS = 7
# A DNS name or a wildcard for nginx's server_name and a certificate's SAN (RFC 1123 labels, one leading "*.").
_NAME = re.compile(r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class TlsConfig(_Frozen):
    """HTTPS at the router: nginx serves ``router.listen`` with TLS 1.2/1.3 and HTTP/2."""

    certificate: str = Field(pattern=NGINX_PATH_PATTERN)
    """PEM chain (leaf first) on the router host"""
    key: str = Field(pattern=NGINX_PATH_PATTERN)
    """PEM private key on the router host"""
    redirect_http: bool = False
    """plain HTTP on http_listen: true answers 308 to https://server_name (POST stays POST), false: nothing listens"""
    http_listen: int = Field(80, ge=1, le=65535)
    """Port of the plain-HTTP server that redirects to HTTPS (and serves ACME challenges)."""
    probe_job: str = Field("blackbox", pattern=r"^[A-Za-z0-9_:.-]{1,128}$")
    """the Prometheus job of the blackbox_exporter probing https://server_name (alert DeployctlCertificateExpiry*)"""


class LimitsConfig(_Frozen):
    """Per-client limits at the router (nginx limit_req / limit_conn). Over a limit: 429 in OpenAI's error shape
    with Retry-After."""

    key: Literal["remote_addr", "api_key"] = "remote_addr"
    """a client: its address, or its Authorization header (requests without one are not limited: nginx skips empty
    keys; the runtime answers them 401 when it has API keys)
    """
    requests_per_s: Optional[float] = Field(None, gt=0, le=100000)
    """limit_req rate per client"""
    burst: int = Field(0, ge=0, le=100000)
    """requests over the rate accepted at once before 429 (nodelay)"""
    connections: Optional[int] = Field(None, ge=1, le=100000)
    """limit_conn: open requests per client"""
    zone_size: str = Field("10m", pattern=r"^[1-9][0-9]{0,5}[km]$")
    """shared memory per zone (10m: ~160k clients)"""


class RouterConfig(_Frozen):
    kind: Literal["nginx"] = "nginx"
    """The router's software; only nginx."""
    host: str = "local"
    """a host name from hosts:, "local", or an address reached over SSH"""
    user: Optional[str] = Field(None, pattern=USER_PATTERN)
    """SSH user for the router host when host is an address, not a name from hosts:."""
    port: int = Field(22, ge=1, le=65535)
    """SSH port of the router host when host is an address."""
    ssh_key: Optional[str] = None
    """SSH private key for the router host when host is an address."""
    listen: int = Field(80, ge=1, le=65535)
    """Port nginx listens on for clients."""
    listen_address: Optional[str] = None
    """The address nginx listens on (e.g. 127.0.0.1); default: every address."""
    upstream_conf: str
    """Path of the nginx include file deployctl writes the upstream and split into."""
    nginx_conf: Optional[str] = None
    """main nginx.conf for `nginx -t -c`; default: nginx's own"""
    nginx_prefix: Optional[str] = None
    """`nginx -p`; default: nginx's own"""
    access_log: Optional[str] = None
    """JSON access log read by canary analysis"""
    server_name: Optional[str] = None
    """the name clients use (nginx server_name; required with tls)"""
    tls: Optional[TlsConfig] = None
    """TLS at the router: certificate, key and the HTTP redirect; default: plain HTTP."""
    max_conns_per_host: Optional[int] = Field(None, ge=1, le=100000)
    """nginx max_conns on every upstream server: requests beyond it on every host get 429 (deployctl bench --apply
    sets it below the measured knee)
    """
    retry_after_s: int = Field(1, ge=1, le=3600)
    """Retry-After of the router's 429s"""
    limits: Optional[LimitsConfig] = None
    """Per-client rate and connection limits at the router; default: none."""
    max_fails: int = Field(1, ge=0, le=100)
    """failover (deployctl.render.failover): a server that fails max_fails connects within fail_timeout_s is left out
    for fail_timeout_s; 0 never marks it down
    """
    fail_timeout_s: int = Field(10, ge=1, le=3600)
    """Seconds a server failing max_fails connects is left out."""
    keepalive_timeout_s: float = Field(60, gt=0, le=3600)
    """nginx's upstream keepalive_timeout: idle connections to the engines are closed after this; the engine's own
    keep-alive is rendered longer (deployctl.engines.keepalive)
    """

    def exposure(self) -> Optional[str]:
        """Where nginx publishes the service beyond loopback, as ``ADDRESS:PORT`` (``*:PORT ...`` when
        ``listen_address`` is unset: nginx's ``listen PORT`` takes every address), or None on loopback only."""
        if self.listen_address is None:
            return f"*:{self.listen} (every address; router.listen_address is unset)"
        if ipaddress.ip_address(self.listen_address).is_loopback:
            return None
        host = f"[{self.listen_address}]" if ":" in self.listen_address else self.listen_address
        return f"{host}:{self.listen}"

    @field_validator("listen_address")
    @classmethod
    def _ip_address(cls, v: Optional[str]) -> Optional[str]:
        # Written into nginx's `listen ADDRESS:PORT;`: anything but an IP address could add directives.
        if v is not None:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError("listen_address must be an IP address such as 127.0.0.1 or ::1") from None
        return v

    @field_validator("server_name")
    @classmethod
    def _dns_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (len(v) > 253 or not _NAME.match(v)):
            raise ValueError("server_name must be a DNS name such as llm.example.com (or *.example.com)")
        return v

    @model_validator(mode="after")
    def _tls_needs_name(self) -> "RouterConfig":
        if self.tls is not None and self.server_name is None:
            raise ValueError("router.tls needs router.server_name: the name clients connect to, which the "
                             "certificate must cover (e.g. server_name: llm.example.com)")
        if self.tls is not None and self.tls.redirect_http and self.tls.http_listen == self.listen:
            raise ValueError(f"router.tls.http_listen {self.tls.http_listen} is router.listen too; "
                             "plain HTTP needs its own port (usually 80, with listen 443)")
        return self
