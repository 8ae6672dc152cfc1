"""What is particular to ``SQLiteStore`` beyond the shared contract: file setup, pragmas, the schema
version and migrations, URL forms, and fork safety."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import BadRequest, HarnessRLError
from harnessrl.schemas import Call
from harnessrl.store import open_store
from harnessrl.store._sqlite_schema import SCHEMA_VERSION
from harnessrl.store.sqlite import SQLiteStore

WORKER = Path(__file__).with_name("store_worker.py")


def test_file_setup(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    with SQLiteStore(path) as store:
        store.create_rollout()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION
    )
    tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "runs", "tasks", "rollouts", "calls", "policy_versions"} <= tables
    raw.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SQLiteStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    with pytest.raises(HarnessRLError, match="newer"):
        SQLiteStore(path)


def test_open_store_urls(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path}/x.db", str(tmp_path / "x.db"), ":memory:"):
        store = open_store(url)
        assert isinstance(store, SQLiteStore)
        store.close()
    assert (tmp_path / "x.db").exists()


def test_token_ids_must_fit_int32() -> None:
    with SQLiteStore(":memory:") as store:
        rollout = store.create_rollout()
        too_big = Call(
            rollout_id=rollout.rollout_id,
            prompt_token_ids=[2**31],
            response_token_ids=[],
            response_logprobs=[],
        )
        with pytest.raises(BadRequest, match="int32"):
            store.add_call(too_big)
        assert store.count_calls() == 0


def test_processes_opening_a_fresh_file_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'store.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "claim", url, f"p{i}"], stdin=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    for proc in procs:
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == 0
    with SQLiteStore(tmp_path / "fresh" / "store.db") as store:
        assert store.count_rollouts() == 0


def _child_adds_a_call(store: SQLiteStore, rollout_id: str) -> None:
    store.add_call(
        Call(rollout_id=rollout_id, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-1.0])
    )


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forked_child_reconnects(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    rollout = store.create_rollout()
    store.add_call(
        Call(rollout_id=rollout.rollout_id, prompt_token_ids=[], response_token_ids=[], response_logprobs=[])
    )
    child = multiprocessing.get_context("fork").Process(
        target=_child_adds_a_call, args=(store, rollout.rollout_id)
    )
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert [c.seq for c in store.list_calls(rollout.rollout_id)] == [0, 1]
    store.close()
