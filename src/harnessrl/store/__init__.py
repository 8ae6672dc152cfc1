"""Durable state: the ``Store`` protocol and its implementations (SQLite, PostgreSQL)."""

from harnessrl.store.base import Store

__all__ = ["Store", "open_store", "sqlite_path"]

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def sqlite_path(url: str) -> str | None:
    """The SQLite file (or ``:memory:``) a store URL names: ``sqlite:///path/to.db``, ``sqlite://path``
    or a plain path; None for a PostgreSQL URL. Any other ``scheme://``, or nothing, is a
    ``ConfigError`` rather than taken for a file name."""
    from harnessrl.errors import ConfigError

    if url.startswith(_POSTGRES_SCHEMES):
        return None
    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///") :]
    elif url.startswith("sqlite://"):
        url = url[len("sqlite://") :]
    elif "://" in url:
        raise ConfigError(
            f"store url {url.split('://', 1)[0]}://... is not supported: use a file path, sqlite:///PATH, "
            "or postgresql://user@host:port/db"
        )
    if not url:
        raise ConfigError("store url is empty: use a file path, sqlite:///PATH, or postgresql://...")
    return url


def open_store(url: str) -> Store:
    """Open a store from a URL or path.

    - ``sqlite:///path/to.db``, a plain file path, or ``:memory:``: ``SQLiteStore``;
    - ``postgresql://user[:password]@host[:port]/db`` (or ``postgres://``; libpq query parameters
      such as ``?sslmode=require`` pass through): ``PostgresStore`` (needs ``harnessrl[postgres]``).

    Any other ``scheme://`` is refused with ``ConfigError`` rather than taken for a file name.
    """
    path = sqlite_path(url)
    if path is None:
        from harnessrl.store.postgres import PostgresStore

        return PostgresStore(url)
    from harnessrl.store.sqlite import SQLiteStore

    return SQLiteStore(path)
