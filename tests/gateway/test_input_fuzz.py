"""Fuzz the input boundary (issue 19): random and hostile JSON at every model route and the control
API of one real gateway, kept running across all examples so that what one request leaves behind
is there for the next.

Each example takes a well-formed body of one route and breaks it: a field set to a random value
(NaN, Infinity, lone surrogates, integers past 64 bits, a 4,000-digit literal, deep nesting, wrong
types), a field dropped, a new field, or the whole body replaced by garbage; query parameters get
odd numbers and text. After every request:

- no 5xx, and every error is in the provider's shape (Anthropic's under ``/v1/messages``);
- a call is recorded if and only if the client got a successful answer;
- the rollout list, and every rollout and its calls, still read;

and at the end the gateway is healthy and still answers a well-formed call.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ADMIN_KEY = "test-admin-key"  # the gateway fixture's (tests/gateway/conftest.py)
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HOLE = "\x00hole\x00"  # where the raw (possibly non-JSON) text of the broken value goes

FUNCTION_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
}
MODEL_ROUTES: dict[str, dict[str, Any]] = {
    "chat/completions": {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
        "max_tokens": 8,
        "temperature": 1.0,
        "stream": False,
        "tools": [FUNCTION_TOOL],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "completions": {"model": "m", "prompt": "hi", "max_tokens": 8, "stream": False, "seed": 1},
    "responses": {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
        "max_output_tokens": 8,
        "stream": False,
        "metadata": {"k": "v"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    },
    "messages": {
        "model": "m",
        "max_tokens": 8,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
        ],
        "stream": False,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}
CONTROL_BODIES: dict[str, dict[str, Any]] = {
    "create": {
        "task": {"prompt": "p"},
        "group": "g",
        "step": 1,
        "metadata": {"sampling": {"temperature": 1.0}},
    },
    "finish": {"outcome": "success", "reward": 1.0, "metadata": {"k": 1}},
}

# -- strategies ---------------------------------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
TEXT = st.one_of(
    st.text(max_size=12),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), SURROGATES, st.text(max_size=4)),
    st.sampled_from(["", "\x00", "user", "assistant", "function", "message", "text", "success", "NaN"]),
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**30, 1e19, 1e308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(TEXT, kids, max_size=3)),
    max_leaves=12,
)
RAW_SNIPPETS = st.one_of(
    st.integers(min_value=2, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=2, max_value=200).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 4000, "[1,", "{", '"\\ud800"']),
)


def raw_value(value: Any) -> str:
    return json.dumps(value)  # NaN, Infinity and lone surrogates (as \\u escapes) are written as is


BROKEN_VALUE = st.one_of(VALUES.map(raw_value), RAW_SNIPPETS)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def with_hole(body: Any, path: tuple[Any, ...], *, drop: bool = False, new_key: str | None = None) -> Any:
    body = json.loads(json.dumps(body))  # a copy
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if new_key is not None:
        target = parent[last]
        if isinstance(target, dict):
            target[new_key] = HOLE
        elif isinstance(target, list):
            target.append(HOLE)
        else:
            parent[last] = HOLE
    elif drop:
        del parent[last]
    else:
        parent[last] = HOLE
    return body


@st.composite
def broken_body(draw: st.DrawFn, good: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["set", "set", "set", "drop", "add", "whole", "good"]))
    if kind == "good":
        return json.dumps(good).encode()
    if kind == "whole":
        return draw(
            st.one_of(BROKEN_VALUE.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=40))
        )
    path = draw(st.sampled_from(paths(good)))
    if kind == "drop":
        return json.dumps(with_hole(good, path, drop=True)).encode()
    new_key = draw(TEXT) if kind == "add" else None
    text = json.dumps(with_hole(good, path, new_key=new_key))
    return text.replace(json.dumps(HOLE), draw(BROKEN_VALUE)).encode("utf-8", "surrogatepass")


QUERY_VALUES = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=10),
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "5",
            "nan",
            "inf",
            "-inf",
            "1e999",
            "9" * 30,
            str(2**63),
            str(2**63 - 1),
            "\u00b2",
            "1.x",
        ]
    ),
)

MODEL_REQUESTS = st.tuples(st.just("model"), st.sampled_from(sorted(MODEL_ROUTES))).flatmap(
    lambda rt: st.tuples(st.just(rt[0]), st.just(rt[1]), broken_body(MODEL_ROUTES[rt[1]]))
)
REQUESTS = st.one_of(
    MODEL_REQUESTS,
    MODEL_REQUESTS,  # twice: model calls are where recording can go wrong
    st.tuples(st.just("control"), st.sampled_from(sorted(CONTROL_BODIES))).flatmap(
        lambda rt: st.tuples(st.just(rt[0]), st.just(rt[1]), broken_body(CONTROL_BODIES[rt[1]]))
    ),
    st.tuples(
        st.just("query"),
        st.sampled_from(["list", "calls", "pause", "resume"]),
        st.dictionaries(
            st.sampled_from(
                [
                    "status",
                    "run_id",
                    "group",
                    "step",
                    "limit",
                    "offset",
                    "attempt",
                    "timeout",
                    "policy_version",
                    "order",
                    "scope",
                ]
            ),
            QUERY_VALUES,
            max_size=3,
        ),
    ),
)

# -- checks -------------------------------------------------------------------------------------------


def check_shape(route: str, r: httpx.Response) -> None:
    assert r.status_code < 500, (route, r.status_code, r.text[:500])
    if r.status_code < 400:
        return
    body = r.json()
    if route.startswith("messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "code", "param"}, body


def answered(route: str, r: httpx.Response) -> bool:
    """Whether the client got a whole, successful answer (a stream included)."""
    if r.status_code != 200 or route == "messages/count_tokens":
        return False
    if not r.headers["content-type"].startswith("text/event-stream"):
        return True
    text = r.text
    if route == "messages":
        return "event: message_stop" in text and "event: error" not in text
    if route == "responses":
        return "event: response.completed" in text or "event: response.incomplete" in text
    return "data: [DONE]" in text and 'data: {"error"' not in text


def check_reads(http: httpx.Client, rollout_ids: list[str]) -> None:
    listed = http.get("/api/rollouts", params={"limit": 100_000}, headers=ADMIN)
    assert listed.status_code == 200, listed.text[:500]
    for rollout_id in rollout_ids:
        for path in (f"/api/rollouts/{rollout_id}", f"/api/rollouts/{rollout_id}/calls"):
            r = http.get(path, headers=ADMIN)
            assert r.status_code == 200, (path, r.text[:500])


@pytest.mark.slow
def test_fuzz_every_route_with_hostile_json(make_gateway: Any) -> None:
    """~1 minute on 2 cores: 1,000 requests."""
    fuzz(make_gateway, 1000)


def fuzz(make_gateway: Any, examples: int) -> None:
    gw = make_gateway({"turns": ["ok"], "on_exhausted": "repeat_last"})
    model_rollout = gw.rollout()
    rollout_ids = [model_rollout["rollout_id"]]
    rollout_key = {"authorization": f"Bearer {model_rollout['api_key']}", "content-type": "application/json"}
    http = httpx.Client(base_url=gw.url, timeout=30)
    seen = {"model": 0, "answered": 0, "control": 0, "query": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(REQUESTS)
    def one(request: tuple[str, str, Any]) -> None:
        kind, route, payload = request
        seen[kind] += 1
        if kind == "model":
            before = len(gw.store.list_calls(model_rollout["rollout_id"]))
            r = http.post(
                f"/rollouts/{model_rollout['rollout_id']}/v1/{route}", content=payload, headers=rollout_key
            )
            check_shape(route, r)
            got = answered(route, r)
            seen["answered"] += got
            after = len(gw.store.list_calls(model_rollout["rollout_id"]))
            assert after - before == (1 if got else 0), (route, payload[:300], r.status_code, r.text[:300])
        elif kind == "control":
            headers = {**ADMIN, "content-type": "application/json"}
            if route == "create":
                r = http.post("/api/rollouts", content=payload, headers=headers)
                check_shape(route, r)
                if r.status_code in (200, 201):
                    rollout_ids.append(r.json()["rollout_id"])
            else:
                target = gw.rollout()
                rollout_ids.append(target["rollout_id"])
                r = http.post(
                    f"/api/rollouts/{target['rollout_id']}/finish", content=payload, headers=headers
                )
                check_shape(route, r)
                stored = gw.store.get_rollout(target["rollout_id"])
                assert (r.status_code == 200) == (stored.reward is not None), (payload[:300], r.text[:300])
        else:
            params = payload
            if route == "list":
                r = http.get("/api/rollouts", params=params, headers=ADMIN)
            elif route == "calls":
                r = http.get(
                    f"/api/rollouts/{model_rollout['rollout_id']}/calls", params=params, headers=ADMIN
                )
            else:
                if route == "pause":
                    params = {**params, "timeout": params.get("timeout", "0")}
                    if _seconds(params["timeout"]) > 1:
                        params["timeout"] = "0"  # a valid long pause would only make the test wait
                r = http.post(f"/api/{route}", params=params, headers=ADMIN)
                # Whatever that did, serve again before the next example (a plain resume always applies).
                assert http.post("/api/resume", headers=ADMIN).status_code == 200
            check_shape(route, r)
        check_reads(http, [model_rollout["rollout_id"], *rollout_ids[-2:]])

    try:
        one()
        check_reads(http, rollout_ids)
        health = http.get("/api/health")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        r = http.post(
            f"/rollouts/{model_rollout['rollout_id']}/v1/chat/completions", content=body, headers=rollout_key
        )
        assert r.status_code == 200, r.text
    finally:
        http.close()
    # The fuzz reached every kind of request, and some model calls got through.
    assert all(seen.values()), seen


def _seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        return 0.0
