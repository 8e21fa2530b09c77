"""The output side of OpenAI's Responses API (`server.routes.responses`): a reply's pieces become the response's
`output` items (a `reasoning` item, a `message` with one `output_text` part, `function_call` items) and, on the
way, the stream events that build them, each with its `sequence_number`.

One builder serves both answers: a whole response is the streamed one with its events dropped, so the two
cannot disagree. Shapes follow the `openai` client's types (openai.types.responses).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from typing import Any

from engine.contract.protocol import GenerateResult
from server.text.render import ToolCall

from ..gojson import ApiError
from ..pipeline import speculation_fields
from ..reply import ReplyPiece, tool_call_id
from .openai import _ERROR_TYPES

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(result: GenerateResult, reasoning_tokens: int) -> dict[str, Any]:
    return {"input_tokens": result.prompt_eval_count,
            "input_tokens_details": {"cached_tokens": result.prompt_cached, "cache_write_tokens": 0},
            "output_tokens": result.eval_count,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, result.eval_count)},
            "total_tokens": result.prompt_eval_count + result.eval_count}


def error_body(e: ApiError) -> dict[str, Any]:
    """The `code` a failed response and an `error` event carry: OpenAI's `server_error` for the server's own
    failures, the error type otherwise (the client shows it beside the message)."""
    return {"code": "server_error" if e.status >= 500 else _ERROR_TYPES.get(e.status, "invalid_request_error"),
            "message": e.message}


class OutputBuilder:
    """The response object and its output items, grown piece by piece; every step returns its stream events.

    Reasoning and text are written into the item open at the time (a new one when the kind changes); a tool
    call closes it and is one complete `function_call` item, since the reply's parser hands calls over whole."""

    def __init__(self, response: dict[str, Any]):
        self.response = response  # status "in_progress", output [], as response.created shows it
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the reasoning or message item being written
        self._text = ""  # the open item's text so far
        self._reasoning_tokens = 0

    @property
    def output(self) -> list[dict[str, Any]]:
        return self.response["output"]

    def _event(self, kind: str, **fields: Any) -> Event:
        # Deep copies: items keep changing after the event that shows them is made.
        event = {"type": kind, "sequence_number": self._seq, **copy.deepcopy(fields)}
        self._seq += 1
        return event

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self.response),
                self._event("response.in_progress", response=self.response)]

    def feed(self, piece: ReplyPiece, tokens: int = 0) -> list[Event]:
        """One piece of the reply, in the order the chat route streams it: reasoning, text, calls. `tokens`
        (the engine chunk's count) counts as reasoning when the piece is reasoning only."""
        if piece.thinking and not (piece.content or piece.tool_calls):
            self._reasoning_tokens += tokens
        events: list[Event] = []
        if piece.thinking:
            events += self._write("reasoning", piece.thinking)
        if piece.content:
            events += self._write("message", piece.content)
        for call in piece.tool_calls:
            events += self._close("completed") + self._call(call)
        return events

    def finish(self, result: GenerateResult) -> list[Event]:
        """The last events: the open item closed, the response completed (or incomplete at the token limit)
        with its usage and tandem's speculation statistics."""
        incomplete = result.done_reason == "length"
        status = "incomplete" if incomplete else "completed"
        events = self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            # an assistant turn even when the model said nothing (or only reasoned): clients read the message
            events += self._write("message", "") + self._close(status)
        self.response.update(status=status, completed_at=int(time.time()),
                             incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
                             usage=usage(result, self._reasoning_tokens),
                             speculative_decoding=speculation_fields(result))
        return events + [self._event("response.incomplete" if incomplete else "response.completed",
                                     response=self.response)]

    def fail(self, e: ApiError) -> list[Event]:
        """A failure after the stream began: OpenAI's `error` event, then the response as failed."""
        body = error_body(e)
        self.response.update(status="failed", error=body)
        return [self._event("error", code=body["code"], message=e.message, param=e.param),
                self._event("response.failed", response=self.response)]

    # --- items -----------------------------------------------------------------------------------------

    def _write(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed") + self._begin(kind)
        self._text += text
        if not text:
            return events
        where = {"item_id": self._open["id"], "output_index": len(self.output) - 1}
        if kind == "reasoning":
            events.append(self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text))
        else:
            events.append(self._event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]))
        return events

    def _begin(self, kind: str) -> list[Event]:
        if kind == "reasoning":
            # The model's own reasoning as the reasoning item's summary: what clients (and Ollama) display.
            item: dict[str, Any] = {"id": new_id("rs"), "type": "reasoning", "summary": []}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
        self._open, self._text = item, ""
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        events = [self._event("response.output_item.added", output_index=where["output_index"], item=item)]
        if kind == "reasoning":
            events.append(self._event("response.reasoning_summary_part.added", **where, summary_index=0,
                                      part={"type": "summary_text", "text": ""}))
        else:
            events.append(self._event("response.content_part.added", **where, content_index=0,
                                      part={"type": "output_text", "text": "", "annotations": []}))
        return events

    def _close(self, status: str) -> list[Event]:
        item, text = self._open, self._text
        if item is None:
            return []
        self._open, self._text = None, ""
        where = {"item_id": item["id"], "output_index": self.output.index(item)}
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            events = [self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                      self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)]
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            item.update(status=status, content=[part])
            events = [self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                      self._event("response.content_part.done", **where, content_index=0, part=part)]
        return events + [self._event("response.output_item.done", output_index=where["output_index"], item=item)]

    def _call(self, call: ToolCall) -> list[Event]:
        arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
        item: dict[str, Any] = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                                "call_id": call.id or tool_call_id(), "name": call.name, "arguments": ""}
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        events = [self._event("response.output_item.added", output_index=where["output_index"], item=item),
                  self._event("response.function_call_arguments.delta", **where, delta=arguments),
                  self._event("response.function_call_arguments.done", **where, arguments=arguments)]
        item.update(arguments=arguments, status="completed")
        return events + [self._event("response.output_item.done", output_index=where["output_index"], item=item)]
