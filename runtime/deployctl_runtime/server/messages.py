"""One chat message and one tool of a chat request (pydantic v2, strict): the keys the field table (fields.py)
gives to the chat template are declared with their types; the others are kept (``model_extra``) for the table's
"messages[]." and "tools[]." rows, by their indexed paths (``inner_extras``)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .fields import FIELDS


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. Anthropic-style cache_control: a hint, not the text
    type: Literal["text"]
    text: str


class ToolCallFunction(BaseModel):
    """An earlier assistant turn's call: ``arguments`` as OpenAI sends it (a JSON string), or an object (the
    Hugging Face convention). Other keys (the openai SDK's ``parsed_arguments``) are left out."""

    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str | dict[str, Any]


class ToolCallParam(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """One chat message. The keys the field table gives to the chat template ("messages[].name", ...: fields.py)
    are declared here with their types, so a malformed one is a 400 naming it, not the template's 500; the other
    keys are kept, checked against the table's "messages[]." rows and left out of the template unless it says so.
    Nulls are left out."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _content_given(cls, data: Any) -> Any:
        # OpenAI: content is required but on an assistant turn (its tool_calls may stand alone); a user message
        # without it was served as an empty prompt. A message with a key the table does not know (a misspelt
        # 'contnet') is left to the field table, whose 400 names that key.
        if (isinstance(data, dict) and data.get("content") is None and data.get("role") not in ("assistant", None)
                and all(k in cls.model_fields or f"messages[].{k}" in FIELDS for k in data)):
            raise PydanticCustomError("content_missing", "a {role} message needs 'content' (a string or text "
                                      "parts); it is missing or null", {"role": data["role"]})
        return data

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, part in enumerate(v):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    got = f"type {kind!r}" if kind != "text" else "a text part without a string 'text'"
                    raise PydanticCustomError(
                        "content_part", "part {i} is {got}: this server takes text parts only ({example}); send "
                        "images and audio to a multimodal server", {"i": i, "got": got,
                                                                     "example": '{"type": "text", "text": "..."}'})
        return v

    def template_dict(self) -> dict[str, Any]:
        """role, content (a string) and the declared keys the field table gives to the template; not the others
        (ignored rows, or unknown ones under --ignore-unknown-fields), not nulls."""
        d = self.model_dump(exclude_none=True, exclude=set(self.model_extra or {}))
        if isinstance(self.content, list):
            d["content"] = "".join(p.text for p in self.content)
        elif self.content is None:
            d["content"] = ""
        return d


class FunctionDef(BaseModel):
    """A tool's function; keys it does not declare are kept for the field table ("tools[].function.<key>")."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """One entry of `tools`; keys it does not declare are kept for the field table ("tools[].<key>")."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"]
    function: FunctionDef

    def template_dict(self) -> dict[str, Any]:
        """The tool as the chat template sees it: its declared keys, not nulls (other keys are unknown: refused, or
        ignored under --ignore-unknown-fields)."""
        d = self.model_dump(exclude_none=True, exclude=set(self.model_extra or {}))
        d["function"] = self.function.model_dump(exclude_none=True, exclude=set(self.function.model_extra or {}))
        return d


def inner_extras(messages: list[ChatMessage] | None, tools: list[Tool] | None) -> dict[str, Any]:
    """The undeclared keys of each message and tool under their indexed paths ("messages[1].name",
    "tools[0].function.strict_mode"), for the field table's "messages[]." and "tools[]." rows (fields.py)."""
    out: dict[str, Any] = {}
    for i, m in enumerate(messages or []):
        out.update({f"messages[{i}].{k}": v for k, v in (m.model_extra or {}).items()})
    for i, t in enumerate(tools or []):
        out.update({f"tools[{i}].{k}": v for k, v in (t.model_extra or {}).items()})
        out.update({f"tools[{i}].function.{k}": v for k, v in (t.function.model_extra or {}).items()})
    return out
