"""Fixtures that run the ``Store`` contract tests against every backend.

A backend is a ``StoreFactory``: calling it opens a new store on the *same* database (a second
connection, like a second process would), and ``url`` is what a child process passes to
``open_store``. Backends whose data cannot be reached from a second connection (``:memory:``) set
``shared = False``; tests that need two connections or processes take ``shared_store_factory`` and
are skipped for them.

To add a backend (PostgreSQL): add a param below that provisions a fresh, empty database (or
schema) for the test, builds its ``url``, and skips when the server is unavailable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harnessrl.store import Store, open_store


@dataclass
class StoreFactory:
    url: str
    shared: bool
    opened: list[Store] = field(default_factory=list)

    def __call__(self) -> Store:
        store = open_store(self.url)
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


def _sqlite_file(tmp_path: Path) -> StoreFactory:
    return StoreFactory(url=f"sqlite:///{tmp_path / 'store' / 'harnessrl.db'}", shared=True)


def _sqlite_memory(tmp_path: Path) -> StoreFactory:
    return StoreFactory(url=":memory:", shared=False)


BACKENDS = {"sqlite-file": _sqlite_file, "sqlite-memory": _sqlite_memory}


@pytest.fixture(params=list(BACKENDS))
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = BACKENDS[request.param](tmp_path)
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
