"""Teacher mode for the Anthropic Messages and OpenAI Responses APIs (``gateway.teacher.messages``,
``gateway.teacher.responses``): each call translated to the upstream's chat completions and back.

The upstream is a second harnessrl gateway with the scripted engine (``teaching_stack`` of
test_teacher_mode.py): its own store says what it was asked and what it answered, and a direct
chat stream from it is what a harness would get from it straight. For what that gateway does not
send (``reasoning_content`` deltas, tool-call arguments split over chunks, 429/500 answers, a
stream cut mid-way) the upstream is a small real OpenAI-compatible server here. The harnesses are
the official ``anthropic`` and ``openai`` SDKs, including their stream helpers, which rebuild the
answer from the events and fail on a sequence that breaks the API's rules.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio.to_thread
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.gateway.test_teacher_mode import (
    ADMIN,
    MESSAGES,
    TOOLS,
    Teaching,
    agent_loop,
    teaching_stack,
    without_ids,
)

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.apis import internal_conversation
from harnessrl.gateway.server import serve_in_thread
from harnessrl.gateway.teacher import Teacher
from harnessrl.gateway.teacher.upstream import upstream_error
from harnessrl.sft.conversations import conversation
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

SYSTEM, QUESTION = MESSAGES[0]["content"], MESSAGES[1]["content"]
A_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
R_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture
def teaching(tmp_path: Path, tokenizer: PolicyTokenizer) -> Iterator[Teaching]:
    with teaching_stack(tmp_path, tokenizer) as t:
        yield t


def claude(sdk: openai.OpenAI) -> anthropic.Anthropic:
    """The Anthropic SDK on the same rollout as ``sdk`` (its base URL without ``/v1``)."""
    base = str(sdk.base_url).rstrip("/").removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=sdk.api_key, max_retries=0)


# -- what the harness received, in the internal (recorded) message's shape ----------------------------


def from_blocks(blocks: list[Any]) -> dict[str, Any]:
    """An Anthropic answer's blocks as the internal message (as ``anthropic_convert`` reads them)."""
    text = "".join(b.text for b in blocks if b.type == "text")
    thinking = "".join(b.thinking for b in blocks if b.type == "thinking")
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if b.type == "tool_use"
    ]
    out: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning_content"] = thinking
    return out


def from_output(output: list[Any]) -> dict[str, Any]:
    """A Response's output items as the internal message."""
    texts = [p.text for item in output if item.type == "message" for p in item.content]
    reasoning = ["".join(c.text for c in item.content or []) for item in output if item.type == "reasoning"]
    calls = [
        {"id": i.call_id, "type": "function", "function": {"name": i.name, "arguments": i.arguments}}
        for i in output
        if i.type == "function_call"
    ]
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    return out


def same_calls(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with tool-call arguments parsed (JSON spacing is not content)."""
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def messages_loop(
    client: anthropic.Anthropic, *, stream: bool, answered_as: str = "claude-x"
) -> list[dict[str, Any]]:
    """Claude Code's loop in small: the tool-calling turn, its result, the answer."""
    history: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    got = []
    for _ in range(2):
        kwargs: dict[str, Any] = dict(
            model="claude-x", max_tokens=200, system=SYSTEM, messages=history, tools=A_TOOLS
        )
        if stream:
            deltas: list[str] = []
            with client.messages.stream(**kwargs) as s:
                for event in s:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        deltas.append(event.delta.text)
                answer = s.get_final_message()
            assert "".join(deltas) == "".join(b.text for b in answer.content if b.type == "text")
        else:
            answer = client.messages.create(**kwargs)
        assert (
            answer.model == answered_as
        )  # translated: the name the harness asked for, as the policy path answers
        got.append(from_blocks(answer.content))
        history.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]}
        )
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "42\n"}
            for b in answer.content
            if b.type == "tool_use"
        ]
        history.append({"role": "user", "content": results or "thanks"})
        if answer.stop_reason != "tool_use":
            assert answer.stop_reason == "end_turn"
            break
    return got


def responses_loop(sdk: openai.OpenAI, *, stream: bool, answered_as: str = "gpt-x") -> list[dict[str, Any]]:
    """Codex's loop in small (the whole history resent, no previous_response_id)."""
    history: list[Any] = [{"role": "user", "content": QUESTION}]
    got = []
    for _ in range(2):
        kwargs: dict[str, Any] = dict(model="gpt-x", instructions=SYSTEM, input=history, tools=R_TOOLS)
        if stream:
            deltas: list[str] = []
            with sdk.responses.stream(**kwargs) as s:
                for event in s:
                    if event.type == "response.output_text.delta":
                        deltas.append(event.delta)
                answer = s.get_final_response()
            assert "".join(deltas) == answer.output_text
        else:
            answer = sdk.responses.create(**kwargs)
        assert answer.status == "completed" and answer.model == answered_as
        got.append(from_output(answer.output))
        history += [item.model_dump(exclude_none=True) for item in answer.output]
        calls = [i for i in answer.output if i.type == "function_call"]
        history += [{"type": "function_call_output", "call_id": c.call_id, "output": "42\n"} for c in calls]
        if not calls:
            break
    return got


def upstream_answers(t: Teaching) -> list[dict[str, Any]]:
    out = []
    for call in t.upstream.list_calls(t.upstream_rollout):
        message = {k: v for k, v in call.response.items() if k in ("role", "content", "reasoning_content")}
        if call.response.get("tool_calls"):
            message["tool_calls"] = call.response["tool_calls"]
        out.append(message)
    return out


def recorded(t: Teaching) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in c.response.items() if not k.startswith("_")}
        for c in t.store.list_calls(t.rollout_id)
    ]


# -- fidelity against a real upstream (a harnessrl gateway) -------------------------------------------


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_harness_gets_and_store_records_what_the_upstream_sent(
    teaching: Teaching, api: str, stream: bool
) -> None:
    if api == "messages":
        got = messages_loop(claude(teaching.harness), stream=stream)
    else:
        got = responses_loop(teaching.harness, stream=stream)
    assert len(got) == 2
    sent = upstream_answers(teaching)
    assert len(sent) == 2
    if stream:
        # The upstream's own chat stream, read straight from it, is what reached the harness in its
        # API's shape (tool-call ids aside: the upstream makes new ones per call; the harness got
        # the ones the upstream sent through the teacher, checked against its record).
        direct = agent_loop(teaching, stream=True, sdk=teaching.direct)
        assert [same_calls(m) for m in without_ids(got)] == [same_calls(m) for m in without_ids(direct)]
        assert [c["id"] for c in got[0]["tool_calls"]] == [c["id"] for c in sent[0]["tool_calls"]]
    else:  # text (the upstream's reasoning in its content, as it sends it), tool calls and their ids
        assert [same_calls(m) for m in got] == [same_calls(m) for m in sent]
    assert "<think>\nThe file holds the answer.\n</think>" in (got[0]["content"] or "")
    assert json.loads(got[0]["tool_calls"][0]["function"]["arguments"]) == {"command": "cat a.txt"}
    assert got[1]["content"].endswith("The answer is 42.")
    # Recorded as the harness received it, as the policy path records this API.
    assert recorded(teaching) == got
    calls = teaching.store.list_calls(teaching.rollout_id)
    assert [c.api for c in calls] == [api, api]
    assert [c.finish_reason for c in calls] == ["tool_calls", "stop"]
    assert calls[0].request["model"] == ("claude-x" if api == "messages" else "gpt-x")  # as received
    assert all(c.prompt_token_ids == [] and c.response_token_ids == [] for c in calls)
    # The upstream was asked for the conversation the request converts to (the tool result under
    # the id it made) under its own model name.
    up_calls = teaching.upstream.list_calls(teaching.upstream_rollout)
    for mine, theirs in zip(calls, up_calls, strict=True):
        converted = internal_conversation(api, mine.request)
        assert converted is not None
        assert theirs.request["messages"] == converted[0]
        assert theirs.request["model"] == "the-teacher"
        assert mine.usage is not None and theirs.usage is not None
        assert mine.usage.completion_tokens == theirs.usage.completion_tokens > 0
        assert mine.usage.prompt_tokens == theirs.usage.prompt_tokens > 0
        assert mine.finished_at is not None and mine.finished_at >= mine.started_at
        if stream:
            assert mine.first_token_at is not None
    assert up_calls[1].request["messages"][-1]["tool_call_id"] == got[0]["tool_calls"][0]["id"]
    # sft reads these calls as it reads the chat ones: the answer is the recorded message.
    assert conversation(calls[1]).answer["content"] == got[1]["content"]
    assert conversation(calls[1]).messages[0] == {"role": "system", "content": SYSTEM}


def test_previous_response_id_resolves_to_the_teachers_recorded_answer(teaching: Teaching) -> None:
    sdk = teaching.harness
    first = sdk.responses.create(model="gpt-x", instructions=SYSTEM, input=QUESTION, tools=R_TOOLS)
    [call] = [i for i in first.output if i.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "42\n"}
    second = sdk.responses.create(
        model="gpt-x", instructions=SYSTEM, input=[output], tools=R_TOOLS, previous_response_id=first.id
    )
    assert second.output_text.endswith("The answer is 42.")
    up_calls = teaching.upstream.list_calls(teaching.upstream_rollout)
    asked = up_calls[1].request["messages"]
    assert [m["role"] for m in asked] == ["system", "user", "assistant", "tool"]
    assert asked[2]["tool_calls"][0]["id"] == call.call_id
    assert len(teaching.store.list_calls(teaching.rollout_id)) == 2


def test_a_request_the_upstream_refuses_reaches_the_harness_in_its_apis_shape_unrecorded(
    teaching: Teaching,
) -> None:
    client, sdk = claude(teaching.harness), teaching.harness
    huge = 10_000  # valid here; the upstream (a 4096-token policy) answers 400: context exceeded
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as a_err:
            if stream:
                with client.messages.stream(
                    model="c", max_tokens=huge, messages=[{"role": "user", "content": "x"}]
                ) as s:
                    s.get_final_message()
            else:
                client.messages.create(
                    model="c", max_tokens=huge, messages=[{"role": "user", "content": "x"}]
                )
        body = a_err.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert "teacher upstream answered 400" in body["error"]["message"]
        with pytest.raises(openai.BadRequestError) as o_err:
            sdk.responses.create(model="g", input="x", max_output_tokens=huge, stream=stream)
        assert "teacher upstream answered 400" in o_err.value.message
    # A request invalid in the harness's own API is refused here, before the upstream is asked.
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="c", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert teaching.store.list_calls(teaching.rollout_id) == []
    assert teaching.upstream.list_calls(teaching.upstream_rollout) == []
    assert len(messages_loop(client, stream=False)) == 2  # control: a good call is answered and recorded
    assert len(teaching.store.list_calls(teaching.rollout_id)) == 2


def test_the_key_reaches_the_upstream_and_nothing_else(teaching: Teaching) -> None:
    key = teaching.key
    client = claude(teaching.harness)
    relayed = []
    args: dict[str, Any] = dict(model="c", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    raw = client.messages.with_raw_response.create(**args)
    relayed += [raw.http_response.text, json.dumps(dict(raw.http_response.headers))]
    with client.messages.with_streaming_response.create(**args, stream=True) as s:
        relayed += [s.http_response.read().decode(), json.dumps(dict(s.http_response.headers))]
    r_raw = teaching.harness.responses.with_raw_response.create(model="g", input="x")
    relayed += [r_raw.http_response.text, json.dumps(dict(r_raw.http_response.headers))]
    with teaching.harness.responses.with_streaming_response.create(model="g", input="x", stream=True) as s:
        relayed += [s.http_response.read().decode(), json.dumps(dict(s.http_response.headers))]
    assert (
        "Let me look." in relayed[0] and "message_stop" in relayed[2] and "response.completed" in relayed[6]
    )
    assert len(teaching.upstream.list_calls(teaching.upstream_rollout)) == 4  # it authenticated the key
    assert all(key not in text for text in relayed)
    for path in teaching.db.parent.glob("teacher.db*"):
        assert key.encode() not in path.read_bytes(), path


# -- a small real upstream: reasoning deltas, split tool-call arguments, errors, a cut stream ---------

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "u"}
#: As vLLM streams an answer with a reasoning parser and a tool parser: reasoning, text, and a tool
#: call whose arguments arrive in pieces.
DELTAS: list[dict[str, Any]] = [
    {"role": "assistant", "reasoning_content": "Think "},
    {"reasoning_content": "twice."},
    {"content": "Half "},
    {"content": "an answer"},
    {
        "tool_calls": [
            {"index": 0, "id": "call_up1", "type": "function", "function": {"name": "bash", "arguments": ""}}
        ]
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"command": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]},
]
EXPECTED = {
    "role": "assistant",
    "content": "Half an answer",
    "reasoning_content": "Think twice.",
    "tool_calls": [
        {"id": "call_up1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    ],
}


def small_upstream(*, cut: str | None = None, status: int = 200) -> Starlette:
    """Answers every chat call with ``DELTAS`` (whole: summed into one message) and records each
    body it got; ``cut``: ``"killed"`` drops the connection before the stream's end, ``"ended"``
    ends the stream there as if it were whole (no finish reason, no ``[DONE]``); ``status``: refuses
    so. A stream first waits for ``app.state.hold`` (a ``threading.Event``) when one is set there."""
    asked: list[dict[str, Any]] = []

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        asked.append(body)
        if status != 200:
            return JSONResponse({"error": {"message": f"said {status}", "type": "x"}}, status_code=status)
        usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
        if not body.get("stream"):
            message = {k: v for k, v in EXPECTED.items()}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return JSONResponse({**CHUNK, "object": "chat.completion", "choices": [choice], "usage": usage})

        hold: threading.Event | None = request.app.state.hold

        async def events() -> AsyncIterator[str]:
            if hold is not None:  # silent until the test says (a teacher thinking before its first token)
                await anyio.to_thread.run_sync(hold.wait, 10.0)  # bounded: a failing test ends
            for delta in DELTAS:
                yield f"data: {json.dumps({**CHUNK, 'choices': [{'index': 0, 'delta': delta}]})}\n\n"
            if cut == "killed":
                raise RuntimeError("upstream killed mid-stream")
            if cut == "ended":
                return
            end = {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
            yield f"data: {json.dumps({**CHUNK, 'choices': [end]})}\n\n"
            yield f"data: {json.dumps({**CHUNK, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )
    app.state.asked = asked
    app.state.hold = None
    return app


@contextlib.contextmanager
def teacher_on(
    upstream: Starlette,
    store: SQLiteStore,
    tokenizer: PolicyTokenizer,
    *,
    keepalive_s: float = 10.0,
    max_tokens: int | None = None,
    api: str = "chat",
    metadata: dict[str, Any] | None = None,
) -> Iterator[tuple[openai.OpenAI, str]]:
    """A teacher-mode gateway on ``upstream`` (``api``: the teacher's); yields an OpenAI SDK on its
    rollout (created with ``metadata``) and the rollout id."""
    with serve_in_thread(upstream) as up_url:
        teacher = Teacher(f"{up_url}/v1", "u", None, api=api)
        policy = ScriptedEngine(["(the policy, unused in teacher mode)"], tokenizer)
        app = create_app(
            GatewayConfig(admin_key=ADMIN, max_tokens=max_tokens),
            store,
            policy,
            teacher=teacher,
            keepalive_s=keepalive_s,
        )
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as client:
            created = client.create_rollout({"prompt": "x"}, run_id="teacher", metadata=metadata)
            with openai.OpenAI(
                base_url=created["base_url"], api_key=created["api_key"], max_retries=0
            ) as sdk:
                yield sdk, created["rollout_id"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "teacher.db")
    yield s
    s.close()


def test_reasoning_text_and_split_tool_arguments_in_both_apis(
    store: SQLiteStore, tokenizer: PolicyTokenizer
) -> None:
    upstream = small_upstream()
    with teacher_on(upstream, store, tokenizer) as (sdk, rollout_id):
        client = claude(sdk)
        args: dict[str, Any] = dict(
            model="c",
            max_tokens=300,
            messages=[{"role": "user", "content": "go"}],
            tools=A_TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            extra_body={"temperature": 0.5},  # (this SDK version dropped the argument)
        )
        whole = client.messages.create(**args)
        with client.messages.stream(**args) as s:
            kinds = [e.type for e in s]
            streamed = s.get_final_message()
        r_args: dict[str, Any] = dict(
            model="g",
            input="go",
            tools=R_TOOLS,
            tool_choice="required",
            max_output_tokens=300,
            include=["reasoning.encrypted_content"],
        )
        r_whole = sdk.responses.create(**r_args)
        with sdk.responses.stream(**r_args) as rs:
            r_kinds = [e.type for e in rs]
            r_streamed = rs.get_final_response()
    expected_blocks = ["thinking", "text", "tool_use"]
    for answer in (whole, streamed):
        assert [b.type for b in answer.content] == expected_blocks
        assert answer.stop_reason == "tool_use"
        assert answer.usage.input_tokens == 5 and answer.usage.output_tokens == 9
        assert same_calls(from_blocks(answer.content)) == same_calls(EXPECTED)
        assert answer.content[0].signature  # a thinking block carries one (Claude Code sends it back)
    assert whole.content[2].id == "call_up1"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    for answer in (r_whole, r_streamed):
        assert [i.type for i in answer.output] == ["reasoning", "message", "function_call"]
        assert from_output(answer.output) == EXPECTED
        assert answer.output[0].encrypted_content  # asked for by include
        assert answer.usage is not None and answer.usage.output_tokens == 9
    assert r_kinds[:2] == ["response.created", "response.in_progress"] and r_kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in r_kinds and "response.function_call_arguments.done" in r_kinds
    # What the upstream was asked: chat's fields for the harness's.
    a_body, r_body = upstream.state.asked[0], upstream.state.asked[2]
    assert a_body["tool_choice"] == "required" and a_body["parallel_tool_calls"] is False
    assert a_body["stop"] == ["END"] and a_body["max_tokens"] == 300 and a_body["temperature"] == 0.5
    assert a_body["model"] == "u" and a_body["tools"] == TOOLS
    assert upstream.state.asked[1]["stream_options"] == {"include_usage": True}
    assert r_body["tool_choice"] == "required" and r_body["max_tokens"] == 300 and r_body["tools"] == TOOLS
    calls = store.list_calls(rollout_id)
    assert [c.api for c in calls] == ["messages"] * 2 + ["responses"] * 2
    expected_record = same_calls(EXPECTED)
    assert [same_calls({k: v for k, v in c.response.items() if not k.startswith("_")}) for c in calls] == [
        expected_record
    ] * 4
    assert calls[2].response["_response_id"] == r_whole.id
    assert all(c.finish_reason == "tool_calls" and c.usage and c.usage.completion_tokens == 9 for c in calls)


@pytest.mark.parametrize("status", [429, 500])
def test_upstream_error_statuses_in_each_apis_shape(
    store: SQLiteStore, tokenizer: PolicyTokenizer, status: int
) -> None:
    with teacher_on(small_upstream(status=status), store, tokenizer) as (sdk, rollout_id):
        client = claude(sdk)
        args: dict[str, Any] = dict(model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}])
        for stream in (False, True):
            with pytest.raises(anthropic.APIStatusError) as a_err:
                client.messages.create(**args, stream=stream)
            # A 4xx keeps its status (429: rate_limit_error); anything else is a 502 api_error.
            assert a_err.value.status_code == (429 if status == 429 else 502)
            body = a_err.value.body
            assert isinstance(body, dict) and body["type"] == "error"
            assert body["error"]["type"] == ("rate_limit_error" if status == 429 else "api_error")
            assert f"teacher upstream answered {status}: said {status}" in body["error"]["message"]
            with pytest.raises(openai.APIStatusError) as o_err:
                sdk.responses.create(model="g", input="x", stream=stream)
            assert o_err.value.status_code == (429 if status == 429 else 502)
        assert store.list_calls(rollout_id) == []


@pytest.mark.parametrize("cut", ["killed", "ended", None])
def test_a_stream_cut_mid_way_leaves_no_answer(
    store: SQLiteStore, tokenizer: PolicyTokenizer, cut: str | None
) -> None:
    """Killed (the connection drops) or ended early (a clean end with no finish reason and no
    ``[DONE]``): each API's stream ends with its error event and nothing is recorded. Control
    (``None``): the same streams, finished, are recorded."""
    with teacher_on(small_upstream(cut=cut), store, tokenizer) as (sdk, rollout_id):
        client = claude(sdk)
        args: dict[str, Any] = dict(
            model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}], tools=A_TOOLS
        )
        with client.messages.stream(**args) as s:
            if cut:  # Anthropic's error event: the SDK raises it
                with pytest.raises(anthropic.APIError, match="teacher upstream"):
                    s.get_final_message()
            else:
                assert s.get_final_message().stop_reason == "tool_use"
        with sdk.responses.stream(model="g", input="x", tools=R_TOOLS) as rs:
            events = list(rs)
        if cut:  # the Responses stream ends with response.failed, saying why
            assert events[-1].type == "response.failed"
            assert "teacher upstream" in events[-1].response.error.message
            assert "response.completed" not in [e.type for e in events]
        else:
            assert events[-1].type == "response.completed"
        chunks = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        if cut:  # chat's: an error chunk, which the SDK raises
            with pytest.raises(openai.APIError, match="teacher upstream"):
                list(chunks)
        else:
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    calls = store.list_calls(rollout_id)
    assert [c.api for c in calls] == ([] if cut else ["messages", "responses", "chat.completions"])


#: Each API's keep-alive while the upstream is silent, and its stream's last event.
KEEPALIVES = {
    "chat/completions": (": waiting for the teacher", "data: [DONE]"),
    "messages": ("event: ping", "event: message_stop"),
    "responses": (": waiting for the teacher", "event: response.completed"),  # + response.in_progress
}


def test_a_silent_upstream_gets_the_harness_keep_alives(
    store: SQLiteStore, tokenizer: PolicyTokenizer
) -> None:
    """While the upstream sends nothing (a teacher thinking without streaming its reasoning), each
    API's stream carries its keep-alive, as the policy path's does, so a harness's idle timer (Codex
    counts events) does not fire; the answer then arrives whole and is recorded."""
    upstream = small_upstream()
    with teacher_on(upstream, store, tokenizer, keepalive_s=0.05) as (sdk, rollout_id):
        base, key = str(sdk.base_url).rstrip("/"), sdk.api_key
        headers = {"authorization": f"Bearer {key}", "x-api-key": key}
        bodies = {
            "chat/completions": {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
            },
            "messages": {
                "model": "c",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
            },
            "responses": {"model": "g", "input": "x", "stream": True},
        }
        for path, body in bodies.items():
            keepalive, last = KEEPALIVES[path]
            hold = upstream.state.hold = threading.Event()
            lines: list[str] = []
            with httpx.stream("POST", f"{base}/{path}", json=body, headers=headers, timeout=30) as reply:
                assert reply.status_code == 200
                for line in reply.iter_lines():
                    lines.append(line)
                    if line.startswith(keepalive) and not hold.is_set():
                        hold.set()  # seen while the upstream was silent: let it answer
            assert hold.is_set(), (path, lines)
            assert lines.index(next(x for x in lines if x.startswith(keepalive))) < next(
                i for i, x in enumerate(lines) if "Half " in x
            ), path
            assert any(x.startswith(last) for x in lines), (path, lines[-5:])
            if path == "responses":  # the comment comes with an event: Codex's idle timer counts events
                assert lines.count("event: response.in_progress") >= 2
    assert [c.api for c in store.list_calls(rollout_id)] == ["chat.completions", "messages", "responses"]


def test_gateway_max_tokens_caps_what_the_upstream_is_asked_for(
    store: SQLiteStore, tokenizer: PolicyTokenizer
) -> None:
    """``gateway.max_tokens`` caps teacher calls as it caps the policy's (Claude Code asks for 32000,
    more than many a teacher's context holds); a smaller ask is kept."""
    upstream = small_upstream()
    with teacher_on(upstream, store, tokenizer, max_tokens=50) as (sdk, _):
        user = [{"role": "user", "content": "x"}]
        sdk.chat.completions.create(model="m", messages=user, max_tokens=1000)  # type: ignore[arg-type]
        sdk.chat.completions.create(model="m", messages=user)  # type: ignore[arg-type]
        sdk.chat.completions.create(model="m", messages=user, max_completion_tokens=20)  # type: ignore[arg-type]
        claude(sdk).messages.create(model="c", max_tokens=20000, messages=user)  # type: ignore[arg-type]
        sdk.responses.create(model="g", input="x")
        sdk.responses.create(model="g", input="x", max_output_tokens=20)
    asked = [
        {k: v for k, v in b.items() if k in ("max_tokens", "max_completion_tokens")}
        for b in upstream.state.asked
    ]
    assert asked == [
        {"max_tokens": 50},
        {"max_tokens": 50},
        {"max_completion_tokens": 20},
        {"max_tokens": 50},
        {"max_tokens": 50},
        {"max_tokens": 20},
    ]


def test_responses_structured_output_and_reasoning_effort_reach_the_upstream(
    store: SQLiteStore, tokenizer: PolicyTokenizer
) -> None:
    """Codex's ``--output-schema`` (``text.format``) and its reasoning effort are said to the chat
    upstream in chat's words (``response_format``, ``reasoning_effort``); plain text adds neither; a
    format chat has no word for is refused, not dropped; Messages' ``thinking`` and ``top_k`` have no
    portable chat field and are not sent."""
    upstream = small_upstream()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    with teacher_on(upstream, store, tokenizer) as (sdk, _):
        sdk.responses.create(
            model="g",
            input="x",
            reasoning={"effort": "low"},
            text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        )
        sdk.responses.create(model="g", input="x", text={"format": {"type": "json_object"}})
        sdk.responses.create(model="g", input="x", text={"format": {"type": "text"}})
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model="g", input="x", text={"format": {"type": "grammar"}})  # type: ignore[arg-type]
        assert refused.value.status_code == 400 and "text.format" in refused.value.message
        claude(sdk).messages.create(
            model="c",
            max_tokens=200,
            messages=[{"role": "user", "content": "x"}],
            thinking={"type": "enabled", "budget_tokens": 100},
            extra_body={"top_k": 5},
        )
    asked = [{k: b.get(k) for k in ("response_format", "reasoning_effort")} for b in upstream.state.asked]
    assert asked == [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
            "reasoning_effort": "low",
        },
        {"response_format": {"type": "json_object"}, "reasoning_effort": None},
        {"response_format": None, "reasoning_effort": None},
        {"response_format": None, "reasoning_effort": None},
    ]
    assert not {"thinking", "top_k"} & set(upstream.state.asked[-1])


# -- api = "native": Messages and Responses forwarded to the upstream's own routes ---------------------


@pytest.fixture
def native(tmp_path: Path, tokenizer: PolicyTokenizer) -> Iterator[Teaching]:
    with teaching_stack(tmp_path, tokenizer, api="native") as t:
        yield t


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_native_forwards_to_the_upstreams_own_api_and_records_its_answer(
    native: Teaching, api: str, stream: bool
) -> None:
    if api == "messages":
        got = messages_loop(claude(native.harness), stream=stream, answered_as="the-teacher")
    else:
        got = responses_loop(native.harness, stream=stream, answered_as="the-teacher")
    up_calls = native.upstream.list_calls(native.upstream_rollout)
    # The upstream served the harness's own API (its record says so), under the teacher's name.
    assert [c.api for c in up_calls] == [api, api]
    assert all(c.request["model"] == "the-teacher" for c in up_calls)
    calls = native.store.list_calls(native.rollout_id)
    assert [c.api for c in calls] == [api, api]
    assert [c.finish_reason for c in calls] == ["tool_calls", "stop"]
    # Received = recorded = what the upstream recorded of its own answer (its tool-call arguments
    # as its parser wrote them: compared parsed). Responses: the upstream's response id, kept.
    assert recorded(native) == got
    assert [same_calls(c.response) for c in calls] == [same_calls(c.response) for c in up_calls]
    assert json.loads(got[0]["tool_calls"][0]["function"]["arguments"]) == {"command": "cat a.txt"}
    for mine, theirs in zip(calls, up_calls, strict=True):
        assert mine.usage is not None and theirs.usage is not None
        assert mine.usage.completion_tokens == theirs.usage.completion_tokens > 0
        # The request as the harness sent it, which is what the upstream got (model aside).
        assert {**mine.request, "model": "the-teacher"} == {
            k: v for k, v in theirs.request.items() if not k.startswith("_")
        }
    if api == "messages":  # the thinking, as Anthropic's API signs it, reaches the harness untouched
        assert "<think>" in got[0]["content"] or got[0].get("reasoning_content")


def test_native_previous_response_id_and_errors(native: Teaching) -> None:
    sdk = native.harness
    first = sdk.responses.create(model="g", instructions=SYSTEM, input=QUESTION, tools=R_TOOLS)
    [call] = [i for i in first.output if i.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "42\n"}
    second = sdk.responses.create(
        model="g", instructions=SYSTEM, input=[output], tools=R_TOOLS, previous_response_id=first.id
    )
    assert second.output_text.endswith("The answer is 42.")
    calls = native.store.list_calls(native.rollout_id)
    # Recorded with the earlier conversation resolved, so sft sees the whole of it.
    assert [m["role"] for m in conversation(calls[1]).messages] == ["system", "user", "assistant", "tool"]
    client = claude(sdk)
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(
                model="c", max_tokens=10_000, messages=[{"role": "user", "content": "x"}], stream=stream
            )
        body = err.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert "teacher upstream answered 400" in body["error"]["message"]
    assert len(native.store.list_calls(native.rollout_id)) == 2
    assert native.key not in json.dumps(
        [c.model_dump(mode="json") for c in native.store.list_calls(native.rollout_id)]
    )


def native_upstream(*, cut: bool) -> Starlette:
    """Anthropic's /messages and OpenAI's /responses, streamed, each cut before its final event
    (``cut``: a clean end there) or finished; the bodies it got in ``app.state.asked``."""
    asked: list[dict[str, Any]] = []

    def sse(payload: dict[str, Any]) -> str:
        return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def messages(request: Request) -> Response:
        asked.append(await request.json())
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "u", "content": []}
        usage = {"input_tokens": 3, "output_tokens": 2}

        async def events() -> AsyncIterator[str]:
            yield sse({"type": "message_start", "message": {**message, "usage": usage}})
            yield sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            )
            yield sse(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Half"}}
            )
            if cut:
                return
            yield sse({"type": "content_block_stop", "index": 0})
            yield sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage})
            yield sse({"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def responses(request: Request) -> Response:
        asked.append(await request.json())
        item = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Half", "annotations": []}],
        }
        done = {"id": "resp_1", "object": "response", "created_at": 0, "model": "u", "status": "completed"}
        usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}

        async def events() -> AsyncIterator[str]:
            yield sse(
                {
                    "type": "response.created",
                    "sequence_number": 0,
                    "response": {**done, "status": "in_progress", "output": []},
                }
            )
            delta = {
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "Half",
                "logprobs": [],
            }
            yield sse({"type": "response.output_text.delta", "sequence_number": 1, **delta})
            if cut:
                return
            final = {**done, "output": [item], "usage": usage}
            yield sse({"type": "response.completed", "sequence_number": 2, "response": final})

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )
    app.state.asked = asked
    return app


@pytest.mark.parametrize("cut", [True, False])
def test_native_stream_cut_before_its_final_event_is_not_recorded(
    store: SQLiteStore, tokenizer: PolicyTokenizer, cut: bool
) -> None:
    with serve_in_thread(native_upstream(cut=cut)) as up_url:
        teacher = Teacher(f"{up_url}/v1", "u", "k", api="native")
        policy = ScriptedEngine(["(unused)"], tokenizer)
        app = create_app(GatewayConfig(admin_key=ADMIN), store, policy, teacher=teacher)
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
            created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
            sdk = openai.OpenAI(base_url=created["base_url"], api_key=created["api_key"], max_retries=0)
            with claude(sdk).messages.stream(
                model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}]
            ) as s:
                if cut:
                    with pytest.raises(anthropic.APIError, match="teacher upstream ended the stream"):
                        s.get_final_message()
                else:
                    assert s.get_final_message().content[0].text == "Half"  # type: ignore[union-attr]
            events = list(sdk.responses.create(model="g", input="x", stream=True))
            assert events[-1].type == ("response.failed" if cut else "response.completed")
            sdk.close()
    calls = store.list_calls(created["rollout_id"])
    if cut:
        assert calls == []
    else:  # control: the same streams, finished, are recorded
        assert [(c.api, c.response["content"]) for c in calls] == [
            ("messages", "Half"),
            ("responses", "Half"),
        ]
        assert calls[1].response["_response_id"] == "resp_1"


def test_native_records_the_conversation_part_of_a_providers_answer() -> None:
    """A provider's answer carries more than the conversation (hosted tools' items, server tool
    blocks, item types newer than this gateway): the record keeps the conversation, nothing fails."""
    from harnessrl.gateway.teacher.native_answers import messages_answer, responses_answer

    response = {
        "id": "resp_1",
        "status": "completed",
        "output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "a_type_from_next_year", "id": "x_1"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    message, finish, usage = responses_answer(response)
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    assert message == {
        "role": "assistant",
        "content": "Hi",
        "reasoning_content": "Look.",
        "tool_calls": [call],
        "_response_id": "resp_1",
    }
    assert (finish, usage) == ("tool_calls", {"prompt_tokens": 3, "completion_tokens": 4})
    blocks = [
        {"type": "thinking", "thinking": "Hm.", "signature": "sig"},
        {"type": "text", "text": "Searching."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": " Found."},
    ]
    message, finish, _ = messages_answer({"content": blocks, "stop_reason": "end_turn", "usage": {}})
    assert message == {"role": "assistant", "content": "Searching. Found.", "reasoning_content": "Hm."}
    assert finish == "stop"


# -- a harness that leaves before its whole answer -----------------------------------------------------

WHOLE_BODIES: dict[str, dict[str, Any]] = {
    "chat/completions": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    "messages": {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
    "responses": {"model": "g", "input": "x"},
}


@pytest.mark.parametrize("api", ["chat", "native"])
def test_a_harness_gone_before_the_teachers_whole_answer_leaves_no_call(
    tmp_path: Path, tokenizer: PolicyTokenizer, api: str
) -> None:
    """A whole answer is recorded only if its harness is still there, as a policy call is: an SDK's
    read timeout closes its connection and retries, and each try used to be recorded as another call
    that no harness received. The upstream's request is cancelled and the call counted as dropped."""
    with teaching_stack(tmp_path, tokenizer, api=api) as t:
        upstream = GatewayClient(str(t.direct.base_url).split("/rollouts/")[0], ADMIN)
        base, headers = str(t.harness.base_url).rstrip("/"), {"Authorization": f"Bearer {t.harness.api_key}"}
        upstream.pause(timeout=5)  # the upstream holds every call it gets until resumed
        for path, body in WHOLE_BODIES.items():
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{base}/{path}", json=body, headers=headers, timeout=httpx.Timeout(30, read=2))
        deadline = time.monotonic() + 60  # a wait, not a timing
        while upstream.state()["waiting"]:  # the teacher's requests were cancelled, not left waiting
            assert time.monotonic() < deadline, upstream.state()
            time.sleep(0.02)
        upstream.resume()
        time.sleep(1)  # an uncancelled request would be answered and recorded now
        assert t.store.list_calls(t.rollout_id) == []
        dropped = [
            row
            for row in GatewayClient(base.split("/rollouts/")[0], ADMIN).metrics().splitlines()
            if row.startswith("harnessrl_calls_dropped_total{") and 'reason="client_gone"' in row
        ]
        assert sum(float(row.rsplit(" ", 1)[1]) for row in dropped) == 3, dropped
        # Control: a harness that waits gets each answer, recorded.
        for path, body in WHOLE_BODIES.items():
            assert httpx.post(f"{base}/{path}", json=body, headers=headers, timeout=30).status_code == 200
        assert len(t.store.list_calls(t.rollout_id)) == 3
        upstream.close()


def test_a_non_integer_answer_length_cannot_slip_past_the_cap(
    store: SQLiteStore, tokenizer: PolicyTokenizer
) -> None:
    """``cap_max_tokens`` capped only ``int`` values: ``65536.0`` (which an upstream's parser takes
    as 65536) went to the upstream as sent."""
    upstream = small_upstream()
    with teacher_on(upstream, store, tokenizer, max_tokens=50) as (sdk, _):
        base, key = str(sdk.base_url).rstrip("/"), sdk.api_key
        user = [{"role": "user", "content": "x"}]
        for asked in (
            {"max_completion_tokens": 65536.0},
            {"max_tokens": 10, "max_completion_tokens": 65536.0},
            {"max_tokens": "65536"},
            {"max_tokens": 20},
        ):
            r = httpx.post(
                f"{base}/chat/completions",
                json={"model": "m", "messages": user, **asked},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
    sent = [
        {k: v for k, v in b.items() if k in ("max_tokens", "max_completion_tokens")}
        for b in upstream.state.asked
    ]
    assert sent == [
        {"max_completion_tokens": 50},
        {"max_tokens": 10, "max_completion_tokens": 50},
        {"max_tokens": 50},
        {"max_tokens": 20},  # control: an integer under the cap is kept
    ]


def test_an_upstream_error_shows_no_part_of_the_key() -> None:
    """A non-JSON error body was cut to 200 characters before the key was redacted: a key across the
    cut showed its head."""
    key = "sk-teacher-SECRET-0123456789abcdef"
    teacher = Teacher("http://127.0.0.1:9/v1", "u", key)
    for lead in (180, 190, 199, 0):
        error = upstream_error(teacher, 400, ("x" * lead + key + " was rejected").encode())
        assert "sk-teacher" not in str(error) and "SECRET" not in str(error), (lead, str(error))
    assert "[teacher key]" in str(upstream_error(teacher, 400, (key + " was rejected").encode()))  # control
