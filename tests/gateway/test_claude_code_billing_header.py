"""Claude Code's billing header is left out of the prompt, as vLLM leaves it out.

Claude Code sends, as the first system block, ``x-anthropic-billing-header: cc_version=<version>.<3 hex
digits taken from the first user message>; cc_entrypoint=cli;``. vLLM's Messages route drops that
block and its chat route drops that first line of system text, so a policy deployed there never sees
it; rendered here, training saw a line deployment does not, and every task's system prompt differed
from its first tokens. The request is still recorded as the harness sent it.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai

HEADER = "x-anthropic-billing-header: cc_version=2.1.197.a3f; cc_entrypoint=cli;"
SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."


def _messages_prompt(gw: Any, system: Any) -> tuple[list[int], dict[str, Any]]:
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    client.messages.create(
        model="m", max_tokens=16, system=system, messages=[{"role": "user", "content": "List the files."}]
    )
    [call] = gw.client.list_calls(rollout["rollout_id"])
    return call.prompt_token_ids, call.request


def _chat_prompt(gw: Any, system: Any) -> list[int]:
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=rollout["api_key"], max_retries=0)
    client.chat.completions.create(
        model="m",
        max_tokens=16,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "List the files."}],
    )
    [call] = gw.client.list_calls(rollout["rollout_id"])
    return call.prompt_token_ids


def test_the_billing_header_block_is_not_in_the_messages_prompt_but_is_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["Done."] * 4)
    with_header, request = _messages_prompt(
        gw, [{"type": "text", "text": HEADER}, {"type": "text", "text": SYSTEM}]
    )
    without, _ = _messages_prompt(gw, [{"type": "text", "text": SYSTEM}])
    assert with_header == without
    assert request["system"][0]["text"] == HEADER  # recorded as the harness sent it
    # Control: the same words anywhere but at the start of a block stay in the prompt.
    elsewhere, _ = _messages_prompt(gw, [{"type": "text", "text": f"{SYSTEM}\n{HEADER}"}])
    assert elsewhere != without


def test_the_billing_header_line_is_not_in_a_chat_system_prompt(make_gateway: Any) -> None:
    gw = make_gateway(["Done."] * 4)
    assert _chat_prompt(gw, f"{HEADER}\n{SYSTEM}") == _chat_prompt(gw, SYSTEM)
    parts = [{"type": "text", "text": HEADER}, {"type": "text", "text": SYSTEM}]
    assert _chat_prompt(gw, parts) == _chat_prompt(gw, SYSTEM)
