"""``SQLiteStore``: the embedded ``Store`` on one SQLite file (WAL), shared by several processes.

The gateway, controller and trainer each open their own ``SQLiteStore`` on the same file. Within a
process, one connection is shared by all threads behind an ``RLock`` (SQLite has one writer at a
time anyway). Across processes, every read-modify-write (seq assignment, claims, transitions,
metadata merges) runs in ``BEGIN IMMEDIATE``, which takes the database's write lock before reading,
so two processes never decide from the same stale read; waiting for that lock is bounded by
``busy_timeout`` (``timeout_s``), past which a write is an ``UpstreamError`` naming the store.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL``. A commit has been written into the
WAL file (the OS page cache) before ``COMMIT`` returns, so it survives the process being SIGKILLed,
which is what the ``Store`` contract asks for; only an OS crash or power loss can drop the last few
commits. Pass ``synchronous="FULL"`` to fsync every commit when that matters more than latency.
WAL needs shared memory, so the file must be on a local filesystem (not NFS).

Permissions: the file holds every task's hidden data and every rollout key, so it is created 0600
before SQLite first opens it; SQLite gives the -wal and -shm files it creates the database file's
permissions, so they are 0600 from their first byte, whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from harnessrl.errors import ConfigError, NotFound, UpstreamError
from harnessrl.schemas import Call, Rollout
from harnessrl.store.chains import EncodedItems, pack_call
from harnessrl.store.codecs import is_storable_key, rollout_from_row
from harnessrl.store.gate import DEFAULT_GATE, GateState, check_gate
from harnessrl.store.migrations import migrate_sqlite
from harnessrl.store.sql import SQLStore, StatusFilter

__all__ = ["SQLiteStore", "StatusFilter"]


class SQLiteStore(SQLStore):
    """The ``Store`` protocol on SQLite. ``path`` is a file (parent folders are created) or ``":memory:"``."""

    PARAM = "?"
    ROW_LOCK = ""  # the write transaction already holds the database's write lock
    CLAIM_LOCK = ""
    NO_LIMIT = -1  # SQLite needs a LIMIT before OFFSET; -1 means none
    SEQ_WITH_LOCK = True  # BEGIN IMMEDIATE holds the database's write lock from the start

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_s: float = 30.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        super().__init__()
        self.path = str(path)
        self._timeout_s = timeout_s
        self._synchronous = synchronous
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False
        self._reset_readers()
        self._by_key: dict[str, tuple[tuple[Any, ...], Rollout]] = {}  # key -> (its row, its rollout)
        if self.path.startswith("file:"):
            # SQLite takes it for a URI: its file would be made with the umask's permissions (not
            # 0600), and each thread's own connection would open another database (``file::memory:``).
            raise ConfigError(
                f"store {self.path!r} is a SQLite URI, which is not supported: name the database file "
                f"as a path (./{self.path} for a file of that name) or use :memory:"
            )
        if self.local_file is not None:
            if self.path.endswith(("/", os.sep)):  # Path() would drop the slash and make a file there
                raise ConfigError(f"store {self.path!r} names a folder: name the database file in it")
            _prepare_file(self.local_file)
        # The schema version is read (and a newer store refused) before the switch to WAL, which
        # would change the file's header and leave -wal/-shm files beside a store it must not touch.
        try:
            self._conn = self._connect(wal=False)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"cannot open store {self.path!r}: {exc}") from exc
        try:
            with self._write() as conn:
                migrate_sqlite(conn, where=f"store {self.path!r}")
            _enter_wal(self._conn, timeout_s)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sqlite3.DatabaseError):  # not a database, or not one of ours
                raise ConfigError(f"cannot open store {self.path!r}: {exc}") from exc
            raise
        if self.local_file is not None:
            # -wal/-shm that an older harnessrl (or another program) made with the umask's
            # permissions, still there because a process of its has the file open.
            for leftover in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.chmod(f"{self.path}{leftover}", 0o600)

    @property
    def local_file(self) -> Path | None:
        if self.path == ":memory:":
            return None
        return Path(self.path)

    @property
    def reads_at_once(self) -> bool:
        # A file in WAL mode: each thread reads on a connection of its own, which never waits for
        # the shared connection's write transactions (an in-memory database is private to one).
        return self.path != ":memory:"

    #: Rollouts looked up by key whose rows are remembered (``get_rollout_by_key``).
    KEY_LOOKUPS_KEPT = 4096

    def get_rollout_by_key(self, api_key: str) -> Rollout:
        """The rollout owning ``api_key``, read on this thread's own connection. Built once per row:
        while its row is unchanged, a later lookup returns the same (read-only) ``Rollout``; the
        gateway looks every model call's key up, and validating the record costs more than the read."""
        if not self.reads_at_once or not is_storable_key(api_key):
            return super().get_rollout_by_key(api_key)
        row = self._reader().execute(self._rollout_by_key_sql(), (api_key,)).fetchone()
        if row is None:
            raise NotFound("no rollout has this api key")  # never echo a (wrong) key into logs
        values = tuple(row)
        kept = self._by_key.get(api_key)
        if kept is not None and kept[0] == values:
            return kept[1]
        rollout = rollout_from_row(row)
        if len(self._by_key) >= self.KEY_LOOKUPS_KEPT:
            self._by_key.clear()  # rare (thousands of live rollouts): start again
        self._by_key[api_key] = (values, rollout)
        return rollout

    def add_call_now(self, call: Call, encoded: EncodedItems | None = None) -> Call | None:
        """``add_call`` on this thread's own connection, which never waits for the database's write
        lock (``busy_timeout`` 0): ``None`` when another connection or process holds it, having done
        nothing. An in-memory database has one connection: always ``None``."""
        if not self.reads_at_once:
            return None
        # Packed before the lock is taken, as ``add_call`` does: a call that cannot be packed (an ID
        # past int32) fails alone, and the lock is never held while packing (nor left held by it).
        packed = pack_call(call, encoded)
        # This thread's own connection, so it never waits for the shared connection's lock.
        conn = self._thread_connection("now", busy_timeout_s=0.0)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                return None
            raise
        return self._add_packed(call, packed, _committed(conn))

    def read_gate(self, gate: str = DEFAULT_GATE) -> GateState:
        """The gate, on this thread's own connection (as ``get_rollout_by_key``): it never waits for
        a write, so a gateway's event loop reads it directly, 20 times a second (``Cluster``)."""
        if not self.reads_at_once:
            return super().read_gate(gate)
        check_gate(gate)
        return self._gate_on(self._reader(), gate)

    def _reader(self) -> sqlite3.Connection:
        """This thread's read-only connection (autocommit: each read sees every commit before it)."""
        return self._thread_connection("reader", read_only=True)

    def _thread_connection(self, role: str, **settings: Any) -> sqlite3.Connection:
        """This thread's connection for ``role``, opened with ``settings`` (``_connect``'s) on first use."""
        if self._pid != os.getpid():
            self._reset_readers()
        held = getattr(self._readers, role, None)
        if held is None:
            if self._closed:
                raise sqlite3.ProgrammingError("the store is closed")
            held = _ThreadConnection(self._connect(**settings))
            setattr(self._readers, role, held)
            with self._readers_lock:
                self._reader_conns.add(held)
        return held.conn

    def _reset_readers(self) -> None:
        # A forked child must not use its parent's connections (their POSIX locks do not carry over).
        self._readers = threading.local()
        self._readers_lock = threading.Lock()
        # Weakly: a thread's connections are closed when it ends (``_ThreadConnection``), not kept
        # open until the store closes (two file descriptors per thread that ever read by key).
        self._reader_conns: weakref.WeakSet[_ThreadConnection] = weakref.WeakSet()

    def _connect(
        self, *, read_only: bool = False, busy_timeout_s: float | None = None, wal: bool = True
    ) -> sqlite3.Connection:
        # isolation_level=None: the sqlite3 module never opens transactions on its own; we issue
        # BEGIN IMMEDIATE / COMMIT ourselves so every write's locking is explicit.
        timeout = self._timeout_s if busy_timeout_s is None else busy_timeout_s
        conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        if read_only:
            conn.execute("PRAGMA query_only = ON")  # the file is in WAL mode already (set on open)
            return conn
        if wal:
            _enter_wal(conn, timeout)
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        if self._pid != os.getpid() and not self._closed:
            # A forked child must not use the parent's connection (its POSIX locks do not carry
            # over, which can corrupt the file) nor a lock another parent thread may have held.
            self._pid, self._lock = os.getpid(), threading.RLock()
            if self.path != ":memory:":
                self._conn = self._connect()
        with self._lock, self._busy_as_upstream():
            yield self._conn

    @contextmanager
    def _busy_as_upstream(self) -> Iterator[None]:
        """SQLite's "database is locked" (its busy timeout ran out: another connection kept the write
        lock, e.g. a process stopped mid-write) as an ``UpstreamError`` naming the store, as
        PostgreSQL's store names a server it cannot use, instead of the driver's traceback."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
            raise UpstreamError(
                f"SQLite store {self.path!r} is locked: another connection kept its write lock past "
                f"the {self._timeout_s:g} s busy timeout (a process stopped while writing, or another "
                f"program holding the file); try again ({exc})"
            ) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database's write lock from its first read."""
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            with _committed(conn):
                yield conn

    _read = _locked

    def named(self, column: str) -> str:
        return f":{column}"

    def _executemany(self, conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
        conn.executemany(sql, rows)

    def _is_duplicate_call_id(self, exc: Exception) -> bool:
        # ``call_id`` is the table's primary key; (rollout_id, seq) is UNIQUE, a different code.
        return (
            isinstance(exc, sqlite3.IntegrityError)
            and exc.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
        )

    # -- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                with self._readers_lock:
                    readers, self._reader_conns = list(self._reader_conns), weakref.WeakSet()
                for held in readers:
                    held.conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _ThreadConnection:
    """One thread's own connection (``SQLiteStore._thread_connection``), held only by that thread's
    ``threading.local``: when the thread ends, the holder goes and the connection is closed."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        weakref.finalize(self, conn.close)


def _prepare_file(path: Path) -> None:
    """Make the database file readable by its owner only (every task with its hidden data, every
    rollout key), creating it and its folders so when it is new, before SQLite first opens it:
    SQLite creates the WAL and shared-memory files with the database file's permissions, whatever
    the umask. A path that is not a regular file (a folder, a device) is a ``ConfigError`` and is
    left as it is: a ``--store runs/x`` naming the run folder must not make that folder 0600."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a folder that cannot be made, a parent that is a file
        raise ConfigError(f"cannot create store {str(path)!r}: {exc}") from exc
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            is_file = stat.S_ISREG(os.stat(path).st_mode)
        except OSError:  # a dangling link (SQLite creates its target), a folder we may not look into
            return
        if not is_file:
            raise ConfigError(
                f"store {str(path)!r} is not a file (a folder?): name the database file, "
                "e.g. runs/x/harnessrl.db"
            ) from None
        if not _may_be_a_database(path):  # someone's other file, named by mistake: left as it is
            raise ConfigError(
                f"cannot open store {str(path)!r}: file is not a database (it does not start with "
                "SQLite's header): name the store's file, e.g. runs/x/harnessrl.db"
            ) from None
        with contextlib.suppress(OSError):  # a file of another owner keeps its permissions
            os.chmod(path, 0o600)
    except OSError as exc:  # a folder this user may not write
        raise ConfigError(f"cannot create store {str(path)!r}: {exc}") from exc
    else:
        os.close(fd)


_SQLITE_HEADER = b"SQLite format 3\x00"


def _may_be_a_database(path: Path) -> bool:
    """Whether ``path`` is empty or starts with SQLite's header (or cannot be read here: SQLite will
    say). Checked before the file is made 0600, so a file that is not a database is not changed."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except OSError:
        return True
    return head in (b"", _SQLITE_HEADER)


def _enter_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch ``conn`` to WAL, retrying while another process holds the lock that switch needs.

    Several processes opening a fresh file at once race to change its journal mode, and SQLite
    answers that race with "database is locked" without calling the busy handler (a fresh-clone CI
    run saw one of three openers fail so), so the wait ``busy_timeout`` promises is ours to do here.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextmanager
def _committed(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The transaction just begun on ``conn``: committed when the block ends, rolled back if it raises."""
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
