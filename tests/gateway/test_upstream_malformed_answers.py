"""An inference server's malformed answer fails the call and is never recorded, end to end.

The gateway is served as a user starts it over a remote engine (``create_app`` with an
``EnginePool([VLLMEngine(url)])`` or ``[SGLangEngine(url)]``, no retries), on 127.0.0.1, and called
over HTTP. Its upstream is a raw-bytes server (``RawUpstream``: ``asyncio.start_server`` in a thread)
that answers the discovery routes normally and, on the generation route, writes whatever bytes the
test scripted: NaN and null logprobs, answers cut short (no finish reason, ``{}``, SGLang's abort),
more tokens than asked, several choices, IDs outside the vocabulary, negative, float or
disagreeing IDs. Each must come back as a 502 in the API's error shape (503 for an abort), not as an
answer and not as a 500; and after them a well-formed answer is the only call recorded, with the
finish reason the server gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.pool import EnginePool
from harnessrl.engines.sglang import SGLangEngine
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "k"
# Token IDs of the tiny tokenizer (4096 IDs; 0 and 2 are its stop tokens).
WORDS = [300, 301, 302, 303, 304, 305, 306, 307, 308, 309]
STOP = 2

# What the generation route answers: (request body) -> the raw bytes of a whole HTTP response.
Answer = Callable[[dict[str, Any]], bytes]


def http(body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (content_type, len(body))
    return head + body


def sse(*events: bytes | dict[str, Any]) -> bytes:
    """An SSE body of ``events`` (raw bytes are sent as they are: NaN is no JSON a dict can hold)."""
    lines = [e if isinstance(e, bytes) else json.dumps(e).encode() for e in events]
    return http(
        b"".join(b"data: %s\n\n" % line for line in lines) + b"data: [DONE]\n\n", b"text/event-stream"
    )


class RawUpstream:
    """A vLLM- and SGLang-shaped server on 127.0.0.1: the discovery routes answer as a healthy server
    does, and the generation routes (``/v1/completions``, ``/generate``) with ``answer``'s bytes,
    exactly (set ``answer`` to change what the next call gets)."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.url = ""

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _route(self, path: str, body: bytes) -> bytes:
        path = path.split("?")[0]
        if path in ("/v1/completions", "/generate"):
            return self.answer(json.loads(body))
        if path == "/v1/models":
            return http(json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode())
        if path == "/server_info":
            mode = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}
            return http(json.dumps(mode).encode())
        if path == "/get_model_info":
            return http(b'{"model_path": "m"}')
        if path == "/get_server_info":
            return http(b'{"context_length": 4096}')
        return http(b"{}")  # /health and the like

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (
                        int(v)
                        for k, _, v in (x.partition(":") for x in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                writer.write(self._route(path, await reader.readexactly(length)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


# -- vLLM's shapes ---------------------------------------------------------------------------------


def choice(ids: list[int], logprobs: list[Any], finish: str | None = None) -> dict[str, Any]:
    names = [f"token_id:{i}" for i in ids]
    return {
        "index": 0,
        "text": "",
        "logprobs": {"tokens": names, "token_logprobs": logprobs},
        "finish_reason": finish,
    }


def vllm_answer(ids: list[int], finish: str | None, logprobs: list[Any] | None = None) -> Answer:
    """What vLLM sends for ``ids``: one whole answer, or one event per token and one with the finish."""
    lps = [-0.5] * len(ids) if logprobs is None else logprobs

    def answer(body: dict[str, Any]) -> bytes:
        if not body.get("stream"):
            return http(json.dumps({"choices": [choice(ids, lps, finish)]}).encode())
        events = [{"choices": [choice([i], [lp])]} for i, lp in zip(ids, lps, strict=True)]
        return sse(*events, {"choices": [choice([], [], finish)]})

    return answer


def answer_of(raw: bytes | dict[str, Any]) -> Answer:
    """The same answer whole, or streamed as one event (a vLLM chunk has a whole answer's shape)."""
    data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    return lambda body: sse(data) if body.get("stream") else http(data)


# -- the gateway -----------------------------------------------------------------------------------


class Stack:
    """A gateway over one engine reaching ``upstream``, and a rollout to call it with."""

    def __init__(self, gateway_url: str, store: SQLiteStore, upstream: RawUpstream):
        self.store = store
        self.upstream = upstream
        self.admin = GatewayClient(gateway_url, ADMIN)
        self.rollout = self.admin.create_rollout({"prompt": "t"})
        self.http = httpx.Client(
            base_url=self.rollout["base_url"],
            headers={
                "authorization": f"Bearer {self.rollout['api_key']}",
                "x-api-key": self.rollout["api_key"],
            },
            timeout=30,
        )

    def chat(self, *, stream: bool = False, max_tokens: int = 8) -> httpx.Response:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        return self.http.post("/chat/completions", json={**body, "stream": stream})

    def messages(self, *, max_tokens: int = 8) -> httpx.Response:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        return self.http.post("/messages", json=body, headers={"anthropic-version": "2023-06-01"})

    def calls(self) -> list[Any]:
        return self.store.list_calls(self.rollout["rollout_id"])

    def recorded_after_a_good_call(self, good: Answer, *, max_tokens: int = 8) -> Any:
        """Serve ``good`` and make one call: it must be the only call recorded (so the calls before it
        were not). Returns it."""
        self.upstream.answer = good
        answered = self.chat(max_tokens=max_tokens)
        assert answered.status_code == 200, answered.text
        deadline = time.monotonic() + 60  # a wait, not a timing
        while not self.calls():
            assert time.monotonic() < deadline, "the good call was never recorded"
            time.sleep(0.02)
        [call] = self.calls()
        return call


@pytest.fixture
def make_stack(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[Callable[[str, Answer], Stack]]:
    with contextlib.ExitStack() as stack:

        def make(kind: str, answer: Answer) -> Stack:
            upstream = stack.enter_context(RawUpstream(answer))
            engine_cls = VLLMEngine if kind == "vllm" else SGLangEngine
            engine = EnginePool([engine_cls(upstream.url, tokenizer)], health_interval_s=0, max_retries=0)
            store = SQLiteStore(tmp_path / f"{kind}.db")
            stack.callback(store.close)
            url = stack.enter_context(
                serve_in_thread(create_app(GatewayConfig(admin_key=ADMIN), store, engine))
            )
            made = Stack(url, store, upstream)
            stack.callback(made.http.close)
            stack.callback(made.admin.close)
            return made

        yield make


def assert_upstream_error(response: httpx.Response, status: int = 502, code: str = "upstream_error") -> None:
    """The OpenAI error shape, a 502 (or ``status``): not an answer, and not a 500."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("api_error", code)


def assert_failed_stream(response: httpx.Response) -> None:
    """A streamed call whose answer failed after its 200 head went out: its last event is the error,
    with no ``[DONE]`` and no finish reason."""
    assert response.status_code == 200, response.text
    assert "data: [DONE]" not in response.text and '"finish_reason":"' not in response.text
    error = json.loads(response.text.rsplit("data: ", 1)[1])["error"]
    assert (error["type"], error["code"]) == ("api_error", "upstream_error")


# -- 1. logprobs that are not a sampled token's ----------------------------------------------------

BAD_LOGPROBS = {
    # NaN and -Infinity are not JSON; the lenient parser the engine fell back to took them, and they
    # were recorded.
    "nan": answer_of(
        b'{"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:300"], "token_logprobs": [NaN]},'
        b' "finish_reason": "length"}]}'
    ),
    "infinity": answer_of(
        b'{"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:300"], "token_logprobs": [-Infinity]},'
        b' "finish_reason": "length"}]}'
    ),
    # A null logprob was recorded as 0.0: a token the policy was certain of.
    "null": vllm_answer([300], "length", [None]),
    "positive": vllm_answer([300], "length", [0.7]),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("bad", BAD_LOGPROBS.values(), ids=BAD_LOGPROBS.keys())
def test_a_bad_logprob_fails_the_call_and_is_not_recorded(
    make_stack: Callable[[str, Answer], Stack], bad: Answer, stream: bool
) -> None:
    stack = make_stack("vllm", bad)
    (assert_failed_stream if stream else assert_upstream_error)(stack.chat(stream=stream, max_tokens=1))
    call = stack.recorded_after_a_good_call(vllm_answer([301], "length", [-0.25]), max_tokens=1)
    assert (call.response_token_ids, call.response_logprobs) == ([301], [-0.25])


# -- 2. answers cut short ---------------------------------------------------------------------------


def test_a_stream_without_a_finish_reason_fails_and_length_is_recorded_only_when_the_server_said_it(
    make_stack: Callable[[str, Answer], Stack],
) -> None:
    # [DONE] after 2 of 8 tokens and no finish reason: was recorded as a 2-token "length" answer.
    stack = make_stack("vllm", vllm_answer(WORDS[:2], None))
    assert_failed_stream(stack.chat(stream=True))
    assert_upstream_error(stack.chat(stream=False))  # the same, as one whole answer
    call = stack.recorded_after_a_good_call(vllm_answer(WORDS[:8], "length"))
    assert (call.finish_reason, call.response_token_ids) == ("length", WORDS[:8])
    # The whole budget sent and no finish reason: that answer is whole, and is "length".
    stack.upstream.answer = vllm_answer(WORDS[:4], None)
    for stream in (False, True):
        assert stack.chat(stream=stream, max_tokens=4).status_code == 200
    deadline = time.monotonic() + 60  # a wait, not a timing
    while len(stack.calls()) < 3:
        assert time.monotonic() < deadline, "the whole-budget calls were never recorded"
        time.sleep(0.02)
    assert sorted((c.finish_reason, len(c.response_token_ids)) for c in stack.calls()) == [
        ("length", 4),
        ("length", 4),
        ("length", 8),
    ]


@pytest.mark.parametrize(
    "cut",
    [answer_of({}), vllm_answer(WORDS[:3], "stop"), vllm_answer(WORDS[:3], "tool_calls")],
    ids=["empty_answer", "stop_without_a_stop_token", "unknown_finish_reason"],
)
def test_an_answer_that_does_not_say_how_it_ended_is_not_recorded(
    make_stack: Callable[[str, Answer], Stack], cut: Answer
) -> None:
    stack = make_stack("vllm", cut)
    assert_upstream_error(stack.chat())
    anthropic = stack.messages()  # Anthropic's error shape
    assert anthropic.status_code == 502, anthropic.text
    assert (anthropic.json()["type"], anthropic.json()["error"]["type"]) == ("error", "api_error")
    call = stack.recorded_after_a_good_call(vllm_answer([*WORDS[:3], STOP], "stop"))
    assert (call.finish_reason, call.response_token_ids) == ("stop", [*WORDS[:3], STOP])


def sglang_answer(ids: list[int], finish: dict[str, Any] | None, logprobs: list[Any] | None = None) -> Answer:
    """SGLang's cumulative stream of ``ids``, its last event carrying ``finish``."""
    lps = [-0.5] * len(ids) if logprobs is None else logprobs

    def event(n: int, done: bool) -> dict[str, Any]:
        entries = [[lp, i, None] for i, lp in zip(ids[:n], lps[:n], strict=True)]
        meta = {"output_token_logprobs": entries, "finish_reason": finish if done else None}
        return {"text": "", "output_ids": ids[:n], "meta_info": meta}

    return lambda body: sse(*[event(n, False) for n in range(1, len(ids) + 1)], event(len(ids), True))


def test_sglang_abort_and_a_missing_finish_reason_are_not_recorded(
    make_stack: Callable[[str, Answer], Stack],
) -> None:
    # What SGLang's FINISH_ABORT.to_json() gives (a /pause_generation with mode abort, as a weight
    # update sends): was recorded as a "length" answer.
    abort = {"type": "abort", "message": "Abort in waiting queue", "status_code": 503, "err_type": None}
    stack = make_stack("sglang", sglang_answer(WORDS[:3], abort))
    assert_upstream_error(stack.chat(), 503, "engine_aborted")
    stack.upstream.answer = sglang_answer(WORDS[:3], None)
    assert_upstream_error(stack.chat())
    stack.upstream.answer = sglang_answer(WORDS[:2], {"type": "length", "length": 2}, [-0.5, None])
    assert_upstream_error(stack.chat(max_tokens=2))  # a null logprob, as with vLLM
    call = stack.recorded_after_a_good_call(sglang_answer(WORDS[:8], {"type": "length", "length": 8}))
    assert (call.finish_reason, call.response_token_ids) == ("length", WORDS[:8])


# -- 3. token counts and IDs ------------------------------------------------------------------------


def with_token_ids(ids: list[Any], names: list[int] | None = None) -> Answer:
    """A whole answer carrying ``token_ids`` (as vLLM's ``return_token_ids`` does)."""
    one = choice(names or [], [-0.5] * len(ids), "length")
    if names is None:
        del one["logprobs"]["tokens"]
    return answer_of({"choices": [{**one, "token_ids": ids}]})


BAD_TOKENS = {
    "more_than_max_tokens": vllm_answer(WORDS[:10], "length"),  # max_tokens is 8
    "two_choices": answer_of(
        {
            "choices": [
                choice(WORDS[:4], [-0.5] * 4, "length"),
                {**choice(WORDS[4:8], [-0.5] * 4, "length"), "index": 1},
            ]
        }
    ),
    "out_of_vocabulary": vllm_answer([300, 999_999], "length"),
    "negative": with_token_ids([300, -5]),
    "float": with_token_ids([300, 7.9]),
    "bool": with_token_ids([300, True]),
    "disagreeing_with_names": with_token_ids([300, 301], names=[300, 302]),
    # token_logprobs that float() refuses: a ValueError escaped as a 500 internal_error.
    "text_logprob": answer_of(
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [300],
                    "logprobs": {"token_logprobs": ["x"]},
                    "finish_reason": "length",
                }
            ]
        }
    ),
}


@pytest.mark.parametrize("bad", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_token_ids_and_counts_the_request_could_not_have_sampled_fail_the_call(
    make_stack: Callable[[str, Answer], Stack], bad: Answer
) -> None:
    stack = make_stack("vllm", bad)
    assert_upstream_error(stack.chat(max_tokens=8))
    assert_failed_stream(stack.chat(stream=True, max_tokens=8))
    call = stack.recorded_after_a_good_call(with_token_ids(WORDS[:8], names=WORDS[:8]))
    assert (call.finish_reason, call.response_token_ids) == ("length", WORDS[:8])


# -- the open health answer names no inference server ------------------------------------------------


def test_open_health_names_no_inference_server(make_stack: Callable[[str, Answer], Stack]) -> None:
    """``/api/health`` is open (a harness in its sandbox reaches it too); the engine's status named
    the vLLM servers (the pool's replicas by URL), which a harness could then call directly. Without
    the admin key it says only whether the gateway is healthy; the admin sees the engine's status."""
    stack = make_stack("vllm", vllm_answer(WORDS[:2], "stop"))
    base = stack.admin.base_url
    for headers in ({}, {"authorization": f"Bearer {stack.rollout['api_key']}"}):
        health = httpx.get(f"{base}/api/health", headers=headers, timeout=30)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert "engine" not in health.json()
        assert stack.upstream.url not in health.text and "127.0.0.1" not in health.text
    # Control: the admin's answer has the engine's status, replicas by URL.
    replicas = stack.admin.health()["engine"]["replicas"]
    assert [r["name"] for r in replicas] == [stack.upstream.url]
