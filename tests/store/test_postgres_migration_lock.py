"""Opening a PostgreSQL store waits a bounded time for the locks its migration needs.

Every open takes the migration's advisory lock; a migration stuck behind another session's long
transaction (a table it alters held by a reader that never ends) held that lock forever, and every
later open waited behind it with no error and no word of why. Now each lock is waited for at most
the store's ``timeout_s`` (``lock_timeout``), then ``MigrationLocked`` names the sessions holding
the locks (``pg_locks`` / ``pg_stat_activity``). Against the real PostgreSQL the tests start.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harnessrl.store.migrations import SCHEMA_VERSION, MigrationLocked, migrate_postgres
from harnessrl.store.pg_server import PostgresServer

if os.environ.get("CI") != "true":  # CI must have the driver: there a missing one fails collection
    pytest.importorskip("psycopg", reason="needs harnessrl[postgres]")
import psycopg  # noqa: E402

from harnessrl.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)

#: The hang guard of an open (its lock timeout is 1 s); an open still waiting then is the old bug.
HANG_GUARD_S = 30


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


def _open_in_thread(url: str) -> tuple[threading.Thread, list[Any]]:
    """Open ``PostgresStore(url, timeout_s=1)`` in a thread; the list gets the store or the error."""
    outcome: list[Any] = []

    def open_store() -> None:
        try:
            outcome.append(PostgresStore(url, timeout_s=1.0))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=open_store, daemon=True)
    thread.start()
    return thread, outcome


def _open_while(url: str, hold: Callable[[psycopg.Connection[Any]], None]) -> Any:
    """What opening the store gives while another session (application ``long-tx``) holds
    ``hold``'s locks in an open transaction; that transaction ends afterwards either way."""
    with psycopg.connect(url, application_name="long-tx") as other:
        hold(other)
        thread, outcome = _open_in_thread(url)
        thread.join(timeout=HANG_GUARD_S)
        still_waiting = thread.is_alive()
        other.rollback()  # lets an old-code open go on, so the thread ends
    thread.join(timeout=HANG_GUARD_S)
    for result in outcome:
        if isinstance(result, PostgresStore):
            result.close()
    assert not still_waiting, f"the store open still waited after {HANG_GUARD_S} s"
    return outcome[0]


def test_open_behind_a_stuck_migration_is_a_named_error(pg_url: str) -> None:
    """A process holds the migration lock (its migration stuck): the open gives up, naming it."""

    def hold_migration_lock(conn: psycopg.Connection[Any]) -> None:
        migrate_postgres(conn)  # the schema at SCHEMA_VERSION, the lock held until rollback

    error = _open_while(pg_url, hold_migration_lock)
    assert isinstance(error, MigrationLocked), error
    assert "long-tx" in str(error) and "idle in transaction" in str(error)


def test_migration_behind_a_long_transaction_is_a_named_error(pg_url: str) -> None:
    """The store is one version behind; a reader's open transaction holds the table that version's
    migration drops: the migrating open gives up naming the reader, and nothing was migrated."""
    with psycopg.connect(pg_url) as conn:
        migrate_postgres(conn, target=SCHEMA_VERSION - 1)

    def read_the_gate(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT * FROM gate").fetchall()  # AccessShare on gate until rollback

    error = _open_while(pg_url, read_the_gate)
    assert isinstance(error, MigrationLocked), error
    assert "long-tx" in str(error) and "SELECT * FROM gate" in str(error)
    with psycopg.connect(pg_url) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (str(SCHEMA_VERSION - 1),)
    PostgresStore(pg_url, timeout_s=1.0).close()  # the reader gone, the open migrates
