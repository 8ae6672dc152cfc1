"""Requests the gateway cannot honour get a 400 in the API's own shape, never a 500 or a silent
change of meaning (each case was found on a live gateway through the official SDKs):

- values of the wrong type that the chat template trips on (a tool's name or description that is
  not a string, a template kwarg shadowing a special token): the template raised ``TypeError``,
  which the gateway answered with a 500;
- an Anthropic assistant prefill (the conversation ends with an assistant message, to be
  continued): it was rendered as a closed turn followed by a new one;
- vLLM's ``continue_final_message`` / ``add_generation_prompt`` / ``chat_template`` on chat: ignored
  as unknown vendor fields;
- ``/completions`` with ``"prompt": [true]``: read as token 1;
- chat's ``functions`` (OpenAI's deprecated form of ``tools``): ignored as an unknown field, so the
  policy never saw the functions the harness offered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from harnessrl.engines.tiny_families import family_available, tiny_family_dir
from harnessrl.tokenizer import PolicyTokenizer

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def deepseek() -> PolicyTokenizer:
    """DeepSeek's template concatenates tool fields and ``bos_token`` as strings: a number fails it."""
    reason = family_available("deepseek")
    if reason is not None:
        pytest.skip(reason)
    return PolicyTokenizer.from_dir(tiny_family_dir("deepseek", weights=False))


def _openai(rollout: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def _anthropic(gw: Any, rollout: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )


def _function(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}, **fields}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [_function(name=5)]}, "tools.0"),
        ({"tools": [_function(description=5)]}, "tools.0"),
        ({"tools": [_function(parameters="x")]}, "tools.0"),
        ({"tools": [{"type": "function"}]}, "tools.0"),
        # Past the shape checks: what the template itself trips on (``bos_token`` joined to a string).
        ({"chat_template_kwargs": {"bos_token": 5}}, "messages"),
    ],
)
def test_chat_values_the_template_cannot_render_are_a_400(
    make_gateway: Callable[..., Any], deepseek: PolicyTokenizer, fields: dict[str, Any], param: str
) -> None:
    gw = make_gateway(["never sampled"], policy_tokenizer=deepseek)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw.rollout()).chat.completions.create(model="m", messages=USER, extra_body=fields)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_messages_tool_description_of_another_type_is_an_anthropic_400(
    make_gateway: Callable[..., Any], deepseek: PolicyTokenizer
) -> None:
    gw = make_gateway(["never sampled"], policy_tokenizer=deepseek)
    client = _anthropic(gw, gw.rollout())
    for tool in ({"name": "a", "description": 5, "input_schema": {}}, {"name": "a", "input_schema": "x"}):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="m", max_tokens=8, messages=USER, tools=[tool])  # type: ignore[list-item]
        assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "tools.0" in caught.value.body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "function", "name": "a", "description": 5},
        {"type": "function", "name": 5},
        {"type": "function", "name": "a", "parameters": "x"},
    ],
)
def test_responses_function_tool_of_the_wrong_shape_is_a_400(
    make_gateway: Callable[..., Any], deepseek: PolicyTokenizer, tool: dict[str, Any]
) -> None:
    gw = make_gateway(["never sampled"], policy_tokenizer=deepseek)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw.rollout()).responses.create(model="m", input="hi", tools=[tool])  # type: ignore[list-item]
    assert caught.value.body["param"].startswith("tools.0")  # type: ignore[index]


def test_anthropic_prefill_is_refused_naming_messages(make_gateway: Callable[..., Any]) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    client = _anthropic(gw, rollout)
    prefill = [*USER, {"role": "assistant", "content": "The answer is"}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=8, messages=prefill)  # type: ignore[arg-type]
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "messages" in error["message"]
    assert gw.client.list_calls(rollout["rollout_id"]) == []


@pytest.mark.parametrize(
    "field",
    [{"continue_final_message": True}, {"add_generation_prompt": False}, {"chat_template": "{{ messages }}"}],
)
def test_chat_rendering_fields_the_gateway_does_not_honour_are_a_400(
    make_gateway: Callable[..., Any], field: dict[str, Any]
) -> None:
    gw = make_gateway(["never sampled"])
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw.rollout()).chat.completions.create(model="m", messages=USER, extra_body=field)  # type: ignore[arg-type]
    assert caught.value.body["param"] == next(iter(field))  # type: ignore[index]


def test_chat_rendering_fields_at_what_the_gateway_does_are_accepted(
    make_gateway: Callable[..., Any],
) -> None:
    gw = make_gateway(["Hello!"])
    fields = {"continue_final_message": False, "add_generation_prompt": True, "chat_template": None}
    reply = _openai(gw.rollout()).chat.completions.create(model="m", messages=USER, extra_body=fields)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "Hello!"


@pytest.mark.parametrize("prompt", [[True], [[1, True]], [1.0]])
def test_completions_prompt_token_ids_are_strict_integers(
    make_gateway: Callable[..., Any], prompt: list[Any]
) -> None:
    gw = make_gateway(["never sampled"])
    rollout = gw.rollout()
    response = httpx.post(
        f"{rollout['base_url']}/completions",
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
        json={"prompt": prompt, "max_tokens": 4},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"].startswith("prompt")


@pytest.mark.parametrize(
    "choice",
    [
        "bogus",
        "Required",
        "required",  # without tools
        {"type": "function", "function": {"name": "bash"}},  # without tools
    ],
)
def test_a_tool_choice_openai_refuses_is_a_400_naming_it(
    make_gateway: Callable[..., Any], choice: Any
) -> None:
    """A misspelled or impossible ``tool_choice`` was taken as ``auto``: OpenAI refuses it."""
    gw = make_gateway(["never sampled"])
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw.rollout()).chat.completions.create(model="m", messages=USER, tool_choice=choice)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "function", "function": {"name": "ls"}},  # not among the tools
        {"type": "function", "name": "bash"},  # the Responses API's shape, not chat's
        {"type": "tool", "function": {"name": "bash"}},
    ],
)
def test_a_named_tool_choice_must_name_one_of_the_tools(
    make_gateway: Callable[..., Any], choice: Any
) -> None:
    gw = make_gateway(["never sampled"])
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw.rollout()).chat.completions.create(
            model="m",
            messages=USER,
            tools=[_function()],  # type: ignore[list-item]
            tool_choice=choice,
        )
    assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]


@pytest.mark.parametrize(
    ("choice", "tools"),
    [
        ("auto", False),  # harmless without tools: some SDKs send it
        ("none", False),
        ("none", True),
        ("auto", True),
        ("required", True),
        ({"type": "function", "function": {"name": "bash"}}, True),
    ],
)
def test_every_tool_choice_openai_takes_is_answered(
    make_gateway: Callable[..., Any], choice: Any, tools: bool
) -> None:
    gw = make_gateway(["an answer"])
    extra = {"tools": [_function()]} if tools else {}
    answer = _openai(gw.rollout()).chat.completions.create(
        model="m", messages=USER, tool_choice=choice, **extra
    )  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "an answer"


def test_chat_functions_the_deprecated_form_of_tools_are_a_400(make_gateway: Callable[..., Any]) -> None:
    gw = make_gateway(["I have no tools."])
    rollout = gw.rollout()
    function = {"name": "bash", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(rollout).chat.completions.create(
            model="m", messages=USER, functions=[function], function_call="auto"
        )
    assert caught.value.body["param"] == "functions"  # type: ignore[index]
    assert "tools" in caught.value.body["message"]  # type: ignore[index]
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    # The same function as a tool is rendered for the policy; an empty list offers nothing either way.
    tools = [{"type": "function", "function": function}]
    _openai(rollout).chat.completions.create(
        model="m", messages=USER, tools=tools, extra_body={"functions": []}
    )
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert '"name": "bash"' in gw.engine.tokenizer.decode(call.prompt_token_ids)
