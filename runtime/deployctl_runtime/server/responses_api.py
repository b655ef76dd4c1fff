"""POST /v1/responses (OpenAI's Responses API): the request, turned into a chat-completions request, and the store
of earlier responses for `previous_response_id`.

One path serves both APIs: a Responses request is checked against its own field table (fields.RESPONSES_FIELDS:
honoured, ignored or refused, never dropped), then translated into the chat request it means and prepared by
serving.prepare, so sampling, the chat template, grammars (`text.format`) and tool calls have one home. Errors the
chat path raises name the Responses field the client sent (`max_output_tokens`, `input`, `text.format`, ...).

Translation (OpenAI's API reference, "Create a model response"; the openai SDK's ResponseInputItemParam):
- `instructions` -> a leading system message (not carried over by `previous_response_id`, as OpenAI documents);
- `input` a string -> one user message; a list of items -> messages: `{"role", "content"}` messages (`type`
  "message"; content a string or input_text / output_text parts), `function_call` items -> an assistant message's
  `tool_calls`, `function_call_output` items -> tool messages;
- `max_output_tokens` -> max_tokens; `temperature`, `top_p`, `parallel_tool_calls` as they are;
- `tools` (function tools: `{"type": "function", "name", "description", "parameters", "strict"}`) -> chat tools;
  `tool_choice` "none" / "auto" / "required" / `{"type": "function", "name"}`;
- `text.format` `{"type": "text" | "json_object" | "json_schema", "name", "schema", "strict", "description"}` ->
  response_format.
`previous_response_id`: the conversation of a stored response (its messages and its output) comes before `input`.
`store` (default true, as OpenAI): a completed response is kept in memory, at most MAX_STORED_RESPONSES (the oldest
go first); an unknown or forgotten id is 404 `previous_response_not_found` naming the field.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from .errors import APIError, invalid
from .fields import RESPONSES_FIELDS, check_fields, without_nulls

MAX_STORED_RESPONSES = 256  # conversations kept for previous_response_id, the oldest forgotten first
ENDPOINT = "/v1/responses"
_ITEM_KEYS = {"message": {"type", "role", "content", "id", "status"},
              "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
              "function_call_output": {"type", "call_id", "output", "id", "status"}}
_PART_KEYS = {"type", "text", "annotations", "logprobs"}
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
_FORMAT_KEYS = {"type", "name", "schema", "strict", "description"}
# a chat field in an error -> the Responses field the client sent
_PARAM = [(re.compile(r"^max_(completion_)?tokens"), "max_output_tokens"), (re.compile(r"^messages"), "input"),
          (re.compile(r"^response_format(\.json_schema)?"), "text.format"), (re.compile(r"\.function\."), ".")]
_WORDS = [("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
          ("'messages'", "'input'"), ("your messages", "your input"), ("response_format", "text.format")]


class ResponsesRequest(BaseModel):
    """The Responses fields this server reads (types checked here; the others are kept for the field table)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return without_nulls(data, True, table=RESPONSES_FIELDS)

    def sent_fields(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.model_fields_set if k in type(self).model_fields}
        out.update(self.model_extra or {})
        for key, value in (self.text or {}).items():
            out[f"text.{key}"] = value
        return out

    @property
    def top_level_names(self) -> set[str]:
        return set(self.model_fields_set) | set(self.model_extra or {})

    @property
    def text_format(self) -> dict[str, Any]:
        return (self.text or {}).get("format") or {"type": "text"}


class ResponseStore:
    """Stored responses, response id -> (the response object as answered, the conversation as chat messages: the
    request's, then its output), at most `capacity`, the least recently stored or used forgotten first. Thread-safe.
    Kept in this process's memory only: another replica or a restart does not have them (said in the 404)."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict[str, Any]], response: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._items[response_id] = (response or {}, messages)
            self._items.move_to_end(response_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def _entry(self, response_id: str):
        with self._lock:
            entry = self._items.get(response_id)
            if entry is not None:
                self._items.move_to_end(response_id)
            return entry

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation `response_id` ends, or None."""
        entry = self._entry(response_id)
        return None if entry is None else list(entry[1])

    def response(self, response_id: str) -> dict[str, Any]:
        """GET /v1/responses/{id}: the response object as it was answered. Raises APIError 404."""
        entry = self._entry(response_id)
        if entry is None:
            raise self._not_found(response_id)
        return entry[0]

    def delete(self, response_id: str) -> dict[str, Any]:
        """DELETE /v1/responses/{id}: forgets it (a later previous_response_id naming it is a 404). Raises APIError
        404."""
        with self._lock:
            if self._items.pop(response_id, None) is None:
                raise self._not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    def _not_found(self, response_id: str) -> APIError:
        return APIError(404, f"response {response_id!r} is not stored here: it was sent with store false, to another "
                        f"replica, before a restart, deleted, or it is older than the last {self.capacity} stored "
                        f"responses", "invalid_request_error", "response_id", "response_not_found")


def _check_keys(obj: dict[str, Any], allowed: set[str], path: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise invalid(f"'{path}.{extra[0]}': unknown field for {ENDPOINT}; remove it", f"{path}.{extra[0]}",
                      "unsupported_parameter")


def _content(content: Any, path: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"'{path}': must be a string or a list of input_text parts", path)
    parts = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise invalid(f"'{where}.type': {kind!r} parts are not supported; this server takes text "
                          "(input_text, output_text)", f"{where}.type", "unsupported_parameter")
        _check_keys(part, _PART_KEYS, where)
        if not isinstance(part.get("text"), str):
            raise invalid(f"'{where}.text': must be a string", f"{where}.text")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as chat messages (module doc). Raises APIError 400 naming the item (`input[2].type`)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        path = f"input[{i}]"
        kind = item.get("type", "message")
        if kind not in _ITEM_KEYS:
            raise invalid(f"'{path}.type': {kind!r} input items are not supported; send messages, function_call "
                          "and function_call_output items", f"{path}.type", "unsupported_parameter")
        _check_keys(item, _ITEM_KEYS[kind], path)
        if kind == "message":
            if item.get("role") not in ("user", "system", "developer", "assistant"):
                raise invalid(f"'{path}.role': must be user, system, developer or assistant, got {item.get('role')!r}",
                              f"{path}.role")
            out.append({"role": item["role"], "content": _content(item.get("content"), f"{path}.content")})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise invalid(f"'{path}.{key}': must be a string", f"{path}.{key}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)  # consecutive calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise invalid(f"'{path}': a function_call_output needs call_id and output (strings)", path)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        if tool.get("type") != "function":
            raise invalid(f"'{path}.type': {tool.get('type')!r} tools are not supported by this server; send "
                          "function tools", f"{path}.type", "unsupported_parameter")
        _check_keys(tool, _TOOL_KEYS, path)
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type" and v is not None}})
    return out


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise invalid("'tool_choice': send none, auto, required or {\"type\": \"function\", \"name\": ...}",
                      "tool_choice", "unsupported_parameter")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict):
        raise invalid("'text.format': must be an object with a type (text, json_object, json_schema)", "text.format")
    _check_keys(fmt, _FORMAT_KEYS, "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise invalid("'text.format.schema': a json_schema format needs its schema (an object)",
                          "text.format.schema")
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        schema.update({k: fmt[k] for k in ("strict", "description") if fmt.get(k) is not None})
        return {"type": "json_schema", "json_schema": schema}
    raise invalid(f"'text.format.type': must be text, json_object or json_schema, got {kind!r}", "text.format.type")


def parse(raw: bytes, ignore_unknown: bool) -> ResponsesRequest:
    """Parse and check a Responses request body. Raises APIError 400 naming the field."""
    from .protocol import parse_request

    req = parse_request(ResponsesRequest, raw)
    check_fields(req.sent_fields(), True, ignore_unknown, req.top_level_names, endpoint=ENDPOINT,
                 table=RESPONSES_FIELDS)
    return req


def history(req: ResponsesRequest, store: ResponseStore) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` names ([] without one). Raises APIError 404."""
    if req.previous_response_id is None:
        return []
    messages = store.get(req.previous_response_id)
    if messages is None:
        raise APIError(404, f"previous response {req.previous_response_id!r} is not stored here: it was sent with "
                       f"store false, to another replica, before a restart, or it is older than the last "
                       f"{store.capacity} stored responses; send the conversation in 'input' instead",
                       "invalid_request_error", "previous_response_id", "previous_response_not_found")
    return messages


def chat_body(req: ResponsesRequest, conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions request `req` means, after `conversation` (its input messages are its end)."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions is not None else [])
    body: dict[str, Any] = {"messages": messages + conversation, "stream": req.stream,
                            "parallel_tool_calls": req.parallel_tool_calls}
    for src, dst in (("model", "model"), ("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                     ("top_p", "top_p")):
        if getattr(req, src) is not None:
            body[dst] = getattr(req, src)
    if req.tools:
        body["tools"] = _tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    fmt = _response_format(req.text_format)
    if fmt is not None:
        body["response_format"] = fmt
    return body


def renamed(exc: APIError) -> APIError:
    """An error of the chat path, naming the Responses field the client sent."""
    param = exc.param
    if param is not None:
        for pattern, name in _PARAM:
            param = pattern.sub(name, param)
    message = exc.message
    for old, new in _WORDS:
        message = message.replace(old, new)
    return APIError(exc.status, message, exc.type, param, exc.code, exc.headers)


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages that continue its conversation."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                       "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    if calls:
        return [{"role": "assistant", "content": None, "tool_calls": calls}]
    return [{"role": "assistant", "content": text}]


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).encode()
