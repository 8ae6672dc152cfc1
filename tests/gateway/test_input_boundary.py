"""Issue 19, the input boundary: every input the model API or the control API accepts is strict JSON
and typed, anything else is a 4xx in the provider's shape naming the problem, before anything is
recorded or generated; and nothing already stored can make a later read fail.

One test per numbered case of the issue, each with the well-formed input beside it as a control.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import httpx
import pytest

from harnessrl.errors import BadRequest
from harnessrl.gateway.json_input import MAX_JSON_DEPTH, parse_json
from harnessrl.schemas import Outcome, RolloutStatus

ADMIN_KEY = "test-admin-key"  # the gateway fixture's (tests/gateway/conftest.py)
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
CHAT = '{"model": "m", "messages": [{"role": "user", "content": "hi"}]@@}'


def post(url: str, raw: str | bytes, headers: dict[str, str]) -> httpx.Response:
    body = raw.encode() if isinstance(raw, str) else raw
    return httpx.post(url, content=body, headers={"content-type": "application/json", **headers}, timeout=30)


def fill(template: str, value: str) -> str:
    return template.replace("@@", value)


def key(rollout: dict[str, Any]) -> dict[str, str]:
    return {"authorization": f"Bearer {rollout['api_key']}"}


def assert_openai_400(r: httpx.Response, *words: str) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param"} and err["type"] == "invalid_request_error"
    for word in words:
        assert word in err["message"], err["message"]
    return err


def assert_anthropic_400(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    for word in words:
        assert word in body["error"]["message"], body["error"]["message"]


def assert_untouched(gw: Any, rollout: dict[str, Any]) -> None:
    """Nothing recorded, nothing generated, the rollout not even started."""
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    assert gw.store.get_rollout(rollout["rollout_id"]).status == RolloutStatus.QUEUED


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- 1. strict JSON: surrogates, NaN/Infinity, deep nesting, huge numbers -----------------------------

SURROGATE = '"\\ud800"'  # valid JSON text, not valid Unicode

EMOJI = '"hi \\ud83d\\ude00"'  # a surrogate pair: valid
# (route, body with a hole for the value, a good value, whether the route answers in Anthropic's shape)
ROUTES = [
    ("chat/completions", '{"model": "m", "messages": [{"role": "user", "content": @@}]}', EMOJI, False),
    ("chat/completions", '{"model": @@, "messages": [{"role": "user", "content": "hi"}]}', '"m"', False),
    (
        "chat/completions",
        '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
        '"function": {"name": @@, "parameters": {"type": "object"}}}]}',
        '"f"',
        False,
    ),
    ("completions", '{"model": "m", "prompt": @@}', EMOJI, False),
    ("responses", '{"model": "m", "input": @@}', EMOJI, False),
    ("responses", '{"model": "m", "input": "hi", "metadata": {"k": @@}}', "1e19", False),
    (
        "messages",
        '{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": @@}]}',
        EMOJI,
        True,
    ),
    ("messages/count_tokens", '{"model": "m", "messages": [{"role": "user", "content": @@}]}', EMOJI, True),
]
FIELDS = {  # the field each template's hole is in (deep nesting names its first levels under it)
    ROUTES[0][1]: "messages.0.content",
    ROUTES[1][1]: "model",
    ROUTES[2][1]: "tools.0.function.name",
    ROUTES[3][1]: "prompt",
    ROUTES[4][1]: "input",
    ROUTES[5][1]: "metadata.k",
}
BAD_VALUES = [
    (SURROGATE, "surrogate"),
    ('"\\udc00 tail"', "surrogate"),
    ("NaN", "NaN and Infinity"),
    ("-Infinity", "NaN and Infinity"),
    ("1e999", "too large"),
    ("9" * 5000, "too large"),  # a 5,000-digit literal
    ("9223372036854775808", "64-bit"),  # 2^63: orjson reads it as an int
    ("-9223372036854775809", "64-bit"),  # below -2^63: orjson reads it as a float
    ("100000000000000000000", "64-bit"),  # past 2^64: orjson reads it as a float
    (nested(5000), "deeper than"),  # orjson's own limit; the old fallback hit RecursionError
    (nested(1000), "deeper than"),  # orjson took it; the template or the store write failed later
    (nested(MAX_JSON_DEPTH), "deeper than"),
]


@pytest.mark.parametrize(("route", "template", "good", "anthropic"), ROUTES)
def test_strict_json_on_every_model_route(
    make_gateway: Any, route: str, template: str, good: str, anthropic: bool
) -> None:
    gw = make_gateway(["ok"])
    rollout = gw.rollout()
    url = f"{rollout['base_url']}/{route}"
    for value, words in BAD_VALUES:
        r = post(url, fill(template, value), key(rollout))
        if anthropic:
            assert_anthropic_400(r, "not valid JSON", words)
        else:
            err = assert_openai_400(r, "not valid JSON", words)
            assert (err["param"] or "").startswith(FIELDS[template]), err  # names the field
    assert_untouched(gw, rollout)
    # Control: the same body with a fine value (a surrogate pair, a big float) is answered.
    r = post(url, fill(template, good), key(rollout))
    assert r.status_code == 200, r.text


def test_strict_json_on_the_control_api(gateway: Any) -> None:
    url = f"{gateway.url}/api/rollouts"
    for value, words in BAD_VALUES:
        assert_openai_400(post(url, fill('{"task": {"prompt": @@}}', value), ADMIN), "not valid JSON", words)
        assert_openai_400(post(url, fill('{"group": @@}', value), ADMIN), "not valid JSON")
    assert gateway.client.list_rollouts() == []  # nothing was created
    created = post(url, '{"task": {"prompt": "caf\\u00e9 \\ud83d\\ude00", "big": 1e19}, "group": "g"}', ADMIN)
    assert created.status_code == 201, created.text
    assert created.json()["task"] == {"prompt": "café 😀", "big": 1e19}
    rollout = created.json()
    finish = f"{url}/{rollout['rollout_id']}/finish"
    assert_openai_400(post(finish, '{"outcome": "success", "reward": NaN}', ADMIN), "NaN")
    assert gateway.store.get_rollout(rollout["rollout_id"]).status == RolloutStatus.QUEUED
    assert [r["rollout_id"] for r in gateway.client.list_rollouts()] == [rollout["rollout_id"]]


def test_a_utf8_bom_is_ignored_and_invalid_utf8_refused(gateway: Any) -> None:
    url = f"{gateway.url}/api/rollouts"
    assert post(url, b'\xef\xbb\xbf{"task": {"a": 1}}', ADMIN).status_code == 201
    assert_openai_400(post(url, b'{"task": {"a": "\xed\xa0\x80"}}', ADMIN), "not valid JSON", "UTF-8")
    assert_openai_400(post(url, b'{"task": {"a": "\xff"}}', ADMIN), "not valid JSON")


def test_parse_json_tells_an_integer_literal_from_a_float_by_its_text() -> None:
    assert parse_json(b'{"a": 1e19, "b": -1.5e300, "c": 9223372036854775807}') == {
        "a": 1e19,
        "b": -1.5e300,
        "c": 2**63 - 1,
    }
    for text in (b'{"a": 18446744073709551616}', b'{"a": [1e19, -9223372036854775809]}'):
        with pytest.raises(BadRequest, match="64-bit"):
            parse_json(text)
    assert parse_json(nested(MAX_JSON_DEPTH).encode()) is not None  # MAX_JSON_DEPTH levels: fine
    with pytest.raises(BadRequest, match="deeper than"):
        parse_json(nested(MAX_JSON_DEPTH + 1).encode())


def test_tool_call_arguments_that_only_lenient_json_reads_stay_a_string(gateway: Any) -> None:
    """Arguments sent as a JSON string are parsed for the template; one holding a lone surrogate,
    NaN or deep nesting used to reach the template (and the tokenizer) as a parsed value."""
    rollout = gateway.rollout()
    url = f"{rollout['base_url']}/chat/completions"
    for arguments in ('{\\"a\\": \\"\\\\ud800\\"}', '{\\"a\\": NaN}', nested(1500), '{\\"a\\": 1}'):
        body = (
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, '
            '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "@@"}}]}, '
            '{"role": "tool", "tool_call_id": "c1", "content": "done"}]}'
        ).replace("@@", arguments)
        r = post(url, body, key(rollout))
        assert r.status_code == 200, (arguments[:40], r.text)


# -- 2. integers within the store's range, finite rewards and timeouts, monotone policy versions ------

BIG = str(2**63)


def test_integers_past_the_store_range_are_400s(gateway: Any) -> None:
    url = f"{gateway.url}/api/rollouts"
    for step in (BIG, "1e19", "-1", '"9223372036854775808"'):
        err = assert_openai_400(post(url, fill('{"task": {}, "step": @@}', step), ADMIN))
        assert err["param"] == "step" or "64-bit" in err["message"]
    assert gateway.client.list_rollouts() == []
    rollout = gateway.rollout(step=2**63 - 1)  # control: the largest step the store holds
    assert rollout["step"] == 2**63 - 1
    for query in (f"step={BIG}", f"limit={BIG}", f"offset={BIG}", "limit=0", "offset=-1"):
        r = httpx.get(f"{url}?{query}", headers=ADMIN, timeout=10)
        assert_openai_400(r, "query parameter")
    r = httpx.get(f"{url}/{rollout['rollout_id']}/calls?attempt={BIG}", headers=ADMIN, timeout=10)
    assert_openai_400(r, "attempt")
    r = httpx.get(f"{url}?step={2**63 - 1}&limit={2**63 - 1}&offset=0", headers=ADMIN, timeout=10)
    assert r.status_code == 200 and [x["rollout_id"] for x in r.json()] == [rollout["rollout_id"]]
    r = httpx.get(f"{url}/{rollout['rollout_id']}/calls?attempt={2**63 - 1}", headers=ADMIN, timeout=10)
    assert r.status_code == 200 and r.json() == []
    for nul in ("run_id=a%00b", "group=%00"):
        assert_openai_400(httpx.get(f"{url}?{nul}", headers=ADMIN, timeout=10), "NUL")
    assert_openai_400(post(url, '{"group": "a\\u0000b"}', ADMIN), "group")


def test_a_non_finite_reward_is_refused_and_nothing_stored(gateway: Any) -> None:
    rollout = gateway.rollout()
    finish = f"{gateway.url}/api/rollouts/{rollout['rollout_id']}/finish"
    for reward in ("1e999", "-1e999", "NaN", '"inf"', '"-Infinity"', '"nan"'):
        r = post(finish, fill('{"outcome": "success", "reward": @@}', reward), ADMIN)
        assert_openai_400(r)
    stored = gateway.store.get_rollout(rollout["rollout_id"])
    assert stored.status == RolloutStatus.QUEUED and stored.reward is None
    r = post(finish, '{"outcome": "success", "reward": -1.5e300}', ADMIN)  # control: finite
    assert r.status_code == 200 and r.json()["reward"] == -1.5e300


def test_a_pause_timeout_must_be_finite(gateway: Any) -> None:
    for timeout in ("inf", "nan", "-inf", "1e999", "-1", "86401"):
        r = httpx.post(f"{gateway.url}/api/pause?timeout={timeout}", headers=ADMIN, timeout=10)
        assert_openai_400(r, "timeout")
    assert gateway.client.state()["paused"] is False
    assert gateway.client.pause(timeout=0.5)["paused"] is True  # control
    gateway.client.resume()


def test_policy_version_is_bounded_and_never_goes_backwards(gateway: Any) -> None:
    rollout = gateway.rollout()
    chat = f"{rollout['base_url']}/chat/completions"
    gateway.client.pause(timeout=5)
    for bad in (BIG, "-1", "1e3"):
        r = httpx.post(f"{gateway.url}/api/resume?policy_version={bad}", headers=ADMIN, timeout=10)
        assert_openai_400(r, "policy_version")
    assert gateway.client.state()["paused"] is True
    assert gateway.client.resume(policy_version=5)["policy_version"] == 5
    gateway.client.pause(timeout=5)
    r = httpx.post(f"{gateway.url}/api/resume?policy_version=4", headers=ADMIN, timeout=10)
    assert r.status_code == 409, r.text
    assert "never go backwards" in r.json()["error"]["message"]
    state = gateway.client.state()
    assert state["paused"] is True and state["policy_version"] == 5  # refused whole: still paused
    assert gateway.client.resume(policy_version=5)["paused"] is False  # the same version again: fine
    # The largest version the store holds, and model calls are still recorded under it.
    gateway.client.pause(timeout=5)
    assert gateway.client.resume(policy_version=2**63 - 1)["policy_version"] == 2**63 - 1
    r = post(chat, fill(CHAT, ""), key(rollout))
    assert r.status_code == 200, r.text
    assert [c.policy_version for c in gateway.client.list_calls(rollout["rollout_id"])] == [2**63 - 1]


# -- 3. chat_template_kwargs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "self"])
def test_chat_template_kwargs_may_not_set_what_the_gateway_renders_with(gateway: Any, name: str) -> None:
    rollout = gateway.rollout()
    url = f"{rollout['base_url']}/chat/completions"
    r = post(url, fill(CHAT, f', "chat_template_kwargs": {{"{name}": []}}'), key(rollout))
    err = assert_openai_400(r, name)
    assert err["param"] == "chat_template_kwargs"
    assert_untouched(gateway, rollout)
    for control in ('{"enable_thinking": false}', '{"my_switch": {"a": [1]}}', "{}", "null"):
        r = post(url, fill(CHAT, ', "chat_template_kwargs": ' + control), key(rollout))
        assert r.status_code == 200, r.text


# -- 4. Responses input items with a list or dict role/type -------------------------------------------


@pytest.mark.parametrize("refuse", [False, True])
def test_responses_items_with_a_non_string_role_or_type_are_400s(make_gateway: Any, refuse: bool) -> None:
    config = {"unsupported_tools": "refuse"} if refuse else {}
    gw = make_gateway(["ok"], **config)
    rollout = gw.rollout()
    url = f"{rollout['base_url']}/responses"
    for item, param in (
        ('{"role": ["user"], "content": "hi"}', "input.0.role"),
        ('{"role": {"user": 1}, "content": "hi"}', "input.0.role"),
        ('{"type": ["message"], "role": "user", "content": "hi"}', "input.0.type"),
        ('{"type": {"t": "message"}, "role": "user", "content": "hi"}', "input.0.type"),
        ('{"type": 7, "role": "user", "content": "hi"}', "input.0.type"),
    ):
        err = assert_openai_400(post(url, fill('{"model": "m", "input": [@@]}', item), key(rollout)))
        assert err["param"] == param, err
    assert_untouched(gw, rollout)
    r = post(url, '{"model": "m", "input": [{"role": "user", "content": "hi"}]}', key(rollout))
    assert r.status_code == 200, r.text


# -- 5. reads of bad rows stored before the boundary was strict ----------------------------------------


def test_bad_rows_already_stored_are_read_with_placeholders(gateway: Any) -> None:
    store = gateway.store
    poisoned = store.create_rollout(task={"prompt": "a\ud800b", "\udc00": [1.0]}, metadata={"m": "\ud83d"})
    store.finish_rollout(poisoned.rollout_id, Outcome.SUCCESS, 1.0)
    # A reward the store refuses now (finish_rollout: finite only), written as an older one took it.
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE rollouts SET reward = ? WHERE rollout_id = ?", (math.inf, poisoned.rollout_id))
    nan = store.create_rollout(task={"x": math.nan})
    fine = gateway.rollout()
    # A call recorded under the old parser: a lone surrogate in the model name, NaN in the metadata.
    r = post(f"{fine['base_url']}/chat/completions", fill(CHAT, ""), key(fine))
    assert r.status_code == 200
    [call] = store.list_calls(fine["rollout_id"])
    store.add_call(
        call.model_copy(
            update={
                "call_id": None,
                "seq": -1,
                "request": {**call.request, "model": "m\ud800", "metadata": {"s": math.nan}},
                "response_logprobs": [-math.inf] * len(call.response_logprobs),
            }
        )
    )

    listed = httpx.get(f"{gateway.url}/api/rollouts", headers=ADMIN, timeout=10)
    assert listed.status_code == 200, listed.text
    by_id = {r["rollout_id"]: r for r in listed.json()}
    task = by_id[poisoned.rollout_id]["task"]
    assert task["prompt"] == "a\ufffdb"
    # The key reached pydantic's str validation when the row was read, which replaced it already.
    assert [set(k) for k in task if k != "prompt"] == [{"\ufffd"}]
    assert by_id[poisoned.rollout_id]["reward"] == "Infinity"
    assert by_id[poisoned.rollout_id]["metadata"] == {"m": "\ufffd"}
    assert by_id[nan.rollout_id]["task"] == {"x": None}  # pydantic's JSON mode writes NaN in Any as null
    one = httpx.get(f"{gateway.url}/api/rollouts/{poisoned.rollout_id}", headers=ADMIN, timeout=10)
    assert one.status_code == 200 and one.json()["reward"] == "Infinity"
    calls = httpx.get(f"{gateway.url}/api/rollouts/{fine['rollout_id']}/calls", headers=ADMIN, timeout=10)
    assert calls.status_code == 200, calls.text
    assert calls.json()[1]["request"]["model"] == "m\ufffd"
    assert calls.json()[1]["request"]["metadata"] == {"s": None}
    typed = gateway.client.list_calls(fine["rollout_id"])  # pydantic reads "-Infinity" as the float
    assert typed[1].response_logprobs == [-math.inf] * len(call.response_logprobs)
    assert typed[0].request == call.request  # a sound row is served as it was stored
