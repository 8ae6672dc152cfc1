"""How a teacher's answer ended is recorded as the upstream said it, through every API and both
teacher kinds, so ``harnessrl sft`` never trains on a cut answer (docs/sft.md: only ``stop``,
``tool_calls`` and ``function_call`` are natural endings).

Translated Messages calls recorded a chat upstream's ``content_filter`` as ``stop``; the native
Messages path recorded every Anthropic stop reason but ``tool_use`` and ``max_tokens`` (``refusal``,
``pause_turn``, ``model_context_window_exceeded``) as ``stop``, and the native Responses path every
status but ``incomplete`` (``failed``, ``cancelled``, a background ``queued``) as ``stop``: each cut
answer was training data. The upstreams are small real servers on 127.0.0.1; the harness is httpx.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.gateway.teacher import Teacher
from harnessrl.schemas import Call
from harnessrl.sft.conversations import conversation
from harnessrl.sft.render import answer_skip
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "endings-admin"
USER = [{"role": "user", "content": "What is in a.txt?"}]
TEXT = "The file holds"


def sse(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"


def chat_upstream(finish: str | None) -> Starlette:
    """A chat completions upstream whose answer ends with ``finish``, whole or streamed (``None``:
    JSON ``null``, no finish reason)."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": TEXT}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return JSONResponse({"id": "c1", "object": "chat.completion", "choices": [choice]})

        async def events() -> AsyncIterator[str]:
            for delta in ({"role": "assistant", "content": TEXT}, {}):
                end = {"finish_reason": finish} if not delta else {}
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, **end}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


def native_upstream(stop_reason: str, status: str) -> Starlette:
    """Anthropic's /messages ending with ``stop_reason`` and OpenAI's /responses ending with
    ``status``, whole or streamed."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def messages(request: Request) -> Response:
        body = await request.json()
        usage = {"input_tokens": 3, "output_tokens": 2}
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "u"}
        if not body.get("stream"):
            content = [{"type": "text", "text": TEXT}]
            return JSONResponse({**message, "content": content, "stop_reason": stop_reason, "usage": usage})

        async def events() -> AsyncIterator[str]:
            yield sse({"type": "message_start", "message": {**message, "content": [], "usage": usage}})
            block = {"type": "text", "text": ""}
            yield sse({"type": "content_block_start", "index": 0, "content_block": block})
            delta = {"type": "text_delta", "text": TEXT}
            yield sse({"type": "content_block_delta", "index": 0, "delta": delta})
            yield sse({"type": "content_block_stop", "index": 0})
            yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": usage})
            yield sse({"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def responses(request: Request) -> Response:
        body = await request.json()
        item = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
        }
        final = {"id": "resp_1", "object": "response", "model": "u", "status": status, "output": [item]}
        if not body.get("stream"):
            return JSONResponse(final)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"

        async def events() -> AsyncIterator[str]:
            yield sse(
                {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}}
            )
            yield sse({"type": "response.output_text.delta", "item_id": "msg_1", "delta": TEXT})
            yield sse({"type": kind, "response": final})

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )


def recorded_calls(
    upstream: Starlette, api: str, paths: list[str], tmp_path: Path, tokenizer: PolicyTokenizer
) -> list[Call]:
    """Each of ``paths`` asked whole and streamed through a teacher gateway on ``upstream``."""
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with serve_in_thread(upstream) as up_url:
            teacher = Teacher(f"{up_url}/v1", "u", None, api=api)
            app = create_app(
                GatewayConfig(admin_key=ADMIN), store, ScriptedEngine(["unused"], tokenizer), teacher=teacher
            )
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
                created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
                base, key = created["base_url"].rstrip("/"), created["api_key"]
                headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
                bodies = {
                    "chat/completions": {"model": "m", "messages": USER},
                    "messages": {"model": "c", "max_tokens": 64, "messages": USER},
                    "responses": {"model": "g", "input": USER[0]["content"]},
                }
                for path in paths:
                    for stream in (False, True):
                        body = {**bodies[path], "stream": stream}
                        reply = httpx.post(f"{base}/{path}", json=body, headers=headers, timeout=30)
                        assert reply.status_code == 200, (path, stream, reply.text)
                        assert TEXT in reply.text  # the harness got the answer
        return store.list_calls(created["rollout_id"])
    finally:
        store.close()


def skipped(call: Call) -> str | None:
    reason = answer_skip(conversation(call))
    return None if reason is None else reason.reason


@pytest.mark.parametrize("finish", ["content_filter", "length", "stop"])
def test_a_chat_upstreams_ending_is_recorded_in_every_api(
    tmp_path: Path, tokenizer: PolicyTokenizer, finish: str
) -> None:
    paths = ["chat/completions", "messages", "responses"]
    calls = recorded_calls(chat_upstream(finish), "chat", paths, tmp_path, tokenizer)
    assert [c.api for c in calls] == [
        "chat.completions",
        "chat.completions",
        "messages",
        "messages",
        "responses",
        "responses",
    ]
    assert [c.finish_reason for c in calls] == [finish] * 6
    # sft: a cut answer is never trained; the control (``stop``) is
    assert [skipped(c) for c in calls] == [None if finish == "stop" else "truncated"] * 6


def test_a_whole_answer_with_no_finish_reason_is_not_trained_as_a_finished_one(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """A whole chat answer whose ``finish_reason`` is null was recorded as ``stop`` in every API, so
    sft trained it as a finished answer though the upstream never said it ended (a stream without
    one is refused and left unrecorded). It is recorded as ``no_finish_reason`` now; the harness is
    answered as before. The control is ``stop`` in the test above."""
    paths = ["chat/completions", "messages", "responses"]
    calls = recorded_calls(chat_upstream(None), "chat", paths, tmp_path, tokenizer)
    # Only the whole answers are recorded: each stream ended with an upstream error event.
    assert [c.api for c in calls] == ["chat.completions", "messages", "responses"]
    assert [c.finish_reason for c in calls] == ["no_finish_reason"] * 3
    assert [skipped(c) for c in calls] == ["truncated"] * 3


@pytest.mark.parametrize(
    ("stop_reason", "status", "want"),
    [
        ("refusal", "failed", ("refusal", "failed")),
        ("pause_turn", "cancelled", ("pause_turn", "cancelled")),
        ("model_context_window_exceeded", "queued", ("model_context_window_exceeded", "queued")),
        ("max_tokens", "incomplete", ("length", "length")),
        ("end_turn", "completed", ("stop", "stop")),  # control: natural endings stay training data
        ("stop_sequence", "completed", ("stop", "stop")),
    ],
)
def test_a_native_upstreams_ending_is_recorded_as_it_said(
    tmp_path: Path, tokenizer: PolicyTokenizer, stop_reason: str, status: str, want: tuple[str, str]
) -> None:
    paths = ["messages", "responses"]
    calls = recorded_calls(native_upstream(stop_reason, status), "native", paths, tmp_path, tokenizer)
    assert len(calls) == 4
    got = {(c.api, c.finish_reason) for c in calls}
    assert got == {("messages", want[0]), ("responses", want[1])}, got
    natural = want == ("stop", "stop")
    assert {skipped(c) for c in calls} == {None if natural else "truncated"}
