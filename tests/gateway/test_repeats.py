"""A request that repeats its rollout's previous history is checked only where it is new, and answered
exactly as if it were checked whole.

- ``repeats.history_bytes`` counts the leading items that are the same JSON (types included) as
  the previous request's, whatever edits came between (property test against a per-item encode);
- through a real gateway, a second request whose *new* messages break a rule (nesting, integer
  range, a field's type, the prompt-size cap, an integer literal past 64 bits) gets exactly the
  answer a first request with the same body gets — the error of the whole-body check — and nothing
  is recorded; the control: the same extension without the fault is answered 200;
- a repeated message whose JSON type changed (``1`` to ``1.0``) is not taken as repeated.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.prompt.messages import key_messages
from harnessrl.gateway.prompt.repeats import history_bytes, text_chars

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, 0.5, -2.0]) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
items = st.lists(json_values, max_size=6)


def _expected_same(new: list[Any], old: list[Any]) -> int:
    same = 0
    while same < min(len(new), len(old)) and orjson.dumps(new[same]) == orjson.dumps(old[same]):
        same += 1
    return same


@settings(max_examples=300, deadline=None)
@given(
    old=items,
    keep=st.integers(0, 6),
    added=items,
    retype=st.booleans(),
)
def test_history_bytes_counts_exactly_the_repeated_items(
    old: list[Any], keep: int, added: list[Any], retype: bool
) -> None:
    new = copy.deepcopy(old[:keep]) + added
    if retype and new and new[0] == 1:
        new[0] = 1.0  # equal in Python, not the same JSON
    first = history_bytes(old, None)
    assert first is not None and first[1] == 0
    got = history_bytes(new, first[0])
    assert got is not None
    history, same = got
    assert same == _expected_same(new, old)
    blob = orjson.dumps(new)
    assert history.blob == blob
    # Each item ends where the list's encoding says, and the text counts add up.
    starts = [1, *(end + 1 for end in history.ends[:-1])][: len(new)]
    assert [blob[s:e] for s, e in zip(starts, history.ends, strict=True)] == [orjson.dumps(i) for i in new]
    assert history.text_chars(len(new)) == text_chars(new)
    # What the store keeps of each item (``store.chains.EncodedItems``), non-ASCII text included.
    assert history.texts() == tuple(orjson.dumps(i).decode() for i in new)


def test_key_messages_takes_a_retyped_message_as_new() -> None:
    first = [{"role": "user", "content": "hi", "name": None}, {"role": "tool", "content": "1", "n": 1}]
    second = [first[0], {**first[1], "n": 1.0}]
    keyed = key_messages(first)
    again = history_bytes(second, keyed.history)
    assert again is not None and again[1] == 1


# -- through a real gateway ----------------------------------------------------------------------

BASE = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug."},
]
ANSWER = {"role": "assistant", "content": "ok"}


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"k": value}
    return value


# Each: the new messages appended after the first call's history and its answer, as a JSON text
# fragment (some faults exist only as text: an integer literal past 64 bits).
FAULTS = {
    "nesting": json.dumps({"role": "tool", "tool_call_id": "c", "content": "x", "extra": _deep(70)}),
    "integer_range": '{"role": "tool", "tool_call_id": "c", "content": "x", "extra": 9223372036854775808}',
    "integer_literal": '{"role": "user", "content": "x", "extra": 10000000000000000000}',
    "field_type": '{"role": "user", "content": 5}',
    "role": '{"role": "wizard", "content": "x"}',
    "prompt_size": json.dumps({"role": "user", "content": "y" * 5000}),
}
FINE = '{"role": "user", "content": "thanks", "extra": 1e19}'  # a float past 2**63 is fine


def _body(extra: str) -> bytes:
    """The first call's history, its answer, ``extra`` and one more plain message (so the fault is
    in neither the first nor the last new message)."""
    messages = json.dumps([*BASE, ANSWER])[:-1]
    return f'{{"model": "m", "messages": {messages}, {extra}, {{"role": "user", "content": "go"}}]}}'.encode()


def _post(http: httpx.Client, rollout: dict[str, Any], raw: bytes) -> httpx.Response:
    return http.post(
        f"{rollout['base_url']}/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {rollout['api_key']}", "content-type": "application/json"},
    )


@pytest.mark.parametrize("fault", [*FAULTS, "none"])
def test_a_fault_in_the_new_messages_gets_the_whole_body_answer(make_gateway: Any, fault: str) -> None:
    gw = make_gateway(["ok", "ok", "ok"], max_prompt_chars=4000)
    extra = FAULTS.get(fault, FINE)
    with httpx.Client(timeout=30) as http:
        fresh = gw.rollout()
        whole = _post(http, fresh, _body(extra))  # a first request: checked whole
        rollout = gw.rollout()
        first = _post(http, rollout, json.dumps({"model": "m", "messages": BASE}).encode())
        assert first.status_code == 200, first.text
        assert first.json()["choices"][0]["message"]["content"] == "ok"
        second = _post(http, rollout, _body(extra))  # repeats BASE and the answer, adds `extra`
    assert second.status_code == whole.status_code
    if fault == "none":
        assert second.status_code == 200, second.text
        assert len(gw.client.list_calls(rollout["rollout_id"])) == 2
        return
    assert whole.status_code in (400, 413), whole.text
    assert second.json() == whole.json()
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1  # only the first call


def test_the_rest_of_the_body_is_checked_again_when_it_changes(make_gateway: Any) -> None:
    """The rest of a body (model, tools, sampling) is taken as checked only while it is the same JSON
    as the last request's: a changed field is validated, and its new value is the one used."""
    gw = make_gateway(["ok", "A long answer that max_tokens cuts.", "ok"])
    rollout = gw.rollout()
    first = {"model": "m", "messages": BASE, "temperature": 0.5}
    with httpx.Client(timeout=30) as http:
        assert _post(http, rollout, json.dumps(first).encode()).status_code == 200
        history = [*BASE, ANSWER, {"role": "user", "content": "more"}]
        for changed, status in (({"temperature": 7}, 400), ({"n": 2}, 400), ({"temperature": "hot"}, 400)):
            resp = _post(http, rollout, json.dumps({**first, "messages": history, **changed}).encode())
            fresh = _post(http, gw.rollout(), json.dumps({**first, "messages": history, **changed}).encode())
            assert resp.status_code == status and resp.json() == fresh.json(), (changed, resp.text)
        # The same messages again with a new max_tokens: answered, and cut where it says.
        cut = _post(http, rollout, json.dumps({**first, "messages": history, "max_tokens": 2}).encode())
    assert cut.status_code == 200, cut.text
    choice = cut.json()["choices"][0]
    assert choice["finish_reason"] == "length" and cut.json()["usage"]["completion_tokens"] == 2
