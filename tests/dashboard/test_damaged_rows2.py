"""A rollout row damaged in a column that is not JSON (a ``status`` no lifecycle has, an ``attempt``
that is no number: a disk or a bad writer) cannot be made a rollout even with its JSON columns set
aside. It failed the whole rollouts table (a 503 for every filter and page that held it), hiding
every other row; now it is left out of the table (logged) and its own page names the damage. A real
run folder's SQLite store, damaged with ``sqlite3``, served by the real dashboard."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from harnessrl.dashboard import create_dashboard_app
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore

KEY = "dash-admin-key"


@pytest.mark.parametrize(("column", "value"), [("status", "bogus"), ("attempt", "not a number")])
def test_a_row_that_is_no_rollout_never_fails_the_table(tmp_path: Path, column: str, value: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    db = run / "harnessrl.db"
    store = SQLiteStore(db)
    store.create_run("run")
    for rollout_id in ("broken", "fine", "other"):
        store.create_rollout(
            task={"prompt": f"{rollout_id}-prompt"}, rollout_id=rollout_id, run_id="run", group_id="g0"
        )
    assert len(store.claim_rollouts("w", 3)) == 3
    for rollout_id in ("broken", "fine", "other"):
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE rollouts SET {column} = ? WHERE rollout_id = 'broken'", (value,))

    with TestClient(create_dashboard_app(run, KEY), raise_server_exceptions=False) as client:
        assert client.get(f"/ui/?key={KEY}").status_code == 200
        for query in ("", "?group=g0", "?sort=reward", "?status=finished"):
            page = client.get(f"/ui/rollouts{query}")
            assert page.status_code == 200, (query, page.text[:300])
            assert "fine" in page.text and "other" in page.text
            assert "/rollouts/broken" not in page.text
        page = client.get("/ui/rollouts/broken")  # its own page names the damage
        assert "rollout &#x27;broken&#x27;" in page.text or "rollout 'broken'" in page.text
        assert column in page.text
        fine = client.get("/ui/rollouts/fine")
        assert fine.status_code == 200 and "fine-prompt" in fine.text
