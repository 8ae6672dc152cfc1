"""Every provider API runs through the same pipeline (``gateway.pipeline``): the same scripted answers
(reasoning, text, a tool call, then text) asked for through chat completions, the Responses API and
Anthropic Messages, streamed and not, leave the same recorded calls.

Each leg is one rollout of two calls, driven by the official SDK of its API: the first call is
answered with a tool call; the second sends the answer back in the API's own shape (as a harness
does) with the tool's result. What the store holds must then agree token for token across all six
legs: the prompt (the same conversation, built with sampled-token reuse on the second call), the
sampled tokens and logprobs, the finish reason, how the prompt was built; and the recorded answer
must be the same message whether the client streamed or not.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from harnessrl.schemas import Call

TURNS = [
    {
        "reasoning": "The user wants the files.",
        "content": "Let me look.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
    },
    {"content": "There is a.txt."},
]
TOOLS_CHAT: Any = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
TOOLS_RESPONSES: Any = [{"type": "function", **TOOLS_CHAT[0]["function"]}]
TOOLS_MESSAGES: Any = [
    {
        "name": "bash",
        "description": "Run a command.",
        "input_schema": TOOLS_CHAT[0]["function"]["parameters"],
    }
]
SYSTEM = "You are an agent."
OUTPUT = "a.txt"


def chat_leg(rollout: dict[str, Any], stream: bool) -> None:
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]

    def ask() -> Any:
        if not stream:
            return client.chat.completions.create(model="m", messages=messages, tools=TOOLS_CHAT).choices[0]
        with client.chat.completions.stream(model="m", messages=messages, tools=TOOLS_CHAT) as events:
            return events.get_final_completion().choices[0]

    first = ask()
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    messages += [
        first.message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
        {"role": "tool", "tool_call_id": call.id, "content": OUTPUT},
    ]
    assert ask().message.content == TURNS[1]["content"]


def responses_leg(rollout: dict[str, Any], stream: bool) -> None:
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    items: Any = [{"role": "user", "content": "List the files."}]

    def ask() -> Any:
        if not stream:
            return client.responses.create(model="m", instructions=SYSTEM, input=items, tools=TOOLS_RESPONSES)
        events = list(
            client.responses.create(
                model="m", instructions=SYSTEM, input=items, tools=TOOLS_RESPONSES, stream=True
            )
        )
        assert events[-1].type == "response.completed"
        return events[-1].response

    first = ask()
    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["bash"]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": OUTPUT})
    assert ask().output_text == TURNS[1]["content"]


def messages_leg(url: str, rollout: dict[str, Any], stream: bool) -> None:
    client = anthropic.Anthropic(
        base_url=f"{url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )
    messages: Any = [{"role": "user", "content": "List the files."}]

    def ask() -> Any:
        kwargs: Any = {"model": "m", "max_tokens": 300, "system": SYSTEM, "messages": messages}
        if not stream:
            return client.messages.create(**kwargs, tools=TOOLS_MESSAGES)
        with client.messages.stream(**kwargs, tools=TOOLS_MESSAGES) as events:
            return events.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": OUTPUT}]},
    ]
    second = ask()
    assert [block.text for block in second.content if block.type == "text"] == [TURNS[1]["content"]]


def tokens(call: Call) -> dict[str, Any]:
    """What a recorded call holds that must not depend on the API or on streaming."""
    return {
        "prompt": call.prompt_token_ids,
        "response": call.response_token_ids,
        "logprobs": call.response_logprobs,
        "finish_reason": call.finish_reason,
        "prompt_source": call.usage.prompt_source,
        "reused": call.usage.reused_prompt_tokens,
        "tokens": (call.usage.prompt_tokens, call.usage.completion_tokens),
    }


def answer(call: Call) -> dict[str, Any]:
    """The recorded answer without what is new on every call (ids)."""
    response = {k: v for k, v in call.response.items() if k != "_response_id"}
    response["tool_calls"] = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in response.get("tool_calls") or []
    ]
    return response


@pytest.fixture
def legs(make_gateway: Any) -> dict[tuple[str, bool], list[Call]]:
    """Every API, streamed and not, each in a rollout of its own: its recorded calls."""
    gw = make_gateway(TURNS)
    recorded = {}
    for api in ("chat.completions", "responses", "messages"):
        for stream in (False, True):
            rollout = gw.rollout()
            if api == "chat.completions":
                chat_leg(rollout, stream)
            elif api == "responses":
                responses_leg(rollout, stream)
            else:
                messages_leg(gw.url, rollout, stream)
            calls = gw.store.list_calls(rollout["rollout_id"])
            assert [c.api for c in calls] == [api, api]
            recorded[api, stream] = calls
    return recorded


def test_every_api_streamed_or_not_records_the_same_tokens(legs: dict[tuple[str, bool], list[Call]]) -> None:
    reference = [tokens(c) for c in legs["chat.completions", False]]
    assert [r["prompt_source"] for r in reference] == ["first", "reused"]
    assert reference[0]["finish_reason"] == "tool_calls" and reference[1]["finish_reason"] == "stop"
    for leg, calls in legs.items():
        assert [tokens(c) for c in calls] == reference, leg


def test_streaming_does_not_change_the_recorded_answer(legs: dict[tuple[str, bool], list[Call]]) -> None:
    for api in ("chat.completions", "responses", "messages"):
        whole, streamed = legs[api, False], legs[api, True]
        assert [answer(c) for c in streamed] == [answer(c) for c in whole], api


def test_the_apis_record_the_same_tool_call_and_text(legs: dict[tuple[str, bool], list[Call]]) -> None:
    answers = {api: [answer(c) for c in calls] for (api, _), calls in legs.items()}
    first_calls = {api: a[0]["tool_calls"] for api, a in answers.items()}
    assert all(
        calls == [{"name": "bash", "arguments": '{"command": "ls"}'}] for calls in first_calls.values()
    ), first_calls
    assert {a[1]["content"] for a in answers.values()} == {TURNS[1]["content"]}
