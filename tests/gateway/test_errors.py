"""Every client mistake gets a clear 4xx in OpenAI's error shape; engine failures a 5xx; never a hang."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.routing import Route

ADMIN_KEY = "test-admin-key"

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def assert_error(
    r: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    if 400 <= status < 500:
        assert r.headers["x-should-retry"] == "false"
    return err


@pytest.fixture
def env(make_gateway: Any) -> Iterator[tuple[Any, dict[str, Any], httpx.Client]]:
    gw = make_gateway(["ok"], context_length=256, max_body_bytes=4096)
    rollout = gw.rollout()
    with httpx.Client(
        base_url=rollout["base_url"], headers={"Authorization": f"Bearer {rollout['api_key']}"}, timeout=10
    ) as http:
        yield gw, rollout, http


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        (json.dumps({**CHAT, "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({**CHAT, "temperature": 7}).encode(), "temperature"),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({**CHAT, "stop": 5}).encode(), "stop"),
        (
            json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            "messages.0.role",
        ),
        (json.dumps({"model": "m", "messages": [{"content": "x"}]}).encode(), "messages.0.role"),
        (
            json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
            ).encode(),
            "messages.0.content.0",
        ),
    ],
)
def test_malformed_chat_bodies_are_400(env: Any, body: bytes, param: str | None) -> None:
    _, _, http = env
    err = assert_error(
        http.post("/chat/completions", content=body, headers={"content-type": "application/json"}), 400
    )
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_unknown_vendor_fields_are_ignored(env: Any) -> None:
    _, _, http = env
    body = {
        **CHAT,
        "drop_params": True,
        "store": False,
        "metadata": {"a": 1},
        "reasoning_effort": "low",
        "user": "u",
    }
    assert http.post("/chat/completions", json=body).status_code == 200


def test_n_above_one_is_400(env: Any) -> None:
    assert_error(env[2].post("/chat/completions", json={**CHAT, "n": 2}), 400, param="n")


def test_context_length_exceeded(env: Any) -> None:
    _, _, http = env
    assert_error(
        http.post("/chat/completions", json={**CHAT, "max_tokens": 10_000}),
        400,
        "context_length_exceeded",
        "max_tokens",
    )
    long = {"model": "m", "messages": [{"role": "user", "content": "word " * 400}]}
    assert_error(http.post("/chat/completions", json=long), 400, "context_length_exceeded", "messages")
    # Each API blames its own prompt field (completions said "messages").
    full = {"model": "m", "prompt": [7] * 256}
    assert_error(http.post("/completions", json=full), 400, "context_length_exceeded", "prompt")
    assert_error(
        http.post("/responses", json={"model": "m", "input": "word " * 400}),
        400,
        "context_length_exceeded",
        "input",
    )


def test_body_over_the_limit_is_413(env: Any) -> None:
    _, _, http = env
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_error(http.post("/chat/completions", json=big), 413, "payload_too_large")

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    assert_error(http.post("/chat/completions", content=chunked()), 413, "payload_too_large")


def test_completions_bad_prompts(env: Any) -> None:
    _, _, http = env
    assert_error(
        http.post("/completions", json={"model": "m", "prompt": [1, 99_999_999]}), 400, param="prompt"
    )
    assert_error(http.post("/completions", json={"model": "m", "prompt": ["a", "b"]}), 400, param="prompt")
    assert_error(http.post("/completions", json={"model": "m", "prompt": []}), 400, param="prompt")
    assert_error(http.post("/completions", json={"model": "m"}), 400, param="prompt")


def test_finished_rollout_is_409_and_the_sdk_does_not_retry(env: Any) -> None:
    gw, rollout, http = env
    # Its key answered a call first: the gateway's lookup of that key (kept while the rollout's row
    # is unchanged) must see the rollout end.
    assert http.post("/chat/completions", json=CHAT).status_code == 200
    gw.client.finish_rollout(rollout["rollout_id"], "success", 1.0)
    assert_error(http.post("/chat/completions", json=CHAT), 409, "rollout_closed")
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=3)
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(**CHAT)
    assert 'harnessrl_errors_total{code="rollout_closed"} 2.0' in gw.client.metrics()  # one try each


def test_cancelled_rollout_is_409(env: Any) -> None:
    gw, rollout, http = env
    gw.client.cancel_rollout(rollout["rollout_id"])
    assert_error(http.post("/chat/completions", json=CHAT), 409, "rollout_closed")


def test_unknown_routes_and_methods(env: Any) -> None:
    gw, _, http = env
    assert_error(http.get("/nope"), 404, "not_found")
    assert_error(http.get("/chat/completions"), 405)
    assert_error(
        httpx.get(f"{gw.url}/api/rollouts/nope", headers={"Authorization": f"Bearer {ADMIN_KEY}"}), 404
    )


def test_control_api_validation(env: Any) -> None:
    gw, rollout, _ = env
    admin = httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    rid = rollout["rollout_id"]
    assert_error(
        admin.post(f"/api/rollouts/{rid}/finish", json={"outcome": "great", "reward": 1}),
        400,
        param="outcome",
    )
    assert_error(admin.post(f"/api/rollouts/{rid}/finish", json={"outcome": "success"}), 400, param="reward")
    assert_error(admin.post("/api/rollouts", json={"task": {}, "surprise": 1}), 400, param="surprise")
    assert_error(admin.post("/api/rollouts", json={"task": "not an object"}), 400, param="task")
    assert_error(admin.get("/api/rollouts", params={"status": "sleeping"}), 400, param="status")
    assert_error(admin.get("/api/rollouts", params={"limit": "many"}), 400, param="limit")
    assert_error(admin.post("/api/pause", params={"timeout": "soon"}), 400, param="timeout")
    assert (
        admin.post(f"/api/rollouts/{rid}/finish", json={"outcome": "success", "reward": 1}).status_code == 200
    )
    assert_error(admin.post(f"/api/rollouts/{rid}/finish", json={"outcome": "success", "reward": 1}), 409)


def test_engine_failure_is_502(make_gateway: Any) -> None:
    gw = make_gateway({"turns": ["only one"], "on_exhausted": "error"})
    rollout = gw.rollout()
    http = httpx.Client(
        base_url=rollout["base_url"], headers={"Authorization": f"Bearer {rollout['api_key']}"}, timeout=10
    )
    assert http.post("/chat/completions", json=CHAT).status_code == 200
    assert_error(http.post("/chat/completions", json=CHAT), 502, "upstream_error")
    # Streaming: the 200 is already sent, so the error arrives as an SSE event the SDK raises.
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(**CHAT, stream=True))
    assert len(gw.client.list_calls(rollout["rollout_id"])) == 1


def test_unexpected_exception_is_500_in_the_same_shape(make_gateway: Any) -> None:
    gw = make_gateway()

    async def boom(request: Request) -> None:
        raise RuntimeError("kaboom")

    gw.app.router.routes.append(Route("/boom", boom))
    err = assert_error(httpx.get(f"{gw.url}/boom"), 500, "internal_error")
    assert "kaboom" not in err["message"]  # internals are logged, not leaked
