"""Tool calling through the structured-output grammar.

The chat template is rendered with `tools` (as transformers does). The model's answer is then generated under a
grammar: a JSON array of calls `[{"name": <a tool's name>, "arguments": <its parameters schema>}, ...]`
(one call for a named tool_choice or parallel_tool_calls false), forced for tool_choice "required" or a named
function, and offered beside free text for "auto" (the default when tools are given): text that starts with "["
is a tool call, anything else is an answer. "none" renders the tools and generates text. The calls come back as
OpenAI `tool_calls` with finish_reason "tool_calls". Streamed, a call comes in one `tool_calls` delta once its JSON
is complete (responses.py). A forced call cut by max_tokens comes back as the calls so far (`parse_truncated`),
finish_reason "length".
"""
from __future__ import annotations

import json
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
    forced: str | None = None  # the function a named tool_choice forces

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
        """The calls of a forced tool call (required / named) cut by max_tokens, at any point: each call whose
        function is known (the named one; for required, the one tool whose name the generated part of the name
        starts), with its `arguments` as far as they got ("" when the cut came before them; the last one is not
        valid JSON), as OpenAI returns them with finish_reason "length". [] when the cut came before any function
        was known; None when the mode allows plain text (auto, none)."""
        if self.kind not in ("required", "named"):
            return None
        out = []
        for name, args in _cut_calls(text) or [("", "")]:  # cut at "[" or before: the first call had begun
            known = [self.forced] if self.forced else [n for n in self.names if n.startswith(name)]
            if len(known) != 1 or not known[0].startswith(name):
                break  # the name is not decided yet (or not one of the tools: nothing under the grammar)
            out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                        "function": {"name": known[0], "arguments": args}})
        return out


_CALL_HEAD, _ARGS_KEY = '{"name":"', ',"arguments":'  # the grammar's call layout: no whitespace (_call_schema)


def _cut_calls(text: str) -> list[tuple[str, str]]:
    """(the name as far as generated, the arguments as far as generated) of each call of a forced tool call's text
    `[{"name":"N","arguments":{...}},...]` cut anywhere. Arguments that came out whole are shown as parse() shows
    them; cut ones as generated; "" before they began."""
    rest, out = text.lstrip().removeprefix("["), []
    while rest:
        if not _CALL_HEAD.startswith(rest[:len(_CALL_HEAD)]):
            break  # not a call (cannot happen under the grammar)
        name, quote, rest = rest[len(_CALL_HEAD):].partition('"')
        if not quote or len(rest) <= len(_ARGS_KEY):  # cut in the name, or before the arguments began
            out.append((name, ""))
            break
        rest = rest[len(_ARGS_KEY):]
        try:
            args, end = json.JSONDecoder().raw_decode(rest)
        except ValueError:  # cut inside the arguments
            out.append((name, rest))
            break
        out.append((name, json.dumps(args, ensure_ascii=False)))
        rest = rest[end:].removeprefix("}")
        if not rest.startswith(","):
            break
        rest = rest[1:]
    return out


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
    template_tools = [t.template_dict() for t in req.tools]
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
        return ToolMode("named", names, StructuredOutputsParams(json=schema), template_tools, name)
    schema = _call_schema(req.tools, one=not req.parallel_tool_calls)
    if choice == "required":
        return ToolMode("required", names, StructuredOutputsParams(json=schema), template_tools)
    lark = f"start: calls | text\ncalls: %json {json.dumps(schema)}\ntext: /[^\\[][\\s\\S]*/\n"
    return ToolMode("auto", names, StructuredOutputsParams(lark=lark), template_tools)
