"""Incremental prompt building: a new call's tokenizer work is bounded by its new messages.

A counting wrapper around the real tokenizer measures characters rendered by the chat template and
characters encoded, over a 20-turn agent conversation; the prompt IDs must equal the full path's
(``incremental=False``) on every call.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.engines.scripted import render_turn
from harnessrl.gateway.parsers.tools import parse_tool_calls
from harnessrl.gateway.prompt.conversation import VERIFY_CALLS, SpliceTrust, build_prompt
from harnessrl.gateway.prompt.messages import PriorCall, normalize_messages, template_key
from harnessrl.tokenizer import PolicyTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


class CountingTokenizer:
    """The real tokenizer, counting characters rendered and encoded (a constructor-argument seam)."""

    def __init__(self, inner: PolicyTokenizer):
        self._inner = inner
        self.encoded = 0
        self.rendered = 0

    def encode(self, text: str) -> list[int]:
        self.encoded += len(text)
        return self._inner.encode(text)

    def encode_conversation(self, text: str) -> list[int]:
        self.encoded += len(text)
        return self._inner.encode_conversation(text)

    def render_chat(self, *args: Any, **kwargs: Any) -> str:
        text = self._inner.render_chat(*args, **kwargs)
        self.rendered += len(text)
        return text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _answer(tokenizer: PolicyTokenizer, k: int) -> tuple[list[int], dict[str, Any]]:
    turn = {
        "content": f"Step {k}: checking.",
        "tool_calls": [{"name": "bash", "arguments": {"command": f"ls {k}"}}],
    }
    if k % 5 == 4:
        turn = {"content": f"Summary after step {k}.", "tool_calls": []}
    ids = tokenizer.encode(render_turn(turn))
    parsed = parse_tool_calls(tokenizer.decode(ids[:-1]))
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
    return ids, message


def test_twenty_turns_tokenize_only_new_messages(tokenizer: PolicyTokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. " * 20},
        {"role": "user", "content": "Fix the bug in the repository."},
    ]
    priors: list[PriorCall] = []
    new_chars = sum(len(m["content"]) for m in messages)
    trust = SpliceTrust()
    rows = []
    for k in range(20):
        normalized = normalize_messages(messages)
        counting.encoded = counting.rendered = 0
        plan = build_prompt(counting, normalized, priors, tools=TOOLS, trust=trust)  # type: ignore[arg-type]
        reference = build_prompt(tokenizer, normalized, priors, tools=TOOLS, incremental=False)
        assert plan.prompt_ids == reference.prompt_ids
        assert plan.result == reference.result == ("first" if k == 0 else "reused")
        context_chars = len(tokenizer.render_chat(normalized, tools=TOOLS, add_generation_prompt=True))
        rows.append((k, counting.encoded, counting.rendered, new_chars, context_chars))
        response_ids, answer = _answer(tokenizer, k)
        priors.append(
            PriorCall.from_call(messages, answer, plan.prompt_ids, response_ids, template_key(TOOLS, None))
        )
        messages.append(answer)
        if answer.get("tool_calls"):
            tail = [
                {
                    "role": "tool",
                    "tool_call_id": answer["tool_calls"][0]["id"],
                    "content": f"file_{k}.py\n" * 3,
                }
            ]
        else:
            tail = [{"role": "user", "content": f"Continue with part {k}."}]
        messages.extend(tail)
        new_chars = sum(len(json.dumps(m)) for m in tail)
    for k, encoded, rendered, new, context in rows[1 + VERIFY_CALLS :]:
        # Encoding: the new messages plus template glue, never the history.
        assert encoded <= new + 100, (k, encoded, new)
        # Rendering: the surrogate (system header + three messages + tail), not the whole conversation.
        assert rendered <= 2 * (rows[0][4] + new + 600), (k, rendered, context)
    first_incremental, last = rows[1 + VERIFY_CALLS], rows[-1]
    # The full path rendered the whole context twice per call; now one call renders less than one
    # context, and that work does not grow as the conversation does.
    assert last[2] < last[4]
    assert last[2] <= first_incremental[2] + 200
    # Calls that verified the incremental path (and the first call) did the full work once.
    assert rows[0][1] >= rows[0][4] - 10
