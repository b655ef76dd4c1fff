"""The request-field table: every top-level field of OpenAI's chat and completions requests and of vLLM's extra
request fields, and what this server does with it. One home for the rule; `check_fields` applies it to a parsed
request and tests/runtime/server/test_field_table.py walks it.

- honoured: it changes the answer as documented (params.py, serving.py, tools.py).
- ignored: accepted, and it cannot change the answer here (`user`, `metadata`, `store`, ...).
- refused: 400 `unsupported_parameter` naming the field, unless the value is the field's `off` value (what a
  client sends to mean "not used", e.g. `echo: false`, `use_beam_search: false`, or what this server does anyway,
  e.g. `add_special_tokens: true` on completions): a value that would change the answer is never dropped.
null asks for nothing: a field of the table sent as null is answered as if it were absent (`without_nulls`;
OpenAI's and vLLM's optional fields are nullable, and the openai SDK sends None when a caller passes it through).
A field not in the table (or not for this endpoint) is unknown: 400 `unsupported_parameter` by default; with
--ignore-unknown-fields it is ignored with one warning per field name (vLLM's behaviour).
Keys of the option objects (stream_options, structured_outputs, response_format, response_format.json_schema)
follow the same rules under their dotted names: the model's own keys are honoured, the table lists the others
(e.g. "structured_outputs.whitespace_pattern"), any other is unknown, its dotted name in the error's `param`.
Keys inside each message and each tool likewise, by their indexed path ("messages[1].contnet" in `param`, the row
"messages[].name"): a misspelt key is 400, not a message the template renders without it. The known message keys
are given to the chat template as sent (`to the template`: the model's template decides what it shows, as in
transformers and vLLM), or refused, or ignored.
Sources: OpenAI's API reference (Create chat completion, Create completion); vLLM's protocol.py
(ChatCompletionRequest / CompletionRequest extra parameters, StreamOptions, StructuredOutputsParams).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Collection

from .errors import invalid

log = logging.getLogger("deployctl_runtime.server")

HONOURED, IGNORED, REFUSED, TEMPLATE = "honoured", "ignored", "refused", "to the template"
BOTH, CHAT, COMPLETIONS = "both", "chat", "completions"
_NO_OFF = object()


@dataclass(frozen=True)
class FieldRule:
    status: str  # HONOURED | IGNORED | REFUSED
    endpoints: str = BOTH  # BOTH | CHAT | COMPLETIONS
    why: str = ""  # refused: the message; ignored: why it changes nothing
    off: Any = _NO_OFF  # refused fields: this value is accepted (it asks for nothing)
    chat_off: Any = _NO_OFF  # the off value on chat, where it differs (add_special_tokens)

    def applies(self, chat: bool) -> bool:
        return self.endpoints == BOTH or self.endpoints == (CHAT if chat else COMPLETIONS)

    def off_value(self, chat: bool) -> Any:
        """The value that asks for nothing on this endpoint (_NO_OFF: none does)."""
        return self.chat_off if chat and self.chat_off is not _NO_OFF else self.off


def _h(endpoints: str = BOTH) -> FieldRule:
    return FieldRule(HONOURED, endpoints)


def _i(why: str, endpoints: str = BOTH) -> FieldRule:
    return FieldRule(IGNORED, endpoints, why)


def _r(why: str, endpoints: str = BOTH, off: Any = _NO_OFF, chat_off: Any = _NO_OFF) -> FieldRule:
    return FieldRule(REFUSED, endpoints, why, off, chat_off)


def _t(why: str) -> FieldRule:
    """A message key given to the chat template as sent: the model's template decides what it shows (as in
    transformers and vLLM)."""
    return FieldRule(TEMPLATE, CHAT, why)


FIELDS: dict[str, FieldRule] = {
    # OpenAI, both endpoints
    "model": _h(), "max_tokens": _h(), "max_completion_tokens": _h(), "temperature": _h(), "top_p": _h(),
    "n": _h(), "stop": _h(), "seed": _h(), "presence_penalty": _h(), "frequency_penalty": _h(),
    "logit_bias": _h(), "logprobs": _h(), "stream": _h(), "stream_options": _h(), "best_of": _h(),
    "response_format": _h(),
    "user": _i("an end-user id for abuse monitoring; it does not change the answer"),
    # OpenAI completions
    "prompt": _h(COMPLETIONS),
    "echo": _r("echo is not supported by this server", COMPLETIONS, off=False),
    "suffix": _r("suffix (insertion) is not supported by this server", COMPLETIONS),
    # OpenAI chat
    "messages": _h(CHAT), "top_logprobs": _h(CHAT), "tools": _h(CHAT), "tool_choice": _h(CHAT),
    "parallel_tool_calls": _h(CHAT), "modalities": _h(CHAT),  # ["text"] only (protocol.py)
    "metadata": _i("stored-completion tags; nothing is stored here", CHAT),
    "store": _i("OpenAI's stored completions; nothing is stored here, the answer is the same", CHAT),
    "service_tier": _i("a billing/latency tier; this server has one", CHAT),
    "prompt_cache_key": _i("a routing hint for OpenAI's prompt cache; the prefix cache here is automatic", CHAT),
    "safety_identifier": _i("an end-user id for abuse monitoring; it does not change the answer", CHAT),
    "functions": _r("the legacy 'functions' field is not supported; send 'tools'", CHAT),
    "function_call": _r("the legacy 'function_call' field is not supported; send 'tool_choice'", CHAT),
    "audio": _r("audio output is not supported by this server", CHAT),
    "prediction": _r("predicted outputs are not supported by this server", CHAT),
    "web_search_options": _r("web search is not supported by this server", CHAT),
    "reasoning_effort": _r("reasoning effort is not supported: the model is served without a reasoning parser",
                           CHAT),
    "verbosity": _r("verbosity is not supported by this server", CHAT),
    # vLLM extra fields, both endpoints
    "top_k": _h(), "min_tokens": _h(), "repetition_penalty": _h(), "ignore_eos": _h(), "return_token_ids": _h(),
    "stop_token_ids": _h(), "guided_json": _h(), "guided_regex": _h(), "guided_choice": _h(),
    "guided_grammar": _h(), "structured_outputs": _h(),
    "guided_decoding_backend": _i("one backend here (llguidance) enforces every grammar"),
    "min_p": _h(), "skip_special_tokens": _h(), "include_stop_str_in_output": _h(),
    "truncate_prompt_tokens": _h(),  # the prompt's last k tokens (serving._truncate)
    "return_tokens_as_token_ids": _h(),  # logprobs' tokens as "token_id:<id>" (responses.TokenIdNames)
    "request_id": _h(),  # the response's id, "cmpl-"/"chatcmpl-" + it, as vLLM (an X-Request-Id header wins)
    "use_beam_search": _r("beam search is not supported by this server", off=False),
    "length_penalty": _r("length_penalty applies to beam search, which is not supported", off=1.0),
    "spaces_between_special_tokens": _r("spaces_between_special_tokens is not supported by this server", off=True),
    "prompt_logprobs": _r("prompt logprobs are not supported by this server"),
    "allowed_token_ids": _r("allowed_token_ids is not supported; use logit_bias or a grammar (guided_*)"),
    "bad_words": _r("bad_words is not supported; use logit_bias", off=[]),
    "logits_processors": _r("custom logits processors are not supported by this server", off=[]),
    "guided_whitespace_pattern": _r("guided_whitespace_pattern is not supported by this server"),
    "structural_tag": _r("structural tags are not supported; use guided_grammar or structured_outputs"),
    "priority": _r("priority scheduling is not supported by this server", off=0),
    "cache_salt": _r("cache_salt is not supported: prefix-cache isolation per tenant is not available here"),
    "kv_transfer_params": _r("KV transfer (disaggregated prefill) is not supported by this server"),
    "vllm_xargs": _r("vllm_xargs is not supported by this server"),
    "mm_processor_kwargs": _r("multimodal inputs are not supported by this server"),
    "add_special_tokens": _r("add_special_tokens is not supported: completions add the tokenizer's special tokens "
                             "(true), chat leaves them to the template (false); the BOS comes once on every path",
                             off=True, chat_off=False),  # vLLM's defaults, and what this server does
    # vLLM extra fields, chat
    "add_generation_prompt": _h(CHAT), "chat_template_kwargs": _h(CHAT),
    "continue_final_message": _r("continue_final_message is not supported by this server", CHAT, off=False),
    "chat_template": _r("a request's own chat template is not supported; the model's template is used", CHAT),
    "documents": _r("documents (RAG) are not supported by this server", CHAT),
    "include_reasoning": _i("the model is served without a reasoning parser: there is no reasoning to include",
                            CHAT),
    # keys of the option objects beyond the ones their models declare (protocol.py)
    "stream_options.include_obfuscation": _r("stream obfuscation (random padding in stream events) is not supported "
                                             "by this server", off=False),
    "structured_outputs.disable_fallback": _i("one backend here (llguidance) enforces every grammar: there is no "
                                              "fallback to disable"),
    "structured_outputs.whitespace_pattern": _r("whitespace_pattern is not supported by this server"),
    "structured_outputs.disable_any_whitespace": _r("disable_any_whitespace is not supported by this server",
                                                    off=False),
    "structured_outputs.disable_additional_properties": _r("disable_additional_properties is not supported by this "
                                                           "server; set additionalProperties in the schema",
                                                           off=False),
    "structured_outputs.structural_tag": _r("structural tags are not supported; use grammar"),
    # keys inside each message and each tool beyond the ones protocol.py declares (role, content; type, function;
    # function.name/description/parameters/strict), by their path with the index as []: "messages[].name".
    # Sources: OpenAI's message params (ChatCompletion{User,Assistant,Tool,...}MessageParam) and vLLM's
    # CustomChatCompletionMessageParam (vllm/renderers/chat_utils/types.py, 0.33)
    "messages[].name": _t("the participant's name"), "messages[].tool_calls": _t("an assistant's tool calls"),
    "messages[].tool_call_id": _t("the call a tool message answers"),
    "messages[].reasoning": _t("vLLM: an earlier turn's reasoning, for interleaved thinking"),
    "messages[].reasoning_content": _t("vLLM's earlier name for reasoning"),
    "messages[].annotations": _i("URL citations of an earlier answer (echoed back from a response); the prompt is "
                                 "the message's content", CHAT),
    "messages[].parsed": _i("the openai SDK's parsed copy of the content (chat.completions.parse, echoed back); the "
                            "prompt is the message's content", CHAT),
    "messages[].refusal": _r("an assistant message's refusal is not supported; put its text in 'content'", CHAT),
    "messages[].function_call": _r("the legacy 'function_call' of a message is not supported; send 'tool_calls'",
                                   CHAT),
    "messages[].audio": _r("audio in a message is not supported by this server", CHAT),
    "messages[].tools": _r("tools on a message are not supported; send the request's 'tools'", CHAT),
    "messages[].task": _r("a message's task marker (vLLM, for DeepSeek V4) is not supported by this server", CHAT),
}
# POST /v1/responses (OpenAI's Responses API): its own fields, the same rules. The request becomes a chat request
# (responses_api.py), so what is honoured here is honoured by the chat path. Source: OpenAI's API reference
# (Create a model response) and the openai SDK's ResponseCreateParams.
RESPONSES_FIELDS: dict[str, FieldRule] = {
    "model": _h(), "input": _h(), "instructions": _h(), "max_output_tokens": _h(), "temperature": _h(),
    "top_p": _h(), "tools": _h(), "tool_choice": _h(), "parallel_tool_calls": _h(), "text": _h(), "stream": _h(),
    "store": _h(),  # kept in memory (bounded) for previous_response_id; false: not kept
    "previous_response_id": _h(),
    "text.format": _h(),
    "metadata": _i("tags echoed back in the response; they do not change the answer"),
    "user": _i("an end-user id for abuse monitoring; it does not change the answer"),
    "safety_identifier": _i("an end-user id for abuse monitoring; it does not change the answer"),
    "prompt_cache_key": _i("a routing hint for OpenAI's prompt cache; the prefix cache here is automatic"),
    "service_tier": _i("a billing/latency tier; this server has one"),
    "text.verbosity": _r("verbosity is not supported by this server"),
    "top_logprobs": _r("top_logprobs is not supported on /v1/responses; use /v1/chat/completions", off=0),
    "include": _r("include (extra output data such as logprobs) is not supported on /v1/responses", off=[]),
    "reasoning": _r("reasoning is not supported: the model is served without a reasoning parser"),
    "truncation": _r("truncation 'auto' is not supported; send input that fits", off="disabled"),
    "background": _r("background responses are not supported by this server", off=False),
    "conversation": _r("conversations are not supported by this server; send previous_response_id"),
    "prompt": _r("reusable prompt templates are not supported by this server; send input"),
    "max_tool_calls": _r("max_tool_calls is not supported by this server"),
    "stream_options": _r("stream_options is not supported on /v1/responses", off={}),
    "context_management": _r("context management (compaction) is not supported by this server"),
}
_INDEX = re.compile(r"\[\d+\]")
_warned: set[str] = set()
_WARN_AT_MOST = 256  # names warned about, per process: random names must not grow the log and memory without end


def without_nulls(body: Any, chat: bool, prefix: str = "", declared: tuple[str, ...] = (),
                  table: dict[str, FieldRule] | None = None) -> Any:
    """A parsed JSON body (or a nested options object at `prefix`, e.g. "stream_options.") without the keys the
    client sent as null that the table knows for this endpoint (or that are `declared` by the nested object's
    model): null asks for nothing. A name not in the table keeps its null, so it is still refused as unknown."""
    if not isinstance(body, dict):
        return body
    rules = FIELDS if table is None else table

    def known(name: str) -> bool:
        rule = rules.get(prefix + name)
        return name in declared or (rule is not None and rule.applies(chat))
    return {k: v for k, v in body.items() if v is not None or not known(k)}


def check_fields(sent: dict[str, Any], chat: bool, ignore_unknown: bool, top_level: Collection[str] = (), *,
                 endpoint: str | None = None, top_rows: bool = True, table: dict[str, FieldRule] | None = None
                 ) -> None:
    """Apply the table to the fields a client sent (name -> parsed value; the undeclared keys of option objects,
    messages and tools under their paths). ``top_level``: the names sent as keys of the body itself, which match
    only the table's top-level rows (a body key spelt "stream_options.include_obfuscation" is unknown, not that
    row), and none with ``top_rows`` False (/tokenize: its body keys are its own, the table's are for inference).
    ``table``: another endpoint's table (RESPONSES_FIELDS) instead of FIELDS.
    Raises APIError 400 `unsupported_parameter` naming the first refused or unknown field."""
    endpoint = endpoint or ("/v1/chat/completions" if chat else "/v1/completions")
    rules = FIELDS if table is None else table
    for name, value in sent.items():
        row = _INDEX.sub("[]", name)  # "messages[2].name" -> the row "messages[].name"
        top = name in top_level
        rule = None if top and (not top_rows or "." in name or "[" in name) else rules.get(row)
        if value is None and rule is not None and rule.applies(chat):
            continue  # null asks for nothing (a top-level null is gone already: without_nulls)
        if rule is None or not rule.applies(chat):
            if ignore_unknown:
                if row not in _warned and len(_warned) < _WARN_AT_MOST:
                    _warned.add(row)
                    log.warning("ignoring unknown request field %r on %s (--ignore-unknown-fields)%s", row,
                                endpoint, "; further unknown names are ignored without a word"
                                if len(_warned) == _WARN_AT_MOST else "")
                continue
            where = "" if rule is None else f" (it is a {rule.endpoints} field)"
            raise invalid(f"'{name}': unknown field for {endpoint}{where}; remove it (or start the server with "
                          "--ignore-unknown-fields to ignore unknown fields)", name, "unsupported_parameter")
        off = rule.off_value(chat)
        is_off = (off is not _NO_OFF and value == off
                  and isinstance(value, bool) == isinstance(off, bool))  # 0 is not False, 1.0 is not True
        if rule.status == REFUSED and not is_off:
            raise invalid(f"'{name}': {rule.why}", name, "unsupported_parameter")
