"""Response bodies of POST /v1/responses, whole and as a stream of Responses events.

The output is one `message` item (an `output_text` part) or, when the model called tools, one `function_call` item
per call (tools.ToolMode.parse, the chat path's parser). status "completed", or "incomplete" with
incomplete_details.reason "max_output_tokens" when max_output_tokens cut the answer. usage counts as for chat:
input_tokens (prompt, with input_tokens_details.cached_tokens from the prefix cache), output_tokens (every token
generated), total_tokens.

Stream (event types as the openai SDK's openai/types/responses/ declares them; each SSE event carries `event:` and a
`data:` JSON object with `type` and a growing `sequence_number`, no `[DONE]`): response.created,
response.in_progress; for text response.output_item.added, response.content_part.added, response.output_text.delta
(as text comes), response.output_text.done, response.content_part.done, response.output_item.done; for a tool call
response.output_item.added, response.function_call_arguments.delta, response.function_call_arguments.done,
response.output_item.done (each call once its JSON is complete, as the chat stream sends tool_calls); then
response.completed (or response.incomplete). A request that fails after the stream began ends with response.failed
(status "failed", `error` {code, message}). With tools, text that may still become a call (it starts with "[") is
held until it is known.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from .errors import APIError
from .responses_api import ResponsesRequest, dumps
from .serving import Choice, Event, Prepared, RequestRecord


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def _usage(rec: RequestRecord) -> dict[str, Any]:
    return {"input_tokens": rec.prompt_tokens, "input_tokens_details": {"cached_tokens": rec.cached_tokens},
            "output_tokens": rec.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": rec.prompt_tokens + rec.completion_tokens}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponsesBuilder:
    """Builds one response's body and events. `on_complete(body)` is called once with a completed or incomplete
    response (the route stores its conversation)."""

    def __init__(self, req: ResponsesRequest, prep: Prepared, model: str, response_id: str, on_complete=None):
        self.req, self.prep, self.model, self.id = req, prep, model, response_id
        self.created = int(time.time())
        self.on_complete = on_complete
        self._seq = 0
        self._msg_id = "msg_" + uuid.uuid4().hex
        self._text = ""  # streamed text so far
        self._held = ""  # text that may still become a tool call
        self._decided = prep.tools is None or prep.tools.kind == "none"  # True: text streams as it comes
        self._message_open = False

    # ---- the response object ----
    def _body(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
              incomplete: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "usage": usage, "error": error,
                "incomplete_details": {"reason": incomplete} if incomplete else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "temperature": 1.0 if req.temperature is None else req.temperature,
                "top_p": 1.0 if req.top_p is None else req.top_p, "tools": req.tools or [],
                "tool_choice": req.tool_choice or "auto", "parallel_tool_calls": req.parallel_tool_calls,
                "text": {"format": req.text_format}, "previous_response_id": req.previous_response_id,
                "store": req.store, "metadata": req.metadata or {}, "truncation": "disabled", "reasoning": None}

    def _calls(self, text: str) -> list[dict[str, Any]] | None:
        tools = self.prep.tools
        calls = tools.parse(text) if tools is not None else None
        if calls is None:
            return None
        return [{"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": c["id"],
                 "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": "completed"}
                for c in calls]

    def _message(self, text: str, status: str = "completed") -> dict[str, Any]:
        return {"type": "message", "id": self._msg_id, "role": "assistant", "status": status,
                "content": [_text_part(text)] if status == "completed" else []}

    def _finish(self, ch: Choice, rec: RequestRecord, output: list[dict[str, Any]]) -> dict[str, Any]:
        incomplete = "max_output_tokens" if ch.finish_reason == "length" else None
        body = self._body("incomplete" if incomplete else "completed", output, _usage(rec), incomplete)
        if self.on_complete is not None:
            self.on_complete(body)
        return body

    def full(self, choices: list[Choice], rec: RequestRecord) -> dict[str, Any]:
        ch = choices[0]
        output = self._calls(ch.text) or [self._message(ch.text)]
        return self._finish(ch, rec, output)

    # ---- the stream ----
    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    def start(self) -> list[bytes]:
        body = self._body("in_progress", [], None)
        return [self._event("response.created", response=body), self._event("response.in_progress", response=body)]

    def _delta(self, text: str) -> list[bytes]:
        out = []
        if not self._message_open:
            self._message_open = True
            out.append(self._event("response.output_item.added", output_index=0,
                                   item=self._message("", "in_progress")))
            out.append(self._event("response.content_part.added", item_id=self._msg_id, output_index=0,
                                   content_index=0, part=_text_part("")))
        if text:
            self._text += text
            out.append(self._event("response.output_text.delta", item_id=self._msg_id, output_index=0,
                                   content_index=0, delta=text, logprobs=[]))
        return out

    def chunks(self, events: list[Event], rec: RequestRecord | None = None) -> list[bytes]:
        out: list[bytes] = []
        for ev in events:
            if ev.index != 0:
                continue
            text = ev.text
            if not self._decided:
                self._held += text
                stripped = self._held.lstrip()
                if not stripped or (stripped.startswith("[") and ev.finish_reason is None):
                    continue
                if stripped.startswith("["):
                    continue  # finished: decided at the end (a call, or text)
                self._decided, text, self._held = True, self._held, ""
            if text:
                out += self._delta(text)
        return out

    def end(self, error: APIError | None, rec: RequestRecord, choices: list[Choice]) -> list[bytes]:
        if error is not None:
            body = self._body("failed", [], _usage(rec), error={"code": error.code or "server_error",
                                                                "message": error.message})
            return [self._event("response.failed", response=body)]
        ch = choices[0]
        out: list[bytes] = []
        calls = self._calls(self._held) if self._held else None
        if calls:
            for k, call in enumerate(calls):
                out.append(self._event("response.output_item.added", output_index=k,
                                       item={**call, "arguments": "", "status": "in_progress"}))
                out.append(self._event("response.function_call_arguments.delta", item_id=call["id"], output_index=k,
                                       delta=call["arguments"]))
                out.append(self._event("response.function_call_arguments.done", item_id=call["id"], output_index=k,
                                       name=call["name"], arguments=call["arguments"]))
                out.append(self._event("response.output_item.done", output_index=k, item=call))
            output = calls
        else:
            out += self._delta(self._held)  # held text that did not become a call; opens the message if none yet
            self._held = ""
            text = self._text
            out.append(self._event("response.output_text.done", item_id=self._msg_id, output_index=0,
                                   content_index=0, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=self._msg_id, output_index=0,
                                   content_index=0, part=_text_part(text)))
            message = self._message(text)
            out.append(self._event("response.output_item.done", output_index=0, item=message))
            output = [message]
        body = self._finish(ch, rec, output)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=body))
        return out
