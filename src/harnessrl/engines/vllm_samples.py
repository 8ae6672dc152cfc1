"""What a vLLM answer sampled: the token IDs, logprobs and finish reason of a stream's events or of a
whole answer.

``samples_of`` reads one event (or one non-streamed answer) and is the reference: it accepts and
refuses what ``VLLMEngine`` does, naming what is wrong. A stream has one event per sampled token and
a read of the socket often holds many (:mod:`harnessrl.engines.sse` parses them a read at a time), so
``batch_samples`` reads a read's events together: a tight loop over the plain shape (one choice of
index 0, a logprobs block with ``"token_id:{id}"`` tokens, no error, a finish reason only on the last
event and only ``stop`` or ``length``) and one parse of all their token names. Anything else (an
error event, ``token_ids``, a bad logprob, a bad name) makes it answer ``None``, and the caller reads
those events one by one with ``samples_of``, so what is yielded before an error, and the error, stay
exactly what they were.

What is refused (:class:`~harnessrl.engines.remote.MalformedAnswer`, retryable, unless it says the
server is set up wrong): anything but exactly one choice of index 0; a finish reason other than
``stop``, ``length`` (``abort``/``error``: :class:`~harnessrl.engines.remote.AbortedByEngine``); a
sampled token's logprob that is null, not a finite number, or above 0
(:mod:`harnessrl.engines.sample_checks`); ``token_ids`` that are not integers, are negative, or
disagree with the ``"token_id:{id}"`` names sent beside them. vLLM sends a null logprob only for a
prompt position (``echo``), which these requests never ask for. The vocabulary's upper bound and the
token budget are the engine's to check: it knows both.
"""

from __future__ import annotations

from typing import Any

import orjson

from harnessrl.engines.remote import AbortedByEngine, MalformedAnswer, RemoteEngineError, stream_error
from harnessrl.engines.sample_checks import check_token_ids, checked_logprobs, float_logprobs

#: Finish reasons with which the server, not the policy, ended an answer.
CUT_SHORT = frozenset({"abort", "error"})
#: Finish reasons of an answer the policy ended: a stop token was sampled, or the budget ran out.
FINISHED = frozenset({"stop", "length"})


def samples_of(event: Any, url: str) -> tuple[list[int], list[float], str | None]:
    """The token IDs, logprobs and finish reason (None: not finished yet) of one stream chunk or of a
    whole non-streamed answer.

    Called once per streamed token, and with 256 tokens for a whole answer: the per-token work is
    C-level passes (``map``, :func:`_token_ids`), not Python loops."""
    error = stream_error(event, url)
    if error is not None:
        raise error
    if type(event) is not dict:
        raise MalformedAnswer(f"unexpected answer {str(event)[:120]!r}", url=url)
    choices = event.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        raise MalformedAnswer(f"expected one choice, got {str(choices)[:120]!r}", url=url)
    choice = choices[0]
    if choice.get("index", 0) != 0:
        raise MalformedAnswer(f"the one choice has index {choice.get('index')!r}, not 0", url=url)
    finish = _finish_reason(choice.get("finish_reason"), url)
    block = choice.get("logprobs")
    if block is None:
        block = {}
    elif type(block) is not dict:
        raise MalformedAnswer(f"logprobs is {str(block)[:60]!r}, not an object", url=url)
    logprobs = _list_field(block, "token_logprobs", url)
    tokens = _list_field(block, "tokens", url)
    ids = choice.get("token_ids")
    if ids is None:
        ids = _token_ids(tokens, url)
    else:
        if type(ids) is not list:
            raise MalformedAnswer(f"token_ids is {str(ids)[:60]!r}, not a list", url=url)
        check_token_ids(ids, None, url)
        if block.get("tokens") is not None:  # both sent: they must name the same tokens
            named = _named_ids(tokens)  # None: text tokens, which cannot be compared with IDs
            if len(tokens) != len(ids) or (named is not None and named != ids):
                raise MalformedAnswer(
                    f"token_ids {str(ids)[:60]} disagree with the logprobs tokens {str(tokens)[:80]}", url=url
                )
    if len(logprobs) != len(ids):
        raise RemoteEngineError(
            f"{url}: chunk has {len(ids)} token IDs but {len(logprobs)} logprobs "
            "(does the server take logprobs and return_tokens_as_token_ids?)",
            retryable=False,
        )
    # IDs are integers >= 0 here (parsed from digits, or checked): the engine checks the vocabulary's
    # bound, which it knows.
    return ids, checked_logprobs(logprobs, url), finish


def _finish_reason(finish: Any, url: str) -> str | None:
    """``finish`` if it is None, ``stop`` or ``length``; :class:`AbortedByEngine` for ``abort`` or
    ``error``; :class:`MalformedAnswer` for anything else."""
    if finish is None or (type(finish) is str and finish in FINISHED):
        return finish
    if type(finish) is str and finish in CUT_SHORT:
        raise AbortedByEngine(
            f"{url}: the server ended the generation itself (finish_reason={finish!r}: paused "
            "with mode=abort, aborted, or failed); the partial answer is discarded",
            url=url,
        )
    raise MalformedAnswer(f"unknown finish_reason {str(finish)[:60]!r}", url=url)


def _list_field(block: dict[str, Any], name: str, url: str) -> list[Any]:
    value = block.get(name)
    if value is None:
        return []
    if type(value) is not list:
        raise MalformedAnswer(f"logprobs.{name} is {str(value)[:60]!r}, not a list", url=url)
    return value


def _named_ids(tokens: list[Any]) -> list[int] | None:
    """The IDs the ``"token_id:{id}"`` names stand for, or None when they are not all names (text
    tokens, which cannot be compared with IDs)."""
    return _joined_ids(tokens) if len(tokens) > _FEW_TOKENS else _ids_one_by_one(tokens)


def batch_samples(events: list[Any]) -> tuple[list[int], list[float], str | None] | None:
    """The samples of ``events`` (a stream's, in order) when every one has the plain shape: what
    ``samples_of`` gives for each, concatenated, and the last one's finish reason (only the last may
    have one). ``None`` when any does not; then ``samples_of``, event by event, says what it is."""
    tokens: list[Any] = []
    logprobs: list[Any] = []
    finished: str | None = None
    for event in events:
        if finished is not None or type(event) is not dict or "error" in event:
            return None  # an event after the finish reason, or not the plain shape
        choices = event.get("choices")
        if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
            return None
        choice = choices[0]
        if choice.get("index", 0) != 0:
            return None
        finished = choice.get("finish_reason")
        if finished is not None and (type(finished) is not str or finished not in FINISHED):
            return None
        block = choice.get("logprobs")
        if type(block) is not dict or choice.get("token_ids") is not None:
            return None
        names, values = block.get("tokens"), block.get("token_logprobs")
        if type(names) is not list or type(values) is not list or len(names) != len(values):
            return None
        tokens += names
        logprobs += values
    ids = _joined_ids(tokens) if len(tokens) > _FEW_TOKENS else _ids_one_by_one(tokens)
    if ids is None:
        return None
    floats = float_logprobs(logprobs)
    if floats is None:  # a null, NaN or positive logprob, or one that is not a number
        return None
    return ids, floats, finished


def events_through(events: list[Any], count: int, total: int) -> int:
    """How many of ``events`` (all of the plain shape, as ``batch_samples`` found them; ``total``
    tokens in all) it takes to hold their first ``count`` tokens. Counted from the end: the stop
    token that asks for this is nearly always in the last event."""
    k, held = len(events), total  # held: the tokens of events[:k]
    while k:
        last = len(events[k - 1]["choices"][0]["logprobs"]["tokens"])
        if held - last < count:
            return k
        held -= last
        k -= 1
    return 0


_TOKEN_ID_PREFIX = "token_id:"
_PREFIX = _TOKEN_ID_PREFIX.encode()
_SEPARATED_PREFIX = b"," + _PREFIX
# Up to this many tokens, ``_token_ids`` parses them one by one.
_FEW_TOKENS = 4


def _token_ids(tokens: list[Any], url: str) -> list[int]:
    """The IDs in ``"token_id:{id}"`` logprobs tokens (``return_tokens_as_token_ids``).

    A 256-token answer has 256 of them, so they are parsed in a few C-level passes over the tokens
    joined by commas, not token by token (~20 µs instead of ~110 µs): the joined text starts with the
    prefix, each of the other tokens' prefixes is one ``",token_id:"`` (counted by how much replacing
    them with ``","`` shortens the text), what is left is ASCII digits and commas, and that is a JSON
    array with one integer per token. Together these hold exactly when every token is the prefix and
    digits. Anything else (or digits JSON refuses, such as ``01``, or reads as a float, past 64 bits)
    takes the token-by-token path, which accepts and refuses exactly what it always did.
    """
    if len(tokens) <= _FEW_TOKENS:  # a streamed chunk (one token): the passes cost more than a loop
        return _token_ids_one_by_one(tokens, url)
    return _token_ids_joined(tokens, url)


def _token_ids_joined(tokens: list[Any], url: str) -> list[int]:
    """``_token_ids`` by the C-level passes (any number of tokens)."""
    ids = _joined_ids(tokens)
    return _token_ids_one_by_one(tokens, url) if ids is None else ids


def _joined_ids(tokens: list[Any]) -> list[int] | None:
    """The IDs by the C-level passes, or None where they do not hold (then token by token decides)."""
    try:
        joined = ",".join(tokens).encode()
    except (TypeError, UnicodeEncodeError):  # a token that is not a string, or a lone surrogate
        return None
    skip = len(_PREFIX)
    numbers = joined[skip:].replace(_SEPARATED_PREFIX, b",")
    if (
        joined.startswith(_PREFIX)
        and len(joined) - skip - len(numbers) == skip * (len(tokens) - 1)  # one prefix per separator
        and numbers.translate(None, b",").isdigit()
    ):
        try:
            ids = orjson.loads(b"[" + numbers + b"]")
        except orjson.JSONDecodeError:  # an empty ID, or leading zeros
            pass
        else:
            # No comma inside a token; and no ID past 64 bits, which orjson reads as a float.
            if len(ids) == len(tokens) and type(sum(ids)) is int:
                return ids
    return None


def _token_ids_one_by_one(tokens: list[Any], url: str) -> list[int]:
    ids = _ids_one_by_one(tokens)
    if ids is not None:
        return ids
    skip = len(_TOKEN_ID_PREFIX)
    bad = next((t for t in tokens if not (isinstance(t, str) and t[skip:].isdigit())), tokens[0])
    raise RemoteEngineError(
        f"{url}: logprobs token {str(bad)[:40]!r} is not 'token_id:<id>' (is the server older than "
        "return_tokens_as_token_ids, vLLM 0.6?)",
        retryable=False,
    )


def _ids_one_by_one(tokens: list[Any]) -> list[int] | None:
    """The IDs token by token (``int`` of what follows each prefix), or None if one is not a name."""
    skip = len(_TOKEN_ID_PREFIX)
    try:
        ids = [int(t[skip:]) for t in tokens if t[:skip] == _TOKEN_ID_PREFIX]
    except (TypeError, ValueError):  # not a string, or no number after the prefix
        return None
    return ids if len(ids) == len(tokens) and min(ids, default=0) >= 0 else None
