"""Request fields the Responses and Messages APIs took and ignored although they change what the model
must do, found through the official SDKs on a live gateway; each is now a 400 in the API's own shape
naming the field, and nothing is recorded:

- Responses' ``conversation`` and ``prompt`` (OpenAI's stored conversation and stored prompt): the
  policy answered without the items or instructions they stand for;
- a ``tool_choice`` the provider refuses (a misspelled value, a named tool not among the tools, a
  forced tool without tools) was taken as ``auto`` on Responses and Messages, as chat no longer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

USER = [{"role": "user", "content": "hi"}]
RESPONSES_TOOL = {"type": "function", "name": "bash", "parameters": {"type": "object"}}
MESSAGES_TOOL = {"name": "bash", "input_schema": {"type": "object"}}


def _openai(rollout: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def _anthropic(gw: Any, rollout: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"conversation": "conv_123"},
        {"conversation": {"id": "conv_123"}},
        {"prompt": {"id": "pmpt_123", "variables": {"city": "Paris"}}},
    ],
)
def test_responses_server_side_state_is_refused_naming_the_field(
    make_gateway: Callable[..., Any], fields: dict[str, Any]
) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(rollout).responses.create(model="m", input="and now?", extra_body=fields)
    assert caught.value.body["param"] == next(iter(fields))  # type: ignore[index]
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert gw.client.list_calls(rollout["rollout_id"]) == []


def test_responses_null_server_side_state_is_still_accepted(make_gateway: Callable[..., Any]) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    answer = _openai(rollout).responses.create(
        model="m", input="hi", extra_body={"conversation": None, "prompt": None}
    )
    assert answer.output_text == "Hello!"
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": "nonе"},  # a Cyrillic "е": not "none", was taken as "auto"
        {"tool_choice": "any", "tools": [RESPONSES_TOOL]},
        {"tool_choice": {"type": "function", "name": "python"}, "tools": [RESPONSES_TOOL]},
        {"tool_choice": {"type": "function"}, "tools": [RESPONSES_TOOL]},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "name": "bash"}},
        {"tool_choice": {"type": "function", "name": "web_search"}, "tools": [{"type": "web_search"}]},
    ],
)
def test_responses_tool_choice_openai_refuses_is_a_400(
    make_gateway: Callable[..., Any], fields: dict[str, Any]
) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(rollout).responses.create(model="m", input="hi", extra_body=fields)
    assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert gw.client.list_calls(rollout["rollout_id"]) == []


def test_responses_required_with_hosted_tools_only_is_still_served(make_gateway: Callable[..., Any]) -> None:
    """The hosted tools are dropped (``unsupported_tools = "drop"``) and the call is served, as before."""
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    answer = _openai(rollout).responses.create(
        model="m",
        input="hi",
        tools=[{"type": "web_search"}],  # type: ignore[list-item]
        tool_choice="required",
    )
    assert answer.output_text == "Hello!"


@pytest.mark.parametrize(
    "choice", ["none", "auto", "required", {"type": "function", "name": "bash"}, {"type": "web_search"}]
)
def test_responses_tool_choices_openai_takes_are_accepted(
    make_gateway: Callable[..., Any], choice: Any
) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    answer = _openai(rollout).responses.create(
        model="m",
        input="hi",
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
        tool_choice=choice,
    )
    assert answer.output_text == "Hello!"
    assert answer.tool_choice == choice or answer.tool_choice.type == choice["type"]  # type: ignore[union-attr,index]


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": {"type": "nonе"}, "tools": [MESSAGES_TOOL]},  # Cyrillic "е": not "none"
        {"tool_choice": {"type": "required"}, "tools": [MESSAGES_TOOL]},
        {"tool_choice": {"type": "tool", "name": "python"}, "tools": [MESSAGES_TOOL]},
        {"tool_choice": {"type": "tool"}, "tools": [MESSAGES_TOOL]},
        {"tool_choice": {"type": "any"}},
        {"tool_choice": {"type": "tool", "name": "bash"}},
    ],
)
def test_messages_tool_choice_anthropic_refuses_is_a_400(
    make_gateway: Callable[..., Any], fields: dict[str, Any]
) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    client = _anthropic(gw, rollout)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=8, messages=USER, extra_body=fields)  # type: ignore[arg-type]
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "tool_choice" in error["message"]
    with pytest.raises(anthropic.BadRequestError):  # count_tokens reads the same body
        client.messages.count_tokens(model="m", messages=USER, extra_body=fields)  # type: ignore[arg-type]
    assert gw.client.list_calls(rollout["rollout_id"]) == []


@pytest.mark.parametrize(
    "choice", [{"type": "auto"}, {"type": "none"}, {"type": "any"}, {"type": "tool", "name": "bash"}]
)
def test_messages_tool_choices_anthropic_takes_are_accepted(
    make_gateway: Callable[..., Any], choice: Any
) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    answer = _anthropic(gw, rollout).messages.create(
        model="m",
        max_tokens=8,
        messages=USER,  # type: ignore[arg-type]
        tools=[MESSAGES_TOOL],  # type: ignore[list-item]
        tool_choice=choice,
    )
    assert answer.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_completion_tokens": 10**9}, "max_completion_tokens"),
        ({"max_tokens": 1, "max_completion_tokens": 10**9}, "max_completion_tokens"),  # the one that counts
        ({"max_tokens": 10**9}, "max_tokens"),
    ],
)
def test_chat_budget_over_the_context_names_the_field_the_client_sent(
    make_gateway: Callable[..., Any], fields: dict[str, Any], param: str
) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(rollout).chat.completions.create(model="m", messages=USER, **fields)  # type: ignore[arg-type]
    assert caught.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert gw.client.list_calls(rollout["rollout_id"]) == []
