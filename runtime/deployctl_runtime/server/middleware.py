"""Outermost ASGI middleware: request id, release header, one access log line per inference request.

A trailing slash is dropped before routing and auth ("/v1/completions/" is "/v1/completions"): no redirect,
which would be built from the client's Host header. Every response carries `X-Request-Id` (the client's, when it
sent a sane one; else the body's vLLM `request_id` with the response id's prefix, serving.adopt_body_request_id)
and `X-Deployctl-Instance` (this process's instance id, made at start: GET /identity) and, with `--release-id`,
`X-Deployctl-Release`. The access log line has request id, method, path, status, prompt
and completion tokens, TTFT and total time, and the API key's id (auth.key_id, `-` without one); never prompt or
output text, never keys.
"""
from __future__ import annotations

import logging
import re
import time
import uuid

from .protocol import REQUEST_ID_PATTERN
from .serving import RequestRecord

access_log = logging.getLogger("deployctl_runtime.access")
_SANE_ID = re.compile(REQUEST_ID_PATTERN)


class RequestContextMiddleware:
    def __init__(self, app, release_id: str | None = None, instance_id: str | None = None):
        self.app = app
        self.release = release_id.encode() if release_id else None
        self.instance = instance_id.encode() if instance_id else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if len(path) > 1 and path.endswith("/"):  # answer like the twin route, never a redirect (C27)
            path = path.rstrip("/") or "/"
            scope = {**scope, "path": path, "raw_path": path.encode()}
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        prefix = ("chatcmpl-" if path.endswith("/chat/completions") else "resp_" if path.endswith("/responses")
                  else "cmpl-")
        from_header = bool(_SANE_ID.match(given))
        rec = RequestRecord(given if from_header else prefix + uuid.uuid4().hex, id_from_header=from_header)
        scope.setdefault("state", {})["record"] = rec
        status = {"code": 0}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                extra = [(b"x-request-id", rec.request_id.encode())]
                if self.instance:
                    extra.append((b"x-deployctl-instance", self.instance))
                if self.release:
                    extra.append((b"x-deployctl-release", self.release))
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            code = rec.status_override or status["code"] or 499
            level = logging.INFO if path.startswith("/v1/") else logging.DEBUG
            if access_log.isEnabledFor(level):
                ttft = f"{(rec.first_token_at - rec.arrival) * 1000:.1f}" if rec.first_token_at else "-"
                access_log.log(
                    level,
                    "request_id=%s method=%s path=%s status=%d prompt_tokens=%d completion_tokens=%d ttft_ms=%s "
                    "total_ms=%.1f finish=%s key_id=%s",
                    rec.request_id, scope.get("method"), path, code, rec.prompt_tokens, rec.completion_tokens, ttft,
                    (time.monotonic() - rec.arrival) * 1000, ",".join(rec.finish_reasons) or "-", rec.key_id or "-",
                )
