"""A teacher's chat answer as Anthropic Messages content blocks and their events.

``MessageBlocks`` turns the upstream's chat chunks into Anthropic's blocks (thinking, text,
tool_use) and the ``content_block_*`` events that stream them; a whole answer is fed as one chunk
(``stream.whole_chunk``), so the whole and streamed shapes come from the same code
(``teacher.messages`` says how each field maps).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from harnessrl.errors import UpstreamError
from harnessrl.gateway.apis.anthropic_blocks import thinking_signature
from harnessrl.gateway.apis.anthropic_convert import message_of_blocks
from harnessrl.gateway.teacher.reading import without_surrogates
from harnessrl.gateway.teacher.recording import NATURAL_ENDINGS
from harnessrl.gateway.teacher.stream import StreamedMessage

__all__ = ["MessageBlocks"]


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


class MessageBlocks:
    """An upstream chat answer, chunk by chunk, as Anthropic content blocks and their stream events.

    A whole answer is fed as one chunk (``whole_chunk``), so both shapes come from this code."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = stop
        self.sum = StreamedMessage()  # tool calls, finish reason, usage
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None  # "thinking" | "text": the block receiving deltas
        self._parts: list[str] = []
        self.calls: list[dict[str, Any]] = []  # the tool calls as sent (internal shape)

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        self.sum.feed(chunk)
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                events += self._append("thinking", reasoning)
            if delta.get("content"):
                events += self._append("text", delta["content"])
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The last events: the open block closed, then each tool call as one ``tool_use`` block."""
        events = self._close()
        for call in self.sum.calls():
            name, arguments = call["function"]["name"], call["function"]["arguments"] or "{}"
            try:
                tool_input = json.loads(arguments)
            except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
                tool_input = None
            if not isinstance(tool_input, dict) or not name:
                raise UpstreamError(f"teacher upstream sent tool call {name!r} without a JSON object input")
            if (clean := without_surrogates(tool_input)) != tool_input:  # as the record reads it
                tool_input, arguments = clean, json.dumps(clean, ensure_ascii=False)
            call_id = call["id"] or f"toolu_{secrets.token_hex(12)}"
            index = len(self.blocks)
            self.blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": tool_input})
            self.calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    # As anthropic_convert reads the block back: the next call's history matches it.
                    "function": {"name": name, "arguments": json.dumps(tool_input, ensure_ascii=False)},
                }
            )
            events += [
                _start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
                _delta(index, {"type": "input_json_delta", "partial_json": arguments}),
                {"type": "content_block_stop", "index": index},
            ]
        return events

    def _append(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != kind:
            events += self._close()
            block: dict[str, Any] = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            self.blocks.append(block)
            self._open = kind
            events.append(_start(len(self.blocks) - 1, dict(block)))
        self._parts.append(text)
        events.append(_delta(len(self.blocks) - 1, {"type": f"{kind}_delta", kind: text}))
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        block = self.blocks[-1]
        block[self._open] = "".join(self._parts)
        events = []
        if self._open == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            events.append(_delta(index, {"type": "signature_delta", "signature": block["signature"]}))
        events.append({"type": "content_block_stop", "index": index})
        self._open, self._parts = None, []
        return events

    def stop_reason(self) -> tuple[str, str | None, str]:
        """(Anthropic ``stop_reason``, ``stop_sequence``, the recorded finish reason in chat's terms).
        An upstream's ending that is not a natural one (``content_filter``, ``length`` after complete
        tool calls, a provider's own word) is recorded as the upstream said it, whatever the harness
        is told: recorded as ``stop``, a cut answer was training data for ``harnessrl sft``."""
        finish = str(self.sum.finish_reason or "stop")
        natural = finish in NATURAL_ENDINGS
        if self.calls:
            return "tool_use", None, "tool_calls" if natural else finish
        if finish == "length":
            return "max_tokens", None, "length"
        recorded = "stop" if natural else finish
        hit = self.sum.stop_reason
        if isinstance(hit, str) and hit in self.stop:
            return "stop_sequence", hit, recorded
        return "end_turn", None, recorded

    def message(self) -> dict[str, Any]:
        """The internal assistant message the harness's blocks read back to (``anthropic_convert``)."""
        return message_of_blocks(self.blocks)

    def usage(self) -> dict[str, int]:
        usage = self.sum.usage or {}
        return {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
