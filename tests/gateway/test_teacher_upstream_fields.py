"""What teacher mode sends a chat upstream and how it passes on the upstream's refusals.

- ``engine.teacher.length_field``: OpenAI's reasoning models refuse ``max_tokens`` and take
  ``max_completion_tokens``; the upstream here refuses exactly as they do, so the control (the default
  field) shows the refusal the setting avoids.
- A refusal of the gateway's own credentials (401, 403) reaches the harness as a 502, not as a refusal
  of the harness's key; another 4xx (a 429) keeps its status (the control).

The upstream is a small real server on 127.0.0.1 that keeps every body it was sent; the harness is the
official ``openai`` SDK, or plain HTTP for the Anthropic Messages API (translated to chat).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig, TeacherConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.gateway.teacher import Teacher
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "teacher-fields-admin"
MESSAGES = [{"role": "user", "content": "What is 6 x 7?"}]
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "u",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


def reasoning_model_upstream(sent: list[dict[str, Any]], refuse: int | None = None) -> Starlette:
    """A chat upstream that refuses ``max_tokens`` as OpenAI's reasoning models do (400), or every
    call with ``refuse``; every body it was sent is appended to ``sent``."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        sent.append(body)
        if refuse is not None:
            error = {"message": f"refused with {refuse}", "type": "refused", "code": None}
            return JSONResponse({"error": error}, status_code=refuse)
        if "max_tokens" in body:
            message = (
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead."
            )
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, 400)
        return JSONResponse(ANSWER)

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


@contextlib.contextmanager
def teacher_gateway(
    upstream: Starlette, tmp_path: Path, tokenizer: PolicyTokenizer, **teacher: Any
) -> Iterator[tuple[openai.OpenAI, SQLiteStore, str]]:
    """A teacher-mode gateway on ``upstream``: the harness's SDK, the gateway's store, the rollout id."""
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with serve_in_thread(upstream) as up_url:
            policy = ScriptedEngine(["(unused in teacher mode)"], tokenizer)
            app = create_app(
                GatewayConfig(admin_key=ADMIN),
                store,
                policy,
                teacher=Teacher(f"{up_url}/v1", "u", None, **teacher),
            )
            with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as client:
                created = client.create_rollout({"prompt": "x"}, run_id="teacher")
                with openai.OpenAI(
                    base_url=created["base_url"], api_key=created["api_key"], max_retries=0
                ) as sdk:
                    yield sdk, store, created["rollout_id"]
    finally:
        store.close()


def test_the_config_field_defaults_to_as_sent_and_refuses_others() -> None:
    assert TeacherConfig(base_url="http://x/v1", model="m").length_field is None
    chosen = TeacherConfig(base_url="http://x/v1", model="m", length_field="max_completion_tokens")
    assert chosen.length_field == "max_completion_tokens"
    with pytest.raises(ValueError, match="length_field"):
        TeacherConfig(base_url="http://x/v1", model="m", length_field="max_output_tokens")  # type: ignore[arg-type]


def test_a_reasoning_model_upstream_gets_max_completion_tokens(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    sent: list[dict[str, Any]] = []
    upstream = reasoning_model_upstream(sent)
    with teacher_gateway(upstream, tmp_path, tokenizer, length_field="max_completion_tokens") as (
        sdk,
        store,
        rid,
    ):
        whole = sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
        assert whole.choices[0].message.content == "42"
        # Both fields set by the harness: the lower is what the upstream is sent.
        sdk.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=30,
            max_completion_tokens=80,
        )
        # A Messages call, translated to chat: its max_tokens goes in the upstream's field too.
        base, key = str(sdk.base_url).rstrip("/"), sdk.api_key
        reply = httpx.post(
            f"{base}/messages",
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
            json={"model": "m", "max_tokens": 64, "messages": MESSAGES},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["content"][0]["text"] == "42"
        assert len(store.list_calls(rid)) == 3
    assert [b.get("max_completion_tokens") for b in sent] == [100, 30, 64]
    assert all("max_tokens" not in b for b in sent)
    assert all(b["model"] == "u" for b in sent)


def test_control_the_default_field_is_refused_by_that_upstream(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    sent: list[dict[str, Any]] = []
    with teacher_gateway(reasoning_model_upstream(sent), tmp_path, tokenizer) as (sdk, store, rid):
        with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
            sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
        assert store.list_calls(rid) == []
    assert sent[0]["max_tokens"] == 100


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_of_the_gateways_own_key_is_a_502_for_the_harness(
    tmp_path: Path, tokenizer: PolicyTokenizer, status: int, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[dict[str, Any]] = []
    with teacher_gateway(reasoning_model_upstream(sent, refuse=status), tmp_path, tokenizer) as (
        sdk,
        store,
        rid,
    ):
        with pytest.raises(openai.APIStatusError) as err:
            sdk.chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
        assert err.value.status_code == 502
        assert not isinstance(err.value, openai.AuthenticationError | openai.PermissionDeniedError)
        assert f"teacher upstream answered {status}" in err.value.message
        assert store.list_calls(rid) == []
    assert sent, "the upstream was asked"
    assert any("refused the gateway's credentials" in r.getMessage() for r in caplog.records)


def test_control_another_upstream_4xx_keeps_its_status(tmp_path: Path, tokenizer: PolicyTokenizer) -> None:
    sent: list[dict[str, Any]] = []
    with teacher_gateway(reasoning_model_upstream(sent, refuse=429), tmp_path, tokenizer) as (sdk, _, _):
        with pytest.raises(openai.RateLimitError) as err:
            sdk.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert err.value.status_code == 429
