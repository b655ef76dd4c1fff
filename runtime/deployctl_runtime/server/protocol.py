"""Request and response models of the OpenAI-compatible API (pydantic v2).

Requests are parsed in strict JSON mode: unknown fields are ignored as OpenAI does, wrong types and impossible values
raise `APIError` 400 with `param` naming the field (`parse_request`). Responses are plain dicts built in `serving`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import APIError, invalid

MAX_N = 64
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20


class _CrossFieldError(ValueError):
    """A rule over several fields (model validator); `param` names the field the client should change."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions, with their allowed ranges."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] = 0
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    ignore_eos: bool = False
    user: str | None = None
    stream: bool = False
    return_token_ids: bool = False  # vLLM extension: each choice (and stream chunk) carries its token ids
    stream_options: StreamOptions | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v < -1:
            raise ValueError("must be -1 (off), 0 (off) or a positive integer")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return v

    @model_validator(mode="after")
    def _min_le_max(self):
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _CrossFieldError("min_tokens",
                                   f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        return self

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("must not be an empty list")
            if any(isinstance(p, list) and not p for p in v):
                raise ValueError("token id lists must not be empty")
            ids = [t for p in v for t in (p if isinstance(p, list) else [p]) if isinstance(t, int)]
            if any(t < 0 for t in ids):
                raise ValueError("token ids must be non-negative")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by this server")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat message; extra keys (name, tool_calls, ...) are kept and passed to the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def template_dict(self) -> dict[str, Any]:
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            d["content"] = "".join(p.text for p in self.content)
        elif self.content is None:
            d["content"] = ""
        return d


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _max_completion_tokens(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise _CrossFieldError("max_completion_tokens",
                                       "max_tokens and max_completion_tokens disagree; send one of them")
            self.max_tokens = self.max_completion_tokens
        return self


T = TypeVar("T", bound=BaseModel)


def _param(loc: tuple[Any, ...]) -> str | None:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "int", "list[str]", "list[int]", "list[list[int]]", "function-after[_prompt(), union]"):
            continue  # union member tags pydantic puts in the location
        elif isinstance(item, str) and ("[" in item or "(" in item):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def parse_request(model: type[T], raw: bytes) -> T:
    """Parse a JSON request body into `model`.

    Raises APIError 400 (invalid_request_error) naming the offending field in `param` for a body that is not a JSON
    object, a wrong type, or an impossible value.
    """
    try:
        return model.model_validate_json(raw or b"")
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        cross = (first.get("ctx") or {}).get("error")
        if isinstance(cross, _CrossFieldError):
            raise invalid(f"'{cross.param}': {cross}", cross.param, "invalid_value") from None
        if first["type"] in ("json_invalid", "json_type") or not first["loc"]:
            raise invalid(f"request body is not a valid JSON object: {first['msg']}", None, "invalid_json") from None
        # prefer the error of the union member whose type matched (pydantic lists one error per member)
        param = _param(tuple(first["loc"]))
        msg = first["msg"]
        if first["type"] == "missing":
            raise invalid(f"'{param}' is a required field", param, "missing_required_parameter") from None
        value = first.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else type(value).__name__
        raise invalid(f"'{param}': {msg} (got {shown})", param, "invalid_value") from None
