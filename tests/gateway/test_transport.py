"""The gateway's transport under failure and abuse (issue 19, items 8-12): a failed stream ends with an
error event, a 500 keeps its keep-alive connection, connections are timed out and capped, and one
huge request is refused before it is tokenized."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, Samples, SamplingParams
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


class FailingEngine(ScriptedEngine):
    """The scripted engine, except that generation raises an unexpected error after ``fail_after`` tokens."""

    def __init__(self, *args: Any, fail_after: int | None = 2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_after = fail_after

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        n = 0
        async for batch in super().generate(prompt_ids, params, context):
            if self.fail_after is not None and n >= self.fail_after:
                raise RuntimeError("the engine's internals broke")
            n += len(batch.token_ids)
            yield batch


@pytest.fixture
def failing(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[tuple[str, SQLiteStore, FailingEngine]]:
    store = SQLiteStore(tmp_path / "store.db")
    engine = FailingEngine(["Hello there, a long enough answer."], tokenizer)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
    with serve_in_thread(app) as url:
        yield url, store, engine
    store.close()


def _rollout(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/api/rollouts", json={"task": {}}, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    return r.json()


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


# -- item 8: a failed stream ends with an error event, is logged once and is not recorded ----------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", {**CHAT, "stream": True}),
        ("completions", {"model": "m", "prompt": "hi", "stream": True}),
        ("responses", {"model": "m", "input": "hi", "stream": True}),
        ("messages", {**ANTHROPIC, "stream": True}),
    ],
)
def test_unexpected_error_mid_stream_ends_with_an_error_event(
    failing: tuple[str, SQLiteStore, FailingEngine], caplog: Any, path: str, body: dict[str, Any]
) -> None:
    url, store, engine = failing
    rollout = _rollout(url)
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    with caplog.at_level(logging.ERROR, logger="harnessrl.gateway"):
        # The stream ends normally (no cut connection: httpx would raise RemoteProtocolError).
        r = httpx.post(f"{rollout['base_url']}/{path}", json=body, headers=headers, timeout=10)
    assert r.status_code == 200
    events = _events(r.text)
    last = events[-1]
    if path == "messages":
        assert "event: error" in r.text
        assert last == {
            "type": "error",
            "error": {"type": "api_error", "message": "internal error: RuntimeError"},
        }
    elif path == "responses":
        assert last["type"] == "response.failed"
        assert last["response"]["status"] == "failed"
        assert last["response"]["error"]["code"] == "internal_error"
    else:
        assert last["error"]["code"] == "internal_error"
        assert "internals broke" not in r.text  # logged, not leaked
    logged = [rec for rec in caplog.records if rec.exc_info and "internals broke" in str(rec.exc_info[1])]
    assert len(logged) == 1  # once, with the traceback
    assert store.list_calls(rollout["rollout_id"]) == []  # a failed stream is not a recorded call
    # Control: the same request on a healthy engine streams to the end and is recorded.
    engine.fail_after = None
    ok = httpx.post(f"{rollout['base_url']}/{path}", json=body, headers=headers, timeout=10)
    assert ok.status_code == 200
    assert "error" not in _events(ok.text)[-1]
    assert len(store.list_calls(rollout["rollout_id"])) == 1


def test_failed_stream_raises_in_the_sdks(failing: tuple[str, SQLiteStore, FailingEngine]) -> None:
    url, _, _ = failing
    rollout = _rollout(url)
    oai = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    with pytest.raises(openai.APIError, match="internal error"):
        list(oai.chat.completions.create(**CHAT, stream=True))
    ant = anthropic.Anthropic(
        base_url=rollout["base_url"].removesuffix("/v1"), api_key=rollout["api_key"], max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError, match="internal error"):
        list(ant.messages.create(**ANTHROPIC, stream=True))


# -- item 9: a 500 does not close the keep-alive connection -----------------------------------------


def test_500_keeps_the_keep_alive_connection(make_gateway: Any) -> None:
    gw = make_gateway()

    async def boom(request: Request) -> None:
        raise RuntimeError("kaboom")

    async def peer(request: Request) -> JSONResponse:
        assert request.client is not None
        return JSONResponse({"port": request.client.port})  # which connection the request came on

    gw.app.router.routes += [Route("/boom", boom), Route("/peer", peer), Route("/v1/messages/boom", boom)]
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        first = client.get("/peer").json()["port"]
        r = client.get("/boom")
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "internal_error"
        assert r.headers.get("connection") != "close"
        assert client.get("/peer").json()["port"] == first  # the same connection, reused
        a = client.get("/v1/messages/boom")  # Anthropic's shape on its routes
        assert a.status_code == 500
        assert a.json() == {
            "type": "error",
            "error": {"type": "api_error", "message": "internal error: RuntimeError"},
        }
        assert client.get("/peer").json()["port"] == first


# -- items 10 and 12: read timeouts, idle keep-alive timeout, connection cap ------------------------


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _request(path: str = "/api/health") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def _still_open(sock: socket.socket) -> bool:
    """Whether the server has neither answered nor closed ``sock`` yet (nothing to read, no EOF)."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # an answer, or b"" for a close
        return False
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def test_half_sent_request_is_closed_after_the_header_timeout(make_gateway: Any) -> None:
    gw = make_gateway(header_timeout_s=2)  # long enough that the test's own steps fit in it when loaded
    # Control, opened first: a whole request in time is answered, and its connection then sits idle
    # for longer than the header timeout (the others below are closed for it meanwhile).
    ok = _connect(gw.url)
    ok.sendall(_request())
    assert ok.recv(65536).startswith(b"HTTP/1.1 200 ")
    half = _connect(gw.url)
    half.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0")  # never finished
    silent = _connect(gw.url)  # never sends anything
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        assert client.get("/api/health").status_code == 200  # a normal client is served meanwhile
        answer = _read_until_closed(half)
        assert answer.startswith(b"HTTP/1.1 408 ")  # closed for the header timeout, and says so
        assert b"request_timeout" in answer
        assert _read_until_closed(silent).startswith(b"HTTP/1.1 408 ")
        assert client.get("/api/health").status_code == 200
    # Idle is the keep-alive timeout's business: the control's connection is still served.
    ok.sendall(_request())
    assert ok.recv(65536).startswith(b"HTTP/1.1 200 ")
    ok.close()


def test_body_that_never_arrives_is_closed_after_the_body_timeout(make_gateway: Any) -> None:
    gw = make_gateway(body_timeout_s=3)  # the open-check below must come before it, when loaded too
    rollout = gw.rollout()
    sock = _connect(gw.url)
    head = (
        f"POST /rollouts/{rollout['rollout_id']}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {rollout['api_key']}\r\ncontent-type: application/json\r\n"
        "content-length: 1000\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"model": "m", ')
    assert _still_open(sock)  # not refused on sight: it waits for the rest, up to the body timeout
    assert _read_until_closed(sock) == b""  # then closed
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    # Control: the whole body in time is a call.
    r = httpx.post(
        f"{rollout['base_url']}/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
    )
    assert r.status_code == 200
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1


def test_idle_keep_alive_connection_closes_after_the_keepalive_timeout(make_gateway: Any) -> None:
    gw = make_gateway(keepalive_timeout_s=3)  # the open-check below must come before it, when loaded too
    sock = _connect(gw.url)
    sock.sendall(_request())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert _still_open(sock)  # kept alive after its answer...
    assert _read_until_closed(sock) == b""  # ...until the keep-alive timeout: closed, no answer


def test_default_keep_alive_outlives_the_clients_5_s() -> None:
    """httpx and the OpenAI SDK reuse a connection idle up to 5 s; uvicorn's default closed it at 5 s."""
    assert GatewayConfig().keepalive_timeout_s >= 60


def test_connection_idle_5_s_is_still_served(make_gateway: Any) -> None:
    """The default keep-alive: a connection idle as long as clients keep theirs is still served."""
    gw = make_gateway()
    sock = _connect(gw.url)
    sock.sendall(_request())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    time.sleep(5.5)  # the scenario itself, not a wait for something: idle as long as clients keep theirs
    sock.sendall(_request())
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_connection_cap_closes_idle_connections_first(make_gateway: Any) -> None:
    gw = make_gateway(max_connections=4)
    idle = [_connect(gw.url) for _ in range(4)]  # hold every slot, sending nothing
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        for _ in range(3):
            assert client.get("/api/health").status_code == 200
    closed = []
    for sock in idle:
        sock.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            closed.append(sock.recv(1) == b"")
        sock.close()
    assert closed == [True]  # the oldest made room for the client; the others are still open


def test_connection_cap_answers_503_when_every_connection_is_busy(make_gateway: Any) -> None:
    gw = make_gateway(max_connections=2)
    rollout = gw.rollout()
    busy = []
    for _ in range(2):  # each is in the middle of sending a body: not idle, not closed to make room
        sock = _connect(gw.url)
        sock.sendall(
            f"POST /rollouts/{rollout['rollout_id']}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {rollout['api_key']}\r\ncontent-length: 100\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        # The server answers "100 Continue" when the app first reads the body: it has read the head
        # and the connection is in its body phase.
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"{")
        busy.append(sock)
    r = httpx.get(f"{gw.url}/api/health", timeout=10)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "too_many_connections"
    assert r.headers["retry-after"] == "1"
    for sock in busy:
        sock.close()


# -- item 11: one huge request is refused before it is tokenized ------------------------------------


def test_prompt_size_cap_is_checked_before_tokenizing(make_gateway: Any) -> None:
    gw = make_gateway(max_prompt_chars=1000)
    rollout = gw.rollout()
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    base = rollout["base_url"]
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 1001}]}
    r = httpx.post(f"{base}/chat/completions", json=big, headers=headers)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"
    assert r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{base}/completions", json={"model": "m", "prompt": "x" * 1001}, headers=headers)
    assert r.status_code == 413
    r = httpx.post(f"{base}/responses", json={"model": "m", "input": "x" * 1001}, headers=headers)
    assert r.status_code == 413
    r = httpx.post(f"{base}/messages", json={**ANTHROPIC, "messages": big["messages"]}, headers=headers)
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "request_too_large"
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    # Control: just under the cap is a call.
    small = {"model": "m", "messages": [{"role": "user", "content": "x" * 900}]}
    assert httpx.post(f"{base}/chat/completions", json=small, headers=headers).status_code == 200


def test_default_prompt_size_cap_follows_the_context_length(make_gateway: Any) -> None:
    gw = make_gateway(context_length=256)  # 16 characters per token of context: 4096
    rollout = gw.rollout()
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    r = httpx.post(f"{rollout['base_url']}/chat/completions", json=big, headers=headers)
    assert r.status_code == 413


def test_requests_in_flight_per_key_are_capped(make_gateway: Any) -> None:
    gw = make_gateway(["ok"], max_requests_per_key=1)
    mine, other = gw.rollout(), gw.rollout()
    auth = {"Authorization": f"Bearer {mine['api_key']}"}
    gw.client.pause(timeout=5)  # the first call waits at the gate: in flight for as long as we like
    with httpx.Client(timeout=10) as client:
        body = {**CHAT, "stream": True}
        with client.stream("POST", f"{mine['base_url']}/chat/completions", json=body, headers=auth) as held:
            deadline = time.monotonic() + 60  # a wait, not a timing
            while gw.client.state()["waiting"] != 1:
                assert time.monotonic() < deadline, "the call never reached the gate"
                time.sleep(0.02)
            r = client.post(f"{mine['base_url']}/chat/completions", json=CHAT, headers=auth)
            assert r.status_code == 429
            assert r.json()["error"]["code"] == "overloaded"
            assert r.headers["retry-after"] == "1"
            a = client.post(f"{mine['base_url']}/messages", json=ANTHROPIC, headers=auth)
            assert a.status_code == 429
            assert a.json()["error"]["type"] == "rate_limit_error"
            assert 'harnessrl_errors_total{code="overloaded"} 2.0' in gw.client.metrics()
            # Control: another rollout's key is served meanwhile.
            theirs = {"Authorization": f"Bearer {other['api_key']}"}
            assert client.get(f"{other['base_url']}/models", headers=theirs).status_code == 200
            gw.client.resume()
            assert "[DONE]" in held.read().decode()
        assert client.post(f"{mine['base_url']}/chat/completions", json=CHAT, headers=auth).status_code == 200
    assert len(gw.client.list_calls(mine["rollout_id"])) == 2


def test_the_per_key_cap_counts_the_key_that_authenticates(make_gateway: Any) -> None:
    """A harness cannot dodge its cap by dressing its key: the cap and authentication read one key.

    They used to read it two ways: duplicate ``Authorization`` headers (a first non-bearer one, then
    a bearer one with a made-up token) authenticated by ``x-api-key`` but were counted under the
    made-up token, and ``KEY\\xa0`` authenticated as ``KEY`` (``str.strip``) while counted as
    another key (``bytes.strip``): every such call was served past the cap."""
    gw = make_gateway(["ok"], max_requests_per_key=1)
    mine = gw.rollout()
    key = mine["api_key"].encode()
    url = f"{mine['base_url']}/chat/completions"
    gw.client.pause(timeout=5)  # the first call waits at the gate: in flight for as long as we like
    with httpx.Client(timeout=10) as client:
        body = {**CHAT, "stream": True}
        with client.stream(
            "POST", url, json=body, headers={"Authorization": f"Bearer {mine['api_key']}"}
        ) as held:
            deadline = time.monotonic() + 60  # a wait, not a timing
            while gw.client.state()["waiting"] != 1:
                assert time.monotonic() < deadline, "the call never reached the gate"
                time.sleep(0.02)
            dressed = {
                "duplicate headers": [
                    (b"Authorization", b"Basic x"),
                    (b"Authorization", b"Bearer made-up-token"),
                    (b"x-api-key", key),
                ],
                "latin-1 padding": [(b"Authorization", b"Bearer " + key + b"\xa0")],
                "padded x-api-key": [(b"x-api-key", key + b"\xa0\x85")],
            }
            for name, headers in dressed.items():
                try:
                    r = client.post(url, json=CHAT, headers=headers, timeout=30)
                except httpx.ReadTimeout:
                    pytest.fail(f"{name}: admitted past the cap (it waits at the gate beside the first)")
                assert r.status_code in (401, 429), f"{name}: {r.status_code} served past the cap"
            # Control: the key with HTTP's own padding is the same key, and is refused by the cap.
            r = client.post(url, json=CHAT, headers=[(b"Authorization", b"Bearer \t " + key)])
            assert r.status_code == 429
            gw.client.resume()
            assert "[DONE]" in held.read().decode()
        r = client.post(url, json=CHAT, headers=dressed["duplicate headers"])
        assert r.status_code == 200  # the same headers authenticate, once nothing else is in flight
    assert len(gw.client.list_calls(mine["rollout_id"])) == 2


def test_a_prompt_that_takes_too_long_to_tokenize_is_a_413_and_others_go_on(make_gateway: Any) -> None:
    """The size cap cannot see a template or text that is slow to tokenize: the time budget can."""
    import threading

    slow = threading.Event()
    release = threading.Event()

    class SlowTokenizer(PolicyTokenizer):
        """The tiny model's tokenizer, with a render that hangs on prompts saying SLOW."""

        def render_chat(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            if any("SLOW" in str(m.get("content")) for m in messages):
                slow.set()
                release.wait(30)
            return super().render_chat(messages, *args, **kwargs)

    gateway = make_gateway(
        ["Fine."],
        tokenize_timeout_s=0.5,
        policy_tokenizer=SlowTokenizer.from_dir(tiny_model_dir(weights=False)),
    )
    rollout = gateway.rollout()
    headers = {"authorization": f"Bearer {rollout['api_key']}"}
    url = f"{gateway.url}/v1/chat/completions"
    with httpx.Client(timeout=30) as client:
        slow_answer = client.post(
            url, json={"messages": [{"role": "user", "content": "SLOW"}]}, headers=headers
        )
        # Answered while the render still hangs (it returns only once released): at the budget.
        assert slow.is_set() and not release.is_set()
        release.set()
        assert slow_answer.status_code == 413, slow_answer.text
        assert "tokenize_timeout_s" in slow_answer.json()["error"]["message"]
        assert gateway.store.list_calls(rollout["rollout_id"]) == []
        # Control: the same gateway answers an ordinary prompt.
        fine = client.post(url, json={"messages": [{"role": "user", "content": "hi"}]}, headers=headers)
        assert fine.status_code == 200, fine.text
