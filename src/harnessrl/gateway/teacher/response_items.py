"""A chat answer as OpenAI Responses output items and events, for ``teacher.responses``.

``ResponseItems`` is fed the upstream's chat chunks (a whole answer as one chunk) and returns the
stream events each completes, without ``sequence_number`` (``ResponseShell.event`` adds it), so a
whole and a streamed answer come from the same code and agree: a ``reasoning`` item (the text in
``content`` and ``summary``; ``encrypted_content`` when asked, as the policy path gives it), a
``message`` item, a ``function_call`` item per tool call with the upstream's call id, sent whole when
the call is complete. ``ResponseShell`` is the Response object around them, echoing the request.
"""

from __future__ import annotations

import time
from typing import Any

from harnessrl.errors import HarnessRLError, UpstreamError
from harnessrl.gateway.apis.responses_output import close_reasoning_item, new_id
from harnessrl.gateway.apis.responses_request import RESPONSE_ID_KEY, ResponsesRequest, response_object
from harnessrl.gateway.pipeline.wire import sse_event
from harnessrl.gateway.teacher.stream import StreamedMessage

__all__ = ["ResponseItems", "ResponseShell"]


class ResponseItems:
    """An upstream chat answer, chunk by chunk, as Responses output items and their stream events
    (without ``sequence_number``, which the writer adds). A whole answer is fed as one chunk."""

    def __init__(self, encrypt: bool) -> None:
        self.encrypt = encrypt
        self.sum = StreamedMessage()  # tool calls, finish reason, usage
        self.items: list[dict[str, Any]] = []
        self._reasoning: dict[str, Any] | None = None
        self._reasoning_parts: list[str] = []  # the open reasoning item's
        self._reasoning_all: list[str] = []  # every reasoning item's: the recorded reasoning
        self._message: dict[str, Any] | None = None
        self._text_parts: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        self.sum.feed(chunk)
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                events += self._reasoning_delta(reasoning)
            if delta.get("content"):
                events += self._close_reasoning()
                events += self._text_delta(delta["content"])
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        events = self._close_reasoning()
        calls = self.sum.calls()
        if self._message is None and not calls:
            events += self._open_message()  # an answer without tool calls has a message, maybe empty
        if self._message is not None:
            events += self._close_message(status)
        for call in calls:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            if not name:
                raise UpstreamError("teacher upstream sent a tool call without a name")
            call_id = call["id"] or new_id("call")
            self.calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call_id,
                "name": name,
                "arguments": "",
            }
            index = self._add(item, events)
            where = {"item_id": item["id"], "output_index": index}
            item.update(arguments=arguments, status="completed")
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": arguments},
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": name,
                    "arguments": arguments,
                },
                {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
            ]
        return events

    def _add(self, item: dict[str, Any], events: list[dict[str, Any]]) -> int:
        self.items.append(item)
        index = len(self.items) - 1
        events.append({"type": "response.output_item.added", "output_index": index, "item": dict(item)})
        return index

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._reasoning is None or self._reasoning["status"] != "in_progress":
            self._reasoning = {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
            }
            self._add(self._reasoning, events)
            self._reasoning_parts = []
        self._reasoning_parts.append(text)
        self._reasoning_all.append(text)
        where = {"item_id": self._reasoning["id"], "output_index": self.items.index(self._reasoning)}
        return events + [
            {"type": "response.reasoning_text.delta", **where, "content_index": 0, "delta": text}
        ]

    def _close_reasoning(self) -> list[dict[str, Any]]:
        item = self._reasoning
        if item is None or item["status"] != "in_progress":
            return []
        text = "".join(self._reasoning_parts)
        # As the policy path closes it (the text in the summary too: harnesses echo summaries back).
        return close_reasoning_item(
            item, self.items.index(item), text, encrypt=self.encrypt, status="completed"
        )

    def _open_message(self) -> list[dict[str, Any]]:
        item = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        events: list[dict[str, Any]] = []
        index = self._add(item, events)
        self._message = item
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return events + [{"type": "response.content_part.added", **where, "part": part}]

    def _text_delta(self, text: str) -> list[dict[str, Any]]:
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        self._text_parts.append(text)
        where = {"item_id": self._message["id"], "output_index": self.items.index(self._message)}
        return events + [
            {"type": "response.output_text.delta", **where, "content_index": 0, "delta": text, "logprobs": []}
        ]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        item = self._message
        assert item is not None
        index = self.items.index(item)
        text = "".join(self._text_parts)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item.update(content=[part], status=status)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]

    def status(self) -> str:
        return "incomplete" if self.sum.finish_reason == "length" else "completed"

    def recorded(self, response_id: str) -> tuple[dict[str, Any], str]:
        """The internal assistant message (with the response id) and the finish reason in chat's terms."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text_parts) if self._message is not None else None,
        }
        if self.calls:
            message["tool_calls"] = self.calls
        if self._reasoning is not None:
            # All of it: reasoning after text is a second item, whose text was all that was recorded
            # (the harness got both items; the Messages path records both thinking blocks too).
            message["reasoning_content"] = "".join(self._reasoning_all)
        finish = self.sum.finish_reason or "stop"
        if self.calls and finish == "stop":
            finish = "tool_calls"
        return {**message, RESPONSE_ID_KEY: response_id}, finish

    def usage(self) -> dict[str, Any] | None:
        usage = self.sum.usage
        if usage is None:
            return None
        n_in, n_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
        return {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": n_in + n_out,
        }


class ResponseShell:
    """The Response object around the items: what the request asked for, echoed."""

    def __init__(self, body: ResponsesRequest, model: str, tools: list[dict[str, Any]] | None) -> None:
        self.body = body
        self.model = model
        self.tools = tools or []
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.seq = 0

    def event(self, payload: dict[str, Any]) -> str:
        payload = {"type": payload["type"], "sequence_number": self.seq, **payload}
        self.seq += 1
        return sse_event(payload)

    def response(
        self, status: str, items: ResponseItems | None = None, error: HarnessRLError | None = None
    ) -> dict[str, Any]:
        body = self.body
        return response_object(
            body,
            response_id=self.id,
            created_at=self.created_at,
            model=self.model,
            status=status,
            output=[dict(item) for item in items.items] if items is not None else [],
            usage=items.usage() if items is not None else None,
            tools=self.tools,
            temperature=body.temperature,
            top_p=body.top_p,
            error=error,
        )
