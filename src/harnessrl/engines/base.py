"""The engine interface: generate from token IDs, stream (token id, logprob) batches, swap weights in place.

An engine never sees text or chat messages: the gateway owns tokenization and sends token IDs
(token-in/token-out), so what the engine conditions on is exactly what is later trained on.
Implementations: ``embedded`` (transformers in-process, batched), ``scripted`` (deterministic
replies for tests and demos); remote vLLM/SGLang engines follow the same protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one generation. ``temperature == 0`` means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # generation ends after sampling one of these (it is kept)
    seed: int | None = None


class TokenSample(NamedTuple):
    """One sampled token and its log-probability under the distribution it was sampled from.

    Embedded engine: ``log_softmax(logits / temperature)[token_id]``, renormalized over the nucleus
    when ``top_p < 1``; greedy (``temperature == 0``) reports the temperature-1 logprob. vLLM (with
    ``--logprobs-mode processed_logprobs``, which harnessrl checks): the same. Scripted engine:
    always ``0.0``.

    A tuple: one is made per streamed token, and a frozen dataclass costs about twice as much.
    """

    token_id: int
    logprob: float


class Samples(NamedTuple):
    """Tokens an engine sampled since its last batch, in order, and their logprobs (as ``TokenSample``).

    ``generate`` yields these rather than one token at a time: a server's stream often delivers many
    tokens in one network read (vLLM merges a request's outputs while its client is behind, and a
    gateway that is behind finds many events in one read), and passing them on as one batch keeps the
    per-token work of every layer between the socket and the client (the pool, the generation) to
    list operations. An in-process engine yields one token per decode step; a whole answer is one
    batch. Never empty.
    """

    token_ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class GenerationContext:
    """Who is asking. Engines may use it for affinity (remote pools) or scripting (scripted engine)."""

    rollout_id: str | None = None
    call_index: int = 0  # how many calls this rollout made before this one
    # False: the caller needs only the whole answer (a non-streaming client), so a remote engine may
    # fetch it as one response instead of one event per token. The samples yielded are the same.
    stream: bool = True
    # Streaming: the caller takes the tokens at most this often (seconds; 0: as each arrives), so a
    # remote engine yields the first at once, then what arrived in each interval as one batch, and the
    # end as soon as it comes (``gateway.stream_interval_s``). The samples yielded are the same.
    stream_interval_s: float = 0.0
    # Streaming: a vLLM server is asked to send the tokens this many at a time (its per-request
    # ``stream_interval``: the first and the last at once), so it sends, and the caller reads, one
    # event per that many tokens (``gateway.stream_interval_tokens``). 1: an event per token.
    stream_interval_tokens: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightUpdate:
    """New policy weights: a state dict (in-process engines) or a checkpoint folder (remote ones)."""

    version: int
    state_dict: Any = None  # Mapping[str, torch.Tensor]; typed loosely so this module needs no torch
    checkpoint_dir: str | None = None


@runtime_checkable
class Engine(Protocol):
    """What the gateway and trainer need from a policy server."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> PolicyTokenizer: ...

    @property
    def context_length(self) -> int: ...

    @property
    def policy_version(self) -> int: ...

    @property
    def shares_weights(self) -> bool:
        """Whether the weights live in servers that other gateways (and the trainer) reach too
        (remote engines; the scripted engine stands in for one). Then whoever loads new weights
        tells every gateway their version with ``adopt_policy_version``; an engine holding its own
        copy (embedded) answers ``False`` and is only ever updated through ``update_weights``."""

    def adopt_policy_version(self, version: int) -> None:
        """Label calls from now on with ``version``: someone else installed those weights in the
        shared servers. Only for engines that ``shares_weights``; others raise ``ConfigError``."""

    async def start(self) -> None:
        """Load the model / connect; must be called before ``generate``."""

    async def aclose(self) -> None:
        """Release resources; pending generations end."""

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        """Stream sampled tokens, in batches (``Samples``). Closing the iterator early (``aclose``)
        cancels the generation.

        Stops after ``params.max_tokens`` tokens or after a token in ``params.stop_token_ids``
        (which is yielded, the last token of the last batch). Raises
        ``harnessrl.errors.UpstreamError`` if the engine fails (after the batches sampled before).

        Ending without a stop token means the budget ran out (``max_tokens``, or the context): the
        gateway records such an answer as ``length``. An engine whose answer ended any other way (a
        remote server that aborted it, or whose answer lacks its finish reason) raises instead.
        """

    async def update_weights(self, update: WeightUpdate) -> None:
        """Install new weights and set ``policy_version = update.version``.

        Callers drain in-flight generations first (the gateway's pause); engines may still refuse
        to swap mid-generation by waiting for the current decode step.
        """

    async def release_weights(self) -> bool:
        """Free this engine's copy of the weights until an ``update_weights`` with every weight
        refills it; True if it did. For an engine in the trainer's process while the trainer steps
        (generation paused, new weights about to replace these): that memory is the step's. Refused
        (False) while a generation is in flight, and by engines whose weights live elsewhere. While
        released, ``generate`` raises ``UpstreamError`` and a partial update ``InvalidWeightUpdate``.
        """

    async def health(self) -> dict[str, Any]:
        """A small JSON-able status dict; raises ``UpstreamError`` if unhealthy."""


def through_first_stop(ids: Sequence[int], stop_ids: Iterable[int]) -> int:
    """How many of ``ids`` an answer keeps: up to and including its first stop token, or all of them.

    Set intersection and ``index`` (C) rather than a Python scan: every whole answer is cut here.
    """
    found = set(stop_ids).intersection(ids)
    if not found:
        return len(ids)
    return min(map(ids.index, found)) + 1


def cut_at_stop(
    ids: list[int], logprobs: list[float], stop_ids: AbstractSet[int]
) -> tuple[list[int], list[float], bool]:
    """A batch's IDs and logprobs up to and including its first stop token, and whether it had one
    (the lists themselves, not copies, when it had none: the common batch)."""
    if stop_ids.isdisjoint(ids):
        return ids, logprobs, False
    cut = through_first_stop(ids, stop_ids)
    return ids[:cut], logprobs[:cut], True


async def each_sample(batches: AsyncIterator[Samples]) -> AsyncIterator[TokenSample]:
    """The tokens of ``generate``'s batches one by one (closing this closes ``batches``)."""
    try:
        async for batch in batches:
            for sample in zip(batch.token_ids, batch.logprobs, strict=True):
                yield TokenSample(*sample)
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


async def collect_samples(batches: AsyncIterator[Samples]) -> tuple[list[int], list[float]]:
    """All of ``generate``'s batches joined: the token IDs and their logprobs."""
    ids: list[int] = []
    logprobs: list[float] = []
    async for batch in batches:
        ids += batch.token_ids
        logprobs += batch.logprobs
    return ids, logprobs
