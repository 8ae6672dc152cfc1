"""What a teacher upstream may send that the gateway mishandled, and what a harness may send in a
chat body that the gateway itself acts on.

- The teacher key echoed URL-encoded (``sk-a%2Fb``) or JSON-escaped (``sk-a\\/b``) in an upstream's
  error reached the harness and the gateway's log whole: only the key's literal text was redacted.
- Tool-call deltas without an ``index`` (Gemini's OpenAI API) were all call 0: two parallel calls were
  recorded as one, named ``bashread`` with both arguments run together; a Messages stream failed on
  it and a Responses stream sent the harness that one call.
- A lone UTF-16 surrogate (JSON ``"\\ud83d"`` without its pair) made a whole answer a 500 after it had
  been recorded (a call the harness never got) and cut a translated stream without its error event.
  The native mode passed it on and recorded it (``harnessrl sft`` then stopped with a TypeError).
- ``stream_options`` that is not an object was a 500 ``TypeError``; ``stream: "yes"`` was a stream.
- An upstream answer had no bound: a body or a stream line without end grew the gateway's memory
  until it died. Then it had a fixed one, 64 MiB held per call at once whatever the gateway's own
  limits said. Past ``gateway.max_body_bytes`` (which bounds the harness's next call, carrying the
  answer, too) the call is now an upstream error, unrecorded.
- Chunks carrying none of the answer (no choices, an empty delta) were not keep-alives: a stream of
  them never ended. A key no header can carry was a traceback, or "not reachable", at start-up.

The upstream is a small real server on 127.0.0.1 (chat completions, and Anthropic's ``/messages``
for the native mode); the harnesses are httpx and the official ``openai`` and ``anthropic`` SDKs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
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
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "hunt-admin"
KEY = "sk-te/ach+er=KEY0123456789"  # a key with characters a URL encodes
USER = [{"role": "user", "content": "What is in a.txt?"}]
BODIES = {
    "chat/completions": {"model": "m", "messages": USER},
    "messages": {"model": "c", "max_tokens": 64, "messages": USER},
    "responses": {"model": "g", "input": "What is in a.txt?"},
}
LAST_EVENT = {"chat/completions": "[DONE]", "messages": "message_stop", "responses": "response.completed"}

#: ``(request body) -> the upstream's answer`` for ``/v1/chat/completions``
Answer = Callable[[dict[str, Any]], Response]


def upstream(answer: Answer, asked: list[dict[str, Any]] | None = None) -> Starlette:
    """An OpenAI-compatible upstream answering every chat call with ``answer``; the bodies it was
    sent are appended to ``asked``."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if asked is not None:
            asked.append(body)
        return answer(body)

    async def messages(request: Request) -> Response:  # Anthropic's, for the native mode
        return answer(await request.json())

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
        ]
    )


def events(lines: list[str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for line in lines:
            yield line

    return StreamingResponse(body(), media_type="text/event-stream")


def data(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', **chunk})}\n\n"


def stream_of(deltas: list[dict[str, Any]], finish: str = "stop") -> StreamingResponse:
    """A chat stream of ``deltas`` (choice 0), its finish reason, usage and ``[DONE]``."""
    chunks = [data({"choices": [{"index": 0, "delta": delta}]}) for delta in deltas]
    chunks.append(data({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    chunks.append(data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}))
    return events([*chunks, "data: [DONE]\n\n"])


def whole(message: dict[str, Any], finish: str = "stop") -> JSONResponse:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return JSONResponse({"id": "c1", "object": "chat.completion", "choices": [choice]})


class Served:
    def __init__(
        self, url: str, base: str, key: str, rollout_id: str, store: SQLiteStore, teacher: Teacher
    ) -> None:
        self.url, self.base, self.rollout_id, self.store, self.teacher = url, base, rollout_id, store, teacher
        self.headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
        self.key = key

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.base}/{path}", json=body, headers=self.headers, timeout=60)

    def calls(self) -> list[Call]:
        return self.store.list_calls(self.rollout_id)


@contextlib.contextmanager
def served(
    up: Starlette,
    tmp_path: Path,
    tokenizer: PolicyTokenizer,
    *,
    api: str = "chat",
    max_body_bytes: int = 0,
    timeout_s: float = 0,
) -> Iterator[Served]:
    """A teacher-mode gateway on ``up`` (the key ``KEY``) and one rollout on it; ``max_body_bytes``:
    the gateway's (default: its default)."""
    store = SQLiteStore(tmp_path / "teacher.db")
    config = GatewayConfig(admin_key=ADMIN, **({"max_body_bytes": max_body_bytes} if max_body_bytes else {}))
    try:
        with serve_in_thread(up) as up_url:
            teacher = Teacher(f"{up_url}/v1", "u", KEY, api=api)
            if timeout_s:  # after the client was made: its read timeout stays 600 s
                teacher.timeout_s = timeout_s
            app = create_app(config, store, ScriptedEngine(["unused"], tokenizer), teacher=teacher)
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as gw:
                created = gw.create_rollout({"prompt": "x"}, run_id="teacher")
                yield Served(
                    url,
                    created["base_url"].rstrip("/"),
                    created["api_key"],
                    created["rollout_id"],
                    store,
                    teacher,
                )
    finally:
        store.close()


def error_message(reply: httpx.Response) -> str:
    """The error the harness was shown: a whole answer's, or a stream's last event's."""
    if reply.headers["content-type"].startswith("text/event-stream"):
        last = [line for line in reply.text.splitlines() if line.startswith("data:")][-1]
        payload = json.loads(last[5:])
    else:
        payload = reply.json()
    error = payload.get("error") or payload.get("response", {}).get("error")
    return str(error["message"])


# -- the key, however the upstream writes it ----------------------------------------------------


ECHOES = {
    "literal": KEY,
    "url-encoded": urllib.parse.quote(KEY, safe=""),
    "url-encoded, lower case": urllib.parse.quote(KEY, safe="").lower(),
    "form-encoded": urllib.parse.quote_plus(KEY),
    "json-escaped slash": KEY.replace("/", "\\/"),
}


@pytest.mark.parametrize("status", [400, 401])
@pytest.mark.parametrize("echo", list(ECHOES))
def test_the_key_is_redacted_however_the_upstream_echoes_it(
    tmp_path: Path, tokenizer: PolicyTokenizer, caplog: pytest.LogCaptureFixture, echo: str, status: int
) -> None:
    written = ECHOES[echo]

    def answer(body: dict[str, Any]) -> Response:
        # Not the error shape: the harness is shown the body's text, as the upstream wrote it.
        text = '{"detail": "no access for https://x.example/v1?key=' + written + ' (MARKER)"}'
        return Response(text, status_code=status, media_type="application/json")

    caplog.set_level(logging.WARNING, logger="harnessrl.gateway")
    with served(upstream(answer), tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            for stream in (False, True):
                reply = gw.post(path, {**body, "stream": stream})
                assert reply.status_code == (status if status == 400 else 502), (path, reply.text)
                shown = error_message(reply)
                assert "MARKER" in shown and "[teacher key]" in shown, (path, shown)  # the echo got through
                assert written not in shown and urllib.parse.unquote(written) not in shown, (path, shown)
                assert KEY not in shown.replace("\\/", "/"), (path, shown)
        assert gw.calls() == []
    if status == 401:  # logged as an error (the gateway's own credentials), redacted too
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "[teacher key]" in logged
        assert written not in logged and KEY not in logged.replace("\\/", "/")


@pytest.mark.parametrize(("shape", "cut"), [("text", 200), ("error", 4000)])
@pytest.mark.parametrize("before", [-8, -1, 0, 2])
def test_a_key_across_the_cut_shows_no_head(
    tmp_path: Path, tokenizer: PolicyTokenizer, shape: str, cut: int, before: int
) -> None:
    """The message is cut short after the key is redacted: an echo across the cut shows none of it."""
    prefix = "teacher upstream answered 400: "
    written = urllib.parse.quote(KEY, safe="")
    pad = "p" * (cut + before)  # the cut is the message's (or the body's), not the prefix's

    def answer(body: dict[str, Any]) -> Response:
        said = pad + written + " and more text"
        if shape == "error":
            return JSONResponse({"error": {"message": said}}, status_code=400)
        return Response(said, status_code=400, media_type="text/plain")

    with served(upstream(answer), tmp_path, tokenizer) as gw:
        shown = error_message(gw.post("chat/completions", BODIES["chat/completions"]))
        assert shown.startswith(prefix + "ppp")
        for head in (written[:6], KEY[:6]):
            assert head not in shown, shown[-60:]
        assert ("[teacher key]" in shown) == (len(pad) < cut), shown[-60:]


# -- tool calls without an index ------------------------------------------------------------------

GEMINI = [  # Gemini's OpenAI API: no index; each call whole, or its arguments over several deltas
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "fc-1", "type": "function", "function": {"name": "bash", "arguments": '{"command":'}}
        ],
    },
    {"tool_calls": [{"function": {"arguments": ' "ls"}'}}]},
    {
        "tool_calls": [
            {"id": "fc-2", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}
        ]
    },
]
CALLS = [("fc-1", "bash", {"command": "ls"}), ("fc-2", "read", {"path": "a"})]


def test_parallel_tool_calls_without_an_index_are_each_received_and_recorded(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    up = upstream(lambda body: stream_of(GEMINI, "stop"))  # Gemini ends tool calls with "stop" too
    with served(up, tmp_path, tokenizer) as gw:
        oai = openai.OpenAI(base_url=gw.base, api_key=gw.key, max_retries=0, timeout=60)
        ant = anthropic.Anthropic(
            base_url=gw.base.removesuffix("/v1"), api_key=gw.key, max_retries=0, timeout=60
        )
        # chat: passed through as the upstream sent it (a harness reads the calls by their ids)
        raw = gw.post("chat/completions", {**BODIES["chat/completions"], "stream": True})
        assert raw.status_code == 200 and raw.text.strip().endswith("[DONE]"), raw.text
        tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("bash", "read")]
        with ant.messages.stream(model="c", max_tokens=64, messages=USER, tools=tools) as s:
            message = s.get_final_message()
        assert message.stop_reason == "tool_use"
        assert [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"] == CALLS
        functions = [
            {"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("bash", "read")
        ]
        with oai.responses.stream(model="g", input="What is in a.txt?", tools=functions) as s:
            response = s.get_final_response()
        got = [
            (o.call_id, o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"
        ]
        assert got == CALLS
        calls = gw.calls()
        assert [c.api for c in calls] == ["chat.completions", "messages", "responses"]
        for call in calls:
            recorded = [
                (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in call.response["tool_calls"]
            ]
            assert recorded == CALLS, call.api


# -- a lone surrogate ---------------------------------------------------------------------------


def test_a_lone_surrogate_is_answered_and_recorded_once(tmp_path: Path, tokenizer: PolicyTokenizer) -> None:
    text = "It holds 42 \\ud83d."  # JSON: half of an emoji's surrogate pair

    def answer(body: dict[str, Any]) -> Response:
        if not body.get("stream"):
            raw = '{"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "message": '
            raw += '{"role": "assistant", "content": "' + text + '"}, "finish_reason": "stop"}]}'
            return Response(raw, media_type="application/json")
        first = (
            '{"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "'
            + text
            + '"}}]}'
        )
        end = data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        return events([f"data: {first}\n\n", end, "data: [DONE]\n\n"])

    with served(upstream(answer), tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            for stream in (False, True):
                reply = gw.post(path, {**body, "stream": stream})
                assert reply.status_code == 200, (path, stream, reply.text)
                assert "It holds 42" in reply.text, (path, stream, reply.text)
                if stream:
                    assert LAST_EVENT[path] in reply.text.strip().splitlines()[-1], (path, reply.text)
        calls = gw.calls()
        assert len(calls) == 6  # one per answer the harness got, and no other
        for call in calls:
            assert call.response["content"] in ("It holds 42 \ufffd.", "It holds 42 \ud83d."), call.api


def test_a_native_lone_surrogate_is_answered_and_recorded_as_u_fffd(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """The native mode passed the upstream's JSON on as sent and recorded its parse: a lone surrogate
    was in the record (``harnessrl sft`` stopped on it with a TypeError) and in the harness's next
    request (refused, 400). Both now hold U+FFFD, as the translated paths do."""
    text = "It holds 42 \\ud83d."
    head = '{"id": "msg_1", "type": "message", "role": "assistant", "model": "u", '
    usage = '"usage": {"input_tokens": 1, "output_tokens": 1}'

    def answer(body: dict[str, Any]) -> Response:
        if not body.get("stream"):
            raw = (
                head
                + f'"stop_reason": "end_turn", {usage}, "content": [{{"type": "text", "text": "{text}"}}]}}'
            )
            return Response(raw, media_type="application/json")
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        delta = (
            '{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "'
            + text
            + '"}}'
        )
        end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}
        lines = [
            f'event: message_start\ndata: {{"type": "message_start", "message": {head}"content": [], {usage}}}}}\n\n',
            f"event: content_block_start\ndata: {json.dumps(block)}\n\n",
            f"event: content_block_delta\ndata: {delta}\n\n",
            'event: content_block_stop\ndata: {"type": "content_block_stop", "index": 0}\n\n',
            f"event: message_delta\ndata: {json.dumps(end)}\n\n",
            'event: message_stop\ndata: {"type": "message_stop"}\n\n',
        ]
        return events(lines)

    with served(upstream(answer), tmp_path, tokenizer, api="native") as gw:
        whole_reply = gw.post("messages", BODIES["messages"])
        assert whole_reply.status_code == 200, whole_reply.text
        assert whole_reply.json()["content"][0]["text"] == "It holds 42 \ufffd."
        streamed = gw.post("messages", {**BODIES["messages"], "stream": True})
        assert streamed.status_code == 200 and "message_stop" in streamed.text, streamed.text
        sent = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
        assert [e["delta"]["text"] for e in sent if e["type"] == "content_block_delta"] == [
            "It holds 42 \ufffd."
        ]
        assert [c.response["content"] for c in gw.calls()] == ["It holds 42 \ufffd."] * 2


#: JSON nested past Python's recursion limit.
DEEP = "[" * 5000 + "]" * 5000


def test_json_nested_past_pythons_limit_is_an_upstream_error(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """An answer or a stream chunk nested deeper than Python parses (``RecursionError``, which no
    handler named) was a 500 "internal error", and cut a stream without its error event (the
    harness: "peer closed connection"). Now an upstream error like any other answer that is not one;
    nothing recorded."""

    def answer(body: dict[str, Any]) -> Response:
        if not body.get("stream"):
            raw = json.dumps(
                {"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}
            )
            return Response(raw[:-1] + ', "x": ' + DEEP + "}", media_type="application/json")
        deep = '{"id": "c1", "choices": [{"index": 0, "delta": {"content": "hi"}}], "x": ' + DEEP + "}"
        end = data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        return events([f"data: {deep}\n\n", end, "data: [DONE]\n\n"])

    with served(upstream(answer), tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            whole_reply = gw.post(path, body)
            assert whole_reply.status_code == 502, (path, whole_reply.text[:300])
            streamed = gw.post(path, {**body, "stream": True})
            assert streamed.status_code == 200, (path, streamed.text[:300])
            assert "not a chat chunk" in error_message(streamed), (path, streamed.text[-300:])
        assert gw.calls() == []
    (tmp_path / "native").mkdir()
    with served(upstream(answer), tmp_path / "native", tokenizer, api="native") as gw:
        assert gw.post("messages", BODIES["messages"]).status_code == 502
        streamed = gw.post("messages", {**BODIES["messages"], "stream": True})
        assert "not JSON" in error_message(streamed), streamed.text[-300:]
        assert gw.calls() == []


# -- the chat body's stream fields --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": True, "stream_options": "include_usage"}, "stream_options"),
        ({"stream": True, "stream_options": [1]}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_the_stream_fields_the_gateway_acts_on_are_checked(
    tmp_path: Path, tokenizer: PolicyTokenizer, fields: dict[str, Any], param: str
) -> None:
    asked: list[dict[str, Any]] = []
    up = upstream(lambda body: stream_of([{"role": "assistant", "content": "ok"}]), asked)
    with served(up, tmp_path, tokenizer) as gw:
        reply = gw.post("chat/completions", {**BODIES["chat/completions"], **fields})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param
        assert asked == [] and gw.calls() == []
        # the control: the same body with a valid field is answered
        ok = gw.post(
            "chat/completions", {**BODIES["chat/completions"], "stream": True, "stream_options": None}
        )
        assert ok.status_code == 200 and ok.text.strip().endswith("[DONE]")
        assert len(asked) == 1 and len(gw.calls()) == 1


# -- answers past the bound -----------------------------------------------------------------------

BOUND = 64 * 1024


@pytest.mark.parametrize("size", [BOUND // 2, 2 * BOUND])
def test_an_answer_past_the_bound_is_an_upstream_error(
    tmp_path: Path, tokenizer: PolicyTokenizer, size: int
) -> None:
    """The bound is ``gateway.max_body_bytes``: a fixed 64 MiB let an answer the harness could not
    send back (its next body is refused past that limit) be answered and recorded."""
    text = "a" * size

    def answer(body: dict[str, Any]) -> Response:
        if not body.get("stream"):
            return whole({"content": text})
        return stream_of([{"role": "assistant", "content": text}])  # one line of ``size`` bytes

    with served(upstream(answer), tmp_path, tokenizer, max_body_bytes=BOUND) as gw:
        for path, body in BODIES.items():
            for stream in (False, True):
                reply = gw.post(path, {**body, "stream": stream})
                if size < BOUND:  # the control: under the bound, answered
                    assert reply.status_code == 200 and text in reply.text, (path, stream)
                    continue
                if stream:  # its 200 was sent: the last event is the API's error
                    assert reply.status_code == 200
                    assert LAST_EVENT[path] not in reply.text.strip().splitlines()[-1], (
                        path,
                        reply.text[-300:],
                    )
                else:
                    assert reply.status_code == 502, (path, reply.text[:300])
                assert f"over {BOUND} bytes" in error_message(reply), (path, stream)
        assert len(gw.calls()) == (6 if size < BOUND else 0)


def test_a_native_answer_past_the_bound_is_an_upstream_error(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    text = "a" * (2 * BOUND)

    def answer(body: dict[str, Any]) -> Response:
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "u",
            "stop_reason": "end_turn",
        }
        usage = {"input_tokens": 1, "output_tokens": 1}
        if not body.get("stream"):
            return JSONResponse({**message, "content": [{"type": "text", "text": text}], "usage": usage})
        start = {"type": "message_start", "message": {**message, "content": [], "usage": usage}}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        lines = [start, block, delta, {"type": "content_block_stop", "index": 0}, {"type": "message_stop"}]
        return events([f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in lines])

    with served(upstream(answer), tmp_path, tokenizer, api="native", max_body_bytes=BOUND) as gw:
        whole_reply = gw.post("messages", BODIES["messages"])
        assert whole_reply.status_code == 502 and f"over {BOUND} bytes" in error_message(whole_reply)
        streamed = gw.post("messages", {**BODIES["messages"], "stream": True})
        assert streamed.status_code == 200 and "message_stop" not in streamed.text
        assert f"over {BOUND} bytes" in error_message(streamed)
        assert gw.calls() == []


# -- what a stream is -------------------------------------------------------------------------------


def test_every_stream_is_an_event_stream(tmp_path: Path, tokenizer: PolicyTokenizer) -> None:
    """A chat stream had no ``Content-Type``: an SSE client that checks it (httpx-sse's
    ``EventSource``, the browser's) refused the answer the policy path gives as ``text/event-stream``."""
    up = upstream(lambda body: stream_of([{"role": "assistant", "content": "ok"}]))
    with served(up, tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            reply = gw.post(path, {**body, "stream": True})
            assert reply.status_code == 200 and LAST_EVENT[path] in reply.text, path
            assert reply.headers.get("content-type", "").startswith("text/event-stream"), (
                path,
                reply.headers,
            )


def test_every_whole_answer_names_its_recorded_call(tmp_path: Path, tokenizer: PolicyTokenizer) -> None:
    """A whole Messages or Responses answer (translated or native) had no ``x-harnessrl-call-seq``,
    which the policy path's and a teacher's chat answer carry: a harness's answer could not be found in
    the store."""

    def answer(body: dict[str, Any]) -> Response:
        return whole({"content": "It holds 42."})

    def native(body: dict[str, Any]) -> Response:
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "u",
            "stop_reason": "end_turn",
        }
        content = [{"type": "text", "text": "It holds 42."}]
        return JSONResponse({**message, "content": content, "usage": {"input_tokens": 1, "output_tokens": 1}})

    for api, up, paths in (
        ("chat", upstream(answer), list(BODIES)),
        ("native", upstream(native), ["messages"]),
    ):
        with served(up, tmp_path / api, tokenizer, api=api) as gw:
            for path in paths:
                reply = gw.post(path, BODIES[path])
                assert reply.status_code == 200 and "It holds 42." in reply.text, (api, path)
                seq = reply.headers.get("x-harnessrl-call-seq")
                assert seq is not None, (api, path, reply.headers)
                assert reply.headers["x-harnessrl-rollout-id"] == gw.rollout_id
                assert [c.seq for c in gw.calls()][-1] == int(seq), (api, path)


# -- many calls at once ---------------------------------------------------------------------------


def test_more_calls_at_once_than_an_http_pool_holds_all_reach_the_upstream(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """The upstream client had httpx's default pool (100 connections): the 101st call at once waited
    in the gateway, its harness sent nothing at all, until a connection freed or ``timeout_s`` made
    it a 502. Many rollouts of an evaluation stream at once (a rollout may have 64 calls at once)."""
    rollouts, each = 3, 40  # 120 calls at once, 40 per rollout
    arrived: list[int] = []
    release = threading.Event()

    def answer(body: dict[str, Any]) -> Response:
        arrived.append(1)

        async def held() -> AsyncIterator[str]:
            while not release.is_set():
                await asyncio.sleep(0.05)
            for line in (
                data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]}),
                data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                "data: [DONE]\n\n",
            ):
                yield line

        return StreamingResponse(held(), media_type="text/event-stream")

    with served(upstream(answer), tmp_path, tokenizer) as gw, GatewayClient(gw.url, ADMIN) as admin:
        made = [admin.create_rollout({"prompt": "x"}, run_id="teacher") for _ in range(rollouts)]

        async def harnesses() -> list[int]:
            limits = httpx.Limits(max_connections=None)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:

                async def call(rollout: dict[str, Any]) -> int:
                    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
                    url = rollout["base_url"].rstrip("/") + "/chat/completions"
                    body = {**BODIES["chat/completions"], "stream": True}
                    reply = await client.post(url, json=body, headers=headers)
                    return reply.status_code if reply.text.strip().endswith("[DONE]") else -1

                calls = [asyncio.ensure_future(call(r)) for r in made for _ in range(each)]
                try:
                    deadline = time.monotonic() + 120  # only ends a hung test
                    while len(arrived) < rollouts * each and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                    assert len(arrived) == rollouts * each  # all of them at the upstream at once
                finally:
                    release.set()
                return list(await asyncio.gather(*calls))

        assert asyncio.run(harnesses()) == [200] * (rollouts * each)
        assert sum(len(gw.store.list_calls(r["rollout_id"])) for r in made) == rollouts * each


def test_a_tool_call_streamed_in_many_pieces_is_received_and_recorded_whole(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """A file written through a tool call comes as thousands of argument deltas; each was added to
    a string (copied whole at every delta: 128 k deltas held the event loop 16 s). Buffered now: the
    call must still arrive and be recorded whole, in every API."""
    arguments = json.dumps({"path": "notes.txt", "text": "caf\u00e9 \U0001f600 line\n" * 150})
    pieces = [arguments[i : i + 3] for i in range(0, len(arguments), 3)]

    def answer(body: dict[str, Any]) -> Response:
        head = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "write", "arguments": ""},
        }
        deltas = [{"role": "assistant", "tool_calls": [head]}]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in pieces]
        return stream_of(deltas, finish="tool_calls")

    with served(upstream(answer), tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            reply = gw.post(path, {**body, "stream": True})
            assert reply.status_code == 200 and LAST_EVENT[path] in reply.text, (path, reply.text[-300:])
        calls = gw.calls()
        assert [c.finish_reason for c in calls] == ["tool_calls"] * 3
        for call in calls:
            (recorded,) = call.response["tool_calls"]
            assert recorded["function"]["name"] == "write", call.api
            assert json.loads(recorded["function"]["arguments"]) == json.loads(arguments), call.api


def test_a_harness_that_leaves_before_the_upstream_answers_cancels_its_stream(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """A streamed call waited for the upstream's first answer (its status and headers) without
    watching its harness: a harness that gave up (a read timeout, then the SDK's retry) left its
    request open on the upstream for up to ``timeout_s``, one more per retry, on an upstream already
    too slow. Now it is cancelled as a whole answer's is, and counted as dropped."""
    left: dict[str, threading.Event] = {}

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        gone = left.setdefault(body["messages"][-1]["content"], threading.Event())
        while not await request.is_disconnected():  # stalled: no status, no headers
            await asyncio.sleep(0.05)
        gone.set()
        return Response(status_code=204)

    stalled = Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )
    with served(stalled, tmp_path, tokenizer) as gw:
        for path, body in BODIES.items():
            question = f"{path}: What is in a.txt?"
            body = json.loads(json.dumps(body).replace("What is in a.txt?", question))
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{gw.base}/{path}", json={**body, "stream": True}, headers=gw.headers, timeout=1)
            assert left.setdefault(question, threading.Event()).wait(30), path  # only ends a hung test
        assert gw.calls() == []


# -- a stream of keep-alives only ---------------------------------------------------------------


def test_a_stream_of_keep_alives_alone_ends_after_timeout_s(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """An upstream that, once begun, sent only keep-alives (SSE comments; Anthropic's ``ping``) was
    never done: each began the read timeout again, the gateway kept the harness alive too, and the
    call waited for ever. After ``timeout_s`` of nothing else it is now the stream's error event."""

    def answer(body: dict[str, Any]) -> Response:
        async def forever() -> AsyncIterator[str]:
            yield data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]})
            while True:
                yield ": still thinking\n\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(forever(), media_type="text/event-stream")

    with served(upstream(answer), tmp_path, tokenizer, timeout_s=1.0) as gw:
        for path, body in BODIES.items():
            last = read_for(gw, path, {**body, "stream": True}, 60)  # only ends a hung test
            assert "only keep-alives" in last, (path, last)
        assert gw.calls() == []


@pytest.mark.parametrize("beat", [{"choices": []}, {"choices": [{"index": 0, "delta": {}}]}])
def test_a_stream_of_empty_chunks_alone_ends_after_timeout_s(
    tmp_path: Path, tokenizer: PolicyTokenizer, beat: dict[str, Any]
) -> None:
    """An upstream that, once begun, sent only chunks without any of the answer (no choices, an
    empty delta) was never quiet: each chunk began ``timeout_s`` again, and the Messages and Responses
    streams' own keep-alives kept the harness waiting for ever. Such chunks are keep-alives now."""

    def answer(body: dict[str, Any]) -> Response:
        async def forever() -> AsyncIterator[str]:
            yield data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]})
            while True:
                yield data(beat)
                await asyncio.sleep(0.05)

        return StreamingResponse(forever(), media_type="text/event-stream")

    with served(upstream(answer), tmp_path, tokenizer, timeout_s=1.0) as gw:
        for path, body in BODIES.items():
            last = read_for(gw, path, {**body, "stream": True}, 20)  # only ends a hung test
            assert "only keep-alives" in last, (path, last)
        assert gw.calls() == []


def test_a_native_stream_of_pings_alone_ends_after_timeout_s(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    def answer(body: dict[str, Any]) -> Response:
        message = {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "u"}
        start = {
            "type": "message_start",
            "message": {**message, "usage": {"input_tokens": 1, "output_tokens": 0}},
        }

        async def forever() -> AsyncIterator[str]:
            yield f"event: message_start\ndata: {json.dumps(start)}\n\n"
            while True:
                yield 'event: ping\ndata: {"type": "ping"}\n\n'
                await asyncio.sleep(0.05)

        return StreamingResponse(forever(), media_type="text/event-stream")

    with served(upstream(answer), tmp_path, tokenizer, api="native", timeout_s=1.0) as gw:
        last = read_for(gw, "messages", {**BODIES["messages"], "stream": True}, 60)
        assert "only keep-alives" in last, last
        assert gw.calls() == []


def read_for(gw: Served, path: str, body: dict[str, Any], seconds: float) -> str:
    """The last ``data:`` line of a stream read for at most ``seconds``."""
    last = ""
    deadline = time.monotonic() + seconds
    with httpx.stream("POST", f"{gw.base}/{path}", json=body, headers=gw.headers, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:"):
                last = line
            if time.monotonic() > deadline:
                break
    return last


# -- the key as the environment gives it -------------------------------------------------------


@pytest.mark.parametrize("bad_key", ["sk-teach\u00e9r-KEY01", "sk-teacher-KEY01\n", "sk-teacher-KEY01\r\n"])
def test_a_key_no_header_can_carry_is_named_at_start_up(
    bad_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-ASCII character in the key was a ``UnicodeEncodeError`` traceback when the gateway
    started; a line end (a key file read whole) made it say the upstream was not reachable. Both are
    now a ``ConfigError`` (exit 2) naming ``engine.teacher.api_key_env``, the key not shown."""
    from harnessrl.config import EngineConfig, TeacherConfig
    from harnessrl.errors import ConfigError
    from harnessrl.gateway.server import build_teacher

    with serve_in_thread(upstream(lambda body: whole({"content": "ok"}))) as up_url:
        cfg = EngineConfig(
            model="scripted:x.json",
            teacher=TeacherConfig(base_url=f"{up_url}/v1", model="u", api_key_env="HRL_HUNT_TEACHER_KEY"),
        )
        monkeypatch.setenv("HRL_HUNT_TEACHER_KEY", bad_key)
        with pytest.raises(ConfigError, match="engine.teacher.api_key_env") as refused:
            build_teacher(cfg)
        assert bad_key.strip() not in str(refused.value) and "KEY01" not in str(refused.value)
        monkeypatch.setenv("HRL_HUNT_TEACHER_KEY", KEY)  # control: a key as it should be starts
        teacher = build_teacher(cfg)
        assert teacher is not None
        asyncio.run(teacher.aclose())
