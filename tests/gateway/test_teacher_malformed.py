"""A chat upstream that answers with malformed parts: the harness gets a clear answer or a clear
error in its API's shape, never a 500 or a stream cut without an error event.

``usage`` that is not an object of integers (a string, ``"prompt_tokens": "abc"``) failed every
answer while it was recorded (``int("abc")``, ``"x".get``): a 500 for a whole answer, a stream cut
mid-way with no error event, nothing recorded, though the answer itself was fine. Usage is
bookkeeping: it now counts 0. A delta whose text is not a string (``"content": 5``) failed the same
way after the stream's 200; it is now the upstream error it is. The upstream is a small real server
on 127.0.0.1, the harness httpx.
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
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "malformed-admin"
USER = [{"role": "user", "content": "What is in a.txt?"}]
BODIES = {
    "chat/completions": {"model": "m", "messages": USER},
    "messages": {"model": "c", "max_tokens": 64, "messages": USER},
    "responses": {"model": "g", "input": "What is in a.txt?"},
}


def upstream(content: Any, usage: Any) -> Starlette:
    """Answers every chat call with ``content`` and ``usage``, whole or streamed."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
            return JSONResponse(
                {"id": "c1", "object": "chat.completion", "choices": [choice], "usage": usage}
            )

        async def events() -> AsyncIterator[str]:
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": content}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": usage},
            ]
            for chunk in chunks:
                yield f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', **chunk})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


def ask_all(
    up: Starlette, store: SQLiteStore, tokenizer: PolicyTokenizer, paths: list[str]
) -> tuple[list[tuple[str, bool, int, str]], str]:
    """(path, streamed, status, body) of each call, and the rollout id."""
    out = []
    with serve_in_thread(up) as up_url:
        teacher = Teacher(f"{up_url}/v1", "u", None)
        app = create_app(
            GatewayConfig(admin_key=ADMIN), store, ScriptedEngine(["unused"], tokenizer), teacher=teacher
        )
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
            created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
            base, key = created["base_url"].rstrip("/"), created["api_key"]
            headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
            for path in paths:
                for stream in (False, True):
                    # a stream cut without its end raises here (httpx.RemoteProtocolError)
                    reply = httpx.post(
                        f"{base}/{path}", json={**BODIES[path], "stream": stream}, headers=headers, timeout=30
                    )
                    out.append((path, stream, reply.status_code, reply.text))
    return out, created["rollout_id"]


@pytest.mark.parametrize("usage", ["12 tokens", {"prompt_tokens": "abc", "completion_tokens": [1]}])
def test_a_malformed_usage_costs_nothing_but_its_counts(
    tmp_path: Path, tokenizer: PolicyTokenizer, usage: Any
) -> None:
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        got, rollout_id = ask_all(upstream("The file holds 42.", usage), store, tokenizer, list(BODIES))
        for path, stream, status, text in got:
            assert status == 200, (path, stream, text)
            assert "The file holds 42." in text, (path, stream, text)
            if stream:  # whole, to its last event
                last = {
                    "chat/completions": "[DONE]",
                    "messages": "message_stop",
                    "responses": "response.completed",
                }
                assert last[path] in text.strip().splitlines()[-1], (path, text)
        calls = store.list_calls(rollout_id)
        assert len(calls) == 6
        assert {(c.usage.prompt_tokens, c.usage.completion_tokens) for c in calls} == {(0, 0)}
        assert {c.response["content"] for c in calls} == {"The file holds 42."}
    finally:
        store.close()


def test_a_delta_whose_text_is_no_string_is_an_upstream_error(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        got, rollout_id = ask_all(upstream(5, None), store, tokenizer, list(BODIES))
        for path, stream, status, text in got:
            if path == "chat/completions" and not stream:
                continue  # passed through as the upstream sent it
            if stream:  # the 200 was sent: the stream's last event is the API's error event
                last = text.strip().splitlines()[-1]
                assert status == 200 and ("error" in last or "response.failed" in last), (path, last)
            else:
                assert status == 502, (path, text)
            assert "not a chat chunk" in text or "without a chat completion" in text, (path, stream, text)
        assert [c.api for c in store.list_calls(rollout_id)] == ["chat.completions"]
    finally:
        store.close()
