"""From a parsed OpenAI request to the engine's SamplingParams, through the validator the offline API uses too.

Every field that changes what an answer means ends up here or is refused by protocol.py: sampling knobs,
logit_bias, logprobs/top_logprobs, response_format (json_object / json_schema: a grammar enforced while decoding)
and tools/tool_choice (tools.py: the tool call is generated under a grammar). A ValueError of
SamplingParams.validate ("<field>: <why>") becomes a 400 whose `param` names the request's own field.
"""
from __future__ import annotations

import json
from typing import Any

from deployctl_runtime.sampling_params import SEED_MAX, SEED_MIN, SamplingParams, StructuredOutputsParams
from deployctl_runtime.structured import grammar_for

from .errors import invalid
from .tools import ToolMode

_MAX_TOP_K = 2**63 - 1  # any k >= vocab keeps every token; larger ones overflow the sampler's int64 tensor
# SamplingParams field -> the request field a client sent, where they differ
_CHAT_PARAM = {"logprobs": "top_logprobs", "structured_outputs": "response_format"}


def _regex_lark(regex: str) -> str:
    return "start: /" + regex.replace("/", "\\/") + "/\n"


def _choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices) + "\n"


def _guided(req: Any) -> list[tuple[str, StructuredOutputsParams]]:
    """(param, spec) per grammar field the client sent: response_format, vLLM's guided_* and structured_outputs."""
    out = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        out.append(("response_format", StructuredOutputsParams(json_object=True)) if rf.type == "json_object"
                   else ("response_format.json_schema.schema", StructuredOutputsParams(json=rf.json_schema.schema_)))
    if req.guided_json is not None:
        out.append(("guided_json", StructuredOutputsParams(json=req.guided_json)))
    if req.guided_regex is not None:
        out.append(("guided_regex", StructuredOutputsParams(lark=_regex_lark(req.guided_regex))))
    if req.guided_choice is not None:
        if not req.guided_choice:
            raise invalid("'guided_choice': must list at least one choice", "guided_choice")
        out.append(("guided_choice", StructuredOutputsParams(lark=_choice_lark(req.guided_choice))))
    if req.guided_grammar is not None:
        out.append(("guided_grammar", StructuredOutputsParams(lark=req.guided_grammar)))
    so = req.structured_outputs
    if so is not None:
        kinds = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(so, k) not in (None, False)]
        if len(kinds) != 1:
            raise invalid("'structured_outputs': give exactly one of json, regex, choice, grammar, json_object",
                          "structured_outputs")
        k = kinds[0]
        spec = {"json_": lambda: StructuredOutputsParams(json=so.json_),
                "regex": lambda: StructuredOutputsParams(lark=_regex_lark(so.regex)),
                "choice": lambda: StructuredOutputsParams(lark=_choice_lark(so.choice)),
                "grammar": lambda: StructuredOutputsParams(lark=so.grammar),
                "json_object": lambda: StructuredOutputsParams(json_object=True)}[k]()
        out.append((f"structured_outputs.{k.rstrip('_')}", spec))
    return out


def structured_spec(req: Any, tools: ToolMode | None) -> StructuredOutputsParams | None:
    """The grammar a request asks for: tools (when a call is forced or allowed), else the one of response_format,
    guided_json / guided_regex / guided_choice / guided_grammar, structured_outputs the client sent (two of them
    are 400). Raises APIError 400 naming the field for a schema or grammar that cannot be used."""
    guided = _guided(req)
    if len(guided) > 1:
        names = ", ".join(p.split(".")[0] for p, _ in guided)
        raise invalid(f"'{guided[1][0].split('.')[0]}': send one grammar field, got {names}",
                      guided[1][0].split(".")[0])
    if tools is not None and tools.spec is not None:
        spec, param = tools.spec, "tools"
    elif guided:
        param, spec = guided[0]
    else:
        return None
    try:
        grammar_for(spec)
    except ValueError as exc:
        raise invalid(f"'{param}': {exc}", param, "invalid_schema") from None
    return spec


def logit_bias(req: Any) -> dict[int, float]:
    out = {}
    for key, value in (req.logit_bias or {}).items():
        digits = key[1:] if key.startswith("-") else key  # "-1" gets the validator's ">= 0" message
        if not (digits.isascii() and digits.isdigit()):  # int() would also take "1_0", " 1", "+1", "\u0661"
            raise invalid(f"'logit_bias': keys must be token ids (decimal digits), got {key!r}", "logit_bias")
        out[int(key)] = value
    return out


def _choice_seed(seed: int, j: int) -> int:
    """Choice j samples with seed + j (wrapping within the generator's range); a seed outside that range is
    passed as is, so the validator refuses it naming `seed` (it used to wrap silently)."""
    if not SEED_MIN <= seed <= SEED_MAX:
        return seed
    return (seed + j - SEED_MIN) % 2**64 + SEED_MIN  # seed + j itself when it is below 2**63


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
        min_p=0.0 if req.min_p is None else req.min_p,
        skip_special_tokens=req.skip_special_tokens, include_stop_str_in_output=req.include_stop_str_in_output,
        seed=None if req.seed is None else _choice_seed(req.seed, j),
        ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
        logprobs=logprobs, stop=req.stop_list, logit_bias=logit_bias(req), structured_outputs=structured,
        stop_token_ids=list(req.stop_token_ids or []),
    )
    try:
        sp.validate()
    except ValueError as exc:
        own, _, why = str(exc).partition(":")
        field = _CHAT_PARAM.get(own, own) if chat else own
        if field == "max_tokens":
            field = req.tokens_field
        raise invalid(f"{field}:{why}", field) from None  # the message names the field the client sent
    return sp


def logprobs_wanted(req: Any, chat: bool) -> int | None:
    """How many alternatives per position the client asked for (0: only the chosen token's), or None."""
    if chat:
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs
