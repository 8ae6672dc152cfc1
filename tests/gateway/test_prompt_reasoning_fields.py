"""An assistant turn's reasoning reaches the chat template under whichever name the harness sends it.

transformers reads a message's reasoning from ``reasoning_content``, ``thinking`` or ``reasoning``
(vLLM's and OpenRouter's newer name), in that order, and gives it to the template under the names
templates read. Normalizing kept ``reasoning_content`` only, so a turn sent back with ``reasoning``
or ``thinking`` rendered without its ``<think>`` block, unlike ``apply_chat_template`` of the same
messages. Matching ignores the reasoning under every name, so the turn is reused however it comes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from harnessrl.engines.tiny_families import family_available, tiny_family_dir
from harnessrl.gateway.prompt.conversation import VERIFY_CALLS, SpliceTrust, build_prompt
from harnessrl.gateway.prompt.messages import PriorCall, message_key, normalize_messages
from harnessrl.tokenizer import PolicyTokenizer

FIELDS = ("reasoning_content", "thinking", "reasoning")
CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
START = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "list files"}]
REASONING = "I should list them."


@pytest.fixture(scope="module")
def qwen3_dir() -> Path:
    reason = family_available("qwen3")
    if reason is not None:
        pytest.skip(reason)
    return tiny_family_dir("qwen3", weights=False)


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(qwen3_dir)


@pytest.fixture(scope="module")
def transformers_qwen3(qwen3_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3_dir))


def _turn(**reasoning: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "Listing.", "tool_calls": [CALL], **reasoning}


def _conversation(**reasoning: str) -> list[dict[str, Any]]:
    # The turn is after the last user message, where Qwen3's template prints its reasoning.
    return [*START, _turn(**reasoning), {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]


@pytest.mark.parametrize(
    "reasoning",
    [
        *({field: REASONING} for field in FIELDS),
        # Several at once: transformers takes the first set in this order.
        {"thinking": "from thinking", "reasoning": "from reasoning"},
        {"reasoning_content": "from reasoning_content", "thinking": "from thinking", "reasoning": "r"},
    ],
    ids=lambda r: "+".join(r),
)
def test_the_reasoning_renders_as_transformers_renders_it(
    qwen3: PolicyTokenizer, transformers_qwen3: Any, reasoning: dict[str, str]
) -> None:
    messages = _conversation(**reasoning)
    expected = transformers_qwen3.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<think>" in expected
    assert qwen3.render_chat(normalize_messages(messages), add_generation_prompt=True) == expected


def test_matching_ignores_the_reasoning_under_every_name() -> None:
    keys = {message_key(normalize_messages([_turn(**{field: REASONING})])[0]) for field in FIELDS}
    assert keys == {message_key(normalize_messages([_turn()])[0])}


SAMPLED = (
    f"<think>\n{REASONING}\n</think>\n\nListing.\n<tool_call>\n"
    '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("trusted", [False, True])
def test_a_turn_sent_back_with_its_reasoning_under_any_name_is_reused(
    qwen3: PolicyTokenizer, field: str, trusted: bool
) -> None:
    prompt = build_prompt(qwen3, normalize_messages(START)).prompt_ids
    prior = PriorCall.from_call(START, _turn(), prompt, qwen3.encode(SAMPLED))
    messages = normalize_messages(_conversation(**{field: REASONING}))
    trust = SpliceTrust()
    for _ in range(VERIFY_CALLS if trusted else 0):
        trust.verify(True)
    plan = build_prompt(qwen3, messages, [prior], trust=trust)
    head = [*prior.prompt_ids, *prior.response_ids]
    assert plan.result == "reused" and plan.prompt_ids[: len(head)] == head
    assert plan.prompt_ids == build_prompt(qwen3, messages, [prior], incremental=False).prompt_ids
    assert not trust.refuted  # the incremental path agreed with the full one


@pytest.mark.parametrize("field", FIELDS)
def test_through_the_gateway_the_prompt_is_what_transformers_tokenizes(
    make_gateway: Callable[..., Any], qwen3: PolicyTokenizer, transformers_qwen3: Any, field: str
) -> None:
    """``history = "as_rendered"``: a real gateway tokenizes the conversation as transformers does."""
    gw = make_gateway(["Listing.", "Done."], policy_tokenizer=qwen3, history="as_rendered")
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    client.chat.completions.create(model="m", messages=START)  # type: ignore[arg-type]
    messages = _conversation(**{field: REASONING})
    client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    client.close()
    second = gw.client.list_calls(rollout["rollout_id"])[1]
    expected = transformers_qwen3.apply_chat_template(
        messages, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert second.prompt_token_ids == list(expected)
    assert REASONING in qwen3.decode(second.prompt_token_ids)


@pytest.mark.parametrize("field", FIELDS)
def test_a_reasoning_that_is_not_text_is_a_400_naming_it(make_gateway: Any, field: str) -> None:
    """A template printed its Python form (``['x']``) into the prompt, or failed on it."""
    gw = make_gateway(["never"])
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    turn = {"role": "assistant", "content": "Done.", field: ["not", "text"]}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "go"}, turn, {"role": "user", "content": "again"}],
        )
    assert caught.value.body["param"] == f"messages.1.{field}"  # type: ignore[index]
    assert gw.client.list_calls(rollout["rollout_id"]) == []
