"""A tool call's arguments fit the gateway's own request check when the harness sends the call back.

Qwen3-Coder and GLM write arguments as text that the schema types: ``int()`` took any length, an
integral ``number`` such as ``1e30`` became a 31-digit integer, and nesting was checked on the value
alone. Such a call came out, and the next request, which echoes it (in Anthropic's shape, four
levels deeper), was refused with a 400. Now such a block is text, as a malformed one is; the depth
bound is the one an Anthropic body leaves a ``tool_use`` input, for the JSON formats (Hermes) too.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from harnessrl.gateway.json_input import parse_json
from harnessrl.gateway.parsers.tools import GlmToolParser, HermesToolParser, QwenXmlToolParser, collect

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "obj": {"type": "object"},
        "any": {"type": "widget"},
    },
}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]


def nested(levels: int) -> Any:
    """A JSON object nested ``levels`` deep (1: ``{}``)."""
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def qwen_call(**params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def glm_call(**params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in params.items())
    return f"<tool_call>f{body}</tool_call>"


def read(parser: Any, text: str) -> tuple[list[dict[str, Any]], str | None, int]:
    message = collect(parser.feed(text) + parser.finish())
    return [json.loads(c.arguments) for c in message.tool_calls], message.content, parser.malformed


def echo_body(arguments: dict[str, Any]) -> str:
    """The next Anthropic request a harness sends with the call in it."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": arguments}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    return json.dumps({"model": "m", "max_tokens": 10, "messages": messages})


@pytest.mark.parametrize(("cls", "call"), [(QwenXmlToolParser, qwen_call), (GlmToolParser, glm_call)])
@pytest.mark.parametrize(
    "value", ["n=" + str(2**63), "n=-" + str(2**63 + 1), "obj=" + json.dumps(nested(59))]
)
def test_a_typed_value_the_next_request_would_refuse_makes_the_block_text(
    cls: type, call: Any, value: str
) -> None:
    key, raw = value.split("=", 1)
    text = "Hi " + call(**{key: raw})
    calls, content, malformed = read(cls(TOOLS), text)
    assert (calls, content, malformed) == ([], text, 1)


@pytest.mark.parametrize(("cls", "call"), [(QwenXmlToolParser, qwen_call), (GlmToolParser, glm_call)])
def test_values_at_the_bounds_are_calls_the_next_request_accepts(cls: type, call: Any) -> None:
    text = call(n=str(2**63 - 1), x="1e30", obj=json.dumps(nested(58)), any=str(10**23))
    [arguments], _, malformed = read(cls(TOOLS), text)
    assert malformed == 0
    assert arguments["n"] == 2**63 - 1
    assert arguments["x"] == 1e30 and isinstance(arguments["x"], float)  # a number, not a 31-digit int
    assert arguments["any"] == str(10**23)  # an integer literal past 64 bits is text, not 1e+23
    parse_json(echo_body(arguments))  # what the harness sends next passes the request check


def test_hermes_arguments_deeper_than_an_echo_allows_are_text() -> None:
    for levels, is_call in ((59, True), (60, False)):
        text = "<tool_call>" + json.dumps({"name": "f", "arguments": nested(levels)}) + "</tool_call>"
        calls, content, malformed = read(HermesToolParser(), text)
        assert (len(calls), malformed) == ((1, 0) if is_call else (0, 1))
        if is_call:
            parse_json(echo_body(calls[0]))
        else:
            assert content == text


def test_a_deep_call_echoed_through_a_real_gateway_is_accepted(make_gateway: Any) -> None:
    # The arguments object is a level of its own: a value in it may nest one level less.
    deepest = qwen_call(obj=json.dumps(nested(58)))
    too_deep = qwen_call(obj=json.dumps(nested(59)))
    gw = make_gateway([deepest, "done", too_deep], tool_call_parser="qwen3_coder")
    rollout = gw.rollout()
    client = anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )
    tools: Any = [{"name": "f", "input_schema": SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": "go"}]
    first = client.messages.create(model="m", max_tokens=400, messages=messages, tools=tools)
    [use] = [b for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
    ]
    second = client.messages.create(model="m", max_tokens=400, messages=messages, tools=tools)  # not a 400
    assert second.content[0].type == "text"
    third = client.messages.create(
        model="m", max_tokens=400, messages=[{"role": "user", "content": "again"}], tools=tools
    )
    assert [b.type for b in third.content] == ["text"]  # too deep to echo: the block is text
