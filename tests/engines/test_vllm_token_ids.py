"""How ``VLLMEngine`` reads sampled token IDs and logprobs out of an answer: the C-level parse of
``"token_id:{id}"`` names (``vllm_samples._token_ids``) accepts and refuses exactly what the
token-by-token parse does, with the same IDs and the same error (a few tokens, as a streamed chunk
has, are parsed one by one); and an answer whose samples cannot be the policy's (a null, NaN or
positive logprob, several choices, IDs that are not integers >= 0 or disagree with their names) is a
retryable ``MalformedAnswer``, never a ``ValueError``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harnessrl.engines.remote import MalformedAnswer, RemoteEngineError
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


def test_samples_turn_integer_logprobs_into_floats() -> None:
    answer = {
        "choices": [
            {"index": 0, "logprobs": {"tokens": ["token_id:3", "token_id:4"], "token_logprobs": [0, -1]}}
        ]
    }
    ids, logprobs, finish = samples_of(answer, "u")
    assert (ids, logprobs, finish) == ([3, 4], [0.0, -1.0], None)
    assert all(type(lp) is float for lp in logprobs)


# Each is refused as a retryable MalformedAnswer, never a ValueError (a 500 at the gateway) and never
# samples. A null logprob was read as 0.0 (a certain token) before; vLLM sends null only for a prompt
# position (echo), which these requests never ask for.
MALFORMED = {
    "null_logprob": {"choices": [{"logprobs": {"tokens": ["token_id:3"], "token_logprobs": [None]}}]},
    "positive_logprob": {"choices": [{"logprobs": {"tokens": ["token_id:3"], "token_logprobs": [0.5]}}]},
    "text_logprob": {"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": ["x"]}}]},
    "text_nan_logprob": {"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": ["nan"]}}]},
    "bool_logprob": {"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [False]}}]},
    "two_choices": {"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}}] * 2},
    "second_choice_only": {"choices": [{"index": 1, "token_ids": [5], "logprobs": {"token_logprobs": [-1]}}]},
    "no_choices": {},
    "text_ids": {"choices": [{"token_ids": ["5"], "logprobs": {"token_logprobs": [-0.5]}}]},
    "float_ids": {"choices": [{"token_ids": [7.9], "logprobs": {"token_logprobs": [-0.5]}}]},
    "bool_ids": {"choices": [{"token_ids": [True], "logprobs": {"token_logprobs": [-0.5]}}]},
    "negative_ids": {"choices": [{"token_ids": [-3], "logprobs": {"token_logprobs": [-0.5]}}]},
    "ids_not_names": {
        "choices": [{"token_ids": [5], "logprobs": {"tokens": ["token_id:6"], "token_logprobs": [-0.5]}}]
    },
    "unknown_finish": {"choices": [{"token_ids": [], "finish_reason": "tool_calls"}]},
    "choice_not_object": {"choices": [7]},
    "not_an_object": "upstream hiccup",
}


@pytest.mark.parametrize("answer", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_answer_is_a_retryable_error_not_samples(answer: Any) -> None:
    with pytest.raises(MalformedAnswer) as caught:
        samples_of(answer, "u")
    assert caught.value.retryable


def test_token_ids_beside_matching_names_or_text_tokens_are_taken() -> None:
    named = {
        "choices": [
            {
                "token_ids": [5, 6],
                "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-1, -2]},
            }
        ]
    }
    text = {
        "choices": [{"token_ids": [5, 6], "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1, -2]}}]
    }
    assert samples_of(named, "u") == samples_of(text, "u") == ([5, 6], [-1.0, -2.0], None)
