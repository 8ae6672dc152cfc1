"""``PostgresStore``: the ``Store`` on PostgreSQL, for several gateways, controllers and trainers
on several hosts sharing one database.

Same schema and semantics as ``SQLiteStore`` (see ``migrations.py`` for the DDL); what differs is
how concurrency is made safe, since PostgreSQL has many writers at once instead of one:

- Claims: ``UPDATE ... WHERE pk IN (SELECT ... ORDER BY pk LIMIT n FOR UPDATE SKIP LOCKED)``.
  Each claimer locks the queued rows it takes and skips rows another claimer holds, so two
  claimers never get the same rollout and never wait on each other. A rollout locked by another
  write at that instant (e.g. a call being recorded) is skipped by that claim and taken by a later one.
- Call seqs: ``add_call`` locks the rollout's row (``FOR UPDATE``) before reading ``MAX(seq)`` and
  holds it until the call is committed, so calls of one rollout get 0, 1, 2, ... in commit order
  however many gateway processes write them (under READ COMMITTED each statement sees what the
  previous lock holder committed).
- Status changes and metadata merges read the rollout ``FOR UPDATE`` before deciding, so two
  writers never both act on the same stale status.
- Every transaction runs at READ COMMITTED, whatever the server's ``default_transaction_isolation``
  says (``ALTER DATABASE ... SET`` or a role's setting): the points above need each statement to see
  what the lock's previous holder committed. Under REPEATABLE READ or SERIALIZABLE two gateways
  took the same ``seq`` (one call lost to a unique violation), claims and transitions failed with
  serialization errors, and two processes opening a fresh database at once both created its tables.
- A connection lost at COMMIT leaves the client unsure whether the server committed. A call write
  looks (``_recorded_seqs``, once the lost transaction's row lock is free) and returns a call the
  server recorded, so the gateway answers it instead of an error for a recorded call; a claim
  raises, and the worker's next claim hands out what it took (``SQLStore.claim_rollouts``).
- A transaction that idles past ``timeout_s`` is ended by the server (``_configure_connection``):
  none of ours idles, so one that does is a stalled writer's, and the rollout lock it holds must
  not make every other writer of that rollout wait until TCP gives up on it (hours).
- Opening migrates under an advisory lock, each lock waited for at most ``timeout_s``
  (``lock_timeout``): a migration stuck behind another session's long transaction is a
  ``MigrationLocked`` naming that session, not every process opening the store waiting forever.

Every method is one transaction on a connection from a ``psycopg_pool.ConnectionPool``; the pool
is thread-safe (the gateway and controller call the store from worker threads) and checks a
connection before lending it, so a restarted server costs no failed calls. Durability is the
server's: a method returns after ``COMMIT``, which with PostgreSQL's default
``synchronous_commit=on`` has flushed the WAL.

Connection problems surface as ``UpstreamError`` naming the server; a URL libpq cannot parse, or a
user who may not create the tables, as ``ConfigError``. The secrets are removed from both, wherever
the URL holds them (``user:password@``, ``?password=``, ``?sslpassword=``) and wherever the driver's
message quotes them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.schemas import Call
from harnessrl.store.chains import EncodedItems
from harnessrl.store.codecs import Row
from harnessrl.store.gate import CHANNEL
from harnessrl.store.migrations import migrate_postgres
from harnessrl.store.sql import SQLStore

try:
    import psycopg
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # an optional extra: say how to get it
    raise ConfigError(
        "a postgresql:// store needs psycopg 3 and psycopg-pool: pip install 'harnessrl[postgres]'"
    ) from exc

log = logging.getLogger("harnessrl.store")

# A forked child opens its own pool and keeps the parent's here, never closing or finalizing it:
# closing would act on connections the parent still uses, and the pool's finalizer would wait on
# worker threads that did not survive the fork. (psycopg itself never closes a connection that
# another process opened.)
_INHERITED_POOLS: list[Any] = []
#: Every connection talks UTF-8, whatever the URL, the environment (PGCLIENTENCODING) or the database
#: default say: psycopg decodes text by the client encoding, and under SQL_ASCII (the database's
#: own, when none is set) it hands back bytes, which no record can be read from.
CONNECT_KWARGS: dict[str, Any] = {"client_encoding": "utf8"}
#: Server encodings that hold any text a store writes: UTF8, and SQL_ASCII, which keeps the
#: client's UTF-8 bytes as they are (no conversion, no check) and gives them back the same.
USABLE_ENCODINGS = ("UTF8", "SQL_ASCII")
#: What ends a transaction for want of the server: an error of the connection, the pool's wait, or
#: the server ending a session that idled in its transaction (``_configure_connection``; an
#: InternalError by its SQLSTATE class, a lost connection all the same).
_CONNECTION_LOST = (psycopg.OperationalError, PoolTimeout, psycopg.errors.IdleInTransactionSessionTimeout)
#: Seconds a gate listener waits for a notification before looking whether it should stop.
WATCH_CHECK_S = 1.0


def _read_committed(conn: psycopg.Connection[Any]) -> None:
    """Run ``conn``'s transactions at READ COMMITTED, whatever the server's default (the module
    docstring says why the store's locking needs it)."""
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED


def _check_encoding(conn: psycopg.Connection[Any], url: str) -> None:
    """``ConfigError`` for a database whose encoding cannot hold every character (LATIN1, say):
    a call quoting text outside it would fail to be recorded long after the store opened."""
    row = conn.execute("SHOW server_encoding").fetchone()
    encoding = row[0] if row else "unknown"
    if encoding not in USABLE_ENCODINGS:
        raise ConfigError(
            f"PostgreSQL store {redact(url)} has encoding {encoding}, which cannot hold every text "
            "harnessrl stores: create the database with ENCODING 'UTF8' (CREATE DATABASE ... "
            "ENCODING 'UTF8' TEMPLATE template0)"
        )


#: A query parameter of a URL: (its ``?``/``&`` and name, ``=``, its value).
_QUERY_PARAM = re.compile(r"([?&][^&#=]*=)([^&#]*)")
#: The libpq parameters that hold a secret: the password, and the passphrase of the client's SSL key.
_SECRET_PARAMS = ("password", "sslpassword")


def _is_secret(param: re.Match[str]) -> bool:
    # libpq percent-decodes a parameter's name too: ``?pass%77ord=`` is the password.
    return unquote(param.group(1)[1:-1]).lower() in _SECRET_PARAMS


def _hide_secret(param: re.Match[str]) -> str:
    return param.group(1) + "***" if _is_secret(param) else param.group(0)


def _url_parts(url: str) -> tuple[str, str | None, str, str]:
    """``scheme://[userinfo@]rest?query`` as (scheme, userinfo or None, the rest before the query,
    the query and fragment), split as text: never raises, whatever the port or host look like."""
    scheme, _, after = url.partition("://")
    cut = min([i for i in (after.find("?"), after.find("#")) if i >= 0], default=len(after))
    userinfo, at, rest = after[:cut].rpartition("@")
    return scheme, userinfo if at else None, rest, after[cut:]


def redact(url: str) -> str:
    """``url`` without its secrets (``user:PASSWORD@``, ``?password=``, ``?sslpassword=``), for
    messages and logs.
    Never raises: a URL libpq cannot parse (a bad port, an unclosed ``[``) is redacted all the same."""
    if "://" not in url:
        return url
    scheme, userinfo, rest, query = _url_parts(url)
    if userinfo is not None:
        user, colon, _ = userinfo.partition(":")
        rest = f"{user}{':***' if colon else ''}@{rest}"
    return f"{scheme}://{rest}" + _QUERY_PARAM.sub(_hide_secret, query)


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message, which may quote a URL it could not parse) without ``url``'s
    secrets, as written or percent-decoded."""
    _, userinfo, _, query = _url_parts(url)
    passwords = [m.group(2) for m in _QUERY_PARAM.finditer(query) if _is_secret(m)]
    if userinfo is not None and ":" in userinfo:
        passwords.append(userinfo.partition(":")[2])
    text = text.replace(url, redact(url))
    for password in sorted({p for pw in passwords if pw for p in (pw, unquote(pw))}, key=len, reverse=True):
        text = text.replace(password, "***")
    return text


class PostgresStore(SQLStore):
    """The ``Store`` protocol on PostgreSQL. ``url`` is a libpq URL (``postgresql://user@host:port/db``);
    the database must exist; its tables are created or migrated on open."""

    PARAM = "%s"
    ROW_LOCK = " FOR UPDATE"
    CLAIM_LOCK = " FOR UPDATE SKIP LOCKED"  # concurrent claimers skip each other's rows
    NO_LIMIT = None  # LIMIT NULL is no limit
    notifies_gate = True  # LISTEN/NOTIFY (``watch_gate``)

    @property
    def local_file(self) -> Path | None:
        return None  # a server's database: the dashboard reads it through --store

    @property
    def reads_at_once(self) -> bool:
        return False  # every read is a round trip to the server

    def add_call_now(self, call: Call, encoded: EncodedItems | None = None) -> Call | None:
        return None  # every write is a round trip to the server: a thread's job

    def __init__(
        self, url: str, *, min_connections: int = 1, max_connections: int = 8, timeout_s: float = 30.0
    ) -> None:
        if not 1 <= min_connections <= max_connections:
            raise ConfigError("PostgresStore needs 1 <= min_connections <= max_connections")
        super().__init__()
        self.url = url
        self._min, self._max, self._timeout_s = min_connections, max_connections, timeout_s
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        try:
            # One plain connection for the migration, so a wrong URL or a down server fails here
            # with libpq's own reason (the pool would only time out).
            with psycopg.connect(url, connect_timeout=max(1, int(timeout_s)), **CONNECT_KWARGS) as conn:
                # Before the first statement: its snapshot must not predate the migration lock's wait.
                _read_committed(conn)
                _check_encoding(conn, url)
                # Bounded: a migration stuck behind another session's transaction is a named error
                # (``MigrationLocked``) after ``timeout_s``, not every opener waiting forever.
                migrate_postgres(conn, where=f"store {redact(url)}", lock_timeout_s=timeout_s)
        except psycopg.OperationalError as exc:
            raise UpstreamError(
                f"cannot use PostgreSQL store {redact(url)}: {scrub(str(exc), url)}".strip()
            ) from None
        except psycopg.Error as exc:  # a URL libpq cannot parse, no right to create the tables, ...
            raise ConfigError(
                f"cannot use PostgreSQL store {redact(url)}: {scrub(str(exc), url)}".strip()
            ) from None
        self._pool = self._new_pool()

    def _new_pool(self) -> ConnectionPool:
        return ConnectionPool(
            self.url,
            min_size=self._min,
            max_size=self._max,
            timeout=self._timeout_s,
            kwargs={"row_factory": dict_row, **CONNECT_KWARGS},
            check=ConnectionPool.check_connection,
            configure=self._configure_connection,
            name=f"harnessrl-store-{os.getpid()}",
            open=True,
        )

    def _configure_connection(self, conn: psycopg.Connection[Any]) -> None:
        """Each pooled connection, once when opened: READ COMMITTED (``_read_committed``), and its
        transactions ended by the server if they idle past ``timeout_s``. A transaction of ours never
        idles (its statements run back to back); one that does belongs to a writer that stalled (a
        frozen process, a host cut off, a COMMIT lost on the way) and holds its rows' locks, for hours
        where no connection reset tells the server: every other writer of that rollout (its
        controller's finish, the trainer's cancel, the other gateways) would wait as long."""
        _read_committed(conn)
        idle_ms = f"{max(1, int(self._timeout_s * 1000))}ms"
        conn.autocommit = True  # a session setting: no transaction around it
        conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (idle_ms,))
        conn.autocommit = False

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Row]]:
        """One transaction on a pooled connection: committed on success, rolled back on error."""
        if self._pid != os.getpid() and not self._closed:
            # A forked child: its own pool, and a new lock (a parent thread may have held the old
            # one at the fork).
            _INHERITED_POOLS.append(self._pool)
            self._pid, self._lock, self._pool = os.getpid(), threading.Lock(), self._new_pool()
        try:
            with self._pool.connection() as conn:
                yield conn
        except _CONNECTION_LOST as exc:
            raise UpstreamError(f"PostgreSQL store {redact(self.url)}: {scrub(str(exc), self.url)}") from exc

    _read = _tx
    _write = _tx

    # -- the gate's notifications (``store.gate``) --------------------------------------------------
    def _notify_gate(self, conn: psycopg.Connection[Row], payload: str) -> None:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))  # delivered at COMMIT

    def watch_gate(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """``LISTEN harnessrl_gate`` on a connection of its own, in a thread that calls ``callback``
        with each notification's payload. A lost connection is reopened (the callback gets ``""``
        then, as once listening: a notification may have been missed). The thread also wakes every
        ``WATCH_CHECK_S`` to see it should stop."""
        stopping = threading.Event()

        def listen() -> None:
            while not stopping.is_set():
                try:
                    with psycopg.connect(
                        self.url, autocommit=True, connect_timeout=10, **CONNECT_KWARGS
                    ) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        callback("")
                        while not stopping.is_set():
                            for notify in conn.notifies(timeout=WATCH_CHECK_S):
                                callback(notify.payload)
                except psycopg.Error:
                    if stopping.wait(1.0):
                        return

        thread = threading.Thread(target=listen, name="harnessrl-gate-listen", daemon=True)
        thread.start()

        def stop() -> None:
            stopping.set()

        return stop

    def named(self, column: str) -> str:
        return f"%({column})s"

    def _executemany(self, conn: psycopg.Connection[Row], sql: str, rows: list[tuple[Any, ...]]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql, rows)

    def _is_duplicate_call_id(self, exc: Exception) -> bool:
        return isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == "calls_pkey"

    def _recorded_seqs(self, rollout_id: str, call_ids: Sequence[str]) -> dict[str, int]:
        """``SQLStore._recorded_seqs``: a connection lost around COMMIT leaves its outcome unknown to
        us, but not to the server (``_once_unlocked``). ``{}`` when the server cannot be asked."""
        rows = self._once_unlocked(
            rollout_id,
            "SELECT call_id, seq FROM calls WHERE call_id = ANY(%s)",
            (list(call_ids),),
            f"{len(call_ids)} call(s)",
        )
        return {row["call_id"]: row["seq"] for row in rows or []}

    def _recorded_tool_request(self, rollout_id: str, pk: int) -> bool:
        """``SQLStore._recorded_tool_request``, as ``_recorded_seqs``. False when it cannot be known."""
        rows = self._once_unlocked(
            rollout_id, "SELECT 1 FROM tool_requests WHERE pk = %s", (pk,), "a tool request"
        )
        return bool(rows)

    def _once_unlocked(self, rollout_id: str, sql: str, params: Sequence[Any], what: str) -> list[Any] | None:
        """``sql``'s rows once ``rollout_id``'s row lock is had: a write that lost its connection around
        COMMIT holds that lock until the server has committed it or rolled it back (it sees the
        connection closed), so what it wrote is looked for after. Waiting for it is bounded by
        ``timeout_s`` (a connection the server still thinks open). None when the server cannot be asked."""
        try:
            with self._tx() as conn:
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, true)", (f"{int(self._timeout_s * 1000)}ms",)
                )
                conn.execute("SELECT 1 FROM rollouts WHERE rollout_id = %s FOR UPDATE", (rollout_id,))
                return conn.execute(sql, params).fetchall()
        except (UpstreamError, psycopg.Error) as exc:
            log.warning("cannot tell whether %s was recorded: %s", what, scrub(str(exc), self.url))
            return None

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._pid == os.getpid():  # a forked child leaves the parent's pool alone
                    self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
