"""Every model API of the gateway in front of a real vLLM server, driven by the official openai and
anthropic SDKs: answered, recorded token-exactly (the stored prompt is the gateway's own tokenization
of the request, the stored response what vLLM sampled), and chained across turns.

The tiny model has random weights, so it never emits a real tool call: tool-call *parsing* is tested
in ``tests/gateway`` with scripted engines. Here the point is rendering and recording through the
real server: requests with ``tools``, an assistant tool call and a ``tool`` result in the history.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from tests.vllm.vllm_support import requests_finished, requests_running, server_metric, wait_until

from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.schemas import Call

pytestmark = pytest.mark.vllm

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful shell agent."},
    {"role": "user", "content": "How many files are in /tmp?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": "ls /tmp | wc -l"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "7"},
    {"role": "user", "content": "And what does that mean?"},
]
MAX_TOKENS = 24
#: Near the whole context (4096), so the gateway's abort reaches vLLM long before the budget could
#: end the request, however far this process lags behind the server (a stop token vLLM samples in
#: that lead can end it first: the test retries then).
STOP_STRING_BUDGET = 3000


def check_recorded(call: Call, stop_ids: tuple[int, ...], max_tokens: int = MAX_TOKENS) -> None:
    """What every call recorded from a real server must satisfy."""
    assert len(call.response_token_ids) == len(call.response_logprobs) > 0
    assert all(lp <= 0.0 for lp in call.response_logprobs)
    assert call.policy_version == 0
    if call.response_token_ids[-1] in stop_ids:
        assert call.finish_reason in ("stop", "tool_calls")
    else:
        assert call.finish_reason == "length"
        assert len(call.response_token_ids) == max_tokens


def assert_extends(first: Call, second: Call) -> None:
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(head)] == head, "the second call does not extend the first"
    assert len(second.prompt_token_ids) > len(head)


def chat(client: Any, messages: list[dict[str, Any]], *, stream: bool) -> tuple[dict[str, Any], str, int]:
    """One chat call; returns the assistant message as a client would append it, the finish reason
    and the completion tokens."""
    kwargs: dict[str, Any] = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": MAX_TOKENS}
    if not stream:
        resp = client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        message = choice.message.model_dump(exclude_none=True)
        return message, choice.finish_reason, resp.usage.completion_tokens
    content, finish, usage = [], None, None
    tool_calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or []:
                tool_calls[tc.index] = tc.model_dump(exclude_none=True, exclude={"index"})
            finish = choice.finish_reason or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    assert usage is not None
    return message, finish or "", usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_with_tools_is_recorded_token_exactly_and_chains(
    gateway: Any, tokenizer: Any, stream: bool
) -> None:
    rollout = gateway.rollout()
    client = gateway.openai(rollout)
    first_message, first_finish, first_usage = chat(client, HISTORY, stream=stream)
    second_history = [*HISTORY, first_message, {"role": "user", "content": "Thanks. Anything else?"}]
    _, second_finish, second_usage = chat(client, second_history, stream=not stream)

    first, second = gateway.store.list_calls(rollout["rollout_id"])
    stop_ids = tuple(tokenizer.stop_token_ids)
    # The gateway's own tokenization of the request: the chat template with the tools, rendered.
    assert first.prompt_token_ids == tokenizer.encode_chat(normalize_messages(HISTORY), tools=TOOLS)
    assert "<tools>" in tokenizer.decode(first.prompt_token_ids)
    assert "<tool_response>\n7\n</tool_response>" in tokenizer.decode(first.prompt_token_ids)
    for call, finish, usage in ((first, first_finish, first_usage), (second, second_finish, second_usage)):
        check_recorded(call, stop_ids)
        assert call.api == "chat.completions"
        assert call.finish_reason == finish and len(call.response_token_ids) == usage
    assert first.response["content"] == first_message["content"]
    assert_extends(first, second)


def test_legacy_completions_text_and_token_ids(gateway: Any, tokenizer: Any) -> None:
    rollout = gateway.rollout()
    client = gateway.openai(rollout)
    text = "Once upon a time, in a land far away,"
    whole = client.completions.create(model="tiny", prompt=text, max_tokens=MAX_TOKENS, logprobs=0)
    ids = [5, 17, 300, 1024, 4000, 77]
    pieces, finish = [], None
    for chunk in client.completions.create(model="tiny", prompt=ids, max_tokens=MAX_TOKENS, stream=True):
        pieces.append(chunk.choices[0].text)
        finish = chunk.choices[0].finish_reason or finish

    first, second = gateway.store.list_calls(rollout["rollout_id"])
    stop_ids = tuple(tokenizer.stop_token_ids)
    assert first.api == second.api == "completions"
    assert first.prompt_token_ids == tokenizer.encode(text)  # no chat template: the text as encoded
    assert second.prompt_token_ids == ids  # token IDs used verbatim
    for call in (first, second):
        check_recorded(call, stop_ids)
    assert whole.choices[0].text == first.response["text"]
    kept = [
        lp
        for t, lp in zip(first.response_token_ids, first.response_logprobs, strict=True)
        if t not in stop_ids
    ]
    assert whole.choices[0].logprobs.token_logprobs == pytest.approx(kept, abs=1e-6)
    assert "".join(pieces) == second.response["text"] and finish == second.finish_reason


def test_responses_api_streamed_then_whole_chains(gateway: Any, tokenizer: Any) -> None:
    rollout = gateway.rollout()
    client = gateway.openai(rollout)
    bash = {
        "type": "function",
        "name": "bash",
        "description": "Run a bash command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "list files"},
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt b.txt"},
    ]
    events = list(
        client.responses.create(
            model="tiny", instructions="Be brief.", input=history, tools=[bash], max_output_tokens=MAX_TOKENS,
            stream=True,
        )
    )  # fmt: skip
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    history += [item.model_dump(exclude_none=True) for item in final.output]
    history.append({"role": "user", "content": "and now?"})
    resp = client.responses.create(
        model="tiny", instructions="Be brief.", input=history, tools=[bash], max_output_tokens=MAX_TOKENS
    )

    first, second = gateway.store.list_calls(rollout["rollout_id"])
    stop_ids = tuple(tokenizer.stop_token_ids)
    assert first.api == second.api == "responses"
    for call, answer in ((first, final), (second, resp)):
        check_recorded(call, stop_ids)
        assert answer.usage.output_tokens == len(call.response_token_ids)
        assert answer.usage.input_tokens == len(call.prompt_token_ids)
    prompt = tokenizer.decode(first.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "<tool_response>\na.txt b.txt" in prompt
    assert_extends(first, second)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_messages_are_recorded(gateway: Any, tokenizer: Any, stream: bool) -> None:
    rollout = gateway.rollout()
    client = anthropic.Anthropic(
        base_url=f"{gateway.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": MAX_TOKENS,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Say something."}],
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    [call] = gateway.store.list_calls(rollout["rollout_id"])
    check_recorded(call, tuple(tokenizer.stop_token_ids))
    assert message.usage.output_tokens == len(call.response_token_ids)
    assert message.stop_reason == ("max_tokens" if call.finish_reason == "length" else "end_turn")
    assert tokenizer.decode(call.prompt_token_ids).startswith("<|im_start|>system\nYou are terse.")


def test_stop_string_ends_the_generation_on_the_server(
    gateway: Any, tiny_server: Any, tokenizer: Any
) -> None:
    """A stop string is the gateway's job (text); when it appears the gateway closes the engine's
    stream, which must end the request on vLLM too, not just hide the rest of the answer.

    vLLM samples ahead of what the gateway has read (a CI run saw 300 tokens before the abort
    arrived), and a stop token sampled in that lead ends the request on vLLM's side first: finished,
    not aborted, and the attempt shows nothing about the abort. Such an attempt is retried with
    another prompt; a gateway that never aborts makes every attempt finish on its own (a stop token
    or the whole budget), so the test still fails then."""
    outcomes: list[tuple[int, float]] = []  # (requests vLLM counted finished, tokens it generated)
    for attempt in range(5):
        rollout = gateway.rollout()
        # The server is shared with the tests before this one: a request of theirs that ends during
        # this one (an answer read to its end after its test returned) would count as finished here.
        wait_until(lambda: requests_running(tiny_server.url) == 0, "earlier requests to end")
        before = server_metric(tiny_server.url, "vllm:generation_tokens_total")
        finished = requests_finished(tiny_server.url)
        resp = gateway.openai(rollout).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"Spell some words ({attempt})."}],
            max_tokens=STOP_STRING_BUDGET,
            stop=["e"],
        )
        [call] = gateway.store.list_calls(rollout["rollout_id"])
        assert resp.choices[0].finish_reason == call.finish_reason == "stop"
        assert "e" not in resp.choices[0].message.content
        # Every sampled token is kept, the one that completed the stop string included.
        assert "e" in tokenizer.decode(call.response_token_ids)
        assert "e" not in tokenizer.decode(call.response_token_ids[:-1])
        assert len(call.response_token_ids) == len(call.response_logprobs) < STOP_STRING_BUDGET
        wait_until(lambda: requests_running(tiny_server.url) == 0, "vLLM to end the request")
        generated = server_metric(tiny_server.url, "vllm:generation_tokens_total") - before
        outcomes.append((requests_finished(tiny_server.url) - finished, generated))
        if outcomes[-1][0] == 0:
            break  # vLLM counts it aborted, not finished (a stop token or the budget would count it)
    aborted = [generated for ended, generated in outcomes if ended == 0]
    assert aborted, f"vLLM ended every attempt itself (finished, tokens generated): {outcomes}"
    # Not the whole budget: with ignore_eos a request nobody ended generates the whole budget (or
    # stops on a stop token). How many vLLM samples before the abort reaches it depends on load (57
    # for a 2-token answer in one CI run, all 300 of a 300-token budget in another), hence a budget
    # near the whole context.
    assert aborted[0] < STOP_STRING_BUDGET
