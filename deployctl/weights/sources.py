"""model.source -> a fetch plan: the manifest text and, per file of it, a URL the host GETs with plain HTTP.

- ``s3://bucket/prefix``: boto3 on the operator's machine lists the prefix (sizes) and presigns one GET URL per
  file (``generate_presigned_url``, SigV4 query signing, valid ``model.s3.url_expiry_s``). The credentials stay
  on the operator's machine, read from the environment variables model.s3 names; the hosts only see URLs, which
  allow GETs of those objects until they expire. S3 honours Range on presigned GETs, so a host resumes by Range.
- ``https://host/prefix/``: ``prefix/manifest.sha256`` lists the files; a HEAD per file gives its size.
- ``hf://org/name@revision``: huggingface_hub lists the files at that revision (sizes) and builds each file's
  resolve URL (``hf_hub_url``), at ``HF_ENDPOINT`` when set (a mirror); the repository must carry
  manifest.sha256. A gated repo's token is not sent to the hosts: such repos need a mirror or the s3/https forms.

Raises ConfigError naming the source and the fix (missing credentials, no manifest, a listed file absent).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from deployctl.config.models import ModelConfig
from deployctl.errors import ConfigError
from deployctl.hostscripts.weights import MANIFEST_NAME


@dataclass(frozen=True)
class FetchPlan:
    """What every host fetches: ``files`` [{path, url, sha256, size (bytes)}], the manifest's text and sha256."""

    source: str
    version: str
    manifest: str
    files: list = field(default_factory=list)

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.manifest.encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files)


def parse_manifest(text: str, where: str) -> dict:
    """{relative path: sha256} from sha256sum-format text. Raises ConfigError naming the line."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, _, name = line.partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name
        if len(digest) != 64 or not name or name.startswith("/") or ".." in name.split("/"):
            raise ConfigError(f"{where}:{n}: not a sha256sum line ({line[:80]!r})",
                              fix="write the manifest with `deployctl manifest MODEL_DIR` and upload it")
        out[name] = digest.lower()
    if not out:
        raise ConfigError(f"{where} lists no files", fix="write it with `deployctl manifest MODEL_DIR`")
    return out


def s3_client(model: ModelConfig, env: Mapping[str, str]):
    import boto3  # lazy: only s3 sources need it (pip install 'deployctl[s3]')
    from botocore.config import Config

    s3 = model.s3
    key, secret = env.get(s3.access_key_env), env.get(s3.secret_key_env)
    if not key or not secret:
        raise ConfigError(f"model.source {model.source} needs S3 credentials: ${s3.access_key_env} and "
                          f"${s3.secret_key_env} are not both set",
                          fix=f"export {s3.access_key_env} and {s3.secret_key_env} (or name other variables in "
                              "model.s3.access_key_env / secret_key_env); they never go in deploy.yaml")
    return boto3.client("s3", endpoint_url=s3.endpoint, region_name=s3.region, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=env.get(s3.session_token_env) or None,
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))


def _plan_s3(model: ModelConfig, env: Mapping[str, str]) -> FetchPlan:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = model.source[5:].partition("/")
    prefix = prefix.strip("/")
    key_of = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
    client = s3_client(model, env)
    try:
        manifest = client.get_object(Bucket=bucket, Key=key_of(MANIFEST_NAME))["Body"].read().decode()
        sizes = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_of("")):
            for obj in page.get("Contents", []):
                sizes[obj["Key"]] = obj["Size"]
    except (ClientError, BotoCoreError) as exc:
        raise ConfigError(f"model.source {model.source}: {exc}",
                          fix=f"check the bucket, {MANIFEST_NAME} under the prefix, model.s3.endpoint and the "
                              "credentials") from None
    files = []
    for rel, digest in parse_manifest(manifest, f"{model.source}/{MANIFEST_NAME}").items():
        if key_of(rel) not in sizes:
            raise ConfigError(f"{model.source}/{MANIFEST_NAME} lists {rel} but the bucket has no {key_of(rel)}",
                              fix="upload the whole model directory with its manifest")
        url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key_of(rel)},
                                            ExpiresIn=model.s3.url_expiry_s)
        files.append({"path": rel, "url": url, "sha256": digest, "size": sizes[key_of(rel)]})
    return FetchPlan(model.source, model.version, manifest, files)


def _plan_https(model: ModelConfig) -> FetchPlan:
    import httpx

    base = model.source if model.source.endswith("/") else model.source + "/"
    try:
        with httpx.Client(timeout=30, follow_redirects=True) as client:
            resp = client.get(base + MANIFEST_NAME)
            resp.raise_for_status()
            manifest = resp.text
            files = []
            for rel, digest in parse_manifest(manifest, base + MANIFEST_NAME).items():
                head = client.head(base + rel)
                head.raise_for_status()
                files.append({"path": rel, "url": base + rel, "sha256": digest,
                              "size": int(head.headers["content-length"])})
    except httpx.HTTPError as exc:
        raise ConfigError(f"model.source {model.source}: {exc}",
                          fix=f"serve the model directory with its {MANIFEST_NAME} at that URL") from None
    return FetchPlan(model.source, model.version, manifest, files)


def _plan_hf(model: ModelConfig, env: Mapping[str, str]) -> FetchPlan:
    from huggingface_hub import HfApi, hf_hub_download, hf_hub_url

    repo, _, revision = model.source[5:].partition("@")
    revision = revision or "main"
    endpoint = env.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
        manifest = open(hf_hub_download(repo, MANIFEST_NAME, revision=revision, endpoint=endpoint)).read()
    except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many kinds; all mean the same to the operator
        raise ConfigError(f"model.source {model.source}: {exc}",
                          fix=f"check the repo and revision (HF_ENDPOINT for a mirror) and that it has {MANIFEST_NAME}"
                          ) from None
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    files = [{"path": rel, "url": hf_hub_url(repo, rel, revision=revision, endpoint=endpoint), "sha256": digest,
              "size": sizes[rel]} for rel, digest in parse_manifest(manifest, f"{model.source}/{MANIFEST_NAME}").items()]
    return FetchPlan(model.source, model.version, manifest, files)


def plan(model: ModelConfig, env: Optional[Mapping[str, str]] = None) -> FetchPlan:
    """The fetch plan of model.source at model.version. Raises ConfigError (see the module docstring)."""
    env = os.environ if env is None else env
    if not model.source:
        raise ConfigError("model.source is not set", fix="set model.source and model.version in deploy.yaml")
    if model.source.startswith("s3://"):
        return _plan_s3(model, env)
    if model.source.startswith("hf://"):
        return _plan_hf(model, env)
    return _plan_https(model)
