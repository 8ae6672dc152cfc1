"""A tool call whose arguments hold integral numbers written as floats (``30.0``, ``1e2``, ``-0.0``)
comes back from a JavaScript or Go harness as integers, and the chain must hold.

A harness in JavaScript (Claude Code, OpenCode and other agents on the Vercel AI SDK) reads a
call's arguments (or a Messages ``tool_use`` input) with ``JSON.parse`` and sends them back with
``JSON.stringify``; Go's ``encoding/json`` does the same with ``float64``. Both write an integral
number without a fraction: ``30.0`` comes back ``30``. History matching compares arguments by their
parsed values, so the answer the gateway gives must be one that survives that round trip:
otherwise the next call is a ``no_match``, the sampled tokens are not reused and the rollout's
chain breaks on every such call (seen with the real Claude Code and OpenCode and a Bash
``timeout`` of ``30000.0``: three calls, three samples). Checked for every tool-call format,
through the real gateway, on the chat and Messages APIs, with ``JSON.stringify`` modelled in
``js_roundtrip`` (its control below holds node's own output).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import pytest

from harnessrl.gateway.parsers.tools import parse_tool_calls

#: A call's arguments as the model writes them: integral numbers spelled as floats, at the top and
#: nested, next to values that must stay what they are (a fraction, a big float, a string).
ARGS = '{"cmd": "sleep 30.0", "timeout": 30.0, "scale": 1e2, "opts": {"xs": [1.0, -0.0, 2.5], "big": 1e30}}'
VALUES = {"cmd": "sleep 30.0", "timeout": 30, "scale": 100, "opts": {"xs": [1, 0, 2.5], "big": 1e30}}

# (parser config, the raw answer in the family's format). The XML formats write values as text,
# typed by the schema (``opts`` is an object there, so its JSON is parsed).
FAMILIES: dict[str, tuple[dict[str, str], str]] = {
    "hermes": (
        {"tool_call_parser": "hermes"},
        '<tool_call>\n{"name": "bash", "arguments": ' + ARGS + "}\n</tool_call>",
    ),
    "llama3_json": (
        {"tool_call_parser": "llama3_json"},
        '<|python_tag|>{"name": "bash", "parameters": ' + ARGS + "}",
    ),
    "mistral": ({"tool_call_parser": "mistral"}, "[TOOL_CALLS]bash[ARGS]" + ARGS),
    "deepseek_v31": (
        {"tool_call_parser": "deepseek_v31"},
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>"
        + ARGS
        + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    "deepseek_v3": (
        {"tool_call_parser": "deepseek_v3"},
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n"
        + ARGS
        + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    "kimi_k2": (
        {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2"},
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
        + ARGS
        + "<|tool_call_end|><|tool_calls_section_end|>",
    ),
    "openai": (
        {"tool_call_parser": "openai", "reasoning_parser": "openai_gptoss"},
        "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>" + ARGS + "<|call|>",
    ),
    "qwen3_coder": (
        {"tool_call_parser": "qwen3_coder"},
        "<tool_call>\n<function=bash>\n<parameter=cmd>\nsleep 30.0\n</parameter>\n"
        "<parameter=timeout>\n30.0\n</parameter>\n<parameter=scale>\n1e2\n</parameter>\n"
        '<parameter=opts>\n{"xs": [1.0, -0.0, 2.5], "big": 1e30}\n</parameter>\n</function>\n</tool_call>',
    ),
    "glm45": (
        {"tool_call_parser": "glm45", "reasoning_parser": "glm45"},
        "<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>sleep 30.0</arg_value>\n"
        "<arg_key>timeout</arg_key>\n<arg_value>30.0</arg_value>\n<arg_key>scale</arg_key>\n<arg_value>1e2</arg_value>\n"
        '<arg_key>opts</arg_key>\n<arg_value>{"xs": [1.0, -0.0, 2.5], "big": 1e30}</arg_value>\n</tool_call>',
    ),
}
SCHEMA = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string"},
        "timeout": {"type": "number"},
        "scale": {"type": "number"},
        "opts": {"type": "object"},
    },
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "bash", "input_schema": SCHEMA}]


def as_javascript(value: Any) -> Any:
    """``value`` after ``JSON.parse`` (every number a double) and ``JSON.stringify``: an integral double
    below 1e21 is printed without a fraction, as its shortest decimal's digits followed by zeros
    (ECMAScript's Number::toString), so it comes back an integer."""
    if isinstance(value, dict):
        return {k: as_javascript(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_javascript(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(Decimal(repr(value)))  # the shortest decimal's digits, then zeros
    return value


def js_roundtrip(text: str) -> str:
    """``JSON.stringify(JSON.parse(text))``."""
    return json.dumps(as_javascript(json.loads(text)), separators=(",", ":"), ensure_ascii=False)


def test_the_javascript_model_is_javascripts() -> None:
    # Control for the helper: what node 20 prints for these (node -e, JSON.stringify(JSON.parse(s))).
    written = '{"a": 30.0, "b": 1e2, "c": -0.0, "d": 2.5, "e": 1e30, "f": "30.0", "g": 9.223372036854775e18}'
    assert (
        js_roundtrip(written) == '{"a":30,"b":100,"c":0,"d":2.5,"e":1e+30,"f":"30.0","g":9223372036854775000}'
    )


def _chat_round_trip(gateway: Any) -> tuple[str, Any]:
    rollout = gateway.rollout()
    url = rollout["base_url"] + "/chat/completions"
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    user = {"role": "user", "content": "Wait a bit."}
    with httpx.Client(timeout=60) as http:
        first = http.post(url, headers=headers, json={"model": "m", "messages": [user], "tools": CHAT_TOOLS})
        assert first.status_code == 200, first.text
        # The harness keeps the call's arguments parsed (the Vercel AI SDK's ``input``) and writes
        # them with JSON.stringify when it sends its history back.
        message = first.json()["choices"][0]["message"]
        [call] = message["tool_calls"]
        call["function"]["arguments"] = js_roundtrip(call["function"]["arguments"])
        history = [user, message, {"role": "tool", "tool_call_id": call["id"], "content": "slept"}]
        second = http.post(
            url, headers=headers, json={"model": "m", "messages": history, "tools": CHAT_TOOLS}
        )
        assert second.status_code == 200, second.text
    return rollout["rollout_id"], json.loads(call["function"]["arguments"])


def _messages_round_trip(gateway: Any) -> tuple[str, Any]:
    rollout = gateway.rollout()
    url = rollout["base_url"] + "/messages"
    headers = {"x-api-key": rollout["api_key"]}
    user = {"role": "user", "content": "Wait a bit."}
    body = {"model": "m", "max_tokens": 400, "tools": ANTHROPIC_TOOLS}
    with httpx.Client(timeout=60) as http:
        first = http.post(url, headers=headers, json={**body, "messages": [user]})
        assert first.status_code == 200, first.text
        blocks = json.loads(js_roundtrip(first.text))["content"]
        [use] = [b for b in blocks if b["type"] == "tool_use"]
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": "slept"}
        history = [user, {"role": "assistant", "content": blocks}, {"role": "user", "content": [result]}]
        second = http.post(url, headers=headers, json={**body, "messages": history})
        assert second.status_code == 200, second.text
    return rollout["rollout_id"], use["input"]


@pytest.mark.parametrize("api", ["chat", "messages"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_call_echoed_by_a_javascript_harness_keeps_the_chain(
    make_gateway: Callable[..., Any], family: str, api: str
) -> None:
    config, raw = FAMILIES[family]
    gateway = make_gateway([raw, "Done."], **config)
    round_trip = _chat_round_trip if api == "chat" else _messages_round_trip
    rollout_id, echoed = round_trip(gateway)
    assert echoed == VALUES  # the call was parsed, and its values are the model's
    first, second = gateway.client.list_calls(rollout_id)
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_source == "reused"
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(head)] == head


def test_control_a_changed_value_still_breaks_the_chain(make_gateway: Callable[..., Any]) -> None:
    # The match is by value: a harness that changes a number is not continuing the answer.
    config, raw = FAMILIES["hermes"]
    gateway = make_gateway([raw, "Done."], **config)
    rollout = gateway.rollout()
    url = rollout["base_url"] + "/chat/completions"
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    user = {"role": "user", "content": "Wait a bit."}
    with httpx.Client(timeout=60) as http:
        first = http.post(url, headers=headers, json={"model": "m", "messages": [user], "tools": CHAT_TOOLS})
        message = first.json()["choices"][0]["message"]
        arguments = json.loads(message["tool_calls"][0]["function"]["arguments"])
        message["tool_calls"][0]["function"]["arguments"] = json.dumps({**arguments, "timeout": 31})
        tool = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "slept"}
        second = http.post(
            url, headers=headers, json={"model": "m", "messages": [user, message, tool], "tools": CHAT_TOOLS}
        )
        assert second.status_code == 200, second.text
    calls = gateway.client.list_calls(rollout["rollout_id"])
    assert calls[1].usage is not None and calls[1].usage.prompt_source == "no_match"


def _tool(value_type: str) -> list[dict[str, Any]]:
    """A tool ``f`` whose argument ``v`` has the JSON-schema type ``value_type``."""
    schema = {"properties": {"v": {"type": value_type}}}
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("30.0", "30"),
        ("-0.0", "0"),
        ("1e2", "100"),
        ("9.223372036854775e18", "9223372036854775000"),  # the decimal written, not the binary value
        ("1152921504606846976.0", "1152921504606847000"),  # 2**60: its shortest decimal, as JavaScript's
        ("9.3e18", "9.3e+18"),  # past 64 bits: an integer there would be refused, so it stays a float
        ("2.5", "2.5"),
        ('"30.0"', '"30.0"'),  # a string is text
    ],
)
def test_the_harness_receives_integral_numbers_as_integers(written: str, sent: str) -> None:
    xml = "<tool_call><function=f><parameter=v>" + written + "</parameter></function></tool_call>"
    for parser, text, value_type in [
        ("hermes", '<tool_call>{"name": "f", "arguments": {"v": ' + written + "}}</tool_call>", "number"),
        ("qwen3_coder", xml, "number"),  # typed by the schema
        ("qwen3_coder", xml, "any"),  # a type the typing does not know: read as JSON when it is JSON
    ]:
        [call] = parse_tool_calls(text, parser, _tool(value_type)).tool_calls
        assert call.arguments == '{"v": ' + sent + "}", (parser, value_type)
