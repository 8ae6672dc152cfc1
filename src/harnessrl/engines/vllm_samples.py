"""What a vLLM answer sampled: the token IDs and logprobs of a stream's events or of a whole answer.

``samples_of`` reads one event (or one non-streamed answer) and is the reference: it accepts and
refuses what ``VLLMEngine`` always did, naming what is wrong. A stream has one event per sampled token
and a read of the socket often holds many (:mod:`harnessrl.engines.sse` parses them a read at a time),
so ``batch_samples`` reads a read's events together: a tight loop over the plain shape (one choice, a
logprobs block with ``"token_id:{id}"`` tokens, no error, not cut short) and one parse of all their
token names. Anything else (an error event, ``token_ids``, a null logprob, a bad name) makes it answer
``None``, and the caller reads those events one by one with ``samples_of``, so what is yielded before
an error, and the error, stay exactly what they were.
"""

from __future__ import annotations

from typing import Any

import orjson

from harnessrl.engines.remote import AbortedByEngine, RemoteEngineError, stream_error

#: Finish reasons with which the server, not the policy, ended an answer.
CUT_SHORT = frozenset({"abort", "error"})


def samples_of(event: Any, url: str) -> tuple[list[int], list[float]]:
    """The token IDs and logprobs of one stream chunk or of a whole non-streamed answer.

    Called once per streamed token, and with 256 tokens for a whole answer: the per-token work is
    C-level passes (``map``, :func:`_token_ids`), not Python loops."""
    error = stream_error(event, url)
    if error is not None:
        raise error
    if not isinstance(event, dict):
        raise RemoteEngineError(f"{url}: unexpected answer {str(event)[:120]!r}", retryable=False)
    out_ids: list[int] = []
    out_logprobs: list[float] = []
    for choice in event.get("choices") or []:
        finish = choice.get("finish_reason")
        if finish in CUT_SHORT:
            raise AbortedByEngine(
                f"{url}: the server ended the generation itself (finish_reason={finish!r}: paused "
                "with mode=abort, aborted, or failed); the partial answer is discarded",
                url=url,
            )
        block = choice.get("logprobs") or {}
        logprobs = block.get("token_logprobs") or []
        ids = choice.get("token_ids")
        ids = _token_ids(block.get("tokens") or [], url) if ids is None else list(map(int, ids))
        if len(logprobs) != len(ids):
            raise RemoteEngineError(
                f"{url}: chunk has {len(ids)} token IDs but {len(logprobs)} logprobs "
                "(does the server take logprobs and return_tokens_as_token_ids?)",
                retryable=False,
            )
        try:
            logprobs = list(map(float, logprobs))
        except TypeError:  # a null logprob (or a value float() refuses: raised again below)
            logprobs = [0.0 if lp is None else float(lp) for lp in logprobs]
        if out_ids:
            out_ids += ids
            out_logprobs += logprobs
        else:  # one choice, as always: its fresh lists, not copies
            out_ids, out_logprobs = ids, logprobs
    return out_ids, out_logprobs


def batch_samples(events: list[Any]) -> tuple[list[int], list[float]] | None:
    """The samples of ``events`` (a stream's, in order) when every one has the plain shape: what
    ``samples_of`` gives for each, concatenated. ``None`` when any does not; then ``samples_of``, event
    by event, says what it is."""
    tokens: list[Any] = []
    logprobs: list[Any] = []
    for event in events:
        if type(event) is not dict or "error" in event:
            return None
        choices = event.get("choices")
        if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
            return None
        choice = choices[0]
        finish = choice.get("finish_reason")
        if finish is not None and (type(finish) is not str or finish in CUT_SHORT):
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
    try:
        return ids, list(map(float, logprobs))
    except (TypeError, ValueError):  # a null logprob, or one float() refuses
        return None


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
