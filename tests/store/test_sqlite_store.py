"""What is particular to ``SQLiteStore`` beyond the shared contract: file setup, pragmas, URL forms,
and fork safety. Schema versions and migrations are tested for every backend in ``test_migrations.py``."""

from __future__ import annotations

import multiprocessing
import sqlite3
import sys
from pathlib import Path

import pytest

from harnessrl.schemas import Call
from harnessrl.store import open_store
from harnessrl.store.migrations import SCHEMA_VERSION
from harnessrl.store.sqlite import SQLiteStore


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


def test_open_store_urls(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path}/x.db", str(tmp_path / "x.db"), ":memory:"):
        store = open_store(url)
        assert isinstance(store, SQLiteStore)
        store.close()
    assert (tmp_path / "x.db").exists()


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
