"""A native Messages teacher under an answer-length cap keeps a thinking budget the upstream takes.

Anthropic refuses ``thinking.budget_tokens >= max_tokens`` (a 400). A harness that thinks asks for
a budget close to its ``max_tokens`` (here 31999 of Claude Code's 32000); ``gateway.max_tokens``
(docs/gateway.md suggests it: harnesses ask for more than many a teacher's context holds) lowered
``max_tokens`` and left the budget, so every call of the rollout came back 400 and nothing was
recorded. The budget is
now lowered under the cap; the recorded request stays the harness's. The upstream is a small real
server on 127.0.0.1 that checks the budget as Anthropic does; the harness is httpx.
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

ADMIN = "thinking-cap-admin"
TEXT = "The file holds 42."
#: A Messages request with thinking on (Claude Code's max_tokens).
CLAUDE_CODE = {
    "model": "claude-x",
    "max_tokens": 32000,
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "messages": [{"role": "user", "content": "What is in a.txt?"}],
}


def sse(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"


def anthropic_upstream(asked: list[dict[str, Any]]) -> Starlette:
    """Anthropic's /messages: refuses a thinking budget that is not under ``max_tokens`` (or under
    1024), as Anthropic does; else answers with a thinking block and text, whole or streamed."""

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "u", "type": "model"}]})

    async def messages(request: Request) -> Response:
        body = await request.json()
        asked.append(body)
        thinking = body.get("thinking") or {}
        if thinking.get("type") == "enabled":
            budget = thinking["budget_tokens"]
            if budget < 1024 or budget >= body["max_tokens"]:
                error = {
                    "type": "invalid_request_error",
                    "message": "`max_tokens` must be greater than `thinking.budget_tokens`",
                }
                return JSONResponse({"type": "error", "error": error}, status_code=400)
        usage = {"input_tokens": 5, "output_tokens": 7}
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "u"}
        blocks = [
            {"type": "thinking", "thinking": "Read it.", "signature": "sig"},
            {"type": "text", "text": TEXT},
        ]
        if not body.get("stream"):
            return JSONResponse({**message, "content": blocks, "stop_reason": "end_turn", "usage": usage})

        async def events() -> AsyncIterator[str]:
            yield sse({"type": "message_start", "message": {**message, "content": [], "usage": usage}})
            for i, block in enumerate(blocks):
                field = block["type"]
                yield sse({"type": "content_block_start", "index": i, "content_block": {**block, field: ""}})
                yield sse(
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": f"{field}_delta", field: block[field]},
                    }
                )
                yield sse({"type": "content_block_stop", "index": i})
            yield sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage})
            yield sse({"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/messages", messages, methods=["POST"])])


def ask(
    tmp_path: Path, tokenizer: PolicyTokenizer, max_tokens: int | None, stream: bool
) -> tuple[httpx.Response, list[dict[str, Any]], list[Any]]:
    """Claude Code's request through a native teacher gateway capped at ``max_tokens``: the reply,
    what the upstream was asked, and the calls recorded."""
    asked: list[dict[str, Any]] = []
    store = SQLiteStore(tmp_path / f"teacher-{max_tokens}-{stream}.db")
    try:
        with serve_in_thread(anthropic_upstream(asked)) as up_url:
            teacher = Teacher(f"{up_url}/v1", "u", "sk-test", api="native")
            config = GatewayConfig(admin_key=ADMIN, max_tokens=max_tokens)
            app = create_app(config, store, ScriptedEngine(["unused"], tokenizer), teacher=teacher)
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
                created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
                reply = httpx.post(
                    created["base_url"].rstrip("/") + "/messages",
                    json={**CLAUDE_CODE, "stream": stream},
                    headers={"x-api-key": created["api_key"], "anthropic-version": "2023-06-01"},
                    timeout=30,
                )
                reply.read()
        return reply, asked, store.list_calls(created["rollout_id"])
    finally:
        store.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_capped_answer_length_keeps_the_thinking_budget_under_it(
    tmp_path: Path, tokenizer: PolicyTokenizer, stream: bool
) -> None:
    reply, asked, calls = ask(tmp_path, tokenizer, 8192, stream)
    assert reply.status_code == 200, reply.text
    assert TEXT in reply.text and "error" not in reply.text
    assert asked[-1]["max_tokens"] == 8192
    assert asked[-1]["thinking"] == {"type": "enabled", "budget_tokens": 8191}
    # Recorded: the harness's request as sent, and the answer with its reasoning.
    [call] = calls
    assert call.request["max_tokens"] == 32000 and call.request["thinking"]["budget_tokens"] == 31999
    assert call.response["content"] == TEXT and call.response["reasoning_content"] == "Read it."

    # Control: uncapped, the harness's budget goes to the upstream as it asked.
    reply, asked, calls = ask(tmp_path, tokenizer, None, stream)
    assert reply.status_code == 200, reply.text
    assert asked[-1]["max_tokens"] == 32000 and asked[-1]["thinking"]["budget_tokens"] == 31999
    assert len(calls) == 1


def test_a_cap_that_leaves_no_room_for_thinking_is_the_upstreams_to_refuse(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """Under Anthropic's least budget (1024) the budget is not invented: the upstream's 400 reaches
    the harness in Anthropic's shape, and nothing is recorded."""
    reply, asked, calls = ask(tmp_path, tokenizer, 1000, False)
    assert reply.status_code == 400
    assert reply.json()["type"] == "error" and "budget_tokens" in reply.json()["error"]["message"]
    assert asked[-1]["thinking"]["budget_tokens"] == 31999 and calls == []
