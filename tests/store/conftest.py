"""Fixtures that run the ``Store`` contract tests against every backend.

A backend is a ``StoreFactory``: calling it opens a new store on the *same* database (a second
connection, like a second process would), and ``url`` is what a child process passes to
``open_store``. Backends whose data cannot be reached from a second connection (``:memory:``) set
``shared = False``; tests that need two connections or processes take ``shared_store_factory`` and
are skipped for them.

``postgres`` runs on one throwaway PostgreSQL server per test session (``pg_server``: initdb +
pg_ctl from Debian's package, or the server ``HARNESSRL_TEST_PG_URL`` names) with a fresh database
per test. Without PostgreSQL (and no way to install it) those params skip, except in CI
(``CI=true``), where they fail: CI must test every backend.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harnessrl.store import Store, open_store
from harnessrl.store.pg_server import PostgresServer, PostgresUnavailable, server_for_tests


@dataclass
class StoreFactory:
    url: str
    shared: bool
    opened: list[Store] = field(default_factory=list)
    cleanup: Callable[[], None] | None = None  # runs after every store is closed

    def __call__(self) -> Store:
        store = open_store(self.url)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()
        if self.cleanup is not None:
            self.cleanup()


def _sqlite_file(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    return StoreFactory(url=f"sqlite:///{tmp_path / 'store' / 'harnessrl.db'}", shared=True)


def _sqlite_memory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    return StoreFactory(url=":memory:", shared=False)


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    server: PostgresServer = request.getfixturevalue("pg_server")
    name = f"t_{uuid.uuid4().hex[:16]}"
    return StoreFactory(
        url=server.create_database(name), shared=True, cleanup=lambda: server.drop_database(name)
    )


BACKENDS = {"sqlite-file": _sqlite_file, "sqlite-memory": _sqlite_memory, "postgres": _postgres}


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (see the module docstring)."""
    started = time.monotonic()
    try:
        with server_for_tests() as server:
            print(f"\n[pg_server] {server.base_url} ready in {time.monotonic() - started:.1f} s")
            yield server
    except PostgresUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL unavailable: {exc}")


@pytest.fixture(params=list(BACKENDS))
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = BACKENDS[request.param](request, tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def shared_store_factory(store_factory: StoreFactory) -> StoreFactory:
    if not store_factory.shared:
        pytest.skip("this backend's data is private to one connection")
    return store_factory


@pytest.fixture
def store(store_factory: StoreFactory) -> Store:
    return store_factory()
