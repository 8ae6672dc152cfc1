"""What a remote server's sampled tokens must be before an engine passes them on: the checks vLLM's
and SGLang's engines share.

A call records the IDs and logprobs the server sent, and training takes them as the policy's: a
logprob that is null (read as 0.0 it claims the token was certain), ``NaN``, infinite or above 0, an
ID that is not an integer of the model's vocabulary, or more tokens than were asked for, would be
trained on as if the policy had done it. Each such answer fails the call instead
(:class:`~harnessrl.engines.remote.MalformedAnswer`, retryable).

Every check runs on every batch of every call, so each is a few C-level passes over the batch
(``map(type, ...)`` into a set, ``min``/``max``/``sum``), never a Python loop per token; only an
answer already found bad is looked at token by token, to say which value is wrong.
"""

from __future__ import annotations

import math
from typing import Any

from harnessrl.engines.remote import MalformedAnswer

#: How far above 0 a reported logprob may be: a server computes in float32, and the logprob of a
#: token of probability 1 may round to a hair above 0 (anything larger is not a log-probability).
LOGPROB_TOLERANCE = 1e-4

_NUMBER_TYPES = frozenset({float, int})  # not bool: a JSON true is not a number
_FLOAT_TYPE = frozenset({float})
_INT_TYPE = frozenset({int})


def token_id_limit(tokenizer: Any) -> int | None:
    """One past the largest token ID the model can sample: its embedding rows (``config.json``'s
    ``vocab_size``, often padded past the tokenizer's) or the tokenizer's IDs, whichever is larger;
    None when the tokenizer says neither (no upper bound is checked)."""
    sizes = [getattr(tokenizer, "vocab_size", None), getattr(tokenizer, "model_vocab_size", None)]
    known = [size for size in sizes if isinstance(size, int) and size > 0]
    return max(known) if known else None


def float_logprobs(values: list[Any]) -> list[float] | None:
    """``values`` as floats when each is a finite number at most ``LOGPROB_TOLERANCE``; None if one is
    not (``null``, text, a bool, ``NaN``, infinite, above 0). C-level passes only."""
    if not values:
        return []
    types = set(map(type, values))
    if types == _FLOAT_TYPE:  # as servers send them: the list itself, not a copy
        floats = values
    elif _NUMBER_TYPES.issuperset(types):
        try:
            floats = list(map(float, values))
        except OverflowError:  # an integer past a float's range
            return None
    else:
        return None
    # A NaN or an infinity makes the sum one of them; then ``max`` is not consulted (NaN compares
    # false either way).
    if not math.isfinite(sum(floats)) or max(floats) > LOGPROB_TOLERANCE:
        return None
    return floats


def checked_logprobs(values: list[Any], url: str) -> list[float]:
    """``float_logprobs`` of ``values``, or :class:`MalformedAnswer` naming the first bad one."""
    floats = float_logprobs(values)
    if floats is None:
        bad = next((v for v in values if float_logprobs([v]) is None), values[0] if values else None)
        raise MalformedAnswer(
            f"a sampled token's logprob is {bad!r}: each must be a finite number <= 0 "
            "(a null, NaN or positive one would be trained on as the policy's)",
            url=url,
        )
    return floats


def check_token_ids(ids: list[Any], limit: int | None, url: str) -> None:
    """``ids`` are integers (not bools or floats) in ``[0, limit)`` (``limit`` None: no upper
    bound), or :class:`MalformedAnswer`."""
    if not ids:
        return
    if not _INT_TYPE.issuperset(map(type, ids)):
        bad = next(i for i in ids if type(i) is not int)
        raise MalformedAnswer(f"token ID {bad!r} is not an integer", url=url)
    low = min(ids)
    if low < 0:
        raise MalformedAnswer(f"token ID {low} is negative", url=url)
    check_id_bound(ids, limit, url)


def check_id_bound(ids: list[int], limit: int | None, url: str) -> None:
    """``ids``, integers >= 0 already (``check_token_ids``, or parsed from ``token_id:`` digits), are
    below ``limit`` (None: nothing to check), or :class:`MalformedAnswer`."""
    if ids and limit is not None and max(ids) >= limit:
        raise MalformedAnswer(f"token ID {max(ids)} is outside the vocabulary [0, {limit})", url=url)


def check_count(count: int, budget: int, url: str) -> None:
    """The server sent ``count`` tokens for a request that asked for at most ``budget``."""
    if count > budget:
        raise MalformedAnswer(f"{count} tokens sent for a request of max_tokens={budget}", url=url)
