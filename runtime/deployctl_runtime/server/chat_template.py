"""Chat template rendering in a jinja2 sandbox (templates come with the model, so they are untrusted input).

The template is the `chat_template` string of the model's tokenizer_config.json, rendered as Hugging Face
transformers does: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception()`, `tojson`,
`strftime_now()`. A template that raises or fails is the request's problem when it calls `raise_exception`
(400), and ours otherwise (500 `chat_template_error` naming the exception, whatever its type).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import APIError, invalid


# Variables the server gives a render -> where they come from. A request's chat_template_kwargs may not set them.
SERVER_VARIABLES = {"messages": "the request's messages", "add_generation_prompt": "the request's field of that name",
                    "tools": "the request's tools field", "bos_token": "the model's tokenizer",
                    "eos_token": "the model's tokenizer", "raise_exception": "the renderer (a template function)",
                    "strftime_now": "the renderer (a template function)"}


class TemplateRaised(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template. Raises ValueError at construction when the template does not compile."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self._bos = bos_token or ""
        self._eos = eos_token or ""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """Render the prompt text. Raises APIError 400 when the template rejects the conversation."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
                **extra,
            )
        except TemplateRaised as exc:
            raise invalid(f"the model's chat template rejected the messages: {exc}", "messages") from None
        except Exception as exc:  # noqa: BLE001 - TemplateError, or a TypeError/KeyError/... of the template's own
            raise APIError(500, f"the model's chat template failed on these messages: {type(exc).__name__}: {exc}",
                           "internal_error", None, "chat_template_error") from None


def render_chat(template: ChatTemplate, messages: list[Any], add_generation_prompt: bool,
                chat_template_kwargs: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> str:
    """The prompt text of a chat request (/v1/chat/completions and /tokenize alike): ``messages`` (protocol's
    ChatMessage, each by its template_dict), the request's ``chat_template_kwargs`` and its ``tools`` as the
    template sees them (None: left undefined). Raises APIError 400 when chat_template_kwargs sets a variable the
    server sets (SERVER_VARIABLES), or when the template does not show the tools (the prompt is the same with and
    without them), and as ChatTemplate.render does."""
    dicts = [m.template_dict() for m in messages]
    extra = dict(chat_template_kwargs or {})
    taken = next((k for k in SERVER_VARIABLES if k in extra), None)
    if taken is not None:
        raise invalid(f"'chat_template_kwargs.{taken}': the server sets {taken} for the chat template (from "
                      f"{SERVER_VARIABLES[taken]}); remove it from chat_template_kwargs",
                      f"chat_template_kwargs.{taken}", "invalid_value")
    text = template.render(dicts, add_generation_prompt, **extra, **({} if tools is None else {"tools": tools}))
    # does the template show the tools? Compared with a render without them: `tools` left undefined, as for a
    # request without tools (a template guarded by `tools is defined` must not see tools=None)
    if tools is not None and text == template.render(dicts, add_generation_prompt, **extra):
        raise invalid("'tools': this model's chat template does not show tools to the model (the prompt is the "
                      "same with and without them); serve a model whose template renders `tools`, or describe "
                      "the functions in the messages", "tools", "unsupported_parameter")
    return text
