"""Teacher mode (``gateway.teacher``): chat calls answered by a real upstream, recorded for sft.

The upstream is a second harnessrl gateway on 127.0.0.1 serving the scripted engine (its OpenAI
chat API is real HTTP, and it records what it answered, so "what the upstream sent" is read from its
own store). Its rollout's key is the teacher key: the upstream authenticates with it, which is the
control for the checks that it appears nowhere else. The harness is the official ``openai`` SDK.
An upstream that dies mid-stream is a small real server (``dying_upstream``), as no gateway can be
made to die on cue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from harnessrl.cli.main import app as cli
from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig, GatewayConfig, TeacherConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.errors import ConfigError
from harnessrl.gateway import create_app
from harnessrl.gateway.parsers.formats import resolve_formats
from harnessrl.gateway.server import build_teacher, serve_in_thread
from harnessrl.gateway.teacher import Teacher
from harnessrl.sft.conversations import conversation
from harnessrl.sft.render import rollout_sequences
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "teacher-test-admin"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
#: One turn with reasoning, text and a tool call; then a plain answer.
TURNS = [
    {
        "reasoning": "The file holds the answer.",
        "content": "Let me look.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.txt"}}],
    },
    {"content": "The answer is 42."},
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "What is in a.txt?"},
]


@dataclass
class Teaching:
    upstream: SQLiteStore  # what the upstream answered (its own record)
    store: SQLiteStore  # the teacher-mode gateway's record
    upstream_rollout: str
    key: str  # the teacher key (the upstream rollout's own key)
    harness: openai.OpenAI  # the harness, on the teacher-mode gateway's rollout
    direct: openai.OpenAI  # the same harness straight on the upstream (another of its rollouts)
    rollout_id: str
    db: Path


@pytest.fixture
def teaching(tmp_path: Path, tokenizer: PolicyTokenizer) -> Iterator[Teaching]:
    with teaching_stack(tmp_path, tokenizer) as t:
        yield t


@contextlib.contextmanager
def teaching_stack(tmp_path: Path, tokenizer: PolicyTokenizer, *, api: str = "chat") -> Iterator[Teaching]:
    """The upstream gateway, a teacher-mode gateway on it, and a rollout's harness on each (also
    used by test_teacher_apis.py)."""
    with contextlib.ExitStack() as stack:
        upstream_store = SQLiteStore(tmp_path / "upstream.db")
        up_app = create_app(
            GatewayConfig(admin_key=ADMIN), upstream_store, ScriptedEngine(TURNS * 4, tokenizer)
        )
        up_url = stack.enter_context(serve_in_thread(up_app))
        up_client = stack.enter_context(GatewayClient(up_url, ADMIN))
        up = up_client.create_rollout({"prompt": "teach"}, run_id="upstream")
        key = up["api_key"]
        other = up_client.create_rollout({"prompt": "teach"}, run_id="direct")
        direct = openai.OpenAI(base_url=other["base_url"], api_key=other["api_key"], max_retries=0)
        stack.callback(direct.close)
        store = SQLiteStore(tmp_path / "teacher.db")
        teacher = Teacher(f"{up_url}/v1", "the-teacher", key, api=api)
        app = create_app(
            GatewayConfig(admin_key=ADMIN),
            store,
            ScriptedEngine(["(the policy, unused in teacher mode)"], tokenizer),
            teacher=teacher,
        )
        url = stack.enter_context(serve_in_thread(app))
        client = stack.enter_context(GatewayClient(url, ADMIN))
        created = client.create_rollout({"prompt": "learn"}, run_id="teacher")
        harness = openai.OpenAI(base_url=created["base_url"], api_key=created["api_key"], max_retries=0)
        stack.callback(harness.close)
        yield Teaching(
            upstream_store,
            store,
            up["rollout_id"],
            key,
            harness,
            direct,
            created["rollout_id"],
            tmp_path / "teacher.db",
        )
        stack.close()
        store.close()
        upstream_store.close()


def received(message: Any) -> dict[str, Any]:
    """What the SDK received, in the recorded message's shape."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = (message.model_extra or {}).get("reasoning_content")
    if reasoning:
        out["reasoning_content"] = reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


def streamed(stream: Any) -> dict[str, Any]:
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for c in delta.tool_calls or []:
                slot = calls.setdefault(
                    c.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = c.id or slot["id"]
                slot["function"]["name"] += (c.function and c.function.name) or ""
                slot["function"]["arguments"] += (c.function and c.function.arguments) or ""
    out: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if "".join(reasoning):
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def upstream_sent(t: Teaching) -> list[dict[str, Any]]:
    """The upstream's answers as it recorded them (its ``Call.response``, the message it sent)."""
    out = []
    for call in t.upstream.list_calls(t.upstream_rollout):
        message = {k: v for k, v in call.response.items() if k in ("role", "content", "reasoning_content")}
        if call.response.get("tool_calls"):
            message["tool_calls"] = call.response["tool_calls"]
        out.append(message)
    return out


def without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**m, "tool_calls": [{**c, "id": None} for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]


def recorded(t: Teaching) -> list[dict[str, Any]]:
    return [call.response for call in t.store.list_calls(t.rollout_id)]


def agent_loop(t: Teaching, *, stream: bool, sdk: openai.OpenAI | None = None) -> list[dict[str, Any]]:
    """Two calls: the tool-calling turn, its tool output, the answer. Returns what the harness got."""
    sdk = sdk or t.harness
    messages = list(MESSAGES)
    got = []
    for _ in range(2):
        if stream:
            message = streamed(
                sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
            )
        else:
            reply = sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            message = received(reply.choices[0].message)
        got.append(message)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42\n"})
    return got


@pytest.mark.parametrize("stream", [False, True])
def test_harness_gets_and_store_records_what_the_upstream_sent(teaching: Teaching, stream: bool) -> None:
    got = agent_loop(teaching, stream=stream)
    sent = upstream_sent(teaching)
    assert len(sent) == 2
    if stream:
        # The upstream's own stream, read straight from it, is what the harness got through the
        # teacher (tool-call ids aside: the upstream makes new ones per call). Its record differs
        # from its stream in whitespace before a tool call, so the stream is compared to the stream.
        assert without_ids(got) == without_ids(agent_loop(teaching, stream=True, sdk=teaching.direct))
        assert [c["id"] for c in got[0]["tool_calls"]] == [c["id"] for c in sent[0]["tool_calls"]]
        assert recorded(teaching) == got
    else:
        assert got == sent  # text (reasoning as the upstream sends it: in content), tool calls, ids
        assert recorded(teaching) == sent
    assert "<think>\nThe file holds the answer.\n</think>" in got[0]["content"]
    assert json.loads(got[0]["tool_calls"][0]["function"]["arguments"]) == {"command": "cat a.txt"}
    calls = teaching.store.list_calls(teaching.rollout_id)
    assert [c.finish_reason for c in calls] == ["tool_calls", "stop"]
    assert calls[0].request["model"] == "m"  # the request as the harness sent it
    assert calls[1].request["messages"][-1] == {
        "role": "tool",
        "tool_call_id": got[0]["tool_calls"][0]["id"],
        "content": "42\n",
    }
    up_calls = teaching.upstream.list_calls(teaching.upstream_rollout)
    assert up_calls[0].request["model"] == "the-teacher"  # the upstream got its own model name
    for mine, theirs in zip(calls, up_calls[:2], strict=True):
        assert mine.usage is not None and theirs.usage is not None
        assert mine.usage.completion_tokens == theirs.usage.completion_tokens > 0
        assert mine.finished_at is not None and mine.finished_at >= mine.started_at


def metric(t: Teaching, name: str, labels: str = "") -> float:
    """One sample of the teacher-mode gateway's ``/metrics`` (0 when it has none yet)."""
    url = str(t.harness.base_url).split("/rollouts/")[0]
    with GatewayClient(url, ADMIN) as client:
        for row in client.metrics().splitlines():
            if row.startswith(f"{name}{labels} ") or (not labels and row.startswith(f"{name} ")):
                return float(row.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_teacher_calls_count_in_the_gateways_metrics(teaching: Teaching, stream: bool) -> None:
    """A user watching /metrics sees the teacher's calls as a policy run's: answered calls by finish
    reason, the upstream's token usage, latency; an upstream error counts no call."""
    bad = [{"role": "nobody", "content": "x"}]
    with pytest.raises(openai.BadRequestError):
        teaching.harness.chat.completions.create(model="m", messages=bad, stream=stream)  # type: ignore[arg-type]
    assert (
        metric(teaching, "harnessrl_calls_total", '{api="chat.completions",finish_reason="tool_calls"}') == 0
    )
    agent_loop(teaching, stream=stream)
    calls = teaching.store.list_calls(teaching.rollout_id)
    assert (
        metric(teaching, "harnessrl_calls_total", '{api="chat.completions",finish_reason="tool_calls"}') == 1
    )
    assert metric(teaching, "harnessrl_calls_total", '{api="chat.completions",finish_reason="stop"}') == 1
    completion = sum(c.usage.completion_tokens for c in calls if c.usage is not None)
    assert completion > 0
    assert metric(teaching, "harnessrl_completion_tokens_total") == completion
    assert metric(teaching, "harnessrl_call_latency_seconds_count", '{api="chat.completions"}') == 2


def test_teacher_calls_are_what_sft_consumes(teaching: Teaching, tokenizer: PolicyTokenizer) -> None:
    """sft reads a teacher-mode call as it reads the same call recorded by the policy path (the
    upstream gateway's own record of it): same conversation, same rendered tokens and loss mask."""
    agent_loop(teaching, stream=False)
    rollout = teaching.store.get_rollout(teaching.rollout_id)
    calls = teaching.store.list_calls(teaching.rollout_id)
    conv = conversation(calls[1])
    assert conv.answer["content"] == "The answer is 42."
    assert conv.messages[-2]["tool_calls"][0]["function"]["name"] == "bash"
    formats = resolve_formats("auto", "auto", tokenizer.chat_template)
    samples, report = rollout_sequences(rollout, calls, tokenizer, formats)
    assert report.rendered >= 1 and samples and all(s.num_loss_tokens > 0 for s in samples)
    up_rollout = teaching.upstream.get_rollout(teaching.upstream_rollout)
    up_calls = teaching.upstream.list_calls(teaching.upstream_rollout)
    for mine, theirs in zip(calls, up_calls, strict=True):
        assert conversation(mine).messages == conversation(theirs).messages
        assert conversation(mine).answer == conversation(theirs).answer
    up_samples, up_report = rollout_sequences(up_rollout, up_calls, tokenizer, formats)
    # (the tiny student's Qwen-style template drops the first turn's reasoning either way)
    assert (report.rendered, dict(report.skipped)) == (up_report.rendered, dict(up_report.skipped))
    assert [(s.input_ids, s.loss_mask) for s in samples] == [(s.input_ids, s.loss_mask) for s in up_samples]


def test_upstream_errors_reach_the_harness_in_openai_shape_unrecorded(teaching: Teaching) -> None:
    bad = [{"role": "nobody", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as err:
        teaching.harness.chat.completions.create(model="m", messages=bad)  # type: ignore[arg-type]
    assert err.value.status_code == 400
    assert "teacher upstream answered 400" in err.value.message
    with pytest.raises(openai.BadRequestError):
        teaching.harness.chat.completions.create(model="m", messages=bad, stream=True)  # type: ignore[arg-type]
    assert teaching.store.list_calls(teaching.rollout_id) == []
    # /completions is not served in teacher mode (Messages and Responses are: test_teacher_apis.py).
    base, key = str(teaching.harness.base_url).rstrip("/"), teaching.harness.api_key
    refused = httpx.post(
        f"{base}/completions", headers={"authorization": f"Bearer {key}"}, json={"prompt": "x"}
    )
    assert refused.status_code == 400 and "teacher mode" in refused.json()["error"]["message"]
    assert teaching.store.list_calls(teaching.rollout_id) == []
    assert len(agent_loop(teaching, stream=False)) == 2  # control: a good call is answered and recorded
    assert len(teaching.store.list_calls(teaching.rollout_id)) == 2


def test_the_key_comes_from_the_gateways_environment_not_the_config(
    teaching: Teaching, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = str(teaching.direct.base_url).split("/rollouts/")[0] + "/v1"
    cfg = EngineConfig(
        model="scripted:x.json",
        teacher=TeacherConfig(base_url=upstream, model="u", api_key_env="HRL_TEST_TEACHER_KEY"),
    )
    with pytest.raises(ConfigError, match="HRL_TEST_TEACHER_KEY is not set"):
        build_teacher(cfg)
    monkeypatch.setenv("HRL_TEST_TEACHER_KEY", teaching.key)
    teacher = build_teacher(cfg)  # probes the upstream's /models with the key: it answers
    assert teacher is not None and teaching.key not in repr(teacher)
    assert teaching.key not in cfg.model_dump_json()  # what a run folder saves of the config
    asyncio.run(teacher.aclose())


def test_the_key_reaches_the_upstream_and_nothing_else(
    teaching: Teaching, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = teaching.key
    raw = teaching.harness.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    relayed = [raw.http_response.text, json.dumps(dict(raw.http_response.headers))]
    with teaching.harness.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, stream=True
    ) as raw_stream:
        relayed.append(raw_stream.http_response.read().decode())
        relayed.append(json.dumps(dict(raw_stream.http_response.headers)))
    assert "Let me look." in relayed[0] and "[DONE]" in relayed[2]
    # Control: the upstream got the key (it authenticated both calls with it).
    assert len(teaching.upstream.list_calls(teaching.upstream_rollout)) == 2
    assert len(teaching.store.list_calls(teaching.rollout_id)) == 2
    assert all(key not in text for text in relayed)
    assert key not in caplog.text
    assert key != teaching.harness.api_key  # the harness holds its own rollout's key
    for path in teaching.db.parent.glob("teacher.db*"):  # the store, with its WAL
        assert key.encode() not in path.read_bytes(), path
    rollout = teaching.store.get_rollout(teaching.rollout_id)
    assert key not in rollout.model_dump_json()


# -- a small OpenAI-compatible server: vLLM's reasoning field, and an upstream that dies mid-stream ----

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "u"}
#: The deltas of an answer as vLLM with a reasoning parser streams it (``reasoning_content``).
REASONED = [
    {"role": "assistant", "reasoning_content": "Think "},
    {"reasoning_content": "twice."},
    {"content": "Half "},
    {"content": "an answer"},
]


def openai_upstream(deltas: list[dict[str, Any]], *, dies: bool = False) -> Starlette:
    """Answers every chat call with ``deltas`` (whole: summed into one message), then finishes
    the stream properly or, ``dies``, drops the connection before its end."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        if not (await request.json()).get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": "", "reasoning_content": ""}
            for d in deltas:
                for k in ("content", "reasoning_content"):
                    message[k] += d.get(k, "")
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
            return JSONResponse({**CHUNK, "object": "chat.completion", "choices": [choice], "usage": usage})

        async def events() -> AsyncIterator[str]:
            for delta in deltas:
                yield f"data: {json.dumps({**CHUNK, 'choices': [{'index': 0, 'delta': delta}]})}\n\n"
            if dies:
                raise RuntimeError("upstream killed mid-stream")
            end = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield f"data: {json.dumps({**CHUNK, 'choices': [end]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


@contextlib.contextmanager
def teacher_on(
    upstream: Starlette, store: SQLiteStore, tokenizer: PolicyTokenizer
) -> Iterator[tuple[openai.OpenAI, str]]:
    """A teacher-mode gateway on ``upstream``; yields the harness's SDK and its rollout id."""
    with serve_in_thread(upstream) as up_url:
        teacher = Teacher(f"{up_url}/v1", "u", None)
        policy = ScriptedEngine(["(the policy, unused in teacher mode)"], tokenizer)
        app = create_app(GatewayConfig(admin_key=ADMIN), store, policy, teacher=teacher)
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as client:
            created = client.create_rollout({"prompt": "x"}, run_id="teacher")
            with openai.OpenAI(
                base_url=created["base_url"], api_key=created["api_key"], max_retries=0
            ) as sdk:
                yield sdk, created["rollout_id"]


def test_reasoning_content_passes_through_streamed_and_not(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with teacher_on(openai_upstream(REASONED), store, tokenizer) as (sdk, rollout_id):
            whole = received(sdk.chat.completions.create(model="m", messages=MESSAGES).choices[0].message)
            stream = streamed(sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        expected = {"role": "assistant", "content": "Half an answer", "reasoning_content": "Think twice."}
        assert whole == stream == expected
        calls = store.list_calls(rollout_id)
        assert [c.response for c in calls] == [expected, expected]
        assert calls[0].usage is not None and calls[0].usage.completion_tokens == 4
        assert calls[1].first_token_at is not None
    finally:
        store.close()


@pytest.mark.parametrize("dies", [True, False])
def test_an_upstream_killed_mid_stream_leaves_no_answer(
    tmp_path: Path, tokenizer: PolicyTokenizer, dies: bool
) -> None:
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with teacher_on(openai_upstream(REASONED, dies=dies), store, tokenizer) as (sdk, rollout_id):
            stream = sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            if dies:
                with pytest.raises(openai.APIError, match="teacher upstream"):
                    for _ in stream:
                        pass
            else:
                assert streamed(stream)["content"] == "Half an answer"
        calls = store.list_calls(rollout_id)
        if dies:
            assert calls == []
        else:  # control: the same stream, finished, is recorded
            assert [c.response["content"] for c in calls] == ["Half an answer"]
    finally:
        store.close()


# -- an unreachable upstream at start -----------------------------------------------------------------


def test_an_unreachable_upstream_is_a_config_error_naming_engine(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    cfg = EngineConfig(model="scripted:x.json", teacher=TeacherConfig(base_url=url, model="u"))
    with pytest.raises(ConfigError, match=r"engine\.teacher\.base_url .* not reachable"):
        build_teacher(cfg)
    config = tmp_path / "gateway.toml"
    config.write_text(f'[engine.teacher]\nbase_url = "{url}"\nmodel = "u"\n')
    result = CliRunner().invoke(
        cli, ["gateway", "--config", str(config), "--port", "0", "--store", str(tmp_path / "g.db")]
    )
    assert result.exit_code == 2, result.output
    assert "engine.teacher.base_url" in result.output
    # `harnessrl rollout` builds the teacher too (before any harness starts): the same exit 2.
    rollout = tmp_path / "rollout.toml"
    rollout.write_text(
        f'[engine]\nmodel = "scripted:x.json"\n[engine.teacher]\nbase_url = "{url}"\nmodel = "u"\n'
        '[harness]\ncommand = ["true"]\nsandbox = "none"\n'
        '[evaluator]\ntype = "command"\ncommand = ["true"]\n'
    )
    task = json.dumps({"prompt": "x"})
    result = CliRunner().invoke(
        cli, ["rollout", "--config", str(rollout), "--task", task, "--run-dir", str(tmp_path / "run")]
    )
    assert result.exit_code == 2, result.output
    assert "engine.teacher.base_url" in result.output


def test_a_training_run_refuses_teacher_mode() -> None:
    from harnessrl.config import load_raw_config, validate_config
    from harnessrl.trainer.config import TrainConfig

    sets = ['engine.teacher.base_url="http://127.0.0.1:9/v1"', 'engine.teacher.model="u"']
    with pytest.raises(ConfigError, match="engine.teacher"):
        validate_config(TrainConfig, load_raw_config("examples/tiny/train.toml", sets))
