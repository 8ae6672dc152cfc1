"""OpenAI chat ``logprobs.content``: one entry per sampled token, written as JSON text directly.

An answer carries one entry (``token``, ``logprob``, ``bytes``, ``top_logprobs``) per sampled token:
hundreds of small dicts that cost more to build and encode than the rest of the answer. Everything
in an entry but its logprob depends on the token alone, so each token's JSON around the logprob is
encoded once per tokenizer and kept; an answer's entries are those pieces joined around its
logprobs (encoded together by one ``orjson.dumps``), embedded in the answer as an
``orjson.Fragment``. The text is what ``orjson.dumps`` of the entries gives.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any

import orjson

# tokenizer -> {token id: (the entry's JSON up to its logprob, the JSON after it and a comma)}
_PIECES: weakref.WeakKeyDictionary[Any, dict[int, tuple[bytes, bytes]]] = weakref.WeakKeyDictionary()


def _encode(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # what orjson refuses (a lone surrogate): the lenient encoder, as ``calls._dumps``
        return json.dumps(value, ensure_ascii=False).encode()


def _pieces(tokenizer: Any, token_ids: Sequence[int]) -> dict[int, tuple[bytes, bytes]]:
    pieces = _PIECES.get(tokenizer)
    if pieces is None:
        pieces = _PIECES[tokenizer] = {}
    missing = [t for t in dict.fromkeys(token_ids) if t not in pieces]
    for token_id, text in zip(missing, tokenizer.token_texts(missing), strict=True):
        head = _encode({"token": text})[:-1] + b',"logprob":'
        # The engine reports the sampled token's logprob only, so ``top_logprobs`` stays empty.
        tail = b',"bytes":' + _encode(list(text.encode("utf-8", "surrogatepass"))) + b',"top_logprobs":[]},'
        pieces[token_id] = (head, tail)
    return pieces


def logprob_content(tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[float]) -> orjson.Fragment:
    """The JSON array of the entries of ``token_ids`` with ``logprobs`` (a non-finite one as ``null``)."""
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{len(token_ids)} token IDs but {len(logprobs)} logprobs")
    if not token_ids:
        return orjson.Fragment(b"[]")
    pieces = _pieces(tokenizer, token_ids)
    # Floats never hold a comma: one encode of the list gives each logprob's text.
    numbers = orjson.dumps(logprobs if isinstance(logprobs, list) else list(logprobs))[1:-1].split(b",")
    parts: list[bytes] = [b""] * (3 * len(token_ids))
    parts[0::3] = [pieces[t][0] for t in token_ids]
    parts[1::3] = numbers
    parts[2::3] = [pieces[t][1] for t in token_ids]
    return orjson.Fragment(b"[" + b"".join(parts)[:-1] + b"]")
