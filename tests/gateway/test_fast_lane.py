"""The model calls' fast lane answers every request exactly as starlette's routes do.

Two gateways, one built as ``create_app`` builds it and one with the ``FastLane`` middleware taken
out (starlette's router then serves the model routes), get the same requests: answered calls, every
kind of refusal the handlers raise (auth, body, size, a closed rollout), a wrong method and an
unknown route (both left to starlette), the Anthropic routes' error shape, a probe. Status, the
headers clients act on and the JSON (ids and timestamps aside) must be the same.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from harnessrl.gateway.app import MODEL_POSTS
from harnessrl.gateway.fast_lane import FastLane

VOLATILE = {"id", "created", "system_fingerprint"}


def _without_fast_lane(gw: Any) -> None:
    app = gw.app
    app.user_middleware = [m for m in app.user_middleware if m.cls is not FastLane]
    app.middleware_stack = app.build_middleware_stack()


def _comparable(resp: httpx.Response) -> tuple[Any, ...]:
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    headers = {k: resp.headers.get(k) for k in ("content-type", "x-should-retry", "allow")}
    return resp.status_code, headers, _stable(body)


def _stable(value: Any) -> Any:
    """``value`` without its ids and timestamps, at any depth (a tool call's id, a listed model's
    ``created``: the two gateways may answer in different seconds)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _requests(gw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    r = gw.rollout(rollout_id="open")  # the same ids in both gateways: errors name them
    done = gw.rollout(rollout_id="done")
    gw.client.finish_rollout(done["rollout_id"], "success", 1.0)
    ok = {"authorization": f"Bearer {r['api_key']}"}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    base, root = r["base_url"], gw.url
    return [
        ("POST", f"{base}/chat/completions", {"json": chat, "headers": ok}),
        ("POST", f"{root}/v1/chat/completions", {"json": chat, "headers": ok}),  # the key alone
        ("POST", f"{base}/chat/completions", {"json": chat}),  # no key: 401
        ("POST", f"{base}/chat/completions", {"json": chat, "headers": {"authorization": "Bearer nope"}}),
        ("POST", f"{root}/rollouts/other/v1/chat/completions", {"json": chat, "headers": ok}),  # 403
        ("POST", f"{base}/chat/completions", {"content": b"{not json", "headers": ok}),
        ("POST", f"{base}/chat/completions", {"json": {"messages": []}, "headers": ok}),
        ("POST", f"{base}/chat/completions", {"json": {**chat, "n": 3}, "headers": ok}),
        ("POST", f"{base}/completions", {"json": {"prompt": "hi", "max_tokens": 2}, "headers": ok}),
        ("POST", f"{base}/messages", {"json": {"messages": []}, "headers": {"x-api-key": r["api_key"]}}),
        (
            "POST",
            f"{done['base_url']}/chat/completions",
            {"json": chat, "headers": {"authorization": f"Bearer {done['api_key']}"}},
        ),
        ("GET", f"{base}/chat/completions", {"headers": ok}),  # wrong method: starlette's 405
        ("POST", f"{base}/nothing/here", {"json": {}, "headers": ok}),  # unknown: starlette's 404
        ("POST", f"{root}/rollouts//v1/chat/completions", {"json": chat, "headers": ok}),
        ("HEAD", f"{base}", {}),
        ("GET", f"{base}/models", {"headers": ok}),
    ]


@pytest.mark.parametrize("index", range(16))
def test_each_request_is_answered_as_starlette_answers_it(make_gateway: Any, index: int) -> None:
    answers = []
    for lane in (True, False):
        gw = make_gateway(["Hello!"] * 4)
        if not lane:
            _without_fast_lane(gw)
        method, url, kwargs = _requests(gw)[index]
        with httpx.Client(timeout=30) as http:
            answers.append(_comparable(http.request(method, url, **kwargs)))
    assert answers[0] == answers[1]


def test_the_lane_takes_exactly_the_model_posts() -> None:
    lane = FastLane(app=lambda *a: None, routes=MODEL_POSTS)  # type: ignore[arg-type]
    for suffix, handler in MODEL_POSTS.items():
        assert lane._match(f"/v1{suffix}") == (handler, {})
        assert lane._match(f"/rollouts/r-1.x:y/v1{suffix}") == (handler, {"rollout_id": "r-1.x:y"})
    refused = (
        "/v1/models",
        "/rollouts//v1/chat/completions",
        "/rollouts/a/b/v1/chat/completions",
        "/api/rollouts",
        "/v1",
        "/rollouts/a/v1",
        "/v1/chat/completions/",
        "/x/v1/chat/completions",
    )
    for path in refused:
        assert lane._match(path)[0] is None, path
