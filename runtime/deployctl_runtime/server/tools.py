"""Tool calling through the structured-output grammar.

The chat template is rendered with `tools` (as transformers does). The model's answer is then generated under a
grammar: a JSON array of calls `[{"name": <a tool's name>, "arguments": <its parameters schema>}, ...]`
(one call for a named tool_choice or parallel_tool_calls false), forced for tool_choice "required" or a named
function, and offered beside free text for "auto" (the default when tools are given): text that starts with "["
is a tool call, anything else is an answer. "none" renders the tools and generates text. The calls come back as
OpenAI `tool_calls` with finish_reason "tool_calls". Streamed, a call comes in one `tool_calls` delta once its JSON
is complete (responses.py).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from deployctl_runtime.sampling_params import StructuredOutputsParams

from .errors import invalid

_NO_WHITESPACE = {"x-guidance": {"whitespace_flexible": False}}


@dataclass
class ToolMode:
    kind: str  # none | auto | required | named
    names: list[str]
    spec: StructuredOutputsParams | None
    template_tools: list[dict[str, Any]]

    def parse(self, text: str) -> list[dict[str, Any]] | None:
        """OpenAI tool_calls from the generated text, or None when it is a plain answer (or cut off)."""
        if self.kind == "none" or not text.lstrip().startswith("["):
            return None
        try:
            calls = json.loads(text)
        except ValueError:
            return None
        if not isinstance(calls, list) or not calls:
            return None
        out = []
        for call in calls:
            if not isinstance(call, dict) or call.get("name") not in self.names:
                return None
            out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                        "function": {"name": call["name"],
                                     "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False)}})
        return out


    def parse_truncated(self, text: str) -> list[dict[str, Any]] | None:
        """The calls of a forced tool call (required / named) cut by max_tokens: each call whose name was generated,
        its `arguments` as far as they got (the last one is not valid JSON), as OpenAI returns them with
        finish_reason "length". None when not even a name came out (or the mode allows plain text)."""
        if self.kind not in ("required", "named") or not text.lstrip().startswith("["):
            return None
        starts = [m for m in _CALL_START.finditer(text) if m.group(1) in self.names]
        if not starts:
            return None
        out = []
        for i, m in enumerate(starts):
            if i + 1 < len(starts):  # a complete call: `{...}},` up to the next call's start
                args = text[m.end():starts[i + 1].start()].rstrip().removesuffix(",").rstrip().removesuffix("}")
            else:
                args = text[m.end():]
                try:  # the arguments came out whole (only the closing brackets are missing): as parse() shows them
                    args = json.dumps(json.JSONDecoder().raw_decode(args)[0], ensure_ascii=False)
                except ValueError:
                    pass
            out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                        "function": {"name": m.group(1), "arguments": args}})
        return out


_CALL_START = re.compile(r'\{"name":"([A-Za-z0-9_-]{1,64})","arguments":')


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists properties and says nothing about
    others: argument keys the tool does not name are never generated (clients' schemas, e.g. LangChain's from a
    Python signature, leave it open, and a grammar would then let a model ramble in extra keys)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _call_schema(tools, one: bool) -> dict[str, Any]:
    items = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                               "arguments": _closed(t.function.parameters or {"type": "object"})},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else
                              {"anyOf": items}, **_NO_WHITESPACE}
    if one:
        schema["maxItems"] = 1
    return schema


def tool_mode(req: Any) -> ToolMode | None:
    """The tool mode of a chat request, or None without tools. Raises APIError 400 naming the field."""
    if not req.tools:
        return None
    names = [t.function.name for t in req.tools]
    template_tools = [t.model_dump(exclude_none=True) for t in req.tools]
    choice = req.tool_choice or "auto"
    if choice == "none":
        return ToolMode("none", names, None, template_tools)
    if not isinstance(choice, str):
        name = choice.function.get("name")
        chosen = [t for t in req.tools if t.function.name == name]
        if not chosen:
            raise invalid(f"'tool_choice': function {name!r} is not one of the tools ({', '.join(names)})",
                          "tool_choice")
        schema = _call_schema(chosen, one=True)
        return ToolMode("named", names, StructuredOutputsParams(json=schema), template_tools)
    schema = _call_schema(req.tools, one=not req.parallel_tool_calls)
    if choice == "required":
        return ToolMode("required", names, StructuredOutputsParams(json=schema), template_tools)
    lark = f"start: calls | text\ncalls: %json {json.dumps(schema)}\ntext: /[^\\[][\\s\\S]*/\n"
    return ToolMode("auto", names, StructuredOutputsParams(lark=lark), template_tools)
