"""A stream sends the tokens that arrive together (one engine read) as one event: a chat chunk with
their text and one logprob entry per token, one Anthropic ``text_delta``, one Responses
``output_text.delta``; tokens that arrive apart stay apart. What the client reads joined, and what is
recorded, are what a whole answer gives.

``BurstEngine`` (an ``Engine`` like any other: the gateway's seam) yields the scripted engine's tokens
in bursts, yielding to the event loop only between bursts, as ``VLLMEngine`` does with the tokens of
one network read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, collect_samples
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.pipeline.generation import Piece
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

from .conftest import ADMIN_KEY

TEXT = "Streaming works one token at a time, or a read at a time."


class BurstEngine:
    """The scripted engine's tokens in bursts of ``sizes`` (the last repeated), the event loop run
    only between bursts."""

    def __init__(self, engine: ScriptedEngine, sizes: Sequence[int]) -> None:
        self._engine = engine
        self.sizes = list(sizes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        ids, logprobs = await collect_samples(self._engine.generate(prompt_ids, params, context))
        k, n = 0, 0
        while k < len(ids):
            size = self.sizes[min(n, len(self.sizes) - 1)]
            n += 1
            await asyncio.sleep(0)  # the next "read": the writer runs first
            yield Samples(ids[k : k + size], logprobs[k : k + size])
            k += size


@pytest.fixture
def gateway(tokenizer: PolicyTokenizer, tmp_path: Path) -> Iterator[tuple[str, GatewayClient, BurstEngine]]:
    engine = BurstEngine(ScriptedEngine([TEXT] * 8, tokenizer), [1])
    store = SQLiteStore(tmp_path / "store.db")
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        url = stack.enter_context(
            serve_in_thread(create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine))
        )
        client = GatewayClient(url, ADMIN_KEY)
        stack.callback(client.close)
        yield url, client, engine


def payloads(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


def post(rollout: dict[str, Any], path: str, body: dict[str, Any]) -> str:
    headers = {"authorization": f"Bearer {rollout['api_key']}", "x-api-key": rollout["api_key"]}
    r = httpx.post(f"{rollout['base_url']}/{path}", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


@pytest.mark.parametrize("sizes", [[1, 4, 7, 1000], [1]], ids=["bursts", "control_token_by_token"])
def test_chat_sends_one_chunk_per_read_with_every_tokens_logprob(gateway: Any, sizes: list[int]) -> None:
    url, client, engine = gateway
    rollout = client.create_rollout({"prompt": "t"})
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    whole = json.loads(post(rollout, "chat/completions", body))
    engine.sizes = sizes
    chunks = payloads(
        post(client.create_rollout({"prompt": "t"}), "chat/completions", {**body, "stream": True})
    )
    content = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    entries = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert (
        "".join(c["delta"]["content"] for c in content) == TEXT == whole["choices"][0]["message"]["content"]
    )
    assert entries == whole["choices"][0]["logprobs"]["content"]  # one entry per token, in order
    tokens = len(entries)
    if sizes == [1]:
        assert len(content) == tokens  # each token its own chunk, as before
    else:
        # One chunk per burst, each with its tokens' entries (the last burst's stop token has none).
        assert [len(c["logprobs"]["content"]) for c in content] == [1, 4, 7, tokens - 12]


@pytest.mark.parametrize("sizes", [[1, 4, 7, 1000], [1]], ids=["bursts", "control_token_by_token"])
def test_messages_and_responses_send_one_text_delta_per_read(gateway: Any, sizes: list[int]) -> None:
    url, client, engine = gateway
    engine.sizes = sizes
    messages = payloads(
        post(
            client.create_rollout({"prompt": "t"}),
            "messages",
            {
                "model": "m",
                "max_tokens": 200,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    )
    texts = [m["delta"]["text"] for m in messages if m["type"] == "content_block_delta"]
    responses = payloads(
        post(client.create_rollout({"prompt": "t"}), "responses", {"input": "hi", "stream": True})
    )
    deltas = [r["delta"] for r in responses if r["type"] == "response.output_text.delta"]
    assert "".join(texts) == "".join(deltas) == TEXT
    assert [r["sequence_number"] for r in responses] == list(range(len(responses)))
    if sizes == [1]:
        assert len(texts) > 12 and len(deltas) > 12  # token by token, as before
    else:
        # One delta per burst (a burst's trailing space waits for the next: it never ends a block).
        assert len(texts) == len(deltas) == 4


def test_joined_deltas_join_only_adjacent_deltas_of_one_part() -> None:
    from harnessrl.gateway.apis.anthropic_blocks import joined_deltas as joined_blocks
    from harnessrl.gateway.apis.responses_deltas import joined_deltas as joined_items

    def text(index: int, kind: str, value: str) -> dict[str, Any]:
        field = "text" if kind == "text_delta" else "thinking"
        return {"type": "content_block_delta", "index": index, "delta": {"type": kind, field: value}}

    stop = {"type": "content_block_stop", "index": 0}
    events = [text(0, "thinking_delta", "a"), text(0, "thinking_delta", "b"), stop]
    events += [text(1, "text_delta", "c"), text(1, "text_delta", "d"), text(2, "text_delta", "e")]
    assert joined_blocks(events) == [
        text(0, "thinking_delta", "ab"),
        stop,
        text(1, "text_delta", "cd"),
        text(2, "text_delta", "e"),
    ]

    def delta(item: str, value: str, logprobs: list[int]) -> dict[str, Any]:
        where = {"item_id": item, "output_index": 0, "content_index": 0}
        return {"type": "response.output_text.delta", **where, "delta": value, "logprobs": logprobs}

    added = {"type": "response.output_item.added", "output_index": 1, "item": {}}
    payloads = [delta("m", "a", [1]), delta("m", "b", []), delta("m", "c", [2]), added, delta("n", "d", [3])]
    assert joined_items(payloads) == [delta("m", "abc", [1, 2]), added, delta("n", "d", [3])]


def test_responses_text_routed_a_read_at_a_time_keeps_the_separator_rule(tokenizer: PolicyTokenizer) -> None:
    """The Responses stream parses its answer's text a read at a time (``OutputStream.flush``); a
    block after the answer started still finds the message open (no separator stripped), and a
    block before it still has its separator stripped."""
    from harnessrl.gateway.apis.responses_output import OutputStream
    from harnessrl.gateway.parsers.reasoning import get_reasoning_parser
    from harnessrl.gateway.pipeline.generation import Piece

    for text, answer in [
        ("First.<think></think> Then.", "First. Then."),
        ("<think>plan</think>\n\nAnswer.", "Answer."),
    ]:
        out = OutputStream(None, reasoning=get_reasoning_parser("glm45")())
        for i in tokenizer.encode(text):
            out.feed(Piece(tokenizer.decode([i]), i, 0.0))
        out.finish("completed")
        [message] = [item for item in out.items if item["type"] == "message"]
        assert message["content"][0]["text"] == answer


@pytest.mark.parametrize("hold", [None, 5], ids=["default_hold", "hold_5"])
@pytest.mark.parametrize("logprobs", [True, False])
def test_chat_takes_a_read_at_once_as_feeding_each_piece_would(
    gateway: Any, monkeypatch: pytest.MonkeyPatch, hold: int | None, logprobs: bool
) -> None:
    """``ChatAnswer.feed_all`` takes a read's texts and logprob entries in a few passes; the chunks are
    those of feeding each piece in turn (the control), the hold's bound cutting them in the same
    places, the stop token (last of the last read) with no entry."""
    from harnessrl.gateway.apis import chat
    from harnessrl.gateway.pipeline.answer import feed_each

    url, client, engine = gateway
    engine.sizes = [1, 4, 7, 1000]
    if hold is not None:
        monkeypatch.setattr(chat, "HOLD_AT_MOST", hold)
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": logprobs, "stream": True}

    def choices() -> list[Any]:
        chunks = payloads(post(client.create_rollout({"prompt": "t"}), "chat/completions", body))
        return [c["choices"] for c in chunks]  # not the ids and timestamps

    batched = choices()
    monkeypatch.setattr(chat.ChatAnswer, "feed_all", lambda self, pieces: feed_each(self.feed, pieces))
    one_by_one = choices()
    assert batched == one_by_one
    deltas = [c[0]["delta"].get("content") for c in batched if c and c[0]["delta"].get("content")]
    assert "".join(deltas) == TEXT
    if hold is None:
        assert len(deltas) == 4  # a read a chunk
    else:
        assert len(deltas) > 4  # the bound of 5 cuts the read of 7 (and the last)


_PIECES = st.lists(
    st.tuples(
        st.sampled_from(["", "a", " b", "c\n", "{"]),
        st.sampled_from([5, 6, 7, -1]),  # -1: a text-only piece (a held-back tail)
        st.sampled_from([-0.5, -1.25, 0.0]),
        st.booleans(),  # a stop token (no text of its own)
    ).map(lambda t: Piece("" if t[3] else t[0], 2 if t[3] else t[1], t[2], is_stop_token=t[3])),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    pieces=_PIECES,
    cuts=st.lists(st.integers(0, 40), max_size=6),
    hold=st.sampled_from([3, 256]),
    lp=st.booleans(),
)
def test_chat_feed_all_is_feeding_each_piece_in_turn(
    tokenizer: PolicyTokenizer, pieces: list[Piece], cuts: list[int], hold: int, lp: bool
) -> None:
    """Whatever a read holds (stop tokens, text-only pieces, pieces without text, anywhere), and
    wherever the hold's bound falls: ``feed_all`` returns and holds what ``feed`` of each piece does."""
    from types import SimpleNamespace
    from unittest import mock

    from harnessrl.gateway.apis import chat
    from harnessrl.gateway.body_models import ChatCompletionRequest
    from harnessrl.gateway.pipeline.answer import feed_each

    engine = SimpleNamespace(tokenizer=tokenizer, model_name="m", policy_version=0)
    call = SimpleNamespace(state=SimpleNamespace(engine=engine, tool_parser=lambda tools: None))
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=lp, model="m")
    reads = [pieces[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(pieces)], strict=True)]
    with mock.patch.object(chat, "HOLD_AT_MOST", hold):
        batched, one_by_one = chat.ChatAnswer(call, body), chat.ChatAnswer(call, body)  # type: ignore[arg-type]
        batched.started(SimpleNamespace())  # type: ignore[arg-type]
        one_by_one.base, one_by_one.head = batched.base, batched.head  # one chunk id for both
        for read in reads:
            assert batched.feed_all(read) == feed_each(one_by_one.feed, read)
            assert batched.held_text == one_by_one.held_text
            assert (batched.pending_ids, batched.pending_lps) == (
                one_by_one.pending_ids,
                one_by_one.pending_lps,
            )
            assert batched.held() == one_by_one.held()
