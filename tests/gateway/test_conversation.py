"""Sampled-token reuse (``gateway.conversation``): pure functions, the tiny model's real tokenizer.

The property under test: when a harness appends to its history (however it re-serializes what the
policy said), call k+1's prompt starts with call k's prompt + call k's sampled response, exactly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.engines.scripted import render_turn
from harnessrl.errors import BadRequest
from harnessrl.gateway.parsers.tools import parse_tool_calls
from harnessrl.gateway.prompt.conversation import build_prompt
from harnessrl.gateway.prompt.messages import (
    PriorCall,
    message_key,
    normalize_message,
    normalize_messages,
    template_key,
)
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


def answer_for(tokenizer: PolicyTokenizer, turn: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """What the gateway does with a sampled turn: its token IDs and the OpenAI message it answers with."""
    ids = tokenizer.encode(render_turn(turn))
    text = tokenizer.decode(ids[:-1])  # the sampled <|im_end|> is not part of the text
    parsed = parse_tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in parsed.tool_calls]
    return ids, message


def test_normalize_content_shapes() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert normalize_message(parts)["content"] == "ab"
    assert normalize_message({"role": "assistant", "content": None})["content"] == ""
    assert normalize_message({"role": "developer", "content": "x"})["role"] == "system"
    with pytest.raises(BadRequest) as err:
        normalize_message({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, 3)
    assert err.value.param == "messages.3.content.0"


def test_message_key_ignores_serialization_details() -> None:
    a = {
        "role": "assistant",
        "content": "Let me look. ",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"a": 1, "b": [2]}'},
            }
        ],
    }
    b = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me look."}],
        "tool_calls": [{"id": "other", "function": {"name": "bash", "arguments": {"b": [2], "a": 1}}}],
    }
    assert message_key(normalize_message(a)) == message_key(normalize_message(b))
    c = json.loads(json.dumps(b))
    c["tool_calls"][0]["function"]["arguments"] = {"a": 2, "b": [2]}
    assert message_key(normalize_message(a)) != message_key(normalize_message(c))


def _run_conversation(
    tokenizer: PolicyTokenizer, turns: list[dict[str, Any]], echo: Any, tools: list[dict[str, Any]] | None
) -> list[tuple[list[int], list[int], str]]:
    """Play a harness: call, append the (re-serialized) answer and a tool result, call again."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    priors: list[PriorCall] = []
    out = []
    for k, turn in enumerate(turns):
        plan = build_prompt(tokenizer, normalize_messages(messages), priors, tools=tools)
        response_ids, answer = answer_for(tokenizer, turn)
        priors.append(
            PriorCall.from_call(messages, answer, plan.prompt_ids, response_ids, template_key(tools, None))
        )
        out.append((plan.prompt_ids, response_ids, plan.result))
        messages.append(echo(answer))
        if answer.get("tool_calls"):
            for call in answer["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"output {k}\n"})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"next {k}"}]})
    return out


def _assert_extends(calls: list[tuple[list[int], list[int], str]]) -> None:
    for (p0, r0, _), (p1, _, result) in zip(calls, calls[1:], strict=False):
        assert result == "reused"
        assert p1[: len(p0) + len(r0)] == p0 + r0


def _echo_reserialized(answer: dict[str, Any]) -> dict[str, Any]:
    """How many harnesses send an answer back: parts list, new ids, arguments re-dumped with other spacing."""
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "text", "text": (answer["content"] or "") + "  "}],
    }
    if answer.get("tool_calls"):
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=2, sort_keys=True),
                },
            }
            for c in answer["tool_calls"]
        ]
    return msg


def test_reuse_with_tool_calls_and_reserialized_history(tokenizer: PolicyTokenizer) -> None:
    turns = [
        {
            "content": "Looking around.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls", "z": 1, "a": 2}}],
        },
        {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "cat  a.txt"}}]},
        {
            "content": "two calls",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "x"}},
                {"name": "bash", "arguments": {"command": "y"}},
            ],
        },
        {"content": "All done."},
        {"content": "Really done."},
    ]
    calls = _run_conversation(tokenizer, turns, _echo_reserialized, TOOLS)
    assert calls[0][2] == "first"
    _assert_extends(calls)


def test_reuse_when_harness_sends_content_none_and_dict_arguments(tokenizer: PolicyTokenizer) -> None:
    def echo(answer: dict[str, Any]) -> dict[str, Any]:
        msg = dict(answer)
        msg["content"] = answer["content"] or None
        if "tool_calls" in msg:
            msg["tool_calls"] = [
                {
                    **c,
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in msg["tool_calls"]
            ]
        return msg

    turns = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "pwd"}}]},
        {"content": "ok"},
        {"content": "fine"},
    ]
    _assert_extends(_run_conversation(tokenizer, turns, echo, TOOLS))


def test_truncated_response_gets_end_of_turn_token(tokenizer: PolicyTokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    first = build_prompt(tokenizer, normalize_messages(messages), [])
    response_ids = tokenizer.encode("Hello there, this is a long")  # cut by max_tokens: no <|im_end|>
    answer = {"role": "assistant", "content": tokenizer.decode(response_ids)}
    prior = PriorCall.from_call(messages, answer, first.prompt_ids, response_ids)
    follow = [*messages, answer, {"role": "user", "content": "go on"}]
    plan = build_prompt(tokenizer, normalize_messages(follow), [prior])
    im_end = tokenizer.token_to_id("<|im_end|>")
    head = first.prompt_ids + response_ids + [im_end]
    assert plan.result == "reused"
    assert plan.prompt_ids[: len(head)] == head
    # The rest is exactly what the template renders after the assistant turn.
    assert (
        tokenizer.decode(plan.prompt_ids[len(head) :])
        == "\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )


def test_edited_history_falls_back_to_full_tokenization(tokenizer: PolicyTokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    first = build_prompt(tokenizer, normalize_messages(messages), [])
    ids, answer = answer_for(tokenizer, {"content": "Hello"})
    prior = PriorCall.from_call(messages, answer, first.prompt_ids, ids)
    edited = [*messages, {"role": "assistant", "content": "Something else"}, {"role": "user", "content": "?"}]
    plan = build_prompt(tokenizer, normalize_messages(edited), [prior])
    assert plan.result == "no_match"
    assert plan.prompt_ids == tokenizer.encode(tokenizer.render_chat(normalize_messages(edited)))


def test_longest_matching_prior_wins(tokenizer: PolicyTokenizer) -> None:
    calls = _run_conversation(
        tokenizer, [{"content": "a"}, {"content": "b"}, {"content": "c"}], lambda m: dict(m), None
    )
    _assert_extends(calls)


def test_retokenization_would_have_drifted(tokenizer: PolicyTokenizer) -> None:
    """Why reuse matters: a sampled tokenization that re-encoding the text would not reproduce."""
    messages = [{"role": "user", "content": "hi"}]
    first = build_prompt(tokenizer, normalize_messages(messages), [])
    # "Hello" sampled as single characters: decodes to the same text, encodes differently.
    sampled = [tid for ch in "Hello" for tid in tokenizer.encode(ch)] + [tokenizer.token_to_id("<|im_end|>")]
    answer = {"role": "assistant", "content": "Hello"}
    prior = PriorCall.from_call(messages, answer, first.prompt_ids, sampled)
    follow = normalize_messages([*messages, answer, {"role": "user", "content": "and?"}])
    plan = build_prompt(tokenizer, follow, [prior])
    assert plan.prompt_ids[: len(first.prompt_ids) + len(sampled)] == first.prompt_ids + sampled
    assert tokenizer.encode(tokenizer.render_chat(follow)) != plan.prompt_ids  # naive retokenization drifts


_text = st.text(alphabet=st.sampled_from(list("abc xyz{}\"':\n\t<>/_é0")), max_size=24)
_args = st.dictionaries(
    st.sampled_from(["command", "path", "n"]), st.one_of(_text, st.integers(-5, 500)), max_size=3
)
_turn = st.fixed_dictionaries(
    {
        "content": _text,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"name": st.just("bash"), "arguments": _args}), max_size=2
        ),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(_turn, min_size=2, max_size=4))
def test_prefix_property_holds_for_any_turns(tokenizer: PolicyTokenizer, turns: list[dict[str, Any]]) -> None:
    _assert_extends(_run_conversation(tokenizer, turns, _echo_reserialized, TOOLS))
