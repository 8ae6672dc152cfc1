"""A stream read a network read at a time gives what it gave read event by event.

``sse.SseLines`` + ``sse.parse_events`` against a line-by-line reader (the one ``remote._events`` was),
``vllm_samples.batch_samples`` against ``samples_of`` per event, and ``VLLMEngine`` on whole reads
whose events hold a stop token, tokens past it, or an error after good tokens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.engines.test_vllm_transport import Knobs, serve_knobs

from harnessrl.engines.base import SamplingParams, each_sample
from harnessrl.engines.remote import AbortedByEngine, RemoteEngineError
from harnessrl.engines.sse import BadEvent, SseLines, loads, parse_events
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.engines.vllm_samples import batch_samples, events_through, samples_of
from harnessrl.tokenizer import PolicyTokenizer

# -- SSE lines ------------------------------------------------------------------------------------


def line_by_line(pieces: list[bytes]) -> tuple[list[Any], bool | None]:
    """The reader ``remote._events`` was before reads were parsed whole: each line on its own."""
    events: list[Any] = []
    done, buffer = False, b""
    for piece in pieces:
        if done:
            continue
        lines = (buffer + piece).split(b"\n")
        buffer = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                events.append(loads(data))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return [*events, "BAD"], None
    if not done and buffer.strip() == b"data: [DONE]":
        done = True
    return events, done


def per_read(pieces: list[bytes]) -> tuple[list[Any], bool | None]:
    lines, events = SseLines(), []
    for piece in pieces:
        try:
            events += parse_events(lines.feed(piece))
        except BadEvent as bad:
            return [*events, *bad.parsed, "BAD"], None
    return events, lines.finish()


sse_lines = st.lists(
    st.sampled_from(
        [
            b'data: {"a": 1}',
            b'data:{"b": [1, 2]}',
            b"data: 3\r",
            b"data: NaN",  # not JSON, though json.loads takes it: refused by both readers
            b"data: {bad",
            b"data: [DONE]",
            b"data:",
            b": comment",
            b"event: message",
            b"",
            b'data: "x\xff"',
        ]
    ),
    max_size=12,
)


@given(sse_lines, st.lists(st.integers(0, 60), max_size=6), st.booleans())
def test_reads_parsed_whole_give_the_events_of_a_line_by_line_reader(
    lines: list[bytes], cuts: list[int], final_newline: bool
) -> None:
    body = b"\n".join(lines) + (b"\n" if final_newline else b"")
    bounds = sorted({0, len(body), *(c for c in cuts if c < len(body))})
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert per_read(pieces) == line_by_line(pieces)


def test_a_bad_payload_carries_the_events_before_it() -> None:
    with pytest.raises(BadEvent) as caught:
        parse_events([b'{"a": 1}', b"[2]", b"{bad", b"2"])
    assert caught.value.parsed[0] == {"a": 1} and len(caught.value.parsed) == 2
    assert caught.value.payload == b"{bad" and "bad stream event b'{bad'" in str(caught.value)


# -- samples of a read's events -------------------------------------------------------------------


def plain(ids: list[int], lps: list[Any], finish: Any = None) -> dict[str, Any]:
    block = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps}
    return {"id": "c", "choices": [{"index": 0, "text": "", "logprobs": block, "finish_reason": finish}]}


def odd(event: dict[str, Any], how: str) -> Any:
    """``event`` changed in one way ``samples_of`` reads differently from the plain shape."""
    choice = event["choices"][0]
    block = choice["logprobs"]
    changed: dict[str, Any] = {
        "error": {**event, "error": {"message": "boom", "code": 503}},
        "abort": {**event, "choices": [{**choice, "finish_reason": "abort"}]},
        "token_ids": {**event, "choices": [{**choice, "token_ids": [9] * len(block["tokens"])}]},
        "null_lp": {**event, "choices": [{**choice, "logprobs": {**block, "token_logprobs": [None]}}]},
        "positive_lp": {**event, "choices": [{**choice, "logprobs": {**block, "token_logprobs": [0.5]}}]},
        "index_1": {**event, "choices": [{**choice, "index": 1}]},
        "odd_finish": {**event, "choices": [{**choice, "finish_reason": "tool_calls"}]},
        "name": {**event, "choices": [{**choice, "logprobs": {**block, "tokens": ["t5"]}}]},
        "leading_zero": {**event, "choices": [{**choice, "logprobs": {**block, "tokens": ["token_id:07"]}}]},
        "two_choices": {**event, "choices": [choice, choice]},
        "no_choices": {**event, "choices": []},
        "not_a_dict": [event],
    }
    return changed[how]


def reference(events: list[Any]) -> tuple[str, Any]:
    ids: list[int] = []
    lps: list[float] = []
    finish = None
    try:
        for event in events:
            if finish is not None:
                return "error", "an event after the finish reason"
            more_ids, more_lps, finish = samples_of(event, "u")
            ids += more_ids
            lps += more_lps
    except RemoteEngineError as exc:  # every malformed event is one (no ValueError, TypeError...)
        return "error", type(exc).__name__
    return "ok", (ids, lps, finish)


events_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, 200_000), min_size=0, max_size=3),
        st.sampled_from([None, None, None, "stop", "length"]),
        st.one_of(
            st.none(),
            st.sampled_from(
                ["error", "abort", "token_ids", "null_lp", "positive_lp", "index_1", "odd_finish", "name"]
                + ["leading_zero"]
            ),
        ),
        st.sampled_from(["two_choices", "no_choices", "not_a_dict", None, None, None, None]),
    ),
    max_size=8,
)


@given(events_strategy)
def test_batch_samples_are_the_events_samples_or_none(spec: list[tuple[Any, ...]]) -> None:
    events: list[Any] = []
    for ids, finish, change, shape in spec:
        event = plain(ids, [-0.5] * len(ids), finish)
        if change is not None and ids:
            event = odd(event, change)
        if shape is not None:
            event = odd(event, shape)
        events.append(event)
    got = batch_samples(events)
    if got is None:  # then some event is not plain, or follows a finished one: samples_of reads it
        finished_early = any(finish is not None for _, finish, _, _ in spec[:-1])
        assert finished_early or any(change is not None and ids or shape for ids, _, change, shape in spec)
    else:
        assert reference(events) == ("ok", got)
        assert all(type(lp) is float for lp in got[1])


def test_a_whole_read_of_plain_events_is_read_in_one_pass() -> None:
    events = [plain([i], [-0.25 * i]) for i in range(40)] + [plain([7, 8], [-1, -2], "stop")]
    assert batch_samples(events) == (
        [*range(40), 7, 8],
        [-0.25 * i for i in range(40)] + [-1.0, -2.0],
        "stop",
    )


# -- the engine on whole reads --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


def stream_until_error(engine: VLLMEngine, params: SamplingParams) -> tuple[list[int], BaseException | None]:
    async def go() -> tuple[list[int], BaseException | None]:
        got: list[int] = []
        await engine.start()
        try:
            async for sample in each_sample(engine.generate([1, 2, 3], params)):
                got.append(sample.token_id)
        except RemoteEngineError as exc:
            return got, exc
        finally:
            await engine.aclose()
        return got, None

    return asyncio.run(go())


def test_a_stop_token_inside_a_read_ends_the_answer_and_tokens_past_it_are_not_yielded(
    tokenizer: PolicyTokenizer,
) -> None:
    stop = tokenizer.stop_token_ids[0]
    knobs = Knobs(tokens=[(5, -0.1), (stop, -0.2), (6, -0.3), (7, -0.4)], ids_as="names", last_event=None)
    with serve_knobs(knobs) as server:
        got, error = stream_until_error(
            VLLMEngine(server.url, tokenizer), SamplingParams(max_tokens=100, stop_token_ids=(stop,))
        )
    assert (got, error) == ([5, stop], None)


def test_an_abort_after_good_tokens_in_the_same_read_comes_after_them(tokenizer: PolicyTokenizer) -> None:
    abort = {"choices": [{"finish_reason": "abort", "logprobs": {"tokens": [], "token_logprobs": []}}]}
    knobs = Knobs(
        tokens=[(5, -0.1), (6, -0.2), (7, -0.3)],
        ids_as="names",
        last_event=None,
        done=f"data: {json.dumps(abort)}\n\ndata: [DONE]\n\n",
    )
    with serve_knobs(knobs) as server:
        got, error = stream_until_error(VLLMEngine(server.url, tokenizer), SamplingParams(max_tokens=100))
    assert got == [5, 6, 7] and isinstance(error, AbortedByEngine)


def test_a_bad_event_after_good_ones_in_the_same_read_comes_after_them(tokenizer: PolicyTokenizer) -> None:
    knobs = Knobs(
        tokens=[(5, -0.1), (6, -0.2)], ids_as="names", last_event=None, done="data: {bad\n\ndata: [DONE]\n\n"
    )
    with serve_knobs(knobs) as server:
        got, error = stream_until_error(VLLMEngine(server.url, tokenizer), SamplingParams(max_tokens=100))
    assert got == [5, 6] and error is not None and error.retryable and "bad stream event" in str(error)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), st.data())
def test_events_through_is_the_fewest_events_that_hold_the_first_tokens(sizes: list[int], data: Any) -> None:
    events = [plain(list(range(n)), [0.0] * n) for n in sizes]
    total = sum(sizes)
    count = data.draw(st.integers(1, max(total, 1)))
    expected = next((k for k in range(len(sizes) + 1) if sum(sizes[:k]) >= count), len(sizes))
    assert events_through(events, count, total) == expected
