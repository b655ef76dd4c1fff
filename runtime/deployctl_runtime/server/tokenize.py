"""POST /tokenize and /detokenize in vLLM's request and response shapes (vllm bench serve and others call them).

/tokenize {"prompt": str, "add_special_tokens": true} or {"messages": [...], "add_generation_prompt": true,
  "tools": [...], "chat_template_kwargs": {...}} -> {"count", "max_model_len", "tokens", "token_strs"} (token_strs
  with "return_token_strs": true, else null).
/detokenize {"tokens": [int]} -> {"prompt": str}. Same tokenization as inference (the BOS once, the chat template
rendered by the same function, tools and chat_template_kwargs included, so a count made here is the prompt_tokens
of the same chat request). The keys inside messages follow the field table (fields.py) as on the chat endpoint; a
body key /tokenize does not take is 400 naming it (ignored with a warning under --ignore-unknown-fields): it
used to be dropped, so `tools` sent here counted a prompt without them.
"""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployctl_runtime.tokenizer import encode_prompt

from .errors import APIError, invalid
from .chat_template import render_chat
from .fields import check_fields
from .messages import ChatMessage, Tool, inner_extras
from .protocol import _CrossFieldError, _Strict, parse_request
from .state import ServerContext


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def sent_fields(self) -> dict[str, Any]:
        """The undeclared keys: of the body (by name) and of its messages and tools (by path), for check_fields."""
        return {**(self.model_extra or {}), **inner_extras(self.messages, self.tools)}

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise _CrossFieldError("prompt", "send exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=0)]


def _check_model(ctx: ServerContext, model: str | None) -> None:
    if model is not None and model != ctx.served_name:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{ctx.served_name}'",
                       "not_found_error", "model", "model_not_found")


def tokenize_body(ctx: ServerContext, body: bytes) -> dict[str, Any]:
    req = parse_request(TokenizeRequest, body)
    _check_model(ctx, req.model)
    # every body key is declared: an undeclared one is unknown here, whatever the inference endpoints take
    check_fields(req.sent_fields(), True, ctx.cfg.ignore_unknown_fields, top_level=set(req.model_extra or {}),
                 endpoint="/tokenize", top_rows=False)
    if req.messages is not None:
        if ctx.chat_template is None:
            raise invalid("this model has no chat template; send prompt", "messages", "no_chat_template")
        text = render_chat(ctx.chat_template, req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                           None if req.tools is None else [t.template_dict() for t in req.tools])
        add = bool(req.add_special_tokens)  # chat default: the template decides (transformers)
    else:
        text = req.prompt
        add = req.add_special_tokens is not False
    if len(text) > ctx.max_model_len * max(ctx.max_token_chars, 1) * 4:
        raise invalid(f"the text is far longer than max_model_len {ctx.max_model_len} tokens", "prompt",
                      "context_length_exceeded")
    ids = encode_prompt(ctx.tokenizer, text, ctx.bos_token_id, add_special_tokens=add)
    strs = [ctx.token_bytes.text(t) for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids, "token_strs": strs}


def detokenize_body(ctx: ServerContext, body: bytes) -> dict[str, Any]:
    req = parse_request(DetokenizeRequest, body)
    _check_model(ctx, req.model)
    bad = next((t for t in req.tokens if t >= ctx.vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is out of range: the vocabulary has {ctx.vocab_size} tokens", "tokens",
                      "invalid_token_id")
    return {"prompt": ctx.tokenizer.decode(req.tokens, skip_special_tokens=False)}
