"""The OpenAI Responses API (``/v1/responses``) driven by the official openai SDK and raw HTTP against a
real uvicorn gateway on 127.0.0.1 with the scripted engine."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from harnessrl.errors import Overloaded
from harnessrl.gateway.apis import internal_conversation
from harnessrl.gateway.apis.responses_input import encode_reasoning, request_to_internal
from harnessrl.gateway.errors import error_response

BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}
TOOL_TURN = {
    "reasoning": "The user wants the files.",
    "content": "Let me check.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}],
}


def sdk(rollout: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def post(rollout: dict[str, Any], body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{rollout['base_url']}/responses",
        json=body,
        headers={"authorization": f"Bearer {rollout['api_key']}"},
        timeout=30,
        **kwargs,
    )


def assert_extends(calls: list[Any]) -> None:
    for prev, nxt in zip(calls, calls[1:], strict=False):
        head = prev.prompt_token_ids + prev.response_token_ids
        assert nxt.prompt_token_ids[: len(head)] == head, f"call {nxt.seq} does not extend call {prev.seq}"


def test_sdk_non_streaming_is_answered_and_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["Hello from the policy!"])
    rollout = gw.rollout()
    raw = sdk(rollout).responses.with_raw_response.create(
        model="codex-test", instructions="Be brief.", input="hi", temperature=0.5, store=False
    )
    resp = raw.parse()
    assert raw.headers["x-harnessrl-call-seq"] == "0"
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.status == "completed"
    assert resp.model == "codex-test" and resp.output_text == "Hello from the policy!"
    [item] = resp.output
    assert item.type == "message" and item.content[0].type == "output_text"
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.api == "responses" and call.request["input"] == "hi" and call.request["store"] is False
    assert call.response["content"] == "Hello from the policy!" and call.response["_response_id"] == resp.id
    assert resp.usage.input_tokens == len(call.prompt_token_ids)
    assert resp.usage.output_tokens == len(call.response_token_ids)
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    prompt = gw.engine.tokenizer.decode(call.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>")


def test_sdk_streaming_event_order_and_function_call(make_gateway: Any) -> None:
    gw = make_gateway([TOOL_TURN])
    rollout = gw.rollout()
    events = list(sdk(rollout).responses.create(model="m", input="list files", tools=[BASH], stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Let me check."  # token by token, no tool-call text
    collapsed = [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]
    assert collapsed == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added",  # function call (the message stays open to the end)
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    fc = final.output[2]
    assert (
        fc.name == "bash" and json.loads(fc.arguments) == {"command": "ls -la"} and fc.status == "completed"
    )
    assert final.output[0].summary[0].text == "The user wants the files."
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.finish_reason == "tool_calls"
    assert call.response["tool_calls"][0]["id"] == fc.call_id
    assert call.response["reasoning_content"] == "The user wants the files."


def test_codex_style_round_trip_reuses_sampled_tokens(make_gateway: Any) -> None:
    """Codex re-sends the whole input each turn (output items echoed back, arguments re-serialized)."""
    gw = make_gateway([TOOL_TURN, {"content": "Two files.", "tool_calls": []}, "Bye."])
    rollout = gw.rollout()
    client = sdk(rollout)
    base = {
        "model": "m",
        "instructions": "You are Codex.",
        "tools": [BASH],
        "store": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "prompt_cache_key": "session-1",
    }
    history: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Sandbox: none."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
    ]
    for user_turn in (None, "thanks"):
        stream = client.responses.create(
            **base, input=history, stream=True, include=["reasoning.encrypted_content"]
        )
        final = next(e.response for e in stream if e.type == "response.completed")
        for item in final.output:
            dumped = item.model_dump(exclude_none=True)
            if item.type == "reasoning":
                dumped.pop("content")  # Codex sends summary + encrypted_content back, not the raw text
                assert dumped["encrypted_content"] == encode_reasoning("The user wants the files.")
            if item.type == "function_call":
                dumped["arguments"] = json.dumps(json.loads(item.arguments), separators=(",", ":"))
                history += [
                    dumped,
                    {"type": "function_call_output", "call_id": item.call_id, "output": "a b"},
                ]
                continue
            history.append(dumped)
        if user_turn:
            history.append({"role": "user", "content": user_turn})
    client.responses.create(**base, input=history)
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert [c.seq for c in calls] == [0, 1, 2]
    assert_extends(calls)
    text = gw.engine.tokenizer.decode(calls[2].prompt_token_ids)
    assert (
        "<|im_start|>system\nSandbox: none.<|im_end|>" in text
        and "<tool_response>\na b\n</tool_response>" in text
    )
    metrics = httpx.get(f"{gw.url}/metrics", headers={"authorization": "Bearer test-admin-key"}).text
    assert 'harnessrl_prompt_reuse_total{result="reused"} 2.0' in metrics


def test_previous_response_id_chains_and_survives_the_converter(make_gateway: Any) -> None:
    gw = make_gateway([TOOL_TURN, TOOL_TURN, "Done."])
    rollout = gw.rollout()
    client = sdk(rollout)
    resp = client.responses.create(model="m", instructions="Sys.", input="go", tools=[BASH])
    for _ in range(2):
        fc = next(o for o in resp.output if o.type == "function_call")
        resp = client.responses.create(
            model="m",
            instructions="Sys.",
            tools=[BASH],
            previous_response_id=resp.id,
            input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "ok"}],
        )
    assert resp.output_text == "Done."
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert len(calls) == 3
    assert_extends(calls)
    # The stored request alone rebuilds the whole conversation (reuse after a gateway restart).
    messages, tools = internal_conversation("responses", calls[2].request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert tools is not None and tools[0]["function"]["name"] == "bash"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="x", previous_response_id="resp_unknown")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_unsupported_tools_are_dropped_by_default(make_gateway: Any) -> None:
    gw = make_gateway(["ok"])
    rollout = gw.rollout()
    hosted = [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
        {
            "type": "namespace",
            "name": "crm",
            "description": "CRM",
            "tools": [{"type": "function", "name": "f"}],
        },
        {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"},
    ]
    r = post(
        rollout,
        {
            "model": "m",
            "tools": [*hosted, BASH],
            "input": [
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"role": "user", "content": "hi"},
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert [t["name"] for t in r.json()["tools"]] == ["bash"]
    [call] = gw.client.list_calls(rollout["rollout_id"])
    prompt = gw.engine.tokenizer.decode(call.prompt_token_ids)
    assert '"name": "bash"' in prompt and "apply_patch" not in prompt and "crm" not in prompt
    assert call.request["tools"][: len(hosted)] == hosted  # recorded as received


def test_unsupported_tools_are_refused_when_configured(make_gateway: Any) -> None:
    gw = make_gateway(["ok"], unsupported_tools="refuse")
    rollout = gw.rollout()
    r = post(rollout, {"model": "m", "input": "hi", "tools": [BASH, {"type": "web_search"}]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "tools.1" and "web_search" in error["message"]
    assert post(rollout, {"model": "m", "input": "hi", "tools": [BASH]}).status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"input": [{"type": "teleport"}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "name": "bash", "arguments": "{}"}]}, "input.0.call_id"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": 42}, "input"),
        ({}, "input"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(gateway: Any, body: dict[str, Any], param: str) -> None:
    rollout = gateway.rollout()
    r = post(rollout, {"model": "m", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.headers["x-should-retry"] == "false"
    assert gateway.client.list_calls(rollout["rollout_id"]) == []


def test_429_carries_retry_after() -> None:
    response = error_response(Overloaded("too many calls"))
    assert response.status_code == 429 and response.headers["retry-after"].isdigit()
    assert "x-should-retry" not in response.headers
    assert json.loads(response.body)["error"]["code"] == "overloaded"


def test_max_output_tokens_makes_an_incomplete_response(make_gateway: Any) -> None:
    gw = make_gateway(["a long answer that will be cut short by the limit"])
    rollout = gw.rollout()
    resp = sdk(rollout).responses.create(model="m", input="hi", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.output[0].status == "incomplete"
    events = list(sdk(rollout).responses.create(model="m", input="hi", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete"


@pytest.mark.timeout(120)
def test_streaming_call_held_at_a_paused_gateway_gets_keepalives(make_gateway: Any) -> None:
    gw = make_gateway(["after the pause"], keepalive_s=0.1)
    rollout = gw.rollout()
    gw.client.pause(timeout=1)
    lines: list[str] = []

    def stream() -> None:
        with httpx.stream(
            "POST",
            f"{rollout['base_url']}/responses",
            json={"model": "m", "input": "hi", "stream": True},
            headers={"x-api-key": rollout["api_key"]},
            timeout=30,
        ) as r:
            lines.extend(line for line in r.iter_lines() if line)

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["waiting"] != 1 or sum(line.startswith(":") for line in lines) < 2:
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    gw.client.resume()
    thread.join(timeout=10)
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [line[7:] for line in lines if line.startswith("event: ")] == [e["type"] for e in events]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "after the pause"
    assert "data: [DONE]" not in lines


def test_request_to_internal_merges_one_answer_into_one_assistant_message() -> None:
    body = {
        "instructions": "Sys.",
        "input": [
            {"role": "developer", "content": "Dev."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("hmm")},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]},
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "b", "arguments": '{"x": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "A"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "B"}],
            },
            {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "someone else's secret"},
            {"type": "function_call", "call_id": "c3", "name": "a", "arguments": "{}"},
        ],
        "tools": [BASH, {"type": "web_search"}],
    }
    messages, tools = request_to_internal(body)
    assert messages == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Dev."},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "On it.",
            "reasoning_content": "hmm",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": '{"x": 1}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "A"},
        {"role": "tool", "tool_call_id": "c2", "content": "B"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "a", "arguments": "{}"}}],
        },
    ]
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a bash command",
                "parameters": BASH["parameters"],
                "strict": False,
            },
        }
    ]


def test_client_that_leaves_mid_stream_cancels_the_call(make_gateway: Any) -> None:
    gw = make_gateway(["slow " * 40], token_delay_s=0.02)
    rollout = gw.rollout()
    with httpx.stream(
        "POST",
        f"{rollout['base_url']}/responses",
        json={"model": "m", "input": "hi", "stream": True},
        headers={"x-api-key": rollout["api_key"]},
        timeout=30,
    ) as r:
        for line in r.iter_lines():
            if "response.output_text.delta" in line:
                break  # leave after the first token
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert gw.client.list_calls(rollout["rollout_id"]) == []


def test_function_call_then_message_items_fold_into_one_assistant_turn():
    """Codex replays a streamed answer as [function_call, message]: still one assistant turn."""
    from harnessrl.gateway.apis.responses_input import input_to_messages

    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    messages = input_to_messages(items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Running." and len(messages[1]["tool_calls"]) == 1
