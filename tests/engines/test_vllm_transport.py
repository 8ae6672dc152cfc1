"""How ``VLLMEngine`` talks to its server: whole answers for non-streaming callers, SSE parsed from raw
bytes, and keep-alive connections reused after a finished stream.

The server here is a small real starlette app on uvicorn (``tests.fakes.vllm_server.FakeServer``)
that records each request's ``stream`` flag and client port, and can cut its SSE body into odd
byte chunks, use CRLF line endings, and send tokens past a stop token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.fakes.vllm_server import FakeModel, FakeServer, serve_vllm

from harnessrl.engines.base import GenerationContext, SamplingParams, each_sample
from harnessrl.engines.remote import HttpUpstream, MalformedAnswer, RemoteEngineError
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.tokenizer import PolicyTokenizer

WHOLE = GenerationContext(rollout_id="r", stream=False)


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


@dataclass
class Knobs:
    """What the test server sends, and what it saw."""

    tokens: list[tuple[int, float]]
    chunk_bytes: int = 0  # >0: the SSE body is sent in pieces of this many bytes
    line_end: str = "\n"
    preamble: str = ""  # sent before the first event (comments, `event:` lines)
    done: str | None = None  # the stream's end; None: "data: [DONE]" and a blank line
    seen: list[tuple[bool, int]] = field(default_factory=list)  # (stream flag, client port) per request
    # How the sampled IDs are sent: "token_ids" (a list per choice, as with return_token_ids),
    # "names" (logprobs tokens "token_id:{id}", as with return_tokens_as_token_ids) or "text"
    # (logprobs tokens as text: a server that ignored return_tokens_as_token_ids).
    ids_as: str = "token_ids"
    # The event after the tokens' (None: none, the last token's event ends the answer). A finish
    # reason of AUTO is the one vLLM would send, as in the whole answer: "stop" when the last token is
    # one of the request's stop tokens, else "length".
    last_event: dict[str, Any] | None = field(
        default_factory=lambda: {"choices": [{"index": 0, "token_ids": [], "finish_reason": AUTO}]}
    )


AUTO = "auto"


def serve_knobs(knobs: Knobs) -> FakeServer:
    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m", "max_model_len": 4096}]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        assert request.client is not None
        knobs.seen.append((bool(body.get("stream")), request.client.port))

        def choice(tokens: list[tuple[int, float]]) -> dict[str, Any]:
            logprobs: dict[str, Any] = {"token_logprobs": [lp for _, lp in tokens]}
            if knobs.ids_as == "token_ids":
                return {"token_ids": [t for t, _ in tokens], "logprobs": logprobs}
            names = [f"token_id:{t}" if knobs.ids_as == "names" else f"t{t}" for t, _ in tokens]
            return {"logprobs": {**logprobs, "tokens": names}}

        stops = body.get("stop_token_ids") or []
        finish = "stop" if knobs.tokens and knobs.tokens[-1][0] in stops else "length"
        if not body.get("stream"):
            return JSONResponse({"choices": [choice(knobs.tokens) | {"index": 0, "finish_reason": finish}]})
        nl = knobs.line_end
        events = [json.dumps({"choices": [choice([token])]}) for token in knobs.tokens]
        if knobs.last_event is not None:
            events.append(json.dumps(knobs.last_event).replace(f'"{AUTO}"', f'"{finish}"'))
        done = f"data: [DONE]{nl}{nl}" if knobs.done is None else knobs.done
        text = knobs.preamble + "".join(f"data: {e}{nl}{nl}" for e in events) + done
        raw = text.encode()

        async def pieces() -> AsyncIterator[bytes]:
            size = knobs.chunk_bytes or len(raw)
            for i in range(0, len(raw), size):
                yield raw[i : i + size]

        return StreamingResponse(pieces(), media_type="text/event-stream")

    app = Starlette(
        routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    )
    return FakeServer(app, FakeModel([0])).start()


@pytest.fixture
def knobs_server(tokenizer: PolicyTokenizer) -> Iterator[tuple[Knobs, VLLMEngine]]:
    text_ids = tokenizer.encode("Grüße, 世界 🚀 done")
    stop = tokenizer.stop_token_ids[0]
    knobs = Knobs(tokens=[(t, -0.5 - i / 100) for i, t in enumerate([*text_ids, stop])])
    server = serve_knobs(knobs)
    yield knobs, VLLMEngine(server.url, tokenizer)
    server.kill()


def _run(engine: VLLMEngine, calls: list[tuple[SamplingParams, GenerationContext | None]]) -> list[list[Any]]:
    async def go() -> list[list[Any]]:
        await engine.start()
        try:
            out = []
            for params, context in calls:
                out.append(
                    [
                        (s.token_id, s.logprob)
                        async for s in each_sample(engine.generate([1, 2, 3], params, context))
                    ]
                )
            return out
        finally:
            await engine.aclose()

    return asyncio.run(go())


def test_non_streaming_caller_gets_one_whole_answer_with_the_same_samples(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer
) -> None:
    knobs, engine = knobs_server
    params = SamplingParams(max_tokens=100, stop_token_ids=tokenizer.stop_token_ids)
    streamed, whole, default = _run(
        engine, [(params, None), (params, WHOLE), (params, GenerationContext("r"))]
    )
    assert streamed == whole == default == [(t, pytest.approx(lp)) for t, lp in knobs.tokens]
    assert [stream for stream, _ in knobs.seen] == [True, False, True]


@pytest.mark.parametrize("context", [None, WHOLE], ids=["streamed", "whole"])
def test_sampled_ids_come_from_token_id_names_when_the_server_sends_no_token_ids(
    knobs_server: tuple[Knobs, VLLMEngine], context: GenerationContext | None
) -> None:
    knobs, engine = knobs_server
    knobs.ids_as = "names"
    (got,) = _run(engine, [(SamplingParams(max_tokens=100), context)])
    assert got == [(t, pytest.approx(lp)) for t, lp in knobs.tokens]


def test_a_logprobs_token_that_names_no_id_is_an_error_that_says_why(
    knobs_server: tuple[Knobs, VLLMEngine],
) -> None:
    knobs, engine = knobs_server
    knobs.ids_as = "text"
    with pytest.raises(RemoteEngineError) as err:
        _run(engine, [(SamplingParams(max_tokens=100), WHOLE)])
    assert not err.value.retryable and "return_tokens_as_token_ids" in str(err.value)


def test_sse_is_parsed_across_odd_chunks_crlf_and_comments(knobs_server: tuple[Knobs, VLLMEngine]) -> None:
    knobs, engine = knobs_server
    knobs.chunk_bytes, knobs.line_end = 7, "\r\n"
    knobs.preamble = ": keep-alive\r\n\r\nevent: message\r\n"
    (got,) = _run(engine, [(SamplingParams(max_tokens=100), None)])
    assert got == [(t, pytest.approx(lp)) for t, lp in knobs.tokens]


def test_connection_is_reused_after_a_stream_ends_with_a_stop_token(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer
) -> None:
    knobs, engine = knobs_server
    params = SamplingParams(max_tokens=100, stop_token_ids=tokenizer.stop_token_ids)
    _run(engine, [(params, None)] * 3 + [(params, WHOLE)])
    ports = {port for _, port in knobs.seen}
    assert len(knobs.seen) == 4 and len(ports) == 1  # one keep-alive connection for every call


def test_tokens_past_a_stop_token_are_not_yielded(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer
) -> None:
    knobs, engine = knobs_server
    stop = tokenizer.stop_token_ids[0]
    knobs.tokens = [(5, -0.1), (stop, -0.2), (6, -0.3), (7, -0.4)]
    params = SamplingParams(max_tokens=100, stop_token_ids=(stop,))
    streamed, whole = _run(engine, [(params, None), (params, WHOLE)])
    assert [t for t, _ in streamed] == [t for t, _ in whole] == [5, stop]


def test_stream_end_without_done_is_retryable_and_a_last_line_without_newline_counts(
    knobs_server: tuple[Knobs, VLLMEngine],
) -> None:
    knobs, engine = knobs_server
    knobs.done = "data: [DONE]"  # no newline after it: still a complete stream
    (got,) = _run(engine, [(SamplingParams(max_tokens=100), None)])
    assert got == [(t, pytest.approx(lp)) for t, lp in knobs.tokens]
    knobs.done = ""  # the server went away between events, before the answer's finish reason
    knobs.last_event = None
    with pytest.raises(RemoteEngineError) as err:
        _run(engine, [(SamplingParams(max_tokens=100), None)])
    assert err.value.retryable and "[DONE]" in str(err.value)


@pytest.mark.parametrize("ended_by", ["stop token", "length", "budget"])
def test_a_stream_cut_after_its_answer_was_whole_is_that_answer(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer, ended_by: str
) -> None:
    # The server goes away after the event that ends the answer (its stop token, the finish reason
    # "length", or the last token of max_tokens) but before "data: [DONE]": the answer is whole and is
    # the call's, not an error (which
    # a pool would continue past the answer's end, and a lone engine would fail a finished call with).
    knobs, engine = knobs_server
    stop = tokenizer.stop_token_ids[0]
    stops = (stop,) if ended_by == "stop token" else ()
    if ended_by != "stop token":
        knobs.tokens = knobs.tokens[:-1]  # no stop token: the last event says "length"
    if ended_by == "budget":
        knobs.last_event = None  # no finish reason, but every token of max_tokens came
    knobs.done = ""
    budget = len(knobs.tokens) if ended_by == "budget" else 100
    params = SamplingParams(max_tokens=budget, stop_token_ids=stops)
    (got,) = _run(engine, [(params, None)])
    assert got == [(t, pytest.approx(lp)) for t, lp in knobs.tokens]
    # Control: the same cut before the answer ended (no finish reason sent) is still an error.
    knobs.last_event = None
    with pytest.raises(RemoteEngineError) as err:
        _run(engine, [(SamplingParams(max_tokens=100), None)])
    assert err.value.retryable and "[DONE]" in str(err.value)


def test_a_stop_token_past_the_budget_is_still_a_malformed_answer(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer
) -> None:
    # Only a stop token that was passed on makes the answer whole: one that came past max_tokens is
    # refused (never an answer ended quietly without its last batch).
    knobs, engine = knobs_server
    stop = tokenizer.stop_token_ids[0]
    knobs.tokens, knobs.done = [(5, -0.1), (6, -0.2), (stop, -0.3)], ""
    with pytest.raises(MalformedAnswer, match="max_tokens=2"):
        _run(engine, [(SamplingParams(max_tokens=2, stop_token_ids=(stop,)), None)])


def test_vllm_fake_whole_answer_matches_stream(tokenizer: PolicyTokenizer) -> None:
    """Against the shared vLLM fake: the non-streamed answer gives the same samples, stop and budget."""
    reply = tokenizer.encode("Hello from the fake server!<|im_end|>")
    with serve_vllm(reply) as server:
        engine = VLLMEngine(server.url, tokenizer)
        stop = SamplingParams(max_tokens=100, stop_token_ids=(reply[-1],))
        short = SamplingParams(max_tokens=3)
        got = _run(engine, [(stop, None), (stop, WHOLE), (short, None), (short, WHOLE)])
    ids = [[t for t, _ in samples] for samples in got]
    assert ids == [reply, reply, reply[:3], reply[:3]]
    assert got[0] == got[1] and got[2] == got[3]
    # The IDs came as logprobs token names: the server was never asked to echo the prompt back.
    sent = server.fake.requests
    assert all(r["return_tokens_as_token_ids"] is True and "return_token_ids" not in r for r in sent)


def test_error_object_in_a_whole_answer_is_raised(tokenizer: PolicyTokenizer) -> None:
    reply = tokenizer.encode("x<|im_end|>")
    with serve_vllm(reply) as server:
        server.fake.fail_with = [503]
        engine = VLLMEngine(server.url, tokenizer)
        with pytest.raises(RemoteEngineError) as err:
            _run(engine, [(SamplingParams(max_tokens=4), WHOLE)])
    assert err.value.status == 503 and err.value.retryable


def test_proxy_and_netrc_come_from_the_environment_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # The session reads them when it is made (aiohttp's trust_env would, per request, in threads).
    from yarl import URL

    from harnessrl.engines.remote import _env_settings

    netrc = tmp_path / "netrc"
    netrc.write_text("machine upstream.example login me password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    monkeypatch.delenv("no_proxy", raising=False)
    proxy, auth = _env_settings(URL("http://upstream.example:8000"), netrc=True)
    assert proxy["proxy"] == URL("http://proxy.example:3128")
    assert auth is not None and (auth.login, auth.password) == ("me", "secret")
    proxy, auth = _env_settings(URL("http://127.0.0.1:8000"), netrc=True)
    assert proxy == {} and auth is None  # NO_PROXY exempts the host; no netrc entry for it
    assert _env_settings(URL("http://upstream.example:8000"), netrc=False)[1] is None  # an API key wins


@pytest.mark.parametrize("context", [WHOLE, GenerationContext("r")], ids=["whole", "streamed"])
def test_a_proxy_in_the_environment_is_used_for_generation(
    tokenizer: PolicyTokenizer, monkeypatch: pytest.MonkeyPatch, context: GenerationContext
) -> None:
    # HTTP_PROXY pointing at a real (fake) vLLM server: requests to an unreachable host arrive there.
    # Streamed too: the proxied stream takes the stream interval the engine passes on (it was a
    # TypeError on every streamed call through a proxy).
    knobs = Knobs(tokens=[(5, -0.5), (6, -0.25)])
    with serve_knobs(knobs) as server:
        monkeypatch.setenv("HTTP_PROXY", server.url)
        monkeypatch.delenv("http_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)

        async def main() -> list[int]:
            engine = VLLMEngine("http://upstream.invalid:9", tokenizer)
            await engine.start()
            try:
                params = SamplingParams(max_tokens=4, stop_token_ids=())
                return [s.token_id async for s in each_sample(engine.generate([1, 2], params, context))]
            finally:
                await engine.aclose()

        assert asyncio.run(main()) == [5, 6]
    assert [stream for stream, _ in knobs.seen] == [context.stream]


def test_whole_answer_generation_matches_the_token_by_token_one(
    knobs_server: tuple[Knobs, VLLMEngine], tokenizer: PolicyTokenizer
) -> None:
    # A non-streamed answer is read whole (``VLLMEngine.generate_whole``); tokens the server
    # sends past the stop token are dropped exactly as the streaming path drops them.
    from harnessrl.gateway.pipeline.generation import Generation

    knobs, engine = knobs_server
    stop = tokenizer.stop_token_ids[0]
    knobs.tokens = [*knobs.tokens, (7, -0.1), (stop, -0.2)]  # past the first stop token
    params = SamplingParams(max_tokens=100, stop_token_ids=tokenizer.stop_token_ids)

    async def go() -> list[Generation]:
        await engine.start()
        try:
            return [
                await Generation(engine, [1, 2, 3], params, context=context).run()
                for context in (WHOLE, GenerationContext("r"))
            ]
        finally:
            await engine.aclose()

    whole, streamed = asyncio.run(go())
    first_stop = knobs.tokens.index((stop, knobs.tokens[-3][1])) + 1
    assert whole.token_ids == streamed.token_ids == [t for t, _ in knobs.tokens[:first_stop]]
    assert whole.logprobs == pytest.approx(streamed.logprobs)
    assert whole.text == streamed.text == "Grüße, 世界 🚀 done"
    assert whole.finish_reason == streamed.finish_reason == "stop"
    assert whole.first_token_at is not None and whole.finished_at is not None
    assert [s for s, _ in knobs.seen] == [False, True]


class HangUpServer:
    """A raw HTTP/1.1 server that answers ``answers_per_connection`` requests on a connection and then
    closes it on reading the next one, unanswered: what a keep-alive connection the server has just
    timed out looks like to a client that writes into it."""

    def __init__(self, answers_per_connection: int):
        self.answers_per_connection = answers_per_connection
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests += 1
                if answered == self.answers_per_connection:
                    return  # hang up without an answer
                answered += 1
                body = b'{"ok": true}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
                writer.write(b"content-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


def test_a_pooled_connection_the_server_closed_is_replaced_not_reported_as_a_failure() -> None:
    """A call on a keep-alive connection the server hangs up on is sent again on a new connection:
    reported as a failure, the pool would mark a live replica down (a CI failover run once sent all
    its retries to the dead replica that way)."""

    async def go() -> HangUpServer:
        server = HangUpServer(answers_per_connection=1)
        upstream = HttpUpstream(await server.start())
        try:
            for _ in range(3):
                assert await upstream.request_json("POST", "/v1/x", json_body={"a": 1}) == {"ok": True}
        finally:
            await upstream.aclose()
            assert server.server is not None
            server.server.close()
        return server

    server = asyncio.run(go())
    # Each call after the first met a closed connection once: 5 requests over 3 connections.
    assert (server.requests, server.connections) == (5, 3)


def test_a_server_that_always_hangs_up_is_an_error_after_one_new_connection() -> None:
    async def go() -> HangUpServer:
        server = HangUpServer(answers_per_connection=0)
        upstream = HttpUpstream(await server.start())
        try:
            with pytest.raises(RemoteEngineError) as caught:
                async with upstream.stream_sse("/v1/completions", {"a": 1}) as events:
                    [event async for event in events]
            assert caught.value.retryable
        finally:
            await upstream.aclose()
            assert server.server is not None
            server.server.close()
        return server

    server = asyncio.run(go())
    assert (server.requests, server.connections) == (2, 2)
