"""OpenAI-shaped API errors: `{"error": {"message", "type", "param", "code"}}` with an honest status code.

400 invalid_request_error (the client's fault, `param` names the field), 401 authentication_error, 404 not_found_error
(unknown model or route), 429 rate_limit_error (queue full, with Retry-After), 503 service_unavailable (loading or
draining, with Retry-After), 500 internal_error only for our own faults.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class APIError(Exception):
    """An error answered to the client; `headers` carries e.g. Retry-After."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """400 invalid_request_error naming the field (`param`)."""
    return APIError(400, message, "invalid_request_error", param, code)


def unavailable(message: str, retry_after_s: int, code: str = "not_ready") -> APIError:
    """503 with Retry-After: the server is loading or draining; the client should retry elsewhere or later."""
    return APIError(503, message, "service_unavailable", None, code, {"Retry-After": str(retry_after_s)})


def queue_full(message: str, retry_after_s: int = 1) -> APIError:
    """429 with Retry-After: more requests are waiting than --max-queued-requests allows."""
    return APIError(429, message, "rate_limit_error", None, "queue_full", {"Retry-After": str(retry_after_s)})
