"""``logprobs.logprob_content`` writes exactly the JSON the entries' dicts encode to.

The entries are built from per-token pieces kept across answers; checked against the plain way
(a dict per token, ``orjson.dumps``) for random tokens of the tiny vocabulary (multi-byte and
partial UTF-8 ones included), random logprobs (``-0.0``, tiny and non-finite ones included) and
repeated tokens, on the first and on later answers (the kept pieces)."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.apis.logprobs import logprob_content
from harnessrl.tokenizer import PolicyTokenizer


def plain(tokenizer: PolicyTokenizer, ids: list[int], lps: list[float]) -> bytes:
    return orjson.dumps(
        [
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
            for text, lp in zip(tokenizer.token_texts(ids), lps, strict=True)
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
