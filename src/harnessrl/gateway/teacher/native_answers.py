"""What a native upstream's answer is recorded as (``teacher.native``): an Anthropic Message or an
OpenAI Response read back to the internal assistant message, its finish reason in chat's terms and
its usage. Only a natural ending is recorded as ``stop``/``tool_calls``; any other is kept as the
upstream stated it, so ``harnessrl sft`` never trains a cut or refused answer as a finished one.
"""

from __future__ import annotations

from typing import Any

from harnessrl.gateway.apis.anthropic_convert import message_of_blocks
from harnessrl.gateway.apis.responses_input import input_to_messages
from harnessrl.gateway.apis.responses_request import RESPONSE_ID_KEY

_ITEMS = ("message", "function_call", "reasoning")


#: Anthropic's stop reasons in chat's terms. Any other (``refusal``: a classifier cut the answer;
#: ``pause_turn``: a server tool's turn to be continued; ``model_context_window_exceeded``; a newer
#: one; none at all) is recorded as Anthropic said it, an ending ``harnessrl sft`` never trains on:
#: recorded as ``stop``, such a cut answer was training data.
MESSAGES_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


def messages_answer(answer: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, int]]:
    """(internal message, finish reason in chat's terms, usage) of an Anthropic Message."""
    message = message_of_blocks(list(answer.get("content") or []))
    stop = answer.get("stop_reason")
    finish = MESSAGES_FINISH.get(stop, str(stop)) if isinstance(stop, str) else "no_stop_reason"
    usage = answer.get("usage") or {}
    return (
        message,
        finish,
        {
            "prompt_tokens": usage.get("input_tokens") or 0,
            "completion_tokens": usage.get("output_tokens") or 0,
        },
    )


def responses_answer(answer: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, int]]:
    """(internal message with the response id, finish reason, usage) of a Response object."""
    # The items of the conversation; hosted tools' items (web search...) and item types newer than
    # this gateway are in the answer the harness gets, not in the recorded message.
    output = [i for i in answer.get("output") or [] if isinstance(i, dict) and i.get("type") in _ITEMS]
    turns = [m for m in input_to_messages(output, "output") if m["role"] == "assistant"]
    message = turns[-1] if turns else {"role": "assistant", "content": None}
    # Only a completed Response ended naturally; an incomplete one was cut (its token limit, a content
    # filter), and any other status (failed, cancelled, a background one still queued) is recorded as
    # such: ``harnessrl sft`` trains on none of them.
    status = answer.get("status")
    if status == "completed":
        finish = "tool_calls" if message.get("tool_calls") else "stop"
    elif status == "incomplete":
        reason = (answer.get("incomplete_details") or {}).get("reason")
        finish = "content_filter" if reason == "content_filter" else "length"
    else:
        finish = str(status) if isinstance(status, str) and status else "no_status"
    usage = answer.get("usage") or {}
    counts = {
        "prompt_tokens": usage.get("input_tokens") or 0,
        "completion_tokens": usage.get("output_tokens") or 0,
    }
    return {**message, RESPONSE_ID_KEY: answer.get("id")}, finish, counts
