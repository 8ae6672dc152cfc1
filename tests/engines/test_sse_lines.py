"""``sse.SseLines`` on long lines: a line fed in many pieces is parsed exactly (the pieces are joined
once, when it ends), and a line that grows past the cap is refused, as a retryable error when it
comes from a server, instead of filling the gateway's memory. And ``sse.loads`` refuses what is not
JSON but Python's parser takes (``NaN``, ``Infinity``): a logprob must never be read as one."""

from __future__ import annotations

import json

import pytest
from tests.engines.test_http_client import Request, run, serve

from harnessrl.engines.remote import HttpUpstream, RemoteEngineError
from harnessrl.engines.sse import MAX_LINE_BYTES, LineTooLong, SseLines, loads, parse_events


def feed_all(lines: SseLines, body: bytes, size: int) -> list[bytes]:
    payloads: list[bytes] = []
    for i in range(0, len(body), size):
        payloads += lines.feed(body[i : i + size])
    return payloads


@pytest.mark.parametrize("size", [1, 7, 4096, 65536])
def test_a_long_line_fed_in_many_pieces_is_parsed_exactly(size: int) -> None:
    length = min(3_000_000, 2000 * size)  # at most ~2000 pieces: small reads get a shorter line
    text = "".join(chr(0x41 + i % 26) for i in range(length))
    event = json.dumps({"text": text, "ids": list(range(1000))}).encode()
    body = b": comment\r\ndata: " + event + b'\r\n\r\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
    lines = SseLines()
    payloads = feed_all(lines, body, size)
    assert payloads == [event, b'{"n": 2}'] and lines.finish()
    assert parse_events(payloads)[0]["text"] == text


def test_a_line_longer_than_the_cap_is_refused_and_one_at_the_cap_is_not() -> None:
    lines = SseLines(max_line_bytes=1000)
    assert feed_all(lines, b"data: " + b"x" * 994, 100) == []  # 1000 bytes pending: at the cap
    assert lines.feed(b"\n") == [b"x" * 994]
    with pytest.raises(LineTooLong):
        feed_all(lines, b"data: " + b"x" * 995, 100)
    with pytest.raises(LineTooLong):  # the rest of a piece after its last newline counts too
        SseLines(max_line_bytes=1000).feed(b"data: 1\n" + b"y" * 1001)


def test_the_default_cap_is_64_mib() -> None:
    assert MAX_LINE_BYTES == 64 * 1024 * 1024
    lines, piece = SseLines(), b"z" * 65536
    for _ in range(MAX_LINE_BYTES // len(piece)):
        assert lines.feed(piece) == []
    with pytest.raises(LineTooLong):
        lines.feed(b"z")


def test_a_server_line_past_the_cap_is_a_retryable_error() -> None:
    chunk = b"x" * (1 << 20)

    async def endless_line(request: Request) -> bool:
        await request.body()
        request.writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        request.writer.write(b"6\r\ndata: \r\n")
        try:
            for _ in range(MAX_LINE_BYTES // len(chunk) + 2):
                request.writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await request.writer.drain()
        except ConnectionError:
            pass  # the client hung up, as it should
        return False

    async def go() -> None:
        server, url = await serve(endless_line)
        upstream = HttpUpstream(url)
        with pytest.raises(RemoteEngineError) as caught:
            async with upstream.stream_sse("/v1/completions", {}) as batches:
                [batch async for batch in batches]
        await upstream.aclose()
        server.close()
        assert caught.value.retryable and "grew past" in str(caught.value)

    run(go)


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json(constant: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"token_logprobs": [' + constant + b"]}")
    assert loads(b'{"a": "\\ud800"}') == {"a": "\ud800"}  # what orjson alone refuses is still read


@pytest.mark.parametrize("done", [b"data: [DONE]", b"data:[DONE]", b"data:  [DONE] \r"])
def test_a_last_done_line_without_its_newline_ends_the_stream_as_with_it(done: bytes) -> None:
    # ``feed`` reads a "data:" line's payload stripped, so "data:[DONE]\n" ends a stream; the same
    # line as the body's last bytes, with no newline after it, must too (not "ended without [DONE]").
    with_newline = SseLines()
    assert with_newline.feed(b'data: {"n": 1}\n\n' + done + b"\n") == [b'{"n": 1}'] and with_newline.done
    lines = SseLines()
    assert lines.feed(b'data: {"n": 1}\n\n' + done) == [b'{"n": 1}']
    assert lines.finish()
    # Control: a last line that is not [DONE] is an unfinished stream.
    cut = SseLines()
    cut.feed(b'data: {"n": 1}\n\ndata: {"n": 2}')
    assert not cut.finish()
