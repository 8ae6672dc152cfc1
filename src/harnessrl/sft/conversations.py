"""A recorded call as an OpenAI chat conversation and its answer, and the JSONL export of them.

Every call the gateway records keeps the request as the harness sent it (``Call.request``, in its
provider's shape) and the answer as one OpenAI-chat-shaped assistant message (``Call.response``:
``content``, ``tool_calls``, optional ``reasoning_content``, whichever API it came through). The
request is read back into the same internal form the gateway rendered it from, by the gateway's own
converters (``anthropic_convert``, ``responses_input``), then normalized as the gateway normalizes it
(``messages.normalize_messages``: content parts joined, tool-call arguments parsed to objects).
Raw ``completions`` calls have no conversation and are counted, not read.

An agent resends its history, so call k's messages plus its answer are usually the start of call
k+1's messages (compared by the gateway's ``message_key``: what a message says, not how it was
serialized, reasoning aside). The harness's copy of an answer is not the answer: OpenAI chat clients
usually drop ``reasoning_content``, some keep ``<think>`` in the text. ``with_recorded_answers`` puts
each recorded answer back in its place in the later calls' histories, as the gateway does when it
serves them (it reuses the sampled tokens of the earlier answer, whatever the harness resent), so
both the export and the student's prompts keep every turn's reasoning.

Export (``write_jsonl``): one line per *conversation*, not per call: only calls whose conversation
no later call of the rollout continues are written (``leaf_conversations``). Each line is
``{"messages": [...], "tools": [...], "rollout_id", "task_id", "reward"}`` with OpenAI messages
(``tool_calls`` with JSON-string arguments, ``reasoning_content`` where there was reasoning): the
format TRL's ``SFTTrainer``, OpenAI fine-tuning and most chat SFT tools read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import BadRequest
from harnessrl.gateway.apis import anthropic_convert, responses_input
from harnessrl.gateway.body_models import RESERVED_TEMPLATE_KWARGS
from harnessrl.gateway.prompt.messages import message_key, normalize_message, normalize_messages
from harnessrl.gateway.teacher.reading import without_surrogates
from harnessrl.schemas import Call, Rollout


@dataclass(frozen=True)
class Conversation:
    """One call as chat: the messages it was asked (normalized), its tools, and its answer."""

    call: Call
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    answer: dict[str, Any]
    #: the request's ``chat_template_kwargs`` (vLLM's extension the gateway honours: ``enable_thinking``...)
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def keys(self) -> list[bytes]:
        return [message_key(m) for m in (*self.messages, self.answer)]


class NoConversation(Exception):
    """A call that cannot be read as a chat conversation; ``reason`` is the count's name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


def request_messages(call: Call) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The internal (OpenAI chat) messages and tools of a recorded request."""
    request = call.request
    if call.api == "chat.completions":
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a list of objects", param="messages")
        return messages, request.get("tools") or None
    if call.api == "messages":
        return anthropic_convert.request_to_internal(request)
    if call.api == "responses":
        return responses_input.request_to_internal(request)
    raise NoConversation("raw_completion", f"call {call.seq}: a raw completion has no conversation")


def answer_message(call: Call) -> dict[str, Any]:
    """The recorded answer as a normalized assistant message (private bookkeeping keys dropped)."""
    response = call.response
    if response.get("role") != "assistant":
        raise NoConversation("no_answer", f"call {call.seq}: no assistant message recorded")
    # A lone UTF-16 surrogate (a native teacher's answer cut inside an emoji, recorded before the
    # gateway replaced it) stopped the whole run with a TypeError: the tokenizer cannot encode it.
    # U+FFFD, as the gateway now records and answers it.
    message = without_surrogates({k: v for k, v in response.items() if not k.startswith("_") and k != "id"})
    if not isinstance(message.get("reasoning_content") or "", str):
        # Teacher mode records a chat upstream's answer as it came; reasoning that is not text
        # (a provider's own object) is no answer sft can read, where it used to end in a traceback.
        raise NoConversation("no_answer", f"call {call.seq}: the recorded reasoning_content is not text")
    if not isinstance(message.get("tool_calls") or [], list):
        # Likewise tool calls that are no list (``5``): a TypeError traceback in the normalizer.
        raise NoConversation("no_answer", f"call {call.seq}: the recorded tool_calls is not a list")
    return normalize_message(message)


def conversation(call: Call) -> Conversation:
    """``call`` as chat; ``NoConversation`` (with its reason) if it cannot be read as one."""
    try:
        messages, tools = request_messages(call)
        kwargs = call.request.get("chat_template_kwargs") if call.api == "chat.completions" else None
        if kwargs is not None and not isinstance(kwargs, dict):
            # The policy path refuses it (400); teacher mode passes the body on, so it may be recorded.
            raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
        kwargs = {k: v for k, v in (kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS}
        return Conversation(call, normalize_messages(messages), tools, answer_message(call), kwargs)
    except BadRequest as exc:  # the gateway answered it, so this is a request we no longer read
        raise NoConversation("unreadable_request", f"call {call.seq}: {exc}") from exc


def final_calls(rollout: Rollout, calls: Iterable[Call]) -> list[Call]:
    """The calls training may use: the final attempt's, in order, up to what the evaluator saw
    (``trajectory.calls_seen``: the same rule as the RL sample builder)."""
    from harnessrl.trajectory import calls_seen

    final = sorted((c for c in calls if c.attempt == rollout.attempt), key=lambda c: c.seq)
    seen = calls_seen(rollout)
    return final if seen is None else final[:seen]


def _recorded_in_place(copy: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` (as recorded) where the harness resent ``copy`` of it, keeping the copy's tool-call
    ids: the tool results after it answer to those."""
    out = {**copy, **answer}
    out.pop("reasoning_content", None)
    if answer.get("reasoning_content"):
        out["reasoning_content"] = answer["reasoning_content"]
    if answer.get("tool_calls"):  # as many as the copy's: their keys matched
        out["tool_calls"] = [
            {**mine, "id": theirs["id"]}
            for mine, theirs in zip(answer["tool_calls"], copy["tool_calls"], strict=True)
        ]
    return out


def with_recorded_answers(conversations: Sequence[Conversation]) -> list[Conversation]:
    """``conversations`` (one rollout's, in order) with each earlier answer a later one continues
    put back in its history as recorded (its reasoning included), in place of the harness's copy."""
    keys = [c.keys() for c in conversations]
    out = []
    for j, conv in enumerate(conversations):
        messages = list(conv.messages)
        for i in range(j):
            at = len(conversations[i].messages)  # where call i's answer sits in call j's history
            if at < len(messages) and keys[j][: at + 1] == keys[i]:
                messages[at] = _recorded_in_place(messages[at], conversations[i].answer)
        out.append(dataclasses.replace(conv, messages=messages) if messages != conv.messages else conv)
    return out


def leaf_conversations(conversations: Sequence[Conversation]) -> list[Conversation]:
    """Those whose messages + answer no later conversation of the same rollout starts with."""
    keys = [c.keys() for c in conversations]
    leaves = []
    for i, conv in enumerate(conversations):
        mine = keys[i]
        continued = any(len(other) > len(mine) and other[: len(mine)] == mine for other in keys[i + 1 :])
        if not continued:
            leaves.append(conv)
    return leaves


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A normalized message in OpenAI's wire form (tool-call arguments as JSON strings)."""
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {
                **call,
                "function": {
                    "name": call["function"]["name"],
                    "arguments": args
                    if isinstance(args := call["function"]["arguments"], str)
                    else json.dumps(args, ensure_ascii=False),
                },
            }
            for call in out["tool_calls"]
        ]
    return out


def export_line(conv: Conversation, rollout: Rollout) -> dict[str, Any]:
    line: dict[str, Any] = {"messages": [openai_message(m) for m in (*conv.messages, conv.answer)]}
    if conv.tools:
        line["tools"] = conv.tools
    line.update(rollout_id=rollout.rollout_id, task_id=rollout.task_id, reward=rollout.reward)
    return line


def write_jsonl(path: Path, lines: Iterable[dict[str, Any]]) -> int:
    """Write ``lines`` (``export_line``) to ``path`` atomically; returns how many."""
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
                n += 1
        tmp.replace(path)
    except BaseException:  # a failed write leaves no half file beside the path
        tmp.unlink(missing_ok=True)
        raise
    return n
