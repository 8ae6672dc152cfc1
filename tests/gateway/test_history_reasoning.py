"""``history = "sampled"``: a reasoning turn sent back by the harness extends the chain token for
token, even where the chat template rewrites earlier turns (Qwen3 drops their reasoning).

The template is Qwen3's reasoning logic on the tiny model's vocabulary
(``tests/fixtures/chat_templates/qwen3_style.jinja``). Each case sends the sampled turn back the
way one kind of harness does: litellm (mini-swe-agent) moves the ``<think>`` block to
``reasoning_content`` and sends command output as a user message; others drop the reasoning, or
send the text back verbatim.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import openai
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.prompt.conversation import build_prompt
from harnessrl.gateway.prompt.messages import PriorCall, message_key, normalize_messages, template_key
from harnessrl.gateway.prompt.splice import splice
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "qwen3_style.jinja"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
SAMPLED = '<think>\nThe file does not exist yet.\n</think>\n\nNext step.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
ANSWER = {"role": "assistant", "content": SAMPLED.split("\n<tool_call>")[0], "tool_calls": [CALL]}
START = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "Make hello.txt."}]

SENT_BACK = {
    "litellm": {"content": "\n\nNext step.", "reasoning_content": "\nThe file does not exist yet.\n"},
    "dropped": {"content": "Next step."},
    "verbatim": {"content": ANSWER["content"]},
}
RESULTS = {
    "tool": {"role": "tool", "tool_call_id": "call_1", "content": "hello.txt"},
    "user": {"role": "user", "content": "Observation: hello.txt"},  # mini-swe-agent's way
}
AFTER = {
    "tool": "\n<|im_start|>user\n<tool_response>\nhello.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    "user": "\n<|im_start|>user\nObservation: hello.txt<|im_end|>\n<|im_start|>assistant\n",
}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> PolicyTokenizer:
    folder = tmp_path_factory.mktemp("qwen3-style")
    source = tiny_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(source / name, folder / name)
    shutil.copy(TEMPLATE, folder / "chat_template.jinja")
    return PolicyTokenizer.from_dir(folder)


def first_call(tok: PolicyTokenizer) -> PriorCall:
    prompt = tok.encode(tok.render_chat(normalize_messages(START), tools=TOOLS, add_generation_prompt=True))
    return PriorCall.from_call(START, ANSWER, prompt, tok.encode(SAMPLED), template_key(TOOLS, None))


def conversation(sent_back: str, result: str) -> list[dict[str, Any]]:
    turn = {"role": "assistant", "tool_calls": [CALL], **SENT_BACK[sent_back]}
    return normalize_messages([*START, turn, RESULTS[result]])


@pytest.mark.parametrize("result", sorted(RESULTS))
@pytest.mark.parametrize("sent_back", sorted(SENT_BACK))
def test_the_sampled_turn_is_reused_however_the_harness_sends_it_back(
    qwen3: PolicyTokenizer, sent_back: str, result: str
) -> None:
    prior = first_call(qwen3)
    messages = conversation(sent_back, result)
    assert message_key(messages[2]) == prior.answer_key  # matched with or without its reasoning

    plan = build_prompt(qwen3, messages, [prior], tools=TOOLS)
    head = [*prior.prompt_ids, *prior.response_ids]
    assert plan.result == "reused"
    assert plan.prompt_ids[: len(head)] == head  # one chain: the sampled reasoning stays
    assert qwen3.decode(plan.prompt_ids[len(head) :]) == AFTER[result]
    assert (
        plan.prompt_ids == build_prompt(qwen3, messages, [prior], tools=TOOLS, incremental=False).prompt_ids
    )


@pytest.mark.parametrize("sent_back", ["litellm", "dropped"])
def test_as_rendered_is_what_the_template_renders_and_the_chain_breaks_there(
    qwen3: PolicyTokenizer, sent_back: str
) -> None:
    prior = first_call(qwen3)
    messages = conversation(sent_back, "user")
    rendered = qwen3.render_chat(messages, tools=TOOLS, add_generation_prompt=True)
    plan = build_prompt(qwen3, messages, [prior], tools=TOOLS, history="as_rendered")
    assert (plan.result, plan.prompt_ids) == ("as_rendered", qwen3.encode(rendered))
    assert "does not exist" not in rendered  # the template dropped the earlier reasoning...
    head = [*prior.prompt_ids, *prior.response_ids]
    assert plan.prompt_ids[: len(head)] != head  # ...so this call starts a new sample
    # Control: splicing the way templates that keep history allow fails here (why the turn's end
    # is found structurally instead).
    prefix = qwen3.render_chat(messages[:3], tools=TOOLS, add_generation_prompt=False)
    assert splice(qwen3, prior, prefix, rendered) is None


def test_a_chain_of_reasoning_turns_stays_one_chain(qwen3: PolicyTokenizer) -> None:
    """Three calls, each answer with reasoning, sent back the litellm way with user observations."""
    prior = first_call(qwen3)
    messages = conversation("litellm", "user")
    plan = build_prompt(qwen3, messages, [prior], tools=TOOLS)
    second_sampled = "<think>\nIt exists now.\n</think>\n\nDone.<|im_end|>"
    second = PriorCall.from_call(
        messages,
        {"role": "assistant", "content": second_sampled[: -len("<|im_end|>")]},
        plan.prompt_ids,
        qwen3.encode(second_sampled),
        template_key(TOOLS, None),
    )
    more = normalize_messages(
        [
            *messages,
            {"role": "assistant", "content": "Done.", "reasoning_content": "It exists now."},
            {"role": "user", "content": "Are you sure?"},
        ]
    )
    third = build_prompt(qwen3, more, [prior, second], tools=TOOLS)
    head = [*second.prompt_ids, *second.response_ids]
    assert third.result == "reused" and third.prompt_ids[: len(head)] == head
    assert third.prompt_ids[: len(prior.prompt_ids) + len(prior.response_ids)] == [
        *prior.prompt_ids,
        *prior.response_ids,
    ]


def test_a_turn_cut_by_max_tokens_is_closed_before_the_next_message(qwen3: PolicyTokenizer) -> None:
    prompt = qwen3.encode(
        qwen3.render_chat(normalize_messages(START), tools=TOOLS, add_generation_prompt=True)
    )
    cut = SAMPLED[: -len("<|im_end|>")]  # no end-of-turn token: the budget ran out right there
    prior = PriorCall.from_call(START, ANSWER, prompt, qwen3.encode(cut), template_key(TOOLS, None))
    plan = build_prompt(qwen3, conversation("litellm", "user"), [prior], tools=TOOLS)
    head = [*prior.prompt_ids, *prior.response_ids]
    assert plan.result == "reused"
    assert qwen3.decode(plan.prompt_ids[len(head) :]) == "<|im_end|>" + AFTER["user"]


@pytest.mark.parametrize("history", ["sampled", "as_rendered"])
def test_through_the_gateway_each_call_says_how_its_prompt_was_built(
    qwen3: PolicyTokenizer, tmp_path: Path, history: str
) -> None:
    """A real gateway and the OpenAI SDK, the harness sending turns back as litellm does."""
    turns = [
        {
            "content": "Next step.",
            "reasoning": "The file does not exist yet.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
        },
        {"content": "Done.", "reasoning": "It exists now."},
    ]
    store = SQLiteStore(tmp_path / "s.db")
    app = create_app(GatewayConfig(admin_key="k", history=history), store, ScriptedEngine(turns, qwen3))
    with serve_in_thread(app) as url:
        admin = GatewayClient(url, "k")
        rollout = admin.create_rollout({"prompt": "x"})
        client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"])
        messages: list[Any] = list(START)
        first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        assert first.tool_calls and first.content and first.content.startswith("<think>")
        sent_back = {
            "role": "assistant",
            "content": first.content.split("</think>")[1],
            "reasoning_content": first.content.split("</think>")[0].removeprefix("<think>"),
            "tool_calls": [c.model_dump() for c in first.tool_calls],
        }
        messages += [sent_back, {"role": "user", "content": "Observation: hello.txt"}]
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        client.close()
        admin.close()
    calls = store.list_calls(rollout["rollout_id"])
    store.close()
    sources = [c.usage.prompt_source for c in calls if c.usage is not None]
    head = [*calls[0].prompt_token_ids, *calls[0].response_token_ids]
    chained = calls[1].prompt_token_ids[: len(head)] == head
    if history == "sampled":
        assert sources == ["first", "reused"] and chained
        assert calls[1].usage is not None and calls[1].usage.reused_prompt_tokens == len(head)
    else:
        assert sources == ["as_rendered", "as_rendered"] and not chained
