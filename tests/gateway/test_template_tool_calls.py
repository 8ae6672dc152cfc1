"""What a family's chat template takes back of the calls the policy made, through the real gateway and
the official SDKs: each API answers with call ids in the form the template renders (and checks) in
the next prompt, and the template gets the arguments in a form it can render.

Mistral's templates raise on any id that is not nine letters and digits ("Tool call IDs should be
alphanumeric strings with length 9!"): with OpenAI-shaped ids, the second call of every tool-using
rollout was a 400. Kimi's template writes the ids the model itself wrote (``functions.NAME:N``)
back: the Messages API gave ``toolu_...`` ids instead, so the next prompt's tool result named a call
the model never made. DeepSeek's templates join the arguments to strings (``'<｜tool▁sep｜>' +
arguments``), as the OpenAI message transformers renders holds them as text; the gateway hands
templates an arguments object (as vLLM does, for ``tojson``), and the join failed: a 400 again.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.tokenizer import PolicyTokenizer

# Mistral's format (v0.3 tokenizer): calls as a JSON array after [TOOL_CALLS], rendered back with
# their ids, and results with the id of their call; both ids checked as Mistral's templates do.
MISTRAL_TEMPLATE = """
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {%- if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}
            {{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson }}
        {{- ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '[TOOL_CALLS] [' }}
        {%- for call in message.tool_calls %}
            {%- if call.id is not defined or call.id | length != 9 %}
                {{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}
            {%- endif %}
            {{- (call.function | tojson)[:-1] + ', "id": "' + call.id + '"}' }}
            {%- if not loop.last %}{{- ', ' }}{%- endif %}
        {%- endfor %}
        {{- ']' + eos_token }}
    {%- elif message.role == 'assistant' %}
        {{- ' ' + message.content + eos_token }}
    {%- else %}
        {{- '[INST] ' + message.content + '[/INST]' }}
    {%- endif %}
{%- endfor %}
"""
MISTRAL_ANSWER = '[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}}]'

# Kimi K2's format: the model writes each call's id; the template renders it back in the call and in
# the header of its result.
KIMI_TEMPLATE = """
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {{- '<|im_start|>tool\\n## Return of ' + message.tool_call_id + '\\n' + message.content + '<|im_end|>' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + (message.content or '') }}
        {%- if message.tool_calls %}
            {{- '<|tool_calls_section_begin|>' }}
            {%- for call in message.tool_calls %}
                {{- '<|tool_call_begin|>' + call.id + '<|tool_call_argument_begin|>' }}
                {%- set arguments = call.function.arguments %}
                {{- (arguments if arguments is string else arguments | tojson) + '<|tool_call_end|>' }}
            {%- endfor %}
            {{- '<|tool_calls_section_end|>' }}
        {%- endif %}
        {{- '<|im_end|>' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
KIMI_ID = "functions.bash:0"
KIMI_ANSWER = (
    "<|tool_calls_section_begin|><|tool_call_begin|>"
    + KIMI_ID
    + '<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>'
)

# DeepSeek V3.1's format, with the joins its published template makes (arguments as text).
DEEPSEEK_TEMPLATE = """
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'tool' %}
        {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '<｜Assistant｜>' + (message['content'] or '') }}
        {%- if message['tool_calls'] %}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for tool in message['tool_calls'] %}
                {{- '<｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>' }}
                {{- tool['function']['arguments'] + '<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜>' }}
        {%- endif %}
        {{- eos_token }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}
"""
DEEPSEEK_CALL = '<｜tool▁call▁begin｜>bash<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜>'
DEEPSEEK_ANSWER = f"<｜tool▁calls▁begin｜>{DEEPSEEK_CALL}<｜tool▁calls▁end｜>"

PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": PARAMETERS}}]
MESSAGES_TOOLS = [{"name": "bash", "input_schema": PARAMETERS}]
RESPONSES_TOOLS = [{"type": "function", "name": "bash", "parameters": PARAMETERS}]


def family_tokenizer(folder: Path, template: str) -> PolicyTokenizer:
    """The tiny model's tokenizer with ``template`` as its chat template (the parsers are chosen from
    its markers)."""
    folder.mkdir()
    for source in tiny_model_dir(weights=False).iterdir():
        if source.name != "chat_template.jinja":
            shutil.copy(source, folder / source.name)
    (folder / "chat_template.jinja").write_text(template)
    return PolicyTokenizer.from_dir(folder)


def chat_round_trip(rollout: dict[str, Any]) -> str:
    """Two chat calls: a tool call, then its result back; the first call's id."""
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "list the files"}]
    answer = client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS).choices[0]
    [call] = answer.message.tool_calls or []
    messages += [
        answer.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
    return call.id


def messages_round_trip(rollout: dict[str, Any]) -> str:
    client = anthropic.Anthropic(
        base_url=rollout["base_url"].removesuffix("/v1"), api_key=rollout["api_key"], max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": "list the files"}]
    answer = client.messages.create(model="m", max_tokens=512, messages=messages, tools=MESSAGES_TOOLS)
    [use] = [block for block in answer.content if block.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]},
    ]
    client.messages.create(model="m", max_tokens=512, messages=messages, tools=MESSAGES_TOOLS)
    return use.id


def responses_round_trip(rollout: dict[str, Any]) -> str:
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    items: list[Any] = [{"role": "user", "content": "list the files"}]
    answer = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS)  # type: ignore[arg-type]
    [call] = [item for item in answer.output if item.type == "function_call"]
    items += [item.model_dump(exclude_none=True) for item in answer.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS)  # type: ignore[arg-type]
    return call.call_id


ROUND_TRIPS: dict[str, Callable[[dict[str, Any]], str]] = {
    "chat": chat_round_trip,
    "messages": messages_round_trip,
    "responses": responses_round_trip,
}


def assert_one_chain(calls: list[Any]) -> None:
    first, second = calls
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(head)] == head  # the sampled tokens were reused


@pytest.mark.parametrize("api", sorted(ROUND_TRIPS))
def test_mistral_call_ids_go_back_into_its_template_in_every_api(
    api: str, make_gateway: Callable[..., Any], tmp_path: Path
) -> None:
    tokenizer = family_tokenizer(tmp_path / "mistral", MISTRAL_TEMPLATE)
    gw = make_gateway([MISTRAL_ANSWER, "Done."], policy_tokenizer=tokenizer)
    rollout = gw.rollout()
    call_id = ROUND_TRIPS[api](rollout)  # the second call was a 400 naming the template's exception
    assert len(call_id) == 9 and call_id.isascii() and call_id.isalnum()
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert [c.response.get("content") for c in calls] == [None, "Done."]
    assert [c["id"] for c in calls[0].response["tool_calls"]] == [call_id]  # recorded as answered
    assert_one_chain(calls)
    result = f'[TOOL_RESULTS] {{"content": "a.txt", "call_id": "{call_id}"}}[/TOOL_RESULTS]'
    assert tokenizer.decode(calls[1].prompt_token_ids).endswith(result)


@pytest.mark.parametrize("api", sorted(ROUND_TRIPS))
def test_kimi_call_ids_are_the_ones_the_model_wrote_in_every_api(
    api: str, make_gateway: Callable[..., Any], tmp_path: Path
) -> None:
    tokenizer = family_tokenizer(tmp_path / "kimi", KIMI_TEMPLATE)
    gw = make_gateway([KIMI_ANSWER, "Done."], policy_tokenizer=tokenizer)
    rollout = gw.rollout()
    assert ROUND_TRIPS[api](rollout) == KIMI_ID  # Messages gave a toolu_ id
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert_one_chain(calls)
    # The result's header names the call the model made, as Kimi's template renders it.
    second_prompt = tokenizer.decode(calls[1].prompt_token_ids)
    assert second_prompt.endswith(
        f"<|im_start|>tool\n## Return of {KIMI_ID}\na.txt<|im_end|><|im_start|>assistant\n"
    )


@pytest.mark.parametrize("history", ["sampled", "as_rendered"])
@pytest.mark.parametrize("api", sorted(ROUND_TRIPS))
def test_deepseek_templates_join_the_arguments_as_text_in_every_api(
    api: str, history: str, make_gateway: Callable[..., Any], tmp_path: Path
) -> None:
    tokenizer = family_tokenizer(tmp_path / "deepseek", DEEPSEEK_TEMPLATE)
    gw = make_gateway([DEEPSEEK_ANSWER, "Done."], policy_tokenizer=tokenizer, history=history)
    rollout = gw.rollout()
    ROUND_TRIPS[api](rollout)  # the second call was a 400: "can only concatenate str (not dict)"
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert [c.response.get("content") for c in calls] == [None, "Done."]
    second_prompt = tokenizer.decode(calls[1].prompt_token_ids)
    # Rendered back (as_rendered: by the template) as the policy wrote it, then the result.
    assert second_prompt.endswith(
        f"{DEEPSEEK_ANSWER}<|im_end|><｜tool▁output▁begin｜>a.txt<｜tool▁output▁end｜><｜Assistant｜>"
    )
    if history == "sampled":
        assert_one_chain(calls)
