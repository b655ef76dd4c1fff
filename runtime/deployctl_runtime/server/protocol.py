"""Request and response models of the OpenAI-compatible API (pydantic v2).

Requests are parsed in strict JSON mode: wrong types and impossible values raise `APIError` 400 with `param` naming
the field (`parse_request`). Top-level fields the models do not declare are kept (`model_extra`) for the field
table (fields.py), which honours, ignores or refuses every field by name. A field sent as null is parsed as if it
were absent (fields.without_nulls), at the top level and inside the option objects (`_Options`). Responses are plain
dicts built in `serving`. The models of one message and one tool: messages.py.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import APIError, invalid
from .fields import without_nulls
from .messages import ChatMessage, Tool, inner_extras

MAX_N = 64
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"  # a request id: the X-Request-Id header's and the body's


class _CrossFieldError(ValueError):
    """A rule over several fields (model validator); `param` names the field the client should change."""

    def __init__(self, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Options(BaseModel):
    """A request's option object (stream_options, structured_outputs, response_format[.json_schema]): its keys sent
    as null are absent; the keys it does not declare are kept for the field table under their dotted names
    (`extras`). `path` is where it sits in the request."""

    model_config = ConfigDict(extra="allow", strict=True)
    path: ClassVar[str] = ""

    def extras(self) -> dict[str, Any]:
        out = {f"{self.path}.{k}": v for k, v in (self.model_extra or {}).items()}
        for name in self.model_fields_set:
            value = getattr(self, name)
            if isinstance(value, _Options):
                out.update(value.extras())
        return out

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        declared = tuple(f.alias or name for name, f in cls.model_fields.items())
        return without_nulls(data, True, cls.path + ".", declared)


class StreamOptions(_Options):
    path: ClassVar[str] = "stream_options"
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension: usage in every chunk


class JSONSchemaFormat(_Options):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)
    path: ClassVar[str] = "response_format.json_schema"
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Options):
    path: ClassVar[str] = "response_format"
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise _CrossFieldError("response_format.json_schema",
                                   "response_format type json_schema needs json_schema.schema")
        return self


class StructuredOutputsRequest(_Options):
    """vLLM's `structured_outputs` object: exactly one of json, regex, choice, grammar, json_object."""

    path: ClassVar[str] = "structured_outputs"

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions. Types are checked here; values by the one
    validator the offline API uses too (SamplingParams.validate), so both refuse the same with the same message.
    Undeclared top-level fields are kept in `model_extra` for the field table (fields.py)."""

    model_config = ConfigDict(extra="allow", strict=True)
    chat: ClassVar[bool] = False

    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    user: str | None = None
    stream: bool = False
    return_token_ids: bool = False  # vLLM extension: each choice (and stream chunk) carries its token ids
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = None
    stop_token_ids: list[int] | None = None  # vLLM: stop at any of these token ids (checked against the vocabulary)
    guided_json: dict[str, Any] | str | None = None  # vLLM's guided decoding fields: the grammar path, structured.py
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    modalities: list[str] | None = None
    best_of: int | None = None  # on chat too (vLLM): it changes which answers come back, so never dropped
    request_id: Annotated[str, Field(pattern=REQUEST_ID_PATTERN)] | None = None  # vLLM: the response's id
    min_p: float | None = None  # vLLM: keep tokens with probability >= min_p x the most likely one's
    skip_special_tokens: bool = True  # vLLM: false shows special tokens (eos, chat markers) in the text
    include_stop_str_in_output: bool = False  # vLLM: the matched stop string (or stop token's text) stays
    truncate_prompt_tokens: int | None = None  # vLLM: keep the prompt's last k tokens (-1: max_model_len)
    return_tokens_as_token_ids: bool = False  # vLLM: logprobs name tokens "token_id:<id>"

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return without_nulls(data, cls.chat)

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of is not None:
            if self.best_of < self.n:
                raise _CrossFieldError("best_of", f"best_of ({self.best_of}) must be >= n ({self.n})")
            if self.best_of > MAX_N:
                raise _CrossFieldError("best_of", f"best_of must be at most {MAX_N}, got {self.best_of}")
            if self.stream and self.best_of > self.n:
                raise _CrossFieldError("best_of", "best_of > n cannot be streamed (the best choices are known only "
                                       "at the end); send stream false", "unsupported_parameter")
        return self

    @property
    def tokens_field(self) -> str:
        """The name the client gave the output-token bound: max_completion_tokens is copied into max_tokens below,
        and an error about it names what was sent."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @model_validator(mode="after")
    def _max_completion_tokens(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise _CrossFieldError("max_completion_tokens",
                                       "max_tokens and max_completion_tokens disagree; send one of them")
            self.max_tokens = self.max_completion_tokens
        return self

    @model_validator(mode="after")
    def _openai_strictness(self):
        if self.modalities and set(self.modalities) != {"text"}:
            raise _CrossFieldError("modalities", "only the text modality is supported by this server",
                                   "unsupported_parameter")
        if self.truncate_prompt_tokens is not None and not (self.truncate_prompt_tokens == -1
                                                             or self.truncate_prompt_tokens >= 1):
            raise _CrossFieldError("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 (the model's context "
                                   f"length) or an integer >= 1, got {self.truncate_prompt_tokens}")
        if self.stream_options is not None and not self.stream:
            raise _CrossFieldError("stream_options", "stream_options is only allowed when stream is true")
        return self

    def sent_fields(self) -> dict[str, Any]:
        """The fields the client sent (declared or not), name -> parsed value, for fields.check_fields: the top
        level's, and the option objects' undeclared keys as "parent.key"."""
        out = {k: getattr(self, k) for k in self.model_fields_set if k in type(self).model_fields}
        out.update(self.model_extra or {})
        for value in list(out.values()):
            if isinstance(value, _Options):
                out.update(value.extras())
        return out

    @property
    def top_level_names(self) -> set[str]:
        """The keys of the request body itself (declared or not), for fields.check_fields."""
        return set(self.model_fields_set) | set(self.model_extra or {})

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None

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



class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: dict[str, str]


class ChatCompletionRequest(_SamplingFields):
    chat: ClassVar[bool] = True
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM: extra variables for the chat template

    def sent_fields(self) -> dict[str, Any]:
        """As the base's, with the undeclared keys of each message and tool under their indexed paths
        ("messages[1].name", "tools[0].function.strict_mode"), for the table's "messages[]." and "tools[]." rows."""
        return {**super().sent_fields(), **inner_extras(self.messages, self.tools)}

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise _CrossFieldError("top_logprobs", "top_logprobs requires logprobs to be true")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise _CrossFieldError("tool_choice", "tool_choice is only allowed when tools are given")
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
            raise invalid(f"'{cross.param}': {cross}", cross.param, cross.code) from None
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
