"""``GET /v1/models/{id}``: the SDKs' ``models.retrieve``, which some harnesses call before their
first model call to check the name they were configured with."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai


def test_openai_sdk_retrieves_any_configured_name(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    for base in (rollout["base_url"], f"{gw.url}/v1"):
        client = openai.OpenAI(base_url=base, api_key=rollout["api_key"], max_retries=0)
        # Model calls take every name, so the harness's own name (a slash in it too) is answered.
        for name in ("scripted", "gpt-4o", "Qwen/Qwen3-8B"):
            model = client.models.retrieve(name)
            assert (model.id, model.object, model.owned_by) == (name, "model", "harnessrl")


def test_anthropic_sdk_retrieves_in_its_shape(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    model = client.models.retrieve("claude-sonnet-4-5")
    assert (model.id, model.type, model.display_name) == ("claude-sonnet-4-5", "model", "claude-sonnet-4-5")
    assert model.created_at.year >= 2026


def test_no_id_is_a_404_in_openais_shape(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    answer = httpx.get(
        f"{rollout['base_url']}/models/", headers={"authorization": f"Bearer {rollout['api_key']}"}
    )
    assert answer.status_code == 404 and answer.json()["error"]["type"]


def test_retrieve_needs_the_rollout_key(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!"])
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="not-a-key", max_retries=0)
    try:
        client.models.retrieve("scripted")
    except openai.AuthenticationError as exc:
        assert exc.status_code == 401
    else:
        raise AssertionError("an unknown key retrieved a model")


def test_anthropic_sdk_lists_in_its_shape(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!"])
    rollout = gw.rollout()
    client = anthropic.Anthropic(base_url=gw.url, api_key=rollout["api_key"], max_retries=0)
    [model] = list(client.models.list())
    assert (model.id, model.type, model.display_name) == ("scripted", "model", "scripted")
    assert model.created_at.year >= 2026
