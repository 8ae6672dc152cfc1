"""``logprobs.logprob_content`` writes exactly the JSON the entries' dicts encode to.

The entries are built from per-token pieces kept across answers; checked against the plain way
(a dict per token, ``orjson.dumps``) for random tokens of the tiny vocabulary (multi-byte and
partial UTF-8 ones included), random logprobs (``-0.0``, tiny and non-finite ones included) and
repeated tokens, on the first and on later answers (the kept pieces). A token's ``bytes`` are its
own UTF-8 bytes: for one that holds part of a character (its text U+FFFD), those of its byte-level
vocabulary entry, read here with GPT-2's table as its ``encoder.py`` builds it."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.apis.logprobs import logprob_content
from harnessrl.tokenizer import PolicyTokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: the byte each character of a byte-level vocabulary is."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


BYTE_DECODER = _byte_decoder()


def _bytes(tokenizer: PolicyTokenizer, token_id: int, text: str) -> list[int]:
    if "\ufffd" not in text:
        return list(text.encode())
    return [BYTE_DECODER[ch] for ch in tokenizer.convert_ids_to_tokens([token_id])[0]]


def plain(tokenizer: PolicyTokenizer, ids: list[int], lps: list[float]) -> bytes:
    return orjson.dumps(
        [
            {"token": text, "logprob": lp, "bytes": _bytes(tokenizer, token_id, text), "top_logprobs": []}
            for token_id, text, lp in zip(ids, tokenizer.token_texts(ids), lps, strict=True)
        ]
    )


logprobs = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [-0.0, -1e-300, -9999.0, math.nan]
)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_entries_are_what_their_dicts_encode_to(tokenizer: PolicyTokenizer, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=30))
    lps = data.draw(st.lists(logprobs, min_size=len(ids), max_size=len(ids)))
    for _ in range(2):  # the second answer uses the kept pieces
        assert bytes(orjson.dumps(logprob_content(tokenizer, ids, lps))) == plain(tokenizer, ids, lps)


def test_an_answer_embeds_them_as_they_are(tokenizer: PolicyTokenizer) -> None:
    ids = tokenizer.encode("héllo wörld ✓")
    body = orjson.dumps({"content": logprob_content(tokenizer, ids, [-0.5] * len(ids))})
    assert orjson.loads(body)["content"] == orjson.loads(plain(tokenizer, ids, [-0.5] * len(ids)))


def test_mismatched_lengths_are_refused(tokenizer: PolicyTokenizer) -> None:
    with pytest.raises(ValueError):
        logprob_content(tokenizer, [1, 2], [-1.0])


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_one_token_chunk_is_what_its_dict_encodes_to(
    tokenizer: PolicyTokenizer, data: st.DataObject
) -> None:
    # A streamed answer's chunks carry one token each (a path of its own); new and kept tokens alike.
    token_id = data.draw(st.integers(0, tokenizer.vocab_size - 1))
    lp = data.draw(logprobs | st.integers(-50, 0))
    for _ in range(2):
        assert bytes(orjson.dumps(logprob_content(tokenizer, [token_id], [lp]))) == plain(
            tokenizer, [token_id], [lp]
        )
