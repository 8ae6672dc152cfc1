"""OpenAI chat ``logprobs.content``: one entry per sampled token, written as JSON text directly.

An answer carries one entry (``token``, ``logprob``, ``bytes``, ``top_logprobs``) per sampled token:
``bytes`` are the token's own UTF-8 bytes (``token_bytes``), so the entries of a character split
over several tokens join to it, as OpenAI's do (their text alone is U+FFFD each).
hundreds of small dicts that cost more to build and encode than the rest of the answer. Everything
in an entry but its logprob depends on the token alone, so each token's JSON around the logprob is
encoded once per tokenizer and kept; an answer's entries are those pieces joined around its
logprobs (encoded together by one ``orjson.dumps``), embedded in the answer as an
``orjson.Fragment``. The text is what ``orjson.dumps`` of the entries gives.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from functools import cache
from typing import Any

import orjson

# tokenizer -> ({token id: "," + the entry's JSON up to its logprob}, {token id: the JSON after it})
_PIECES: weakref.WeakKeyDictionary[Any, tuple[dict[int, bytes], dict[int, bytes]]] = (
    weakref.WeakKeyDictionary()
)


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@cache
def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character a ``ByteLevel`` vocabulary writes for each byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = (b for b in range(256) if b not in printable)
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}


def token_bytes(tokenizer: Any, token_id: int, text: str) -> bytes:
    """The bytes token ``token_id`` stands for. ``text`` (its decode) is whole UTF-8 for most tokens;
    one that holds part of a character decodes to U+FFFD, and its bytes are read from its vocabulary
    entry: a byte-fallback token (``<0xE9>``) or a byte-level one (GPT-2's alphabet)."""
    if "\ufffd" not in text:
        return text.encode("utf-8", "surrogatepass")
    raw = tokenizer.convert_ids_to_tokens([token_id])[0]
    found = _BYTE_TOKEN.fullmatch(raw or "")
    if found is not None:
        return bytes([int(found.group(1), 16)])
    table = _byte_level_table()
    if raw and all(ch in table for ch in raw):
        return bytes(table[ch] for ch in raw)
    return text.encode("utf-8", "surrogatepass")  # a token that is U+FFFD itself


def _encode(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # what orjson refuses (a lone surrogate): the lenient encoder, as ``calls._dumps``
        return json.dumps(value, ensure_ascii=False).encode()


def _pieces(tokenizer: Any, token_ids: Sequence[int]) -> tuple[dict[int, bytes], dict[int, bytes]]:
    pieces = _PIECES.get(tokenizer)
    if pieces is None:
        pieces = _PIECES[tokenizer] = ({}, {})
    heads, tails = pieces
    missing = [t for t in dict.fromkeys(token_ids) if t not in tails]
    for token_id, text in zip(missing, tokenizer.token_texts(missing), strict=True):
        heads[token_id] = b"," + _encode({"token": text})[:-1] + b',"logprob":'
        # The engine reports the sampled token's logprob only, so ``top_logprobs`` stays empty.
        tails[token_id] = (
            b',"bytes":' + _encode(list(token_bytes(tokenizer, token_id, text))) + b',"top_logprobs":[]}'
        )
    return pieces


def logprob_content(tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[float]) -> orjson.Fragment:
    """The JSON array of the entries of ``token_ids`` with ``logprobs`` (a non-finite one as ``null``)."""
    return orjson.Fragment(logprob_json(tokenizer, token_ids, logprobs))


def logprob_json(tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[float]) -> bytes:
    """``logprob_content`` as bytes (a streamed chunk's event is joined from bytes, not encoded)."""
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{len(token_ids)} token IDs but {len(logprobs)} logprobs")
    if not token_ids:
        return b"[]"
    if len(token_ids) == 1:  # a streamed chunk: one entry
        return _one_entry(tokenizer, token_ids[0], logprobs[0])
    heads, tails = _pieces(tokenizer, token_ids)
    # Floats never hold a comma: one encode of the list gives each logprob's text.
    numbers = orjson.dumps(logprobs if isinstance(logprobs, list) else list(logprobs))[1:-1].split(b",")
    parts: list[bytes] = [b""] * (3 * len(token_ids) + 2)  # "[", then head, number, tail per entry, "]"
    parts[1:-1:3] = map(heads.__getitem__, token_ids)
    parts[2:-1:3] = numbers
    parts[3:-1:3] = map(tails.__getitem__, token_ids)
    parts[0], parts[1], parts[-1] = b"[", parts[1][1:], b"]"  # the first entry has no comma before it
    return b"".join(parts)


def _one_entry(tokenizer: Any, token_id: int, logprob: float) -> bytes:
    pieces = _PIECES.get(tokenizer)
    if pieces is None or token_id not in pieces[1]:
        pieces = _pieces(tokenizer, [token_id])
    number = orjson.dumps([logprob])[1:-1]  # as the list of many is encoded
    return b"[" + pieces[0][token_id][1:] + number + pieces[1][token_id] + b"]"
