"""Durable state: the ``Store`` protocol and its implementations."""

from harnessrl.store.base import Store

__all__ = ["Store", "open_store"]


def open_store(url: str) -> Store:
    """Open a store from a URL or path: ``sqlite:///path/to.db``, a plain file path, or ``:memory:``."""
    from harnessrl.store.sqlite import SQLiteStore

    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///") :]
    elif url.startswith("sqlite://"):
        url = url[len("sqlite://") :]
    return SQLiteStore(url)
