"""OpenAI's deprecated function-calling history: an assistant ``function_call`` and the ``function``
message answering it reach the policy as the tool call and tool result the template renders."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from harnessrl.errors import BadRequest
from harnessrl.gateway.prompt.messages import normalize_message

HISTORY: list[Any] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {"role": "function", "name": "get_weather", "content": "SUNNY-42"},
]


def test_a_legacy_function_call_and_its_result_are_in_the_prompt(make_gateway: Any) -> None:
    gw = make_gateway(["It is sunny."])
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    answer = client.chat.completions.create(model="m", messages=HISTORY)
    assert answer.choices[0].message.content == "It is sunny."
    [call] = gw.client.list_calls(rollout["rollout_id"])
    prompt = gw.engine.tokenizer.decode(call.prompt_token_ids)
    # The policy sees the call it made, not an empty assistant turn followed by an orphan result.
    assert "get_weather" in prompt and '"city": "Paris"' in prompt
    assert prompt.index("get_weather") < prompt.index("SUNNY-42")


def test_a_function_call_is_the_same_turn_as_its_tool_call_form() -> None:
    legacy = normalize_message(HISTORY[1], 1)
    modern = normalize_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": HISTORY[1]["function_call"]}],
        },
        1,
    )
    assert legacy == modern


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "", "function_call": "get_weather"},
        {"role": "user", "content": "hi", "function_call": {"name": "x", "arguments": "{}"}},
        {"role": "assistant", "content": "", "function_call": {"arguments": "{}"}},
        {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": 5}},
    ],
)
def test_a_malformed_function_call_is_refused_naming_it(message: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as caught:
        normalize_message(message, 3)
    assert caught.value.param.startswith("messages.3.function_call")
