"""The trusted incremental splice gives the full path's prompt when system messages come later.

DeepSeek's template gathers every system message into the header at the top. The incremental path
renders a short surrogate conversation without the earlier system messages; a system message among
the new messages (even an empty one, which adds a separator to the header) made the trusted splice
differ from what the full path builds for the same messages. Such a tail now takes the full path;
system messages before the reused turn stay out of the surrogate, which changes nothing after it.
"""

from __future__ import annotations

from typing import Any

import pytest

from harnessrl.engines.tiny_families import family_available, tiny_family_dir
from harnessrl.gateway.prompt.conversation import VERIFY_CALLS, SpliceTrust, build_prompt, quick_prompt
from harnessrl.gateway.prompt.messages import PriorCall, key_messages, normalize_messages, template_key
from harnessrl.tokenizer import PolicyTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
ANSWER = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    ],
}
SAMPLED = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"cmd": "ls"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
)


@pytest.fixture(scope="module")
def deepseek() -> PolicyTokenizer:
    reason = family_available("deepseek")
    if reason is not None:
        pytest.skip(reason)
    return PolicyTokenizer.from_dir(tiny_family_dir("deepseek", weights=False))


def _trusted() -> SpliceTrust:
    trust = SpliceTrust()
    for _ in range(VERIFY_CALLS):
        trust.verify(True)
    assert trust.trusted
    return trust


@pytest.mark.parametrize(
    ("first", "tail"),
    [
        # The case found: a system message in the history and an empty one among the new messages.
        (
            [{"role": "user", "content": "hi"}, {"role": "system", "content": "S2"}],
            [{"role": "system", "content": ""}, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
        ),
        # Several system messages before the reused turn, none after it (fine before the fix too).
        (
            [
                {"role": "system", "content": "S1"},
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "S2"},
                {"role": "user", "content": "go"},
            ],
            [{"role": "tool", "tool_call_id": "c1", "content": "x"}],
        ),
    ],
)
def test_trusted_splice_equals_the_full_path_with_later_system_messages(
    deepseek: PolicyTokenizer, first: list[dict[str, Any]], tail: list[dict[str, Any]]
) -> None:
    first = [*first, {"role": "tool", "tool_call_id": "c0", "content": "out"}]
    context = template_key(TOOLS, None)
    prompt = build_prompt(deepseek, normalize_messages(first), tools=TOOLS).prompt_ids
    prior = PriorCall.from_call(first, ANSWER, prompt, deepseek.encode(SAMPLED), context)
    keyed = key_messages([*first, ANSWER, *tail])
    full = build_prompt(deepseek, keyed.messages, [prior], tools=TOOLS, incremental=False)
    trusted = build_prompt(deepseek, keyed.messages, [prior], tools=TOOLS, trust=_trusted())
    assert trusted.prompt_ids == full.prompt_ids
    quick = quick_prompt(deepseek, keyed.messages, [prior], keyed.keys, tools=TOOLS, trust=_trusted())
    assert quick is None or quick.prompt_ids == full.prompt_ids
