"""gpt-oss tool-call turns with a preamble: reasoning (analysis), a text to the user (a commentary
message without a recipient) and a call. The gateway answers such a turn with the preamble as
``content`` beside ``reasoning_content``; sent back, it must render (gpt-oss's official template
refuses a tool-call turn with both) and render as sampled: analysis, commentary, call."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anthropic
import pytest

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.tokenizer import PolicyTokenizer

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "gpt_oss_style.jinja"
TOOLS: list[Any] = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
ANALYSIS = "<|channel|>analysis<|message|>I should list the files.<|end|>"
PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Listing them now.<|end|>"
CALL = '<|start|>assistant to=functions.bash<|channel|>commentary json<|message|>{"cmd": "ls"}<|call|>'
FINAL = "<|channel|>final<|message|>There is one file.<|return|>"


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> PolicyTokenizer:
    folder = tmp_path_factory.mktemp("gpt-oss-style")
    source = tiny_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(source / name, folder / name)
    shutil.copy(TEMPLATE, folder / "chat_template.jinja")
    return PolicyTokenizer.from_dir(folder)


def test_a_turn_with_a_preamble_and_reasoning_is_sent_back_and_reused(
    make_gateway: Any, harmony: PolicyTokenizer
) -> None:
    gw = make_gateway(
        [ANALYSIS + PREAMBLE + CALL, FINAL], policy_tokenizer=harmony, reasoning_parser="openai_gptoss"
    )
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    tools: list[Any] = [{"name": "bash", "input_schema": {"type": "object"}}]
    messages: list[Any] = [{"role": "user", "content": "What is here?"}]
    first = client.messages.create(model="m", max_tokens=1024, messages=messages, tools=tools)
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[1].text == "Listing them now."
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": first.content[2].id, "content": "a.txt"}],
        },
    ]
    # Was a 400: the template refuses a tool-call turn with both a content and a reasoning.
    second = client.messages.create(model="m", max_tokens=1024, messages=messages, tools=tools)
    assert [b.text for b in second.content if b.type == "text"] == ["There is one file."]
    one, two = gw.client.list_calls(rollout["rollout_id"])
    # The sampled turn's tokens are the next prompt's, token for token. (The tiny vocabulary has no
    # <|call|> token: the turn ends in its end-of-sequence token, which this template never writes.)
    assert harmony.decode(one.response_token_ids[-1:]) == "<|im_end|>"
    sampled = one.prompt_token_ids + one.response_token_ids[:-1]
    assert two.prompt_token_ids[: len(sampled)] == sampled


def test_the_full_render_is_the_turn_as_sampled(harmony: PolicyTokenizer) -> None:
    turn = {
        "role": "assistant",
        "content": "Listing them now.",
        "reasoning_content": "I should list the files.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
        ],
    }
    history = [{"role": "user", "content": "What is here?"}, turn, {"role": "tool", "content": "a.txt"}]
    text = harmony.render_chat(normalize_messages(history), tools=TOOLS)
    assert "<|start|>assistant" + ANALYSIS + PREAMBLE + CALL in text
    # Once a final answer follows, the template drops the turn's reasoning; its preamble goes with it.
    final = {"role": "assistant", "content": "There is one file."}
    later = harmony.render_chat(normalize_messages([*history, final, {"role": "user", "content": "ok"}]))
    assert "I should list" not in later and "Listing them now." not in later
    assert "<|start|>assistant" + CALL.removeprefix("<|start|>assistant") in later
