"""Anthropic Messages (``/v1/messages``) driven by the official ``anthropic`` SDK and raw HTTP against a
real uvicorn gateway on 127.0.0.1 with the scripted engine: answers, tool use, streaming, token-exact
reuse across Claude Code's habits, count_tokens, keep-alives at a paused gateway, and errors in
Anthropic's shape."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.errors import Overloaded
from harnessrl.gateway import create_app
from harnessrl.gateway.apis import template_context
from harnessrl.gateway.apis.anthropic import request_to_internal
from harnessrl.gateway.apis.anthropic_blocks import BlockAssembler
from harnessrl.gateway.errors import anthropic_error_response, error_response
from harnessrl.gateway.parsers.tools import HermesToolParser
from harnessrl.gateway.prompt.conversation import build_prompt
from harnessrl.gateway.prompt.history import CallHistory
from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

TOOLS = [
    {
        "name": "bash",
        "description": "Run a bash command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
TOOL_TURN = {"content": "Let me check.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}
USER = [{"role": "user", "content": "hi"}]


def sdk(gw: Any, rollout: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )


def assert_extends(calls: list[Any]) -> None:
    for prev, nxt in zip(calls, calls[1:], strict=False):
        head = prev.prompt_token_ids + prev.response_token_ids
        assert nxt.prompt_token_ids[: len(head)] == head, f"call {nxt.seq} does not extend call {prev.seq}"


def test_text_message_is_answered_and_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["Hello from the policy!", "Again."])
    rollout = gw.rollout()
    client = sdk(gw, rollout)
    raw = client.messages.with_raw_response.create(
        model="claude-custom-model", max_tokens=64, messages=USER, metadata={"user_id": "u"},
        extra_body={"temperature": 0.5, "top_k": 5},  # older SDKs and Claude Code still send them
    )  # fmt: skip
    msg = raw.parse()
    assert raw.headers["x-harnessrl-call-seq"] == "0"
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == "claude-custom-model"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello from the policy!"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.cache_read_input_tokens == 0 and msg.usage.cache_creation_input_tokens == 0
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert call.api == "messages" and call.finish_reason == "stop"
    assert call.request == {
        "model": "claude-custom-model", "max_tokens": 64, "messages": USER, "temperature": 0.5, "top_k": 5,
        "metadata": {"user_id": "u"},
    }  # fmt: skip
    assert call.response == {"role": "assistant", "content": "Hello from the policy!"}
    assert msg.usage.input_tokens == len(call.prompt_token_ids)
    assert msg.usage.output_tokens == len(call.response_token_ids)
    # The beta surface (``?beta=true``, what Claude Code uses) is the same endpoint.
    beta = client.beta.messages.create(
        model="m", max_tokens=16, messages=USER, betas=["context-1m-2025-08-07"]
    )
    assert beta.content[0].text == "Again."  # type: ignore[union-attr]


def test_tool_use_round_trip(make_gateway: Any) -> None:
    gw = make_gateway([TOOL_TURN, "There are two files."])
    rollout = gw.rollout()
    client = sdk(gw, rollout)
    first = client.messages.create(model="m", max_tokens=128, messages=USER, tools=TOOLS)  # type: ignore[arg-type]
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.stop_reason == "tool_use"
    text, use = first.content
    assert text.text == "Let me check."  # type: ignore[union-attr]
    assert use.name == "bash" and use.input == {"command": "ls -la"} and use.id.startswith("toolu_")  # type: ignore[union-attr]
    history = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a\nb"}]},  # type: ignore[union-attr]
    ]
    final = client.messages.create(model="m", max_tokens=128, messages=history, tools=TOOLS)  # type: ignore[arg-type]
    assert final.content[0].text == "There are two files." and final.stop_reason == "end_turn"  # type: ignore[union-attr]
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert calls[0].finish_reason == "tool_calls"
    assert calls[0].response["tool_calls"][0]["id"] == use.id  # type: ignore[union-attr]
    assert "<tool_response>\na\nb\n</tool_response>" in gw.engine.tokenizer.decode(calls[1].prompt_token_ids)
    assert_extends(calls)


RAW_EVENTS = {
    "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
    "message_stop",
}  # fmt: skip


def test_streaming_event_sequence_and_final_message(make_gateway: Any) -> None:
    turn = {**TOOL_TURN, "reasoning": "The user wants files."}
    gw = make_gateway([turn])
    rollout = gw.rollout()
    with sdk(gw, rollout).messages.stream(
        model="m", max_tokens=256, messages=USER, tools=TOOLS,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 128},
    ) as stream:  # fmt: skip
        events = [e for e in stream if e.type in RAW_EVENTS]
        final = stream.get_final_message()
    seq: list[str] = []
    for e in events:
        label = e.type
        if e.type == "content_block_start":
            label += ":" + e.content_block.type
        elif e.type == "content_block_delta":
            label += ":" + e.delta.type
        if not seq or seq[-1] != label:
            seq.append(label)
    assert seq == [
        "message_start",
        "content_block_start:thinking", "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta", "content_block_stop",
        "content_block_start:text", "content_block_delta:text_delta", "content_block_stop",
        "content_block_start:tool_use", "content_block_delta:input_json_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    text_deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert len(text_deltas) > 1  # token by token, not one lump
    thinking, text, use = final.content
    assert thinking.thinking == "The user wants files." and thinking.signature  # type: ignore[union-attr]
    assert text.text == "Let me check." and use.input == {"command": "ls -la"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"
    [call] = gw.client.list_calls(rollout["rollout_id"])
    assert final.usage.output_tokens == len(call.response_token_ids)
    assert call.response["reasoning_content"] == "The user wants files."
    assert call.response["content"] == "Let me check." and call.response["tool_calls"][0]["id"] == use.id  # type: ignore[union-attr]


def test_count_tokens_matches_the_call_and_records_nothing(make_gateway: Any) -> None:
    gw = make_gateway(["ok"])
    rollout = gw.rollout()
    client = sdk(gw, rollout)
    kwargs: dict[str, Any] = {"model": "m", "messages": USER, "system": "Be brief.", "tools": TOOLS}
    counted = client.messages.count_tokens(**kwargs)
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    assert gw.client.get_rollout(rollout["rollout_id"])["status"] == "queued"  # counting is not a call
    msg = client.messages.create(max_tokens=16, **kwargs)
    assert counted.input_tokens == msg.usage.input_tokens


def test_system_blocks_system_role_and_vendor_fields(make_gateway: Any) -> None:
    gw = make_gateway(["ok"])
    rollout = gw.rollout()
    msg = sdk(gw, rollout).messages.create(
        model="m",
        max_tokens=16,
        system=[
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Work carefully.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[{"role": "system", "content": "Extra rule."}, *USER],  # type: ignore[list-item]
        thinking={"type": "adaptive"},  # type: ignore[typeddict-item]
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "low"}},
    )
    assert msg.content[0].text == "ok"  # type: ignore[union-attr]
    [call] = gw.client.list_calls(rollout["rollout_id"])
    prompt = gw.engine.tokenizer.decode(call.prompt_token_ids)
    assert prompt.startswith("<|im_start|>system\nYou are Claude Code.\n\nWork carefully.<|im_end|>")
    assert "<|im_start|>system\nExtra rule.<|im_end|>" in prompt


def test_claude_code_habits_keep_every_call_token_exact(make_gateway: Any) -> None:
    """cache_control markers move to the newest turn, assistant turns come back as their blocks
    (thinking + text + tool_use) with re-serialized inputs; every call extends the previous one."""
    script = [
        {**TOOL_TURN, "reasoning": "Look first."},
        {"content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "cat a", "timeout": 5}}]},
        {"content": "Now I edit.", "tool_calls": [{"name": "bash", "arguments": {"command": "sed -i x a"}}]},
        "Done: the bug is fixed.",
    ]
    gw = make_gateway(script)
    rollout = gw.rollout()
    client = sdk(gw, rollout)
    marker = {"type": "ephemeral"}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                     {"type": "text", "text": "Fix the bug."}]},
    ]  # fmt: skip
    for step in range(4):
        sent = copy.deepcopy(history)
        sent[-1]["content"][-1]["cache_control"] = marker  # only the newest turn carries the marker
        msg = client.messages.create(
            model="m", max_tokens=256, system=[{"type": "text", "text": "S", "cache_control": marker}],
            messages=sent, tools=TOOLS, thinking={"type": "enabled", "budget_tokens": 64},  # type: ignore[arg-type]
        )  # fmt: skip
        if step == 3:
            assert msg.content[0].text == "Done: the bug is fixed."  # type: ignore[union-attr]
            break
        blocks = [b.model_dump(exclude_none=True) for b in msg.content]
        for block in blocks:
            if block["type"] == "tool_use":  # the harness rebuilds the input: other key order
                block["input"] = dict(reversed(list(block["input"].items())))
        history.append({"role": "assistant", "content": blocks})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": b["id"],
                "content": [{"type": "text", "text": f"out {step}"}],
            }
            for b in blocks
            if b["type"] == "tool_use"
        ]
        history.append({"role": "user", "content": results})
    calls = gw.client.list_calls(rollout["rollout_id"])
    assert len(calls) == 4
    assert_extends(calls)
    assert 'harnessrl_prompt_reuse_total{result="reused"} 3.0' in gw.client.metrics()
    # After a restart the reuse memory is rebuilt from the stored requests through the converter.
    memory = asyncio.run(CallHistory(gw.store).get(rollout["rollout_id"], 0))
    priors = [memory.priors[c.seq] for c in calls[:3]]
    messages, tools = request_to_internal(calls[3].request)
    _, kwargs = template_context("messages", calls[3].request)  # thinking: the template's switch
    plan = build_prompt(
        gw.engine.tokenizer, normalize_messages(messages), priors, tools=tools, template_kwargs=kwargs
    )
    assert plan.result == "reused" and plan.prompt_ids == calls[3].prompt_token_ids


THINKING_SWITCH = (
    "{%- if add_generation_prompt and enable_thinking is defined %}"
    "{{- '<think>\\n' if enable_thinking else '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)


def test_thinking_maps_onto_the_templates_switch(tmp_path: Path) -> None:
    """A template with ``enable_thinking`` (as Qwen3's): ``thinking`` turns it on or off, and reasoning
    opened by the generation prompt itself still comes back as a thinking block."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir(weights=False) / name, model_dir / name)
    template = (tiny_model_dir(weights=False) / "chat_template.jinja").read_text()
    (model_dir / "chat_template.jinja").write_text(template + THINKING_SWITCH)
    tokenizer = PolicyTokenizer.from_dir(model_dir)
    engine = ScriptedEngine(["plan it\n</think>\n\nThe answer.", "Plain answer."], tokenizer)
    with SQLiteStore(tmp_path / "s.db") as store, serve_in_thread(
        create_app(GatewayConfig(admin_key="admin"), store, engine)
    ) as url:  # fmt: skip
        gw = SimpleNamespace(url=url)
        admin = GatewayClient(url, "admin")
        rollout = admin.create_rollout({"prompt": "x"})
        admin.close()
        client = sdk(gw, rollout)
        on = client.messages.create(
            model="m", max_tokens=64, messages=USER, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in on.content] == [
            ("thinking", "plan it"),
            ("text", "The answer."),
        ]
        off = client.messages.create(model="m", max_tokens=64, messages=USER, thinking={"type": "disabled"})
        assert [b.type for b in off.content] == ["text"]
        first, second = store.list_calls(rollout["rollout_id"])
        assert tokenizer.decode(first.prompt_token_ids).endswith("<|im_start|>assistant\n<think>\n")
        assert tokenizer.decode(second.prompt_token_ids).endswith("<think>\n\n</think>\n\n")


def test_stop_sequences_and_max_tokens(make_gateway: Any) -> None:
    gw = make_gateway(["Hello STOP world", "a long answer that will be cut short by max tokens"])
    rollout = gw.rollout()
    client = sdk(gw, rollout)
    msg = client.messages.create(model="m", max_tokens=64, messages=USER, stop_sequences=["STOP", "zzz"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"
    assert msg.content[0].text == "Hello"  # type: ignore[union-attr]
    cut = client.messages.create(model="m", max_tokens=3, messages=USER)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert [c.finish_reason for c in gw.client.list_calls(rollout["rollout_id"])] == ["stop", "length"]


def test_paused_gateway_streams_pings_and_completes_after_resume(make_gateway: Any) -> None:
    gw = make_gateway(["after the pause"], keepalive_s=0.05)
    rollout = gw.rollout()
    gw.client.pause(timeout=5)
    lines: list[str] = []

    def call() -> None:
        body = {"model": "m", "max_tokens": 32, "messages": USER, "stream": True}
        url = f"{gw.url}/v1/messages"  # attributed by the key alone
        with httpx.stream("POST", url, json=body, headers={"x-api-key": rollout["api_key"]}, timeout=30) as r:
            assert r.status_code == 200
            lines.extend(line for line in r.iter_lines() if line.startswith("event: "))

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing: the machine may be busy
    while gw.client.state()["waiting"] != 1:
        assert time.monotonic() < deadline, "the call never reached the gate"
        time.sleep(0.02)
    while lines.count("event: ping") < 2:  # the held stream is kept alive meanwhile
        assert time.monotonic() < deadline + 5, "no keep-alive pings while paused"
        time.sleep(0.02)
    gw.client.resume()
    thread.join(timeout=10)
    first_start = lines.index("event: message_start")
    assert first_start >= 2 and set(lines[:first_start]) == {"event: ping"}
    assert lines[-2:] == ["event: message_delta", "event: message_stop"]
    [call_] = gw.client.list_calls(rollout["rollout_id"])
    assert call_.response["content"] == "after the pause"


def test_pings_while_a_long_tool_call_is_held_back(make_gateway: Any) -> None:
    turn = {"tool_calls": [{"name": "bash", "arguments": {"command": "echo " + "word " * 30}}]}
    gw = make_gateway([turn], token_delay_s=0.01, keepalive_s=0.05)
    rollout = gw.rollout()
    body = {"model": "m", "max_tokens": 256, "messages": USER, "tools": TOOLS, "stream": True}
    headers = {"authorization": f"Bearer {rollout['api_key']}"}
    with httpx.stream("POST", f"{rollout['base_url']}/messages", json=body, headers=headers) as r:
        lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    start = lines.index("event: message_start")
    assert "event: ping" in lines[start : lines.index("event: content_block_start")]


def test_no_pings_while_text_flows(make_gateway: Any) -> None:
    """Control of the test above: text deltas sent as the tokens arrive (held back until the stream's
    writer takes them, ``MessageAnswer.held``) count as sent, so no ping goes between them."""
    gw = make_gateway(["word " * 40], token_delay_s=0.01, keepalive_s=0.05)
    rollout = gw.rollout()
    body = {"model": "m", "max_tokens": 256, "messages": USER, "stream": True}
    headers = {"authorization": f"Bearer {rollout['api_key']}"}
    with httpx.stream("POST", f"{rollout['base_url']}/messages", json=body, headers=headers) as r:
        lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    assert lines.count("event: content_block_delta") > 20
    assert "event: ping" not in lines


def test_rollout_cancelled_while_waiting_gets_an_error_event(make_gateway: Any) -> None:
    gw = make_gateway(["never"], keepalive_s=0.05)
    rollout = gw.rollout()
    gw.client.pause(timeout=5)
    errors: list[Exception] = []

    def call() -> None:
        try:
            with sdk(gw, rollout).messages.stream(model="m", max_tokens=8, messages=USER) as stream:  # type: ignore[arg-type]
                stream.get_final_message()
        except anthropic.APIStatusError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing: the machine may be busy
    while gw.client.state()["waiting"] != 1:
        assert time.monotonic() < deadline, "the call never reached the gate"
        time.sleep(0.02)
    gw.client.cancel_rollout(rollout["rollout_id"])
    gw.client.resume()
    thread.join(timeout=10)
    [exc] = errors
    assert exc.body["error"]["type"] == "invalid_request_error" and "cancelled" in str(exc)  # type: ignore[index]


def test_probes_answer(gateway: Any) -> None:
    rollout = gateway.rollout()
    for path in ("/", "/v1", f"/rollouts/{rollout['rollout_id']}", f"/rollouts/{rollout['rollout_id']}/v1"):
        assert httpx.head(gateway.url + path).status_code == 200, path


GOOD = {"model": "m", "max_tokens": 16, "messages": USER}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}


@pytest.mark.parametrize(
    ("path", "body", "status", "kind", "needle"),
    [
        ("messages", b"{not json", 400, "invalid_request_error", "not valid JSON"),
        ("messages", b"[1]", 400, "invalid_request_error", "JSON object"),
        ("messages", {"model": "m", "messages": USER}, 400, "invalid_request_error", "max_tokens"),
        ("messages", {"model": "m", "max_tokens": 8}, 400, "invalid_request_error", "messages"),
        ("messages", {**GOOD, "messages": []}, 400, "invalid_request_error", "messages"),
        ("messages", {**GOOD, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
        ("messages", {**GOOD, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
        ("messages", {**GOOD, "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_request_error", "role"),
        ("messages", {**GOOD, "messages": [{"role": "user", "content": [IMAGE]}]}, 400, "invalid_request_error",
         "'image' is not supported"),
        ("messages", {**GOOD, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, 400,
         "invalid_request_error", "tool_use_id"),
        ("messages", {**GOOD, "max_tokens": 250}, 400, "invalid_request_error",
         "input length and `max_tokens` exceed context limit"),
        ("messages", {**GOOD, "messages": [{"role": "user", "content": "hi " * 300}]}, 400,
         "invalid_request_error", "prompt is too long"),
        ("messages", {**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}, 413, "request_too_large",
         "exceeds"),
        ("messages/count_tokens", {"model": "m"}, 400, "invalid_request_error", "messages"),
        ("messages/count_tokens", {"messages": [{"role": "user", "content": [IMAGE]}]}, 400,
         "invalid_request_error", "image"),
        ("messages/nope", GOOD, 404, "not_found_error", "no route"),
    ],
)  # fmt: skip
def test_bad_requests_in_anthropic_shape(
    make_gateway: Any, path: str, body: Any, status: int, kind: str, needle: str
) -> None:
    gw = make_gateway(["ok"], context_length=256, max_body_bytes=4096)
    rollout = gw.rollout()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{rollout['base_url']}/{path}",
        content=content,
        headers={"x-api-key": rollout["api_key"]},
        timeout=10,
    )
    assert r.status_code == status, r.text
    assert r.json() == {"type": "error", "error": {"type": kind, "message": r.json()["error"]["message"]}}
    assert needle in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false"
    assert gw.client.list_calls(rollout["rollout_id"]) == []


def test_auth_and_closed_rollouts_raise_the_sdk_errors(make_gateway: Any) -> None:
    gw = make_gateway(["ok"])
    mine, other = gw.rollout(), gw.rollout()
    with pytest.raises(anthropic.AuthenticationError) as denied:
        sdk(gw, {**mine, "api_key": "wrong"}).messages.create(**GOOD)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk(gw, {**other, "api_key": mine["api_key"]}).messages.create(**GOOD)
    gw.client.finish_rollout(mine["rollout_id"], outcome="success", reward=1.0)
    with pytest.raises(anthropic.ConflictError) as closed:
        sdk(gw, mine).messages.create(**GOOD)
    assert closed.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.ConflictError):
        sdk(gw, mine).messages.count_tokens(model="m", messages=USER)  # type: ignore[arg-type]
    r = httpx.get(f"{gw.url}/v1/messages", headers={"x-api-key": other["api_key"]})
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_429_carries_retry_after_in_both_shapes() -> None:
    for response in (anthropic_error_response(Overloaded("busy")), error_response(Overloaded("busy"))):
        assert response.status_code == 429 and response.headers["retry-after"].isdigit()
        assert "x-should-retry" not in response.headers
    assert json.loads(anthropic_error_response(Overloaded("busy")).body) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "busy"},
    }  # fmt: skip


def test_converter_mapping() -> None:
    messages, tools = request_to_internal(
        {
            "system": "S",
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "T", "signature": "x"}]},
                {"role": "assistant", "content": [
                    {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "A"},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "note"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                     "content": [{"type": "text", "text": "boom"}]},
                ]},
            ],
            "tools": [*TOOLS, {"type": "web_search_20250305", "name": "web_search"}],
        }
    )  # fmt: skip
    assert messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "A", "reasoning_content": "T", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "boom"},
        {"role": "user", "content": "note"},
    ]  # fmt: skip
    assert tools == [
        {"type": "function", "function": {"name": "bash", "parameters": TOOLS[0]["input_schema"],
                                          "description": "Run a bash command"}}
    ]  # fmt: skip


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_blocks_do_not_depend_on_how_the_text_arrives(size: int) -> None:
    text = '\n<think>\nplan it\n</think>\n\nI will look.  \n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
    whole = BlockAssembler(HermesToolParser())
    whole.feed(text)
    whole.finish()
    pieces = BlockAssembler(HermesToolParser())
    events = [e for i in range(0, len(text), size) for e in pieces.feed(text[i : i + size])] + pieces.finish()
    strip_ids = [{k: v for k, v in b.items() if k != "id"} for b in pieces.blocks]
    assert strip_ids == [{k: v for k, v in b.items() if k != "id"} for b in whole.blocks]
    assert [b["type"] for b in whole.blocks] == ["thinking", "text", "tool_use"]
    assert whole.blocks[0]["thinking"] == "plan it" and whole.blocks[1]["text"] == "I will look."
    deltas = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert deltas == "I will look."
