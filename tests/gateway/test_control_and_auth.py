"""Control API (admin key) and the key rules: a rollout key opens only its own rollout's model API."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.errors import Conflict, NotFound, Unauthorized

ADMIN_KEY = "test-admin-key"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_create_rollout_contract_and_idempotence(gateway: Any) -> None:
    r = httpx.post(
        f"{gateway.url}/api/rollouts",
        json={"task": {"q": 1}, "rollout_id": "r-1", "group": "g"},
        headers=bearer(ADMIN_KEY),
    )
    assert r.status_code == 201
    body = r.json()
    assert body["rollout_id"] == "r-1" and body["api_key"] and body["status"] == "queued"
    assert body["base_url"] == f"{gateway.url}/rollouts/r-1/v1"
    assert body["group_id"] == "g" and body["task"] == {"q": 1}
    again = httpx.post(
        f"{gateway.url}/api/rollouts", json={"task": {"q": 1}, "rollout_id": "r-1"}, headers=bearer(ADMIN_KEY)
    )
    assert again.status_code == 200 and again.json()["api_key"] == body["api_key"]
    fresh = gateway.client.create_rollout({"q": 2})
    assert fresh["rollout_id"] != "r-1" and fresh["api_key"] != body["api_key"]


def test_list_get_finish_cancel(gateway: Any) -> None:
    c = gateway.client
    a, b = gateway.rollout(run_id=None), gateway.rollout()
    assert [r["rollout_id"] for r in c.list_rollouts()] == [a["rollout_id"], b["rollout_id"]]
    assert [r["rollout_id"] for r in c.list_rollouts(limit=1, offset=1)] == [b["rollout_id"]]
    finished = c.finish_rollout(a["rollout_id"], "success", 0.5, metadata={"tests": "3/3"})
    assert finished["status"] == "finished" and finished["reward"] == 0.5 and finished["outcome"] == "success"
    assert c.cancel_rollout(b["rollout_id"])["status"] == "cancelled"
    assert [r["rollout_id"] for r in c.list_rollouts(status="finished")] == [a["rollout_id"]]
    assert c.get_rollout(a["rollout_id"])["metadata"] == {"tests": "3/3"}
    with pytest.raises(NotFound):
        c.get_rollout("missing")
    with pytest.raises(Conflict):
        c.finish_rollout(b["rollout_id"], "success", 1.0)
    with pytest.raises(NotFound):
        c.list_calls("missing")


def test_infra_failure_outcome_fails_the_rollout(gateway: Any) -> None:
    r = gateway.rollout()
    assert (
        gateway.client.finish_rollout(r["rollout_id"], "infra_failure", 0.0, error="sandbox died")["status"]
        == "failed"
    )


def test_health_state_metrics(gateway: Any) -> None:
    health = httpx.get(f"{gateway.url}/api/health")  # no key needed
    assert health.status_code == 200
    assert health.json()["model"] == "scripted" and health.json()["policy_version"] == 0
    state = gateway.client.state()
    assert state["paused"] is False and state["in_flight"] == 0
    assert "harnessrl_calls_in_flight 0.0" in gateway.client.metrics()
    # The gauges are the gate's state when the metrics are read (``read_gauges_from``).
    assert "harnessrl_paused 0.0" in gateway.client.metrics()
    assert "harnessrl_policy_version 0.0" in gateway.client.metrics()
    gateway.client.pause(timeout=5)
    assert "harnessrl_paused 1.0" in gateway.client.metrics()
    rollout = gateway.rollout()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            httpx.post,
            f"{rollout['base_url']}/chat/completions",
            json=CHAT,
            headers=bearer(rollout["api_key"]),
            timeout=30,
        )
        deadline = time.monotonic() + 60  # a wait, not a timing
        while "harnessrl_calls_waiting 1.0" not in gateway.client.metrics():
            assert time.monotonic() < deadline, "the call held by the pause never showed as waiting"
            time.sleep(0.05)
        gateway.client.resume()
        assert held.result().status_code == 200
    after = gateway.client.metrics()
    assert "harnessrl_paused 0.0" in after and "harnessrl_calls_waiting 0.0" in after
    assert "harnessrl_calls_in_flight 0.0" in after


def test_rollout_keys_cannot_use_the_control_api(gateway: Any) -> None:
    r = gateway.rollout()
    for method, path in [
        ("GET", "/api/rollouts"),
        ("POST", "/api/rollouts"),
        ("GET", f"/api/rollouts/{r['rollout_id']}"),
        ("GET", f"/api/rollouts/{r['rollout_id']}/calls"),
        ("POST", f"/api/rollouts/{r['rollout_id']}/finish"),
        ("POST", "/api/pause"),
        ("POST", "/api/resume"),
        ("GET", "/api/state"),
        ("GET", "/metrics"),
    ]:
        for headers in (bearer(r["api_key"]), {"x-api-key": r["api_key"]}, {}):
            resp = httpx.request(method, f"{gateway.url}{path}", headers=headers, json={})
            assert resp.status_code in (401, 403), (method, path, resp.status_code)
            assert resp.json()["error"]["type"] == "authentication_error"
    with pytest.raises(Unauthorized):
        GatewayClient(gateway.url, r["api_key"]).state()


def test_model_api_keys(gateway: Any) -> None:
    a, b = gateway.rollout(), gateway.rollout()
    url_a = f"{a['base_url']}/chat/completions"
    assert httpx.post(url_a, json=CHAT).status_code == 401  # no key
    assert httpx.post(url_a, json=CHAT, headers=bearer("wrong")).status_code == 401
    assert (
        httpx.post(url_a, json=CHAT, headers=bearer(ADMIN_KEY)).status_code == 401
    )  # admin is not a rollout
    cross = httpx.post(url_a, json=CHAT, headers=bearer(b["api_key"]))
    assert cross.status_code == 403 and cross.json()["error"]["code"] == "forbidden"
    assert (
        httpx.post(
            f"{gateway.url}/rollouts/nope/v1/chat/completions", json=CHAT, headers=bearer(a["api_key"])
        ).status_code
        == 403
    )
    assert httpx.post(url_a, json=CHAT, headers={"x-api-key": a["api_key"]}).status_code == 200
    # Plain /v1 attributes the call by key alone.
    assert (
        httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers=bearer(b["api_key"])).status_code
        == 200
    )
    assert len(gateway.client.list_calls(a["rollout_id"])) == 1
    assert len(gateway.client.list_calls(b["rollout_id"])) == 1
    assert gateway.client.list_calls(b["rollout_id"])[0].rollout_id == b["rollout_id"]


def test_a_requeued_attempts_key_opens_nothing(gateway: Any) -> None:
    """A requeue ends an attempt and issues the rollout a new key. The ended attempt's harness (a pod
    that outlived its controller, say) calling with its old key is refused (401): it neither starts
    the queued rollout under the next attempt (left running with no worker, no controller could
    ever claim it) nor gets its calls recorded as the next attempt's. The control: the same call
    with the key the next attempt is given is answered and recorded under that attempt."""
    created = gateway.rollout()
    url = f"{created['base_url']}/chat/completions"
    [claimed] = gateway.store.claim_rollouts("controller-1", 1)
    assert httpx.post(url, json=CHAT, headers=bearer(claimed.api_key)).status_code == 200
    requeued = gateway.store.requeue_rollout(created["rollout_id"], error="node lost")
    assert requeued.api_key != claimed.api_key and requeued.attempt == 1

    late = httpx.post(url, json=CHAT, headers=bearer(claimed.api_key))
    assert late.status_code == 401 and late.json()["error"]["code"] == "invalid_api_key"
    assert gateway.store.get_rollout(created["rollout_id"]).status.value == "queued"
    [again] = gateway.store.claim_rollouts("controller-2", 1)  # claimable, by the next controller
    assert again.rollout_id == created["rollout_id"] and again.api_key == requeued.api_key
    assert httpx.post(url, json=CHAT, headers=bearer(again.api_key)).status_code == 200
    calls = gateway.client.list_calls(created["rollout_id"])
    assert [(c.seq, c.attempt) for c in calls] == [(0, 0), (1, 1)]


def test_call_metrics_count_every_answered_call(make_gateway: Any) -> None:
    gw = make_gateway(["Hello!", "Again!"])
    r = gw.rollout()
    headers = {"authorization": f"Bearer {r['api_key']}"}
    messages = [{"role": "user", "content": "hi"}]
    for _ in range(2):
        resp = httpx.post(f"{r['base_url']}/chat/completions", json={"messages": messages}, headers=headers)
        assert resp.status_code == 200, resp.text
        messages = [*messages, resp.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    metrics = gw.client.metrics()
    assert 'harnessrl_calls_total{api="chat.completions",finish_reason="stop"} 2.0' in metrics
    assert 'harnessrl_call_latency_seconds_count{api="chat.completions"} 2.0' in metrics
    assert 'harnessrl_time_to_first_token_seconds_count{api="chat.completions"} 2.0' in metrics
