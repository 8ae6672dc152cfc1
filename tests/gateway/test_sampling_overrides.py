"""A rollout's ``metadata.sampling`` (set by the trainer) overrides what the harness asks for: the
temperature the trainer's log-probs assume, greedy evaluation, and a cap on new tokens."""

from __future__ import annotations

import openai

from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.engines.factory import create_engine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore

ADMIN = "admin-key"
ADMIN_KEY = "test-admin-key"  # the gateway fixture's (tests/gateway/conftest.py)


def test_rollout_sampling_overrides_the_harness(tmp_path):
    from harnessrl.client import GatewayClient

    store = SQLiteStore(tmp_path / "db.sqlite")
    app = create_app(GatewayConfig(admin_key=ADMIN), store, create_engine(EngineConfig(model="tiny")))
    with serve_in_thread(app) as url:
        admin = GatewayClient(url, ADMIN)
        greedy = admin.create_rollout({}, metadata={"sampling": {"temperature": 0.0, "max_tokens": 5}})
        client = openai.OpenAI(base_url=greedy["base_url"], api_key=greedy["api_key"], max_retries=0)
        texts = []
        for _ in range(3):
            reply = client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}], temperature=2.0, max_tokens=50
            )
            texts.append(reply.choices[0].message.content)
            assert reply.usage.completion_tokens <= 5
        assert len(set(texts)) == 1  # greedy despite the harness's temperature 2.0
        calls = admin.list_calls(greedy["rollout_id"])
        assert all(len(c.response_token_ids) <= 5 for c in calls)
        admin.close()
    store.close()


def test_gateway_max_tokens_caps_what_the_harness_asks_for(tmp_path):
    """Hermes asks for max_tokens 65536 on every call: more than the tiny model's whole context. With
    ``gateway.max_tokens`` the call is cut to the cap instead of refused (the control is the same
    request without the cap: a 400 context_length_exceeded)."""
    from harnessrl.client import GatewayClient

    store = SQLiteStore(tmp_path / "db.sqlite")
    engine = create_engine(EngineConfig(model="tiny"))
    request = dict(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=65536)
    for cap in (None, 3):
        app = create_app(GatewayConfig(admin_key=ADMIN, max_tokens=cap), store, engine)
        with serve_in_thread(app) as url:
            admin = GatewayClient(url, ADMIN)
            rollout = admin.create_rollout({})
            client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
            if cap is None:
                try:
                    client.chat.completions.create(**request)
                except openai.BadRequestError as exc:
                    assert exc.body["code"] == "context_length_exceeded"
                else:
                    raise AssertionError("65536 new tokens fit the tiny model's context?")
            else:
                reply = client.chat.completions.create(**request, temperature=0.0)
                assert 1 <= reply.usage.completion_tokens <= cap
            admin.close()
    store.close()


BAD_SAMPLING = [  # JSON text, as a client may send it
    '"x"',
    "[0.5]",
    '{"temperature": "hot"}',
    '{"temperature": -1}',
    '{"top_p": 0}',
    '{"top_p": 1.5}',
    '{"max_tokens": 0}',
    '{"max_tokens": 1e999}',
    '{"max_tokens": 9223372036854775808}',
    '{"seed": 1}',  # not an override the gateway knows
]


def test_malformed_sampling_is_refused_at_creation_and_nothing_is_stored(gateway):
    import httpx

    for bad in BAD_SAMPLING:
        response = httpx.post(
            f"{gateway.url}/api/rollouts",
            content=f'{{"rollout_id": "r-bad", "metadata": {{"sampling": {bad}, "kind": "train"}}}}',
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
        )
        assert response.status_code == 400, (bad, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and "metadata.sampling" in (
            error.get("param") or ""
        ), (
            bad,
            error,
        )
    assert gateway.store.count_rollouts() == 0
    # Control: a well-formed one is stored as sent, other metadata untouched.
    ok = gateway.rollout(metadata={"sampling": {"temperature": 0.0, "max_tokens": 5}, "kind": "eval"})
    stored = gateway.store.get_rollout(ok["rollout_id"])
    assert stored.metadata == {"sampling": {"temperature": 0.0, "max_tokens": 5}, "kind": "eval"}
    assert stored.sampling.temperature == 0.0 and stored.sampling.top_p is None


def test_a_stored_rollout_with_malformed_sampling_gets_a_400_not_a_500(gateway):
    # Written around the control API (an older harnessrl, or the store directly).
    rollout = gateway.store.create_rollout(metadata={"sampling": {"temperature": "hot"}})
    client = openai.OpenAI(
        base_url=f"{gateway.url}/rollouts/{rollout.rollout_id}/v1", api_key=rollout.api_key, max_retries=0
    )
    try:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    except openai.BadRequestError as exc:
        assert exc.body["param"] == "metadata.sampling"
    else:
        raise AssertionError("a call with malformed stored sampling was answered")
    assert gateway.store.count_calls(rollout.rollout_id) == 0
