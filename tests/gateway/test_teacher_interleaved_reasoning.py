"""Reasoning a chat upstream sends after it began its text (a model that thinks again mid-answer) is
recorded whole through every translated API.

The Responses translation gives such reasoning a second ``reasoning`` item (the first was closed when
the text began) and recorded only that item's text: the first reasoning, which the harness received,
was lost from the store ``harnessrl sft`` trains on. The Messages translation (a second ``thinking``
block) recorded both. The upstream is a small real chat server on 127.0.0.1; the harness is httpx,
whole and streamed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

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

ADMIN = "interleaved-admin"
QUESTION = "What is in a.txt?"
#: The upstream's deltas: reasoning, text, reasoning again, more text.
DELTAS = [
    {"role": "assistant", "reasoning_content": "First I read it. "},
    {"content": "It holds "},
    {"reasoning_content": "Then I check the number."},
    {"content": "42."},
]
REASONING = "First I read it. Then I check the number."
TEXT = "It holds 42."
BODIES = {
    "responses": {"model": "g", "input": QUESTION},
    "messages": {"model": "c", "max_tokens": 64, "messages": [{"role": "user", "content": QUESTION}]},
}


def upstream() -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": TEXT, "reasoning_content": REASONING}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return JSONResponse({"id": "c1", "object": "chat.completion", "choices": [choice]})

        async def events() -> AsyncIterator[str]:
            for delta in [*DELTAS, {}]:
                end = {} if delta else {"finish_reason": "stop"}
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


def received_reasoning(api: str, reply: httpx.Response) -> str:
    """All the reasoning text the harness was sent, in order."""
    if api == "responses":
        done = [
            json.loads(line[5:])
            for line in reply.text.splitlines()
            if line.startswith("data:") and '"response.output_item.done"' in line
        ]
        items = [e["item"] for e in done]
        return "".join(c["text"] for i in items if i["type"] == "reasoning" for c in i["content"])
    deltas = [
        json.loads(line[5:])
        for line in reply.text.splitlines()
        if line.startswith("data:") and '"thinking_delta"' in line
    ]
    return "".join(e["delta"]["thinking"] for e in deltas)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_reasoning_after_the_text_began_is_recorded_with_the_rest(
    tmp_path: Path, tokenizer: PolicyTokenizer, api: str
) -> None:
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with serve_in_thread(upstream()) as up_url:
            teacher = Teacher(f"{up_url}/v1", "u", None)
            app = create_app(
                GatewayConfig(admin_key=ADMIN), store, ScriptedEngine(["unused"], tokenizer), teacher=teacher
            )
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
                created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
                headers = {"Authorization": f"Bearer {created['api_key']}", "anthropic-version": "2023-06-01"}
                replies: dict[bool, httpx.Response] = {}
                for stream in (False, True):
                    replies[stream] = httpx.post(
                        f"{created['base_url'].rstrip('/')}/{api}",
                        json={**BODIES[api], "stream": stream},
                        headers=headers,
                        timeout=30,
                    )
                    assert replies[stream].status_code == 200, replies[stream].text
        calls = store.list_calls(created["rollout_id"])
    finally:
        store.close()
    # The streamed harness got both reasoning parts (the whole answer came as one, the control).
    assert received_reasoning(api, replies[True]) == REASONING
    assert [c.response.get("reasoning_content") for c in calls] == [REASONING, REASONING]
    assert [c.response.get("content") for c in calls] == [TEXT, TEXT]
