"""One generation: drive the engine from prompt IDs, turn sampled tokens into text, apply stop strings.

The engine stops on stop *tokens*; stop *strings* are the gateway's job, because they are text and
the gateway owns text. Tokens are decoded incrementally; decoded text that could be the start of a
stop string is held back, so a streamed delta never shows part of a stop string. When one appears
the engine iterator is closed (ending the generation) and the text is cut before the stop string,
as OpenAI does. The token IDs are never cut: every sampled token (including one that completed a
stop string, or a sampled stop token) stays in ``token_ids``, because that is what the policy did
and what training must see.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import AsyncGeneratorType
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from harnessrl.engines.base import GenerationContext, SamplingParams, cut_at_stop
from harnessrl.schemas import now

if TYPE_CHECKING:
    from harnessrl.engines.base import Engine


class Piece(NamedTuple):
    """What one sampled token added: released text (maybe ``""``) and the token itself.

    A tuple: one is made per sampled token, and a frozen dataclass costs several times as much."""

    text: str
    token_id: int
    logprob: float
    is_stop_token: bool = False


#: ``Piece`` of a (text, token_id, logprob, is_stop_token) tuple, made in C (its ``__new__`` is Python).
_piece = functools.partial(tuple.__new__, Piece)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


async def close_stream(stream: AsyncIterator[Any]) -> None:
    """Close an iterator over the engine's samples, which cancels the generation. Shielded: when a
    client disconnect cancels us, the close must still run to the end and free the engine slot. An
    iterator that ran to its end has nothing left to close (``aclose`` would return at once): no
    scope for it."""
    if isinstance(stream, AsyncGeneratorType) and stream.ag_frame is None:
        return
    with anyio.CancelScope(shield=True):
        await stream.aclose()  # type: ignore[attr-defined]


@dataclass
class Generation:
    engine: Engine
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    context: GenerationContext | None = None

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    policy_version: int = 0
    started_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None

    async def batches(self) -> AsyncIterator[list[Piece]]:
        """Run the engine, yielding the ``Piece`` of each sampled token, a list per engine batch
        (``Samples``: the tokens of one network read, or one decode step); the fields are final
        afterwards. The per-token work is a loop here, not an ``async`` step per token.

        Closing this iterator early closes the engine's, which cancels the generation.
        """
        tokenizer = self.engine.tokenizer
        stop_ids = set(self.params.stop_token_ids)
        stop = self.stop
        decoder = tokenizer.stream_decoder()
        pending = ""  # decoded but not yet released: it may be the start of a stop string
        self.policy_version = self.engine.policy_version
        self.started_at = now()
        stream = self.engine.generate(self.prompt_ids, self.params, self.context)
        ended_by = None  # "token" (a stop token was sampled), "string" (a stop string appeared) or None
        released_parts: list[str] = []  # joined once at the end: += on a long answer is quadratic
        # Once per sampled token: the bound methods are looked up once.
        push, push_all, release = decoder.push, decoder.push_all, released_parts.append
        try:
            async for batch in stream:
                if ended_by is not None:
                    break  # an engine yielding past its stop token: the turn ended there
                if self.first_token_at is None:
                    self.first_token_at = now()
                if not stop:  # no stop strings: every token before a stop token adds its text
                    ids, logprobs, stopped = cut_at_stop(*batch, stop_ids)
                    last: list[Piece] = []
                    if stopped:
                        # Not decoded: the stop token ends the turn and is no part of the answer's
                        # text. The engine ends by itself after it; letting it finish (rather than
                        # closing it) lets a remote engine read its stream to the end and keep the
                        # connection.
                        ended_by = "token"
                        last = [Piece("", ids[-1], logprobs[-1], is_stop_token=True)]
                    self.token_ids += ids
                    self.logprobs += logprobs
                    texted = ids[:-1] if last else ids
                    texts = push_all(texted)  # a batch's texts at once where each is whole UTF-8
                    released_parts += texts
                    yield list(map(_piece, zip(texts, texted, logprobs, repeat(False)))) + last
                    continue
                out: list[Piece] = []
                for token_id, logprob in zip(*batch, strict=True):
                    self.token_ids.append(token_id)
                    self.logprobs.append(logprob)
                    if token_id in stop_ids:  # as above
                        ended_by = "token"
                        out.append(Piece("", token_id, logprob, is_stop_token=True))
                        break
                    pending += push(token_id)
                    released, pending, hit = self._release(pending)
                    release(released)
                    out.append(Piece(released, token_id, logprob))
                    if hit:
                        ended_by = "string"
                        break
                yield out
                if ended_by == "string":
                    break
        finally:
            await close_stream(stream)
        if ended_by != "string":
            # Release what was held back as a possible stop-string start (and any partial character).
            pending += decoder.flush()
            released, pending, hit = self._release(pending)
            tail = released if hit else released + pending
            released_parts.append(tail)
            if tail:
                yield [Piece(tail, -1, 0.0)]
            if hit:
                ended_by = "string"
        self.text = "".join(released_parts)
        # No stop token and no stop string: the engine ran out of budget (max_tokens or context). An
        # engine ends any other way only by raising (``Engine.generate``: a remote server's answer
        # that does not say "length" fails there), so "length" is recorded only where it is true.
        self.finish_reason = "length" if ended_by is None else "stop"
        self.finished_at = now()

    def _release(self, pending: str) -> tuple[str, str, bool]:
        """Split ``pending`` into (text safe to release, text held back, whether a stop string ended it)."""
        if not self.stop:
            return pending, "", False
        cut = min((i for i in (pending.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            return pending[:cut], "", True
        hold = _held_back(pending, self.stop)
        return pending[: len(pending) - hold], pending[len(pending) - hold :], False

    async def run(self) -> Generation:
        """Generate to the end without streaming.

        Without stop strings nothing has to be decided token by token, so the tokens are collected
        and decoded once at the end (``StreamDecoder`` pieces joined equal ``decode`` of all IDs);
        with stop strings the text is checked as it grows, exactly as when streaming.
        """
        if self.stop:
            async for _ in self.batches():
                pass
            return self
        stop_ids = set(self.params.stop_token_ids)
        self.policy_version = self.engine.policy_version
        self.started_at = now()
        ended_by_token = await self._collect(stop_ids)
        text_ids = self.token_ids[:-1] if ended_by_token else self.token_ids
        self.text = self.engine.tokenizer.decode(text_ids) if text_ids else ""
        self.finish_reason = "stop" if ended_by_token else "length"  # as in ``batches``
        self.finished_at = now()
        return self

    def replayed_pieces(self) -> Iterator[Piece]:
        """The pieces ``batches`` would have yielded for this finished generation, from its token IDs
        (for an answer generated whole, ``run`` without stop strings, that is read piece by piece)."""
        assert not self.stop, "a generation with stop strings runs piece by piece"
        stop_ids = set(self.params.stop_token_ids)
        decoder = self.engine.tokenizer.stream_decoder()
        for token_id, logprob in zip(self.token_ids, self.logprobs, strict=True):
            if token_id in stop_ids:
                yield Piece("", token_id, logprob, is_stop_token=True)
            else:
                yield Piece(decoder.push(token_id), token_id, logprob)
        tail = decoder.flush()
        if tail:
            yield Piece(tail, -1, 0.0)

    async def _collect(self, stop_ids: set[int]) -> bool:
        """Read the engine's samples to the end; whether a stop token ended them.

        The context says nobody streams (``GenerationContext.stream``), so an engine that can answer
        whole does (``VLLMEngine`` asks its server for one JSON answer: one batch); this only collects.
        """
        stream = self.engine.generate(self.prompt_ids, self.params, self.context)
        ended_by_token = False
        try:
            async for ids, logprobs in stream:
                if ended_by_token:
                    break  # an engine yielding past its stop token: the turn ended there
                if self.first_token_at is None:
                    self.first_token_at = now()
                ids, logprobs, ended_by_token = cut_at_stop(ids, logprobs, stop_ids)
                self.token_ids += ids
                self.logprobs += logprobs
        finally:
            await close_stream(stream)
        return ended_by_token
