"""From a parsed OpenAI request to the engine's SamplingParams, through the validator the offline API uses too.

Every field that changes what an answer means ends up here or is refused by protocol.py: sampling knobs,
logit_bias, logprobs/top_logprobs, response_format (json_object / json_schema: a grammar enforced while decoding)
and tools/tool_choice (tools.py: the tool call is generated under a grammar). A ValueError of
SamplingParams.validate ("<field>: <why>") becomes a 400 whose `param` names the request's own field.
"""
from __future__ import annotations

from typing import Any

from deployctl_runtime.sampling_params import SamplingParams, StructuredOutputsParams
from deployctl_runtime.structured import grammar_for

from .errors import invalid
from .tools import ToolMode

_MAX_TOP_K = 2**63 - 1  # any k >= vocab keeps every token; larger ones overflow the sampler's int64 tensor
# SamplingParams field -> the request field a client sent, where they differ
_CHAT_PARAM = {"logprobs": "top_logprobs", "structured_outputs": "response_format"}


def structured_spec(req: Any, tools: ToolMode | None) -> StructuredOutputsParams | None:
    """The grammar a request asks for: tools (when a call is forced or allowed) win over response_format.
    Raises APIError 400 naming the field for a schema that cannot be used."""
    if tools is not None and tools.spec is not None:
        spec, param = tools.spec, "tools"
    else:
        rf = req.response_format
        if rf is None or rf.type == "text":
            return None
        spec = (StructuredOutputsParams(json_object=True) if rf.type == "json_object"
                else StructuredOutputsParams(json=rf.json_schema.schema_))
        param = "response_format" if rf.type == "json_object" else "response_format.json_schema.schema"
    try:
        grammar_for(spec)
    except ValueError as exc:
        raise invalid(f"'{param}': {exc}", param, "invalid_schema") from None
    return spec


def logit_bias(req: Any) -> dict[int, float]:
    out = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            out[int(key)] = value
        except ValueError:
            raise invalid(f"'logit_bias': keys must be token ids, got {key!r}", "logit_bias") from None
    return out


def build(req: Any, chat: bool, max_tokens: int, j: int, logprobs: int | None,
          structured: StructuredOutputsParams | None) -> SamplingParams:
    """SamplingParams for choice j of a request. Raises APIError 400 naming the field (same rule and message as
    SamplingParams.validate offline)."""
    sp = SamplingParams(
        max_tokens=max_tokens,  # an omitted max_tokens (the remaining context) never refuses min_tokens
        min_tokens=req.min_tokens if req.max_tokens is not None else min(req.min_tokens, max_tokens),
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else min(req.top_k, _MAX_TOP_K),
        seed=None if req.seed is None else (req.seed + j) % (2**63),
        ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
        logprobs=logprobs, stop=req.stop_list, logit_bias=logit_bias(req), structured_outputs=structured,
    )
    try:
        sp.validate()
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        if chat:
            field = _CHAT_PARAM.get(field, field)
            if field == "max_tokens" and req.max_completion_tokens is not None:
                field = "max_completion_tokens"
        raise invalid(str(exc), field) from None
    return sp


def logprobs_wanted(req: Any, chat: bool) -> int | None:
    """How many alternatives per position the client asked for (0: only the chosen token's), or None."""
    if chat:
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs
