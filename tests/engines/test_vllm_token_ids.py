"""How ``VLLMEngine`` reads sampled token IDs and logprobs out of an answer: the C-level parse of
``"token_id:{id}"`` names (``vllm_samples._token_ids``) accepts and refuses exactly what the token-by-token
parse does, with the same IDs and the same error (a few tokens, as a streamed chunk has, are parsed one by one)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harnessrl.engines.remote import RemoteEngineError
from harnessrl.engines.vllm_samples import _token_ids, _token_ids_joined, _token_ids_one_by_one, samples_of


def outcome(parse: Any, tokens: list[Any]) -> tuple[str, Any]:
    try:
        return "ids", parse(tokens, "u")
    except RemoteEngineError as exc:
        return "error", (str(exc), exc.retryable)


names = st.integers(min_value=0, max_value=2**40).map(lambda i: f"token_id:{i}")
# Text near the format: digits, the prefix's own characters, separators, signs, spaces, non-ASCII digits.
near = st.text(alphabet="0123456789token_id:,-+ ._e\n٣", max_size=14)
tokens_strategy = st.lists(
    st.one_of(
        names,
        names,
        near.map(lambda t: f"token_id:{t}"),
        near,
        st.integers(-3, 3),
        st.none(),
    ),
    max_size=12,
)


@given(tokens_strategy)
@example(["token_id:1,token_id:2"])
@example(["token_id:token_id:5", "token_id:7"])
@example(["token_id:01", "token_id:2"])  # int() takes leading zeros, JSON does not
@example(["token_id:", "token_id:2"])
@example(["token_id:-0"])
@example(["token_id: 5"])
@example(["token_id:١٢"])  # int() takes Arabic-Indic digits
@example(["5token_id:"])
@example(["token_id:99999999999999999999999"])  # past 64 bits: orjson refuses, int() does not
@example(["token_id:1_000"])
@example(["token_id:5", "x,token_id:6"])
@example(["token_id:\ud800"])  # a lone surrogate cannot be encoded
def test_the_fast_parse_matches_the_token_by_token_one(tokens: list[Any]) -> None:
    assert outcome(_token_ids_joined, tokens) == outcome(_token_ids_one_by_one, tokens)
    assert outcome(_token_ids, tokens) == outcome(_token_ids_one_by_one, tokens)


def test_a_whole_answer_of_names_parses_to_its_ids() -> None:
    ids = [0, 7, 151645, 2**31]
    assert _token_ids([f"token_id:{i}" for i in ids], "u") == ids
    assert _token_ids([], "u") == []
    with pytest.raises(RemoteEngineError, match="'t5' is not 'token_id:<id>'") as caught:
        _token_ids(["token_id:4", "t5"], "u")
    assert not caught.value.retryable


def test_samples_turn_null_and_integer_logprobs_into_floats() -> None:
    answer = {
        "choices": [{"logprobs": {"tokens": ["token_id:3", "token_id:4"], "token_logprobs": [None, -1]}}]
    }
    ids, logprobs = samples_of(answer, "u")
    assert (ids, logprobs) == ([3, 4], [0.0, -1.0])
    assert all(type(lp) is float for lp in logprobs)
    two = {"choices": [{"token_ids": ["5"], "logprobs": {"token_logprobs": [-0.5]}}] * 2}
    assert samples_of(two, "u") == ([5, 5], [-0.5, -0.5])  # IDs as given, converted; choices joined
    with pytest.raises(ValueError):
        samples_of({"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": ["x"]}}]}, "u")
