"""A damaged record (a rollout row or a call row a disk or a bad writer damaged) seen through a real
gateway on 127.0.0.1: the control API answers 409 ``conflict`` naming the rollout, the attempt and
the column (it was a 500 ``internal_error``), a readable attempt's calls and a damaged row's calls
are still served, a finish ends such a rollout ``failed`` instead of leaving it running, and the
harness's model call with the key of a damaged row gets 409 ``rollout_closed`` (not retried), never
the damage itself. Rows are damaged with ``sqlite3``, beside an undamaged control rollout."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace
from typing import Any

import httpx

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore

ADMIN = {"Authorization": "Bearer test-admin-key"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def damage(gateway: Any, statement: str, *params: object) -> None:
    with sqlite3.connect(gateway.store.local_file) as conn:
        assert conn.execute(statement, params).rowcount == 1


def chat(gateway: Any, rollout: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/rollouts/{rollout['rollout_id']}/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
        timeout=30,
    )


def conflict(response: httpx.Response, *named: str) -> str:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "conflict" and error["type"] == "invalid_request_error"
    assert response.headers["x-should-retry"] == "false"
    assert all(text in error["message"] for text in named), error["message"]
    return error["message"]


def test_damaged_calls_are_a_named_409_and_the_readable_attempt_is_served(make_gateway: Any) -> None:
    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    retried = gateway.rollout(rollout_id="retried")
    assert chat(gateway, control).status_code == 200
    assert chat(gateway, retried).status_code == 200
    gateway.store.requeue_rollout("retried", error="retried", attempt=0)
    retried = gateway.client.get_rollout("retried")  # attempt 1's key
    assert chat(gateway, retried).status_code == 200
    damage(gateway, "UPDATE calls SET response = '{damaged' WHERE rollout_id = 'retried' AND attempt = 0")

    calls = f"{gateway.url}/api/rollouts/retried/calls"
    conflict(httpx.get(calls, headers=ADMIN), "rollout retried", "attempt 0", "response column")
    conflict(httpx.get(f"{calls}?attempt=0", headers=ADMIN), "rollout retried attempt 0", "response")
    attempt_1 = httpx.get(f"{calls}?attempt=1", headers=ADMIN)
    assert attempt_1.status_code == 200 and [c["attempt"] for c in attempt_1.json()] == [1]
    assert httpx.get(f"{gateway.url}/api/rollouts/retried", headers=ADMIN).status_code == 200
    # the control rollout beside it reads as written
    control_calls = httpx.get(f"{gateway.url}/api/rollouts/control/calls", headers=ADMIN)
    assert control_calls.status_code == 200 and len(control_calls.json()) == 1


def test_a_damaged_rollout_row_is_a_named_409_and_its_calls_are_served(make_gateway: Any) -> None:
    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    broken = gateway.rollout(rollout_id="broken")
    assert chat(gateway, control).status_code == 200 and chat(gateway, broken).status_code == 200
    damage(gateway, "UPDATE rollouts SET task = '{damaged' WHERE rollout_id = 'broken'")

    conflict(httpx.get(f"{gateway.url}/api/rollouts/broken", headers=ADMIN), "rollout broken", "task")
    created = httpx.post(f"{gateway.url}/api/rollouts", json={"rollout_id": "broken"}, headers=ADMIN)
    conflict(created, "rollout broken", "task")
    # its calls are rows of their own: still served, all of them and by attempt
    for query in ("", "?attempt=0"):
        calls = httpx.get(f"{gateway.url}/api/rollouts/broken/calls{query}", headers=ADMIN)
        assert calls.status_code == 200 and len(calls.json()) == 1
    listed = httpx.get(f"{gateway.url}/api/rollouts", headers=ADMIN)
    assert listed.status_code == 200 and [r["rollout_id"] for r in listed.json()] == ["control"]
    assert httpx.get(f"{gateway.url}/api/rollouts/control", headers=ADMIN).json()["status"] == "running"


def test_a_finish_of_a_damaged_running_rollout_ends_it_failed(make_gateway: Any) -> None:
    """An external controller finishes through this API: the finish raised (500) and the rollout
    stayed running for ever. Now it ends failed (``infra_failure``) and the 409 says so."""
    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    broken = gateway.rollout(rollout_id="broken")
    assert chat(gateway, control).status_code == 200 and chat(gateway, broken).status_code == 200
    damage(gateway, "UPDATE rollouts SET metadata = '[1,' WHERE rollout_id = 'broken'")

    finish = {"outcome": "success", "reward": 1.0}
    answer = httpx.post(f"{gateway.url}/api/rollouts/broken/finish", json=finish, headers=ADMIN)
    conflict(answer, "rollout broken", "metadata", "failed (infra_failure)")
    with sqlite3.connect(gateway.store.local_file) as conn:
        row = conn.execute(
            "SELECT status, outcome, reward FROM rollouts WHERE rollout_id = 'broken'"
        ).fetchone()
    assert row == ("failed", "infra_failure", None)  # not the verdict it could not hold
    done = httpx.post(f"{gateway.url}/api/rollouts/control/finish", json=finish, headers=ADMIN)
    assert done.status_code == 200 and done.json()["status"] == "finished"  # the control


def test_a_cancel_of_a_damaged_running_rollout_ends_it_failed(make_gateway: Any) -> None:
    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    broken = gateway.rollout(rollout_id="broken")
    assert chat(gateway, control).status_code == 200 and chat(gateway, broken).status_code == 200
    damage(gateway, "UPDATE rollouts SET flags = '{damaged' WHERE rollout_id = 'broken'")

    answer = httpx.post(f"{gateway.url}/api/rollouts/broken/cancel", headers=ADMIN)
    conflict(answer, "rollout broken", "flags", "a cancel", "failed (infra_failure)")
    with sqlite3.connect(gateway.store.local_file) as conn:
        row = conn.execute("SELECT status, outcome FROM rollouts WHERE rollout_id = 'broken'").fetchone()
    assert row == ("failed", "infra_failure")
    again = httpx.post(f"{gateway.url}/api/rollouts/broken/cancel", headers=ADMIN)
    assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_transition"
    cancelled = httpx.post(f"{gateway.url}/api/rollouts/control/cancel", headers=ADMIN)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"  # the control


def test_a_model_call_with_the_key_of_a_damaged_row_is_closed_not_a_500(make_gateway: Any) -> None:
    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    broken = gateway.rollout(rollout_id="broken", task={"prompt": "p", "answer": "secret-answer"})
    assert chat(gateway, broken).status_code == 200
    damage(gateway, "UPDATE rollouts SET metadata = '{\"sampling\": ' WHERE rollout_id = 'broken'")

    refused = chat(gateway, broken)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "rollout_closed" and refused.headers["x-should-retry"] == "false"
    assert "'broken'" in error["message"] and "damaged" in error["message"]
    # the harness is told its rollout is closed, not what the store held (the admin reads that)
    assert "sampling" not in error["message"] and "JSONDecodeError" not in error["message"]
    # its key on another rollout's URL is still another rollout's key
    elsewhere = chat(gateway, {"rollout_id": "control", "api_key": broken["api_key"]})
    assert elsewhere.status_code == 403 and elsewhere.json()["error"]["code"] == "forbidden"
    assert chat(gateway, control).status_code == 200  # the control rollout goes on
    assert len(gateway.store.list_calls("broken")) == 1  # nothing recorded for the refused call


def test_a_gateway_that_must_read_a_damaged_history_answers_409(make_gateway: Any, tokenizer: Any) -> None:
    """A gateway that did not serve a rollout's earlier calls (restarted, or one of several) reads
    them from the store to build the next prompt: a damaged row of them raised ``JSONDecodeError``,
    a 500 ``internal_error`` the harness's SDK retried, for nothing. Now a 409 naming the call."""
    first = make_gateway(["Hello!"] * 4)
    control = first.rollout(rollout_id="control")
    broken = first.rollout(rollout_id="broken")
    assert chat(first, control).status_code == 200 and chat(first, broken).status_code == 200
    damage(first, "UPDATE calls SET response = '{damaged' WHERE rollout_id = 'broken'")

    store = SQLiteStore(first.store.local_file)
    engine = ScriptedEngine(["Hello again!"] * 4, tokenizer)
    app = create_app(GatewayConfig(admin_key="test-admin-key"), store, engine)
    try:
        with serve_in_thread(app) as url:
            second = SimpleNamespace(url=url)
            refused = chat(second, broken)
            message = conflict(refused, "call broken/0 (attempt 0)", "response column")
            assert "Hello" not in message
            assert chat(second, control).status_code == 200  # the control rollout goes on here
    finally:
        store.close()
    assert len(first.store.list_calls("control")) == 2


def test_a_call_held_at_the_gate_whose_row_was_damaged_meanwhile_is_closed(make_gateway: Any) -> None:
    """A call waiting at a paused gate reads its rollout again when released
    (``pipeline.calls._still_open``); a row damaged meanwhile gave a 409 ``conflict`` showing the
    harness the damage. Now it is closed like a key of a damaged row, and the call is dropped."""
    import concurrent.futures
    import time

    gateway = make_gateway(["Hello!"] * 4)
    control = gateway.rollout(rollout_id="control")
    broken = gateway.rollout(rollout_id="broken")
    assert httpx.post(f"{gateway.url}/api/pause?timeout=30", headers=ADMIN).json()["drained"] is True
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(chat, gateway, broken)
        held_control = pool.submit(chat, gateway, control)
        deadline = time.monotonic() + 60  # only ends a hung test
        while httpx.get(f"{gateway.url}/api/state", headers=ADMIN).json()["waiting"] < 2:
            assert time.monotonic() < deadline, "the calls never reached the gate"
            time.sleep(0.05)
        damage(gateway, "UPDATE rollouts SET metadata = '[1, {damaged' WHERE rollout_id = 'broken'")
        assert httpx.post(f"{gateway.url}/api/resume", headers=ADMIN).status_code == 200
        answer, control_answer = held.result(timeout=60), held_control.result(timeout=60)
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "rollout_closed" and "rollout 'broken' cannot be read" in error["message"]
    assert (
        "damaged" in error["message"]
        and "{damaged" not in error["message"]
        and "metadata" not in error["message"]
    )
    assert control_answer.status_code == 200, control_answer.text  # the control, held beside it
    assert gateway.store.list_calls("broken") == []
