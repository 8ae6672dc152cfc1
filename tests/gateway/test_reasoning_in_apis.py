"""Reasoning in the Responses and Messages answers comes from the configured reasoning parser
(``gateway.reasoning_parser``): a ``<think>`` model's answers keep their shape, a gpt-oss model's
Harmony ``analysis`` channel becomes the reasoning item / thinking block, and an unknown name is a
config error. Driven by the official SDKs against a real gateway with the scripted engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.errors import ConfigError
from harnessrl.gateway import create_app
from harnessrl.gateway.apis.responses_output import OutputStream
from harnessrl.gateway.parsers.reasoning import get_reasoning_parser
from harnessrl.gateway.pipeline.generation import Piece
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

THINK_TURN = {"reasoning": "The user wants a greeting.", "content": "Hello there."}
HARMONY = "<|channel|>analysis<|message|>thinking…<|end|><|start|>assistant<|channel|>final<|message|>answer"


def responses_output(rollout: dict[str, Any], stream: bool) -> tuple[list[Any], Any]:
    """(output items, usage) of one Responses call, streamed or not."""
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    if not stream:
        resp = client.responses.create(model="m", input="hi")
        return resp.output, resp.usage
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    final = events[-1].response
    # The streamed deltas spell what the final items say.
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas.strip() == final.output[0].content[0].text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text
    return final.output, final.usage


def messages_content(gw: Any, rollout: dict[str, Any], stream: bool) -> list[Any]:
    """The content blocks of one Messages call, streamed or not."""
    client = anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )
    messages: Any = [{"role": "user", "content": "hi"}]
    if not stream:
        return client.messages.create(model="m", max_tokens=200, messages=messages).content
    with client.messages.stream(model="m", max_tokens=200, messages=messages) as events:
        return events.get_final_message().content


@pytest.mark.parametrize("stream", [False, True])
def test_a_think_models_answers_keep_their_shape(make_gateway: Any, stream: bool) -> None:
    gw = make_gateway([THINK_TURN])
    output, usage = responses_output(gw.rollout(), stream)
    assert [item.type for item in output] == ["reasoning", "message"]
    assert output[0].content[0].text == "The user wants a greeting."
    assert output[0].summary[0].text == "The user wants a greeting."
    assert output[1].content[0].text == "Hello there."  # the separator after </think> is dropped
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens

    blocks = messages_content(gw, gw.rollout(), stream)
    assert [b.type for b in blocks] == ["thinking", "text"]
    assert blocks[0].thinking == "The user wants a greeting." and blocks[0].signature
    assert blocks[1].text == "Hello there."


@pytest.mark.parametrize("stream", [False, True])
def test_harmony_analysis_is_the_reasoning_with_openai_gptoss(make_gateway: Any, stream: bool) -> None:
    gw = make_gateway([HARMONY], reasoning_parser="openai_gptoss")
    output, usage = responses_output(gw.rollout(), stream)
    assert [item.type for item in output] == ["reasoning", "message"]
    assert output[0].content[0].text == "thinking…"
    assert output[1].content[0].text == "answer"
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens

    rollout = gw.rollout()
    blocks = messages_content(gw, rollout, stream)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in blocks] == [
        ("thinking", "thinking…"),
        ("text", "answer"),
    ]
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.response["content"] == "answer" and call.response["reasoning_content"] == "thinking…"


def test_an_unknown_reasoning_parser_is_a_config_error_naming_the_known_ones(
    tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        with pytest.raises(ConfigError, match=r"reasoning_parser: unknown parser 'qwen9'.*openai_gptoss"):
            create_app(
                GatewayConfig(admin_key="k", reasoning_parser="qwen9"),
                store,
                ScriptedEngine(["x"], tokenizer),
            )
    finally:
        store.close()


def _pieces(tokenizer: PolicyTokenizer, text: str) -> list[Piece]:
    return [Piece(tokenizer.decode([i]), i, 0.0) for i in tokenizer.encode(text)]


def test_reasoning_after_the_answer_started_opens_a_new_reasoning_item(tokenizer: PolicyTokenizer) -> None:
    out = OutputStream(None, reasoning=get_reasoning_parser("glm45")())
    for piece in _pieces(tokenizer, "<think>plan</think>\n\nFirst. <think>more</think> Then."):
        out.feed(piece)
    out.finish("completed")
    kinds = [(item["type"], item["status"]) for item in out.items]
    assert kinds == [("reasoning", "completed"), ("message", "completed"), ("reasoning", "completed")]
    assert [out.items[i]["content"][0]["text"] for i in (0, 2)] == ["plan", "more"]
    assert out.items[1]["content"][0]["text"] == "First.  Then."
    assert out.internal_message()["reasoning_content"] == "plan\nmore"


def test_separator_tokens_count_as_reasoning_and_a_later_think_is_text(tokenizer: PolicyTokenizer) -> None:
    text = "<think>\nplan\n</think>\n\nAnswer <think>"
    out = OutputStream(None, reasoning=get_reasoning_parser("qwen3")())
    pieces = _pieces(tokenizer, text)
    for piece in pieces:
        out.feed(piece)
    out.finish("completed")
    assert [item["type"] for item in out.items] == ["reasoning", "message"]
    assert out.items[1]["content"][0]["text"] == "Answer <think>"  # qwen3: only a leading block is reasoning
    # Reasoning tokens, as before the parsers: the block with its tags, the separator after it, and
    # the token that ends the separator (the answer's first, seen while still in the separator).
    up_to_answer = len(tokenizer.encode("<think>\nplan\n</think>\n\n"))
    assert out.reasoning_tokens == up_to_answer + 1
