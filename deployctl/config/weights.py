"""``model.source`` and friends: where a model version's files come from and how many versions a host keeps
(issue 43; fetched by deployctl/weights/, on the host by deployctl/hostscripts/fetch.py)."""
from __future__ import annotations

import re
from typing import Optional

from pydantic import Field, field_validator

from deployctl.config.fields import _Frozen

SOURCE_PATTERN = r"^(s3://[a-z0-9][a-z0-9.-]{1,62}(/.*)?|https?://[^\s]+|hf://[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?)$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class S3Config(_Frozen):
    endpoint: Optional[str] = Field(None, description=(
        "The S3-compatible endpoint URL (MinIO, Ceph RGW, R2, ...); None: AWS's own. Example: http://minio:9000"))
    region: str = Field("us-east-1", description="The bucket's region, used in the request signature (SigV4).")
    access_key_env: str = Field("AWS_ACCESS_KEY_ID", pattern=ENV_NAME, description=(
        "The environment variable on the operator's machine that holds the access key id; the key itself is never "
        "in deploy.yaml, a log, or on the hosts (the hosts get presigned URLs)."))
    secret_key_env: str = Field("AWS_SECRET_ACCESS_KEY", pattern=ENV_NAME, description=(
        "The environment variable that holds the secret access key."))
    session_token_env: str = Field("AWS_SESSION_TOKEN", pattern=ENV_NAME, description=(
        "The environment variable that holds a session token, when the credentials are temporary (read if set)."))
    url_expiry_s: int = Field(6 * 3600, ge=60, le=7 * 86400, description=(
        "How long a presigned URL stays valid, seconds; at most 7 days (SigV4's limit). It must outlast the "
        "slowest host's fetch."))


def version_ok(v: Optional[str]) -> Optional[str]:
    if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", v):
        raise ValueError(f"model.version {v!r} must be letters, digits and ._+- (it names a directory on each host)")
    return v


class WeightsFields(_Frozen):
    """Mixed into ModelConfig: the fields of model: that deal with fetching versions."""

    source: Optional[str] = Field(None, pattern=SOURCE_PATTERN, description=(
        "Where the model's files come from: s3://bucket/prefix, https://host/prefix/ (a file server; "
        "prefix/manifest.sha256 lists the files), or hf://org/name@revision. Set with model.version; each host "
        "fetches into model.store/<name>/<version>/ and model.path becomes that directory."))
    version: Optional[str] = Field(None, description=(
        "The model version deployed (a directory name on each host; the release record names it)."))
    store: str = Field("/srv/models", description=(
        "The model store on each host: versions live in <store>/<name>/<version>/; a relative store lies under "
        "each host's deploy_root."))
    quantization: Optional[str] = Field(None, description=(
        "The weights' quantization as the release record names it (awq, gptq, fp8, ...); None: unquantized."))
    keep_versions: int = Field(2, ge=1, le=100, description=(
        "How many model versions a host keeps besides those the kept releases use; older ones are pruned."))
    fetch_parallel_hosts: int = Field(4, ge=1, le=1024, description=(
        "How many hosts fetch at once (bounds the load on the source)."))
    peer_copy: bool = Field(False, description=(
        "Peer copy: one host fetches from the source, then every host that has the verified version serves it to "
        "the next ones (a one-shot HTTP server on its address, a random token in the URL, read-only, Range), so "
        "the source sends about one copy whatever the number of hosts. The hosts must reach each other's "
        "address on a free TCP port; a peer that fails falls back to the source."))
    s3: S3Config = Field(default_factory=S3Config, description="How to reach an s3:// source.")

    @field_validator("version")
    @classmethod
    def _check_version(cls, v: Optional[str]) -> Optional[str]:
        return version_ok(v)


def source_name(source: str) -> str:
    """The model's name in the store, from its source: the last path element (s3/https) or the repo name (hf)."""
    if source.startswith("hf://"):
        return source[5:].split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    rest = source.split("://", 1)[1].rstrip("/")
    tail = rest.split("/", 1)[1] if "/" in rest else rest
    return tail.rsplit("/", 1)[-1]
