"""The incremental splice and the reference path agree when an answer writes an end-of-turn text.

A model may write the text of a stop token with ordinary tokens (an agent explaining that Qwen's
EOS is "<|endoftext|>"); the harness echoes the answer back, and the template renders that text in
the history. Where the template also rewrites earlier turns (Qwen3 drops the reasoning of turns
before the last user query), the reference path splices after the reused turn's end, and it
checked that the render has as many end-of-turn texts as the earlier tokens have stop *IDs*: the
written text counted on one side only, the splice was refused, the whole conversation re-encoded
(the model's own words became an EOS token in its prompt, ``mismatch``), while the trusted
incremental path spliced: two different prompts for one conversation, and a gateway verifying its
first splices turned the incremental path off for good. The earlier tokens' written end-of-turn
texts now count too, including those in reasoning the template drops. The control: an answer that
writes no such text.
"""

from __future__ import annotations

from typing import Any

import pytest

from harnessrl.engines.tiny_families import family_available, tiny_family_dir
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
START = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Explain the EOS token."},
]
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
EOS_TEXT = "<|endoftext|>"


@pytest.fixture(scope="module")
def qwen3() -> PolicyTokenizer:
    reason = family_available("qwen3")
    if reason is not None:
        pytest.skip(reason)
    return PolicyTokenizer.from_dir(tiny_family_dir("qwen3", weights=False))


def _spelled(tok: PolicyTokenizer, text: str) -> list[int]:
    """``text`` as a model would sample it: the EOS text written with ordinary tokens."""
    ids: list[int] = []
    for i, part in enumerate(text.split(EOS_TEXT)):
        if i:
            ids += tok.encode("<|") + tok.encode("endoftext") + tok.encode("|>")
        ids += tok.encode(part)
    return ids


def _third_call(
    tok: PolicyTokenizer, content: str, reasoning: str
) -> tuple[list[dict[str, Any]], list[PriorCall]]:
    """A reasoning turn with a tool call, its result, a short answer, then a new user query (which
    makes the template drop the first turn's reasoning): the third call's messages and priors."""
    im_end = tok.token_to_id("<|im_end|>")
    key = template_key(TOOLS, None)
    prompt1 = build_prompt(tok, normalize_messages(START), tools=TOOLS).prompt_ids
    sampled1 = f"<think>\n{reasoning}\n</think>\n\n{content}\n" + (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    answer1 = {"role": "assistant", "content": content, "tool_calls": [CALL]}
    prior1 = PriorCall.from_call(START, answer1, prompt1, [*_spelled(tok, sampled1), im_end], key)
    second = [
        *START,
        {**answer1, "reasoning_content": reasoning},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    plan2 = build_prompt(tok, normalize_messages(second), [prior1], tools=TOOLS, incremental=False)
    assert plan2.result == "reused"
    answer2 = {"role": "assistant", "content": "Done."}
    prior2 = PriorCall.from_call(second, answer2, plan2.prompt_ids, [*tok.encode("Done."), im_end], key)
    third = normalize_messages([*second, answer2, {"role": "user", "content": "Now run the tests."}])
    return third, [prior1, prior2]


@pytest.mark.parametrize(
    ("content", "reasoning"),
    [
        (f"The EOS token is {EOS_TEXT} in Qwen.", "Let me check"),  # echoed in the content
        (f"The EOS token is {EOS_TEXT} in Qwen.", f"It is {EOS_TEXT}"),  # and in dropped reasoning
        ("The EOS token is endoftext in Qwen.", f"It is {EOS_TEXT}"),  # in dropped reasoning only
        ("The EOS token is endoftext in Qwen.", "Let me check"),  # the control: written nowhere
    ],
)
def test_written_end_of_turn_text_splices_alike(qwen3: PolicyTokenizer, content: str, reasoning: str) -> None:
    messages, priors = _third_call(qwen3, content, reasoning)
    reference = build_prompt(qwen3, messages, priors, tools=TOOLS, incremental=False)
    trusted = SpliceTrust()
    trusted.checks = VERIFY_CALLS
    fast = build_prompt(qwen3, messages, priors, tools=TOOLS, trust=trusted)
    assert fast.result == "reused"
    assert reference.result == "reused"
    assert reference.prompt_ids == fast.prompt_ids
    # The sampled tokens are kept: no EOS token where the model wrote the text.
    sampled = (*priors[1].prompt_ids, *priors[1].response_ids)
    assert reference.prompt_ids[: len(sampled)] == list(sampled)
    assert qwen3.token_to_id(EOS_TEXT) not in reference.prompt_ids
    # A gateway still verifying its splices keeps the incremental path.
    verifying = SpliceTrust()
    assert build_prompt(qwen3, messages, priors, tools=TOOLS, trust=verifying).prompt_ids == fast.prompt_ids
    assert verifying.checks == 1
