"""Consecutive user messages in a Messages request are one turn, as Anthropic's API combines them:
templates that require alternating roles (Mistral's, Gemma's, Llama 2's) refused the request."""

from __future__ import annotations

import shutil
from typing import Any

import anthropic
import pytest

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway.apis.anthropic_convert import request_to_internal
from harnessrl.tokenizer import PolicyTokenizer

# A template in the style of Mistral's and Gemma's: roles must alternate after the system message.
ALTERNATING = """{{ bos_token }}
{%- for message in messages if message.role != 'system' %}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- if message.role == 'user' %}[INST] {{ message.content }} [/INST]
{%- else %}{{ message.content }}{{ eos_token }}{% endif %}
{%- endfor %}"""


@pytest.fixture(scope="module")
def alternating(tmp_path_factory: pytest.TempPathFactory) -> PolicyTokenizer:
    folder = tmp_path_factory.mktemp("alternating")
    source = tiny_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(source / name, folder / name)
    (folder / "chat_template.jinja").write_text(ALTERNATING, encoding="utf-8")
    return PolicyTokenizer.from_dir(folder)


def test_two_user_messages_reach_an_alternating_template_as_one_turn(
    make_gateway: Any, alternating: PolicyTokenizer
) -> None:
    gw = make_gateway(["Both read."], policy_tokenizer=alternating)
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    answer = client.messages.create(
        model="m",
        max_tokens=64,
        messages=[{"role": "user", "content": "First part."}, {"role": "user", "content": "Second part."}],
    )
    assert [b.text for b in answer.content if b.type == "text"] == ["Both read."]
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert "[INST] First part.\n\nSecond part. [/INST]" in alternating.decode(call.prompt_token_ids)


def test_consecutive_user_messages_are_the_one_message_of_their_blocks() -> None:
    apart = [
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "out"}]},
        {"role": "user", "content": [{"type": "text", "text": "B"}]},
        {"role": "user", "content": "C"},
    ]
    together = [
        *apart[:2],
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "out"},
                {"type": "text", "text": "B"},
                {"type": "text", "text": "C"},
            ],
        },
    ]
    assert request_to_internal({"messages": apart}) == request_to_internal({"messages": together})
    assert [m["role"] for m in request_to_internal({"messages": apart})[0]] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]
