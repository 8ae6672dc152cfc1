"""What the gateway has done by the time a streamed answer's ``[DONE]`` goes out.

A harness sends its next call the moment it reads ``[DONE]``. By then the call must be recorded and
no longer counted as generating: the next call's index (which turn the scripted engine plays, what
a pause waits for) is computed from those counts. The app is driven as raw ASGI so the test can
look at the gateway's state exactly when the ``[DONE]`` chunk is handed to the server, while the
response generator is still suspended there (over a socket the client would race the server).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer


async def _asgi_post(app: Any, path: str, body: dict[str, Any], key: str, on_chunk: Any) -> int:
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"authorization", f"Bearer {key}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and message.get("body"):
            on_chunk(message["body"])

    await app(scope, receive, send)
    return status


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_streamed_call_is_recorded_and_done_before_its_end_is_sent(
    tokenizer: PolicyTokenizer, tmp_path: Path, api: str
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    app = create_app(GatewayConfig(admin_key="k"), store, ScriptedEngine(["Hello there."], tokenizer))
    seen: list[tuple[int, int]] = []  # (calls in the store, calls still generating) at the end event

    async def go() -> None:
        async with app.router.lifespan_context(app):
            state = app.state.gateway
            rollout = store.create_rollout(rollout_id="r1", task={"prompt": "x"})
            memory = await state.history.get("r1", 0)

            def on_chunk(chunk: bytes) -> None:
                if b"[DONE]" in chunk or b"message_stop" in chunk or b"response.completed" in chunk:
                    seen.append((store.count_calls("r1"), memory.in_flight))

            path, body = {
                "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                "responses": ("/v1/responses", {"input": "hi"}),
                "messages": (
                    "/v1/messages",
                    {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
                ),
            }[api]
            status = await _asgi_post(
                app, path, {"model": "m", "stream": True, **body}, rollout.api_key, on_chunk
            )
            assert status == 200

    asyncio.run(go())
    store.close()
    assert seen and seen[0] == (1, 0), seen
