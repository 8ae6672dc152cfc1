"""A call row the store cannot decode (a disk or a bad writer damaged it) never fails a trace or
compare page: the page shows every attempt it can read and names the damaged ones (it was a 500).
A real run folder's SQLite store, damaged with ``sqlite3``, served by the real dashboard."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Call, Outcome
from harnessrl.store.sqlite import SQLiteStore

KEY = "dash-admin-key"


def call(rollout_id: str, attempt: int, text: str) -> Call:
    return Call(
        rollout_id=rollout_id,
        attempt=attempt,
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        request={"messages": [{"role": "user", "content": text}]},
        response={},
    )


@pytest.fixture
def damaged_run(tmp_path: Path) -> Path:
    """``retried``: attempt 0 (retried) has a damaged row, attempt 1 a readable call; ``broken``: its
    only attempt's row is damaged; ``clean``: nothing damaged."""
    run = tmp_path / "run"
    run.mkdir()
    db = run / "harnessrl.db"
    store = SQLiteStore(db)
    store.create_run("run")
    for rollout_id in ("retried", "broken", "clean"):
        store.create_rollout(task={}, rollout_id=rollout_id, run_id="run", group_id="g0", task_id="t")
    assert len(store.claim_rollouts("w", 3)) == 3
    store.add_call(call("retried", 0, "first-attempt-text"))
    store.requeue_rollout("retried", error="evaluator failed: x", attempt=0)
    assert [r.rollout_id for r in store.claim_rollouts("w", 1)] == ["retried"]
    store.add_call(call("retried", 1, "second-attempt-text"))
    store.finish_rollout("retried", Outcome.SUCCESS, 1.0, attempt=1)
    store.add_call(call("broken", 0, "broken-text"))
    store.finish_rollout("broken", Outcome.SUCCESS, 0.0)
    store.add_call(call("clean", 0, "clean-text"))
    store.finish_rollout("clean", Outcome.SUCCESS, 0.0)
    store.close()
    with sqlite3.connect(db) as conn:
        for rollout_id in ("retried", "broken"):
            conn.execute(
                "UPDATE calls SET response = '{damaged' WHERE rollout_id = ? AND attempt = 0", (rollout_id,)
            )
    store = SQLiteStore(db)
    try:  # the control: these rows really cannot be read
        for rollout_id in ("retried", "broken"):
            with pytest.raises(ValueError):
                store.list_calls(rollout_id)
        assert len(store.list_calls("clean")) == 1
    finally:
        store.close()
    return run


@pytest.fixture
def client(damaged_run: Path):
    with TestClient(create_dashboard_app(damaged_run, KEY), raise_server_exceptions=False) as c:
        assert c.get(f"/ui/?key={KEY}").status_code == 200
        yield c


def test_a_trace_over_a_damaged_attempt_shows_the_rest_and_names_the_damage(client: TestClient) -> None:
    page = client.get("/ui/rollouts/retried")
    assert page.status_code == 200, page.text[:300]
    assert "Damaged record" in page.text and "attempt 0" in page.text and "JSONDecodeError" in page.text
    assert "second-attempt-text" in page.text  # the readable attempt's conversation is shown

    page = client.get("/ui/rollouts/broken")
    assert page.status_code == 200, page.text[:300]
    assert "Damaged record" in page.text and "broken-text" not in page.text

    page = client.get("/ui/rollouts/clean")  # the control: no damage, no card
    assert page.status_code == 200 and "Damaged record" not in page.text and "clean-text" in page.text


def test_a_compare_over_a_damaged_rollout_shows_both_sides(client: TestClient) -> None:
    page = client.get("/ui/compare?a=retried&b=clean")
    assert page.status_code == 200, page.text[:300]
    assert page.text.count("Damaged record") == 1
    assert "second-attempt-text" in page.text and "clean-text" in page.text


def test_the_rollouts_table_lists_damaged_rollouts(client: TestClient) -> None:
    page = client.get("/ui/rollouts")
    assert page.status_code == 200
    assert all(rollout_id in page.text for rollout_id in ("retried", "broken", "clean"))


@pytest.fixture
def damaged_rows(tmp_path: Path) -> Path:
    """Rollouts whose own row holds a damaged JSON column: ``meta`` (metadata), ``flagged`` (flags),
    ``task`` (task); ``fine`` is whole and flagged ``network_fetch``."""
    run = tmp_path / "run"
    run.mkdir()
    db = run / "harnessrl.db"
    store = SQLiteStore(db)
    store.create_run("run")
    for rollout_id in ("meta", "flagged", "task", "fine"):
        store.create_rollout(
            task={"prompt": f"{rollout_id}-prompt"},
            rollout_id=rollout_id,
            run_id="run",
            group_id="g0",
            task_id="t",
            metadata={"kind": "train"},
        )
    assert len(store.claim_rollouts("w", 4)) == 4
    for rollout_id in ("meta", "flagged", "task", "fine"):
        store.set_rollout_flags(rollout_id, ["network_fetch"])
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    with sqlite3.connect(db) as conn:
        for rollout_id, column in (("meta", "metadata"), ("flagged", "flags"), ("task", "task")):
            conn.execute(f"UPDATE rollouts SET {column} = '{{damaged' WHERE rollout_id = ?", (rollout_id,))
    store = SQLiteStore(db)
    try:  # the control: these rows really cannot be read
        for rollout_id in ("meta", "flagged", "task"):
            with pytest.raises(ValueError):
                store.get_rollout(rollout_id)
        assert store.get_rollout("fine").flags == ["network_fetch"]
    finally:
        store.close()
    return run


def test_a_damaged_rollout_row_never_fails_the_table_its_filters_or_its_trace(damaged_rows: Path) -> None:
    with TestClient(create_dashboard_app(damaged_rows, KEY), raise_server_exceptions=False) as client:
        assert client.get(f"/ui/?key={KEY}").status_code == 200
        for query in ("", "?flag=network_fetch", "?split=train", "?flagged=1"):
            page = client.get(f"/ui/rollouts{query}")
            assert page.status_code == 200, (query, page.text[:300])
            assert "fine" in page.text
        assert all(rid in client.get("/ui/rollouts").text for rid in ("meta", "flagged", "task"))
        for rollout_id, column in (("meta", "metadata"), ("flagged", "flags"), ("task", "task")):
            page = client.get(f"/ui/rollouts/{rollout_id}")
            assert page.status_code == 200, page.text[:300]
            assert "Damaged record" in page.text and f"the rollout's {column}" in page.text
        page = client.get("/ui/rollouts/fine")
        assert page.status_code == 200 and "Damaged record" not in page.text and "fine-prompt" in page.text
        assert client.get("/ui/compare?a=meta&b=fine").status_code == 200


def test_a_damaged_run_row_never_fails_the_runs_page_or_the_table(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    db = run / "harnessrl.db"
    store = SQLiteStore(db)
    store.create_run("run", config={"trainer": {"steps": 2}})
    store.create_rollout(task={}, rollout_id="r0", run_id="run")
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET config = '{damaged' WHERE run_id = 'run'")
    store = SQLiteStore(db)
    try:  # the control: the row really cannot be read
        with pytest.raises(ValueError):
            store.list_runs()
    finally:
        store.close()
    with TestClient(create_dashboard_app(run, KEY), raise_server_exceptions=False) as client:
        page = client.get(f"/ui/?key={KEY}")
        assert page.status_code == 200, page.text[:300]
        assert "damaged_record" in page.text and "JSONDecodeError" in page.text
        assert client.get("/ui/rollouts").status_code == 200
