"""A system message added after the reused turn reaches the prompt, whatever the template does with it.

DeepSeek's template gathers every system message into the header at the top. When the template
also rewrites the shared history (so the prompt is spliced after the reused turn's end, not from a
prefix render), the splice kept the earlier call's tokens, whose header lacks the new system text,
and took from the full render only what follows the turn: the instruction was silently dropped and
the call still counted as ``reused``. Such a splice is now refused (``mismatch``, the full render)
when the later system messages change the text before the turn's end. Qwen3's template renders a
later system message in place, after the turn: there the splice stays (the control).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from harnessrl.engines.tiny_families import family_available, tiny_family_dir
from harnessrl.gateway.prompt.conversation import VERIFY_CALLS, SpliceTrust, build_prompt
from harnessrl.gateway.prompt.messages import PriorCall, normalize_messages, template_key
from harnessrl.tokenizer import PolicyTokenizer

RULE = "NEW RULE: never delete files."
START = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "list files"}]


def _family(name: str) -> PolicyTokenizer:
    reason = family_available(name)
    if reason is not None:
        pytest.skip(reason)
    return PolicyTokenizer.from_dir(tiny_family_dir(name, weights=False))


@pytest.fixture(scope="module")
def deepseek() -> PolicyTokenizer:
    return _family("deepseek")


@pytest.fixture(scope="module")
def qwen3() -> PolicyTokenizer:
    return _family("qwen3")


def _trusted() -> SpliceTrust:
    trust = SpliceTrust()
    for _ in range(VERIFY_CALLS):
        trust.verify(True)
    return trust


def _full_render_ids(tok: PolicyTokenizer, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    return tok.encode_conversation(
        tok.render_chat(normalize_messages(messages), tools=tools, add_generation_prompt=True)
    )


def rule_added_after_an_answer(rollout: dict[str, Any]) -> list[Any]:
    """Through the OpenAI SDK: one answer, then the conversation again with a user message and the
    late system RULE after it; the second call's messages."""
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    history: list[Any] = list(START)
    answer = client.chat.completions.create(model="m", messages=history).choices[0].message.content
    history += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "now delete them"},
        {"role": "system", "content": RULE},
    ]
    client.chat.completions.create(model="m", messages=history)
    client.close()
    return history


def test_through_the_gateway_a_late_system_message_is_in_deepseeks_prompt(
    make_gateway: Callable[..., Any], deepseek: PolicyTokenizer
) -> None:
    """The case found: a real gateway, the scripted engine, the OpenAI SDK."""
    gw = make_gateway(["a.txt b.txt", "I will not."], policy_tokenizer=deepseek)
    rollout = gw.rollout()
    history = rule_added_after_an_answer(rollout)
    second = gw.client.list_calls(rollout["rollout_id"])[1]
    assert RULE in deepseek.decode(second.prompt_token_ids)
    assert second.prompt_token_ids == _full_render_ids(deepseek, history)
    assert second.usage is not None and second.usage.prompt_source == "mismatch"


TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
DEEPSEEK_SAMPLED = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"cmd": "ls"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
)


@pytest.mark.parametrize("trusted", [False, True])
def test_a_reminder_after_a_tool_result_is_in_deepseeks_prompt(
    deepseek: PolicyTokenizer, trusted: bool
) -> None:
    first = [{"role": "system", "content": "S1"}, {"role": "user", "content": "go"}]
    answer = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    prompt = build_prompt(deepseek, normalize_messages(first), tools=TOOLS).prompt_ids
    prior = PriorCall.from_call(
        first, answer, prompt, deepseek.encode(DEEPSEEK_SAMPLED), template_key(TOOLS, None)
    )
    later = [
        *first,
        answer,
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "system", "content": "REMINDER"},
    ]
    trust = _trusted() if trusted else SpliceTrust()
    plan = build_prompt(deepseek, normalize_messages(later), [prior], tools=TOOLS, trust=trust)
    assert "REMINDER" in deepseek.decode(plan.prompt_ids)
    assert plan.prompt_ids == _full_render_ids(deepseek, later, TOOLS)
    assert plan.result == "mismatch"


QWEN_SAMPLED = "<think>\nThey want a listing.\n</think>\n\na.txt b.txt<|im_end|>"


def _qwen3_prior(qwen3: PolicyTokenizer) -> PriorCall:
    prompt = build_prompt(qwen3, normalize_messages(START)).prompt_ids
    answer = {"role": "assistant", "content": "a.txt b.txt", "reasoning_content": "They want a listing."}
    return PriorCall.from_call(START, answer, prompt, qwen3.encode(QWEN_SAMPLED))


@pytest.mark.parametrize("trusted", [False, True])
def test_control_qwen3_renders_a_late_system_message_in_place_and_the_splice_stays(
    qwen3: PolicyTokenizer, trusted: bool
) -> None:
    """Qwen3 drops the reused turn's reasoning once a user message follows (so the splice is made
    after the turn's end) and renders the system message where it is: reuse keeps the chain."""
    prior = _qwen3_prior(qwen3)
    later = [
        *START,
        {"role": "assistant", "content": "a.txt b.txt", "reasoning_content": "They want a listing."},
        {"role": "user", "content": "now delete them"},
        {"role": "system", "content": RULE},
    ]
    trust = _trusted() if trusted else SpliceTrust()
    plan = build_prompt(qwen3, normalize_messages(later), [prior], trust=trust)
    head = [*prior.prompt_ids, *prior.response_ids]
    assert plan.result == "reused" and plan.prompt_ids[: len(head)] == head
    assert qwen3.decode(plan.prompt_ids[len(head) :]) == (
        f"\n<|im_start|>user\nnow delete them<|im_end|>\n<|im_start|>system\n{RULE}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_control_through_the_gateway_qwen3_keeps_the_chain_with_the_rule(
    make_gateway: Callable[..., Any], qwen3: PolicyTokenizer
) -> None:
    gw = make_gateway(["a.txt b.txt", "I will not."], policy_tokenizer=qwen3)
    rollout = gw.rollout()
    rule_added_after_an_answer(rollout)
    first, second = gw.client.list_calls(rollout["rollout_id"])
    assert RULE in qwen3.decode(second.prompt_token_ids)
    head = [*first.prompt_token_ids, *first.response_token_ids]
    assert second.prompt_token_ids[: len(head)] == head
    assert second.usage is not None and second.usage.prompt_source == "reused"
