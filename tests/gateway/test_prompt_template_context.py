"""Sampled-token reuse only continues a call rendered with the same tools and template kwargs.

A harness that adds a tool mid-rollout (an MCP server connecting) or changes a template kwarg
(``reasoning_effort``, Anthropic's ``thinking``) changes what the template renders before the
first message. Reusing an earlier call's tokens then would give the policy a prompt that lists the
old tools (it never sees the new one) while the recorded request names the new ones. Found on a
live gateway: the second call below was ``reused`` and its prompt lacked ``python_exec``.

Each test runs three calls of one conversation through an official SDK: the second changes the
context (a full render that shows it), the third keeps it (reuse again, which also proves that
what the gateway remembers of a call matches what the next call compares it with).
"""

from __future__ import annotations

import asyncio
import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway.bodies import CheckedRest
from harnessrl.gateway.body_models import ChatCompletionRequest
from harnessrl.gateway.prompt.conversation import prompt_template_key
from harnessrl.gateway.prompt.history import CallHistory, RolloutMemory
from harnessrl.tokenizer import PolicyTokenizer

#: Prints the kwargs the APIs pass (chat's own kwarg, Messages' and Responses' thinking switch).
KWARGS_HEADER = (
    "{%- if reasoning_effort is defined %}"
    "{{- '<|im_start|>system\\nReasoning: ' + reasoning_effort + '<|im_end|>\\n' }}{%- endif %}"
    "{%- if enable_thinking is defined %}"
    "{{- '<|im_start|>system\\nThinking: ' + ('on' if enable_thinking else 'off') + '<|im_end|>\\n' }}"
    "{%- endif %}\n"
)


@pytest.fixture(scope="module")
def kwargs_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PolicyTokenizer:
    """The tiny model's tokenizer, its template printing the kwargs above before the conversation."""
    folder = tmp_path_factory.mktemp("kwargs-template")
    source = tiny_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        shutil.copy(source / name, folder / name)
    template = (source / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").write_text(KWARGS_HEADER + template)
    return PolicyTokenizer.from_dir(folder)


def _schema() -> dict[str, Any]:
    return {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}


def _tools(api: str, names: list[str]) -> list[dict[str, Any]]:
    if api == "chat":
        return [{"type": "function", "function": {"name": n, "parameters": _schema()}} for n in names]
    if api == "messages":
        return [{"name": n, "description": f"{n} tool", "input_schema": _schema()} for n in names]
    return [{"type": "function", "name": n, "parameters": _schema()} for n in names]


def _kwargs(api: str, level: str) -> dict[str, Any]:
    """Request fields that set a template kwarg, at one of two levels."""
    if api == "chat":
        return {"extra_body": {"chat_template_kwargs": {"reasoning_effort": level}}}
    if api == "messages":
        return {
            "thinking": {"type": "enabled", "budget_tokens": 64} if level == "high" else {"type": "disabled"}
        }
    return {"reasoning": {"effort": level if level == "high" else "none"}}


def _call(gw: Any, rollout: dict[str, Any], api: str, users: list[str], fields: dict[str, Any]) -> None:
    """One call whose conversation is ``users`` with the scripted answers ("A0", "A1"...) between."""
    history: list[dict[str, Any]] = []
    for i, text in enumerate(users):
        if i:
            history.append({"role": "assistant", "content": f"A{i - 1}"})
        history.append({"role": "user", "content": text})
    if api == "chat":
        client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=history, **fields)  # type: ignore[arg-type]
    elif api == "responses":
        client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        client.responses.create(model="m", input=history, **fields)  # type: ignore[arg-type]
    else:
        sdk = anthropic.Anthropic(
            base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
        )
        sdk.messages.create(model="m", max_tokens=32, messages=history, **fields)  # type: ignore[arg-type]


def _three_calls(
    gw: Any, api: str, first: dict[str, Any], changed: dict[str, Any]
) -> tuple[list[Any], list[str]]:
    rollout = gw.rollout()
    _call(gw, rollout, api, ["go"], first)
    _call(gw, rollout, api, ["go", "more"], changed)
    _call(gw, rollout, api, ["go", "more", "again"], changed)
    calls = gw.client.list_calls(rollout["rollout_id"])
    return calls, [c.usage.prompt_source for c in calls]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_tool_added_mid_rollout_is_in_the_next_prompt(
    api: str, make_gateway: Callable[..., Any], kwargs_tokenizer: PolicyTokenizer
) -> None:
    gw = make_gateway(["A0", "A1", "A2"], policy_tokenizer=kwargs_tokenizer)
    calls, sources = _three_calls(
        gw, api, {"tools": _tools(api, ["bash"])}, {"tools": _tools(api, ["bash", "python_exec"])}
    )
    second = kwargs_tokenizer.decode(calls[1].prompt_token_ids)
    assert "python_exec" in second  # the policy sees the tool the harness now offers
    assert sources == ["first", "no_match", "reused"]
    head = calls[1].prompt_token_ids + calls[1].response_token_ids
    assert calls[2].prompt_token_ids[: len(head)] == head


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_changed_template_kwarg_is_in_the_next_prompt(
    api: str, make_gateway: Callable[..., Any], kwargs_tokenizer: PolicyTokenizer
) -> None:
    gw = make_gateway(["A0", "A1", "A2"], policy_tokenizer=kwargs_tokenizer)
    calls, sources = _three_calls(gw, api, _kwargs(api, "low"), _kwargs(api, "high"))
    first, second = (kwargs_tokenizer.decode(c.prompt_token_ids) for c in calls[:2])
    changed = "Reasoning: high" if api == "chat" else "Thinking: on"
    assert changed not in first and changed in second
    assert sources == ["first", "no_match", "reused"]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_the_memory_rebuilt_from_the_store_keeps_each_calls_template_key(
    api: str, make_gateway: Callable[..., Any], kwargs_tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    """After a restart the memory comes from the stored requests: each call's key is the one the
    live gateway remembered (so reuse after a restart tells contexts apart the same way)."""
    gw = make_gateway(["A0", "A1", "A2"], policy_tokenizer=kwargs_tokenizer)
    fields = {"tools": _tools(api, ["bash"]), **_kwargs(api, "high")}
    changed = {"tools": _tools(api, ["bash", "python_exec"]), **_kwargs(api, "high")}
    calls, _ = _three_calls(gw, api, fields, changed)
    rollout_id = calls[0].rollout_id
    live_memory = asyncio.run(gw.app.state.gateway.history.get(rollout_id, 0))
    stored_memory = asyncio.run(CallHistory(gw.store).get(rollout_id, 0))
    keys = [live_memory.priors[c.seq].template_key for c in calls]
    assert keys == [stored_memory.priors[c.seq].template_key for c in calls]
    assert keys[0] != keys[1] == keys[2]


def test_a_body_repeating_the_last_ones_rest_is_rendered_with_its_prepared_tools(
    kwargs_tokenizer: PolicyTokenizer,
) -> None:
    """A request whose body but its history is the same JSON as the rollout's last one (the chat
    route's ``CheckedRest``) takes the tools prepared for that one, the very object, instead of
    preparing its own copy again; it renders and is keyed exactly as its own would be."""
    memory = RolloutMemory()
    tools = _tools("chat", ["bash"])
    first = {"messages": [], "tools": tools}
    prepared = memory.template_tools(kwargs_tokenizer, first, tools, None)
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    )
    known = CheckedRest(b"{}", 0, body, prepared)
    second = {"messages": [], "tools": copy.deepcopy(tools)}
    again = memory.template_tools(kwargs_tokenizer, second, second["tools"], None, known=known)
    assert again is prepared
    own = kwargs_tokenizer.template_tools(copy.deepcopy(tools))
    assert memory.noted_keys[id(second)][1] == prompt_template_key(kwargs_tokenizer, own, None)
    conversation = [{"role": "user", "content": "go"}]
    assert kwargs_tokenizer.render_chat(conversation, tools=again) == kwargs_tokenizer.render_chat(
        conversation, tools=copy.deepcopy(tools)
    )
