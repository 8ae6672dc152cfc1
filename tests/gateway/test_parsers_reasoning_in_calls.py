"""Reasoning markers inside a tool call's arguments are the arguments' text, in every API.

Chat gives the tool parser the sampled text as it is; Messages and Responses give it the content the
reasoning parser leaves. After a reasoning block the ``<think>`` parsers drop a stray ``</think>``
(and glm45 opens a block at ``<think>``), which used to reach into the calls: ``s.split("</think>")``
came out as ``s.split("")`` in Messages and Responses, and a glm45 argument holding ``<think>`` lost
its call. Now the reasoning parser passes a tool call's block on verbatim, so all three agree.
Driven through a real gateway with the scripted engine, and on the parsers directly.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from harnessrl.gateway.apis.anthropic_blocks import BlockAssembler
from harnessrl.gateway.parsers.reasoning import get_reasoning_parser, split_reasoning
from harnessrl.gateway.parsers.tools import GlmToolParser, HermesToolParser

CODE = 's.split("</think>") + ["<think>"]'
HERMES_ANSWER = (
    "<think>\nplan\n</think>\n\n<tool_call>\n"
    + json.dumps({"name": "write", "arguments": {"code": CODE}})
    + "\n</tool_call>"
)
GLM_ANSWER = f"<think>plan</think>\n<tool_call>write\n<arg_key>code</arg_key>\n<arg_value>{CODE}</arg_value>\n</tool_call>"
KIMI_ANSWER = (
    "<think>plan</think><|tool_calls_section_begin|><|tool_call_begin|>functions.write:0"
    f"<|tool_call_argument_begin|>{json.dumps({'code': CODE})}<|tool_call_end|><|tool_calls_section_end|>"
)
WRITE = {"type": "object", "properties": {"code": {"type": "string"}}}


@pytest.mark.parametrize(
    ("parser", "answer"),
    [("qwen3", HERMES_ANSWER), ("glm45", GLM_ANSWER), ("kimi_k2", KIMI_ANSWER)],
)
def test_a_calls_block_reaches_the_tool_parser_verbatim(parser: str, answer: str) -> None:
    reasoning, content = split_reasoning(answer, parser)
    assert reasoning is not None and reasoning.strip() == "plan"
    assert (
        content.lstrip() == answer[answer.index("<tool_call>" if parser != "kimi_k2" else "<|tool_calls") :]
    )
    # Any split of the text gives the same (the block's end marker may arrive in pieces).
    for size in (1, 3, 7):
        p = get_reasoning_parser(parser)()
        events = [e for i in range(0, len(answer), size) for e in p.feed(answer[i : i + size])] + p.finish()
        assert "".join(e.text for e in events if type(e).__name__ == "ContentText") == content


def test_after_the_block_stray_markers_outside_calls_are_still_read() -> None:
    # qwen3 drops a stray </think> after the block; glm45 opens a new block at <think>: in the content,
    # not in a call's block.
    _, content = split_reasoning(
        "<think>a</think>x</think>y<tool_call>{</think>}</tool_call></think>z", "qwen3"
    )
    assert content == "xy<tool_call>{</think>}</tool_call>z"
    reasoning, content = split_reasoning(
        "<think>a</think>x<tool_call><think></tool_call><think>b</think>", "glm45"
    )
    assert (reasoning, content) == ("ab", "x<tool_call><think></tool_call>")


def test_glm_content_held_by_the_tool_parser_comes_before_a_later_thinking_block() -> None:
    # "<tool" may start a call: the tool parser holds it. A block opened after it (glm45) must not
    # come first, nor merge with an earlier thinking block.
    blocks = BlockAssembler(GlmToolParser(), reasoning=get_reasoning_parser("glm45")())
    for piece in ("<think>one</think>", "Look <tool", "<think>two</think>", "done"):
        blocks.feed(piece)
    blocks.finish()
    shown = [(b["type"], b.get("thinking", b.get("text"))) for b in blocks.blocks]
    assert shown == [("thinking", "one"), ("text", "Look <tool"), ("thinking", "two"), ("text", "done")]


def _chat_arguments(gw: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    chat_tools: Any = [{"type": "function", "function": t} for t in tools]
    message = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "go"}], tools=chat_tools
    )
    [call] = message.choices[0].message.tool_calls or []
    return json.loads(call.function.arguments)


def _messages_arguments(gw: Any, tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    rollout = gw.rollout()
    client = anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )
    kwargs: Any = {
        "model": "m",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"name": t["name"], "input_schema": t["parameters"]} for t in tools],
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            content = events.get_final_message().content
    else:
        content = client.messages.create(**kwargs).content
    [use] = [b for b in content if b.type == "tool_use"]
    return dict(use.input)


def _responses_arguments(gw: Any, tools: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    response_tools: Any = [{"type": "function", **t} for t in tools]
    if stream:
        events = list(client.responses.create(model="m", input="go", tools=response_tools, stream=True))
        output = events[-1].response.output
    else:
        output = client.responses.create(model="m", input="go", tools=response_tools).output
    [call] = [item for item in output if item.type == "function_call"]
    return json.loads(call.arguments)


@pytest.mark.parametrize(
    ("answer", "config"),
    [
        (HERMES_ANSWER, {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"}),
        (GLM_ANSWER, {"tool_call_parser": "glm45", "reasoning_parser": "glm45"}),
    ],
)
def test_chat_messages_and_responses_give_the_same_arguments(
    make_gateway: Any, answer: str, config: dict[str, str]
) -> None:
    gw = make_gateway([answer] * 5, **config)
    tools = [{"name": "write", "parameters": WRITE}]
    expected = {"code": CODE}
    assert _chat_arguments(gw, tools) == expected
    for stream in (False, True):
        assert _messages_arguments(gw, tools, stream) == expected
    assert _responses_arguments(gw, tools, stream=False) == expected
    assert _responses_arguments(gw, tools, stream=True) == expected


def test_hermes_parser_and_the_reasoning_parser_agree_on_a_block_split_anywhere() -> None:
    # The reasoning parser's view of where a call's block ends is the tool parser's: a </tool_call>
    # cut in two still ends it, and the </think> after it is stray again.
    text = HERMES_ANSWER + "</think>tail"
    for cut in range(len(HERMES_ANSWER) - 8, len(HERMES_ANSWER) + 2):
        p = get_reasoning_parser("qwen3")()
        events = p.feed(text[:cut]) + p.feed(text[cut:]) + p.finish()
        content = "".join(e.text for e in events if type(e).__name__ == "ContentText")
        assert content.endswith("</tool_call>tail")
        parser = HermesToolParser()
        [call] = [e.call for e in parser.feed(content) + parser.finish() if hasattr(e, "call")]
        assert json.loads(call.arguments) == {"code": CODE}
