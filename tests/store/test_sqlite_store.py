"""What is particular to ``SQLiteStore`` beyond the shared contract: file setup, pragmas, URL forms,
and fork safety. Schema versions and migrations are tested for every backend in ``test_migrations.py``."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sqlite3
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.errors import BadRequest, ConfigError, HarnessRLError, NotFound, UpstreamError
from harnessrl.schemas import Call, Outcome, RolloutStatus
from harnessrl.store import open_store
from harnessrl.store.gate import GateState
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


def test_a_store_path_that_is_not_a_database_file_is_a_config_error_and_left_alone(tmp_path: Path) -> None:
    """``--store runs/x`` (the run folder, not its file) was made 0600, so its owner could no longer
    look into it (and as root ``--store /dev/null`` made /dev/null 0600); a file that is not a
    database, or a parent that is a file, raised sqlite3's own error, which the CLI shows as a
    traceback. Each is now a ``ConfigError`` naming the store, and nothing is changed."""
    folder = tmp_path / "run"
    (folder / "keep").mkdir(parents=True)
    folder.chmod(0o755)
    with pytest.raises(ConfigError, match="is not a file"):
        open_store(str(folder))
    with pytest.raises(ConfigError, match="names a folder"):
        open_store(f"{tmp_path}/new-run/")  # nothing is made there
    assert not (tmp_path / "new-run").exists()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755 and [p.name for p in folder.iterdir()] == ["keep"]

    text = tmp_path / "notes.db"
    text.write_text("not a database, " * 20)
    with pytest.raises(ConfigError, match="notes.db.*not a database"):
        open_store(str(text))
    assert text.read_text() == "not a database, " * 20

    with pytest.raises(ConfigError, match="cannot create store"):
        open_store(str(text / "harnessrl.db"))  # its parent is a file

    with open_store(str(folder / "harnessrl.db")) as store:  # the control: a file path opens
        assert store.create_rollout(rollout_id="r").rollout_id == "r"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_a_file_that_is_not_a_database_keeps_its_permissions(tmp_path: Path) -> None:
    """``--store notes.txt`` (someone's file, named by mistake) was made 0600 before SQLite said it
    is not a database: the ``ConfigError`` came, but the file's owner had lost the permissions they
    gave it. Such a file is now refused before anything is changed; a database file is still made
    private."""
    notes = tmp_path / "notes.txt"
    notes.write_text("shared notes\n")
    notes.chmod(0o644)
    with pytest.raises(ConfigError, match="notes.txt.*not a database"):
        open_store(str(notes))
    assert stat.S_IMODE(notes.stat().st_mode) == 0o644 and notes.read_text() == "shared notes\n"

    database = tmp_path / "harnessrl.db"  # the control: a store made, then opened with loose permissions
    SQLiteStore(database).close()
    database.chmod(0o644)
    with SQLiteStore(database) as store:
        assert store.create_rollout(rollout_id="r").rollout_id == "r"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600


def test_a_sqlite_uri_is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file:PATH`` was handed to SQLite, which takes it for a URI: the database was made at PATH with
    the umask's permissions (0644: every rollout key and task readable by anyone), and a
    ``file::memory:`` store read keys on another, empty database ("no such table: rollouts"). A
    store named so is now a ``ConfigError``, and nothing is created."""
    monkeypatch.chdir(tmp_path)
    for url in (f"file:{tmp_path}/uri.db", "sqlite:///file:uri.db", "file::memory:"):
        with pytest.raises(ConfigError, match="SQLite URI"):
            open_store(url)
    assert list(tmp_path.iterdir()) == []
    with open_store(f"./file:{tmp_path.name}.db") as store:  # the control: a file of that name, by path
        assert store.local_file is not None
        assert store.get_rollout_by_key(store.create_rollout().api_key).status.value == "queued"
    assert stat.S_IMODE((tmp_path / f"file:{tmp_path.name}.db").stat().st_mode) == 0o600


def file_modes(path: Path) -> dict[str, int]:
    """The permission bits of the database file and of its WAL and shared-memory files."""
    return {suffix: stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode) for suffix in ("", "-wal", "-shm")}


def test_the_file_and_its_wal_are_private_from_the_first_write_whatever_the_umask(tmp_path: Path) -> None:
    """Every task with its hidden data and every rollout key is in the file and in its -wal: readable
    by the owner only. SQLite gives -wal/-shm the database file's permissions when it creates them, so
    the file is made 0600 before SQLite first opens it (it was chmod-ed after the switch to WAL,
    leaving the first process's -wal at the umask's 0644 for as long as it ran)."""
    private = {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.db"
        with SQLiteStore(fresh) as store:
            store.create_rollout(task={"hidden": "the answer"})
            assert file_modes(fresh) == private
        # A store an older harnessrl (or sqlite3) made with the umask's permissions, open elsewhere.
        older = tmp_path / "older.db"
        SQLiteStore(older).close()
        os.chmod(older, 0o644)
        other = sqlite3.connect(older, isolation_level=None)
        other.execute("INSERT INTO runs (run_id, config, status, created_at) VALUES ('r', '{}', 'x', 0)")
        assert file_modes(older)["-wal"] == 0o644
        with SQLiteStore(older) as store:
            store.create_rollout(task={"hidden": "the answer"})
            assert file_modes(older) == private
        other.close()
    finally:
        os.umask(umask)


def test_a_newer_store_is_refused_before_anything_is_written_to_it(tmp_path: Path) -> None:
    """A store of a newer schema, in rollback-journal mode (not WAL): the version is read before the
    switch to WAL, which would rewrite its header and leave -wal/-shm files beside it."""
    path = tmp_path / "newer.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    raw.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '99')")
    raw.commit()
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    raw.close()
    before = path.read_bytes()
    with pytest.raises(HarnessRLError, match="schema version 99, newer"):
        SQLiteStore(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["newer.db"]


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


def _child_reads_a_key(store: SQLiteStore, api_key: str, out: multiprocessing.Queue) -> None:
    out.put(store.get_rollout_by_key(api_key).status.value)


def test_key_lookup_reads_at_once_while_another_thread_writes(tmp_path: Path) -> None:
    """``reads_at_once``: ``get_rollout_by_key`` and ``read_gate`` answer while a write transaction is open on the
    store's shared connection (the gateway calls it on its event loop); the control, a read on the
    shared connection, waits for that transaction."""
    store = SQLiteStore(tmp_path / "store.db")
    rollout = store.create_rollout()
    assert store.reads_at_once and not SQLiteStore(":memory:").reads_at_once
    holding, release = threading.Event(), threading.Event()

    def hold_a_write() -> None:
        with store._write():
            holding.set()
            release.wait(30)

    writer = threading.Thread(target=hold_a_write)
    writer.start()
    assert holding.wait(30)
    try:
        assert store.get_rollout_by_key(rollout.api_key).rollout_id == rollout.rollout_id
        assert store.read_gate() == GateState(paused=False, policy_version=None, command=0)
        shared = threading.Thread(target=store.get_rollout, args=(rollout.rollout_id,))
        shared.start()
        shared.join(timeout=0.5)
        assert shared.is_alive()  # control: the shared connection waits for the writer
    finally:
        release.set()
        writer.join()
    shared.join(timeout=30)
    store.close()


def test_a_gate_read_at_once_sees_every_command_of_another_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    other = SQLiteStore(tmp_path / "store.db")  # another process's store, as far as SQLite knows
    assert store.read_gate().command == 0
    other.command_gate(paused=True)
    assert store.read_gate() == GateState(paused=True, policy_version=None, command=1)
    other.command_gate(paused=False, policy_version=4)
    assert store.read_gate() == GateState(paused=False, policy_version=4, command=2)
    other.close()
    store.close()


def test_key_lookup_sees_every_commit_and_ends_with_the_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    other = SQLiteStore(tmp_path / "store.db")  # another process's store, as far as SQLite knows
    rollout = store.create_rollout()
    assert store.get_rollout_by_key(rollout.api_key).status.value == "queued"
    other.start_rollout(rollout.rollout_id)
    assert store.get_rollout_by_key(rollout.api_key).status.value == "running"
    requeued = other.requeue_rollout(rollout.rollout_id)  # a new attempt, with a new key
    with pytest.raises(NotFound):
        store.get_rollout_by_key(rollout.api_key)  # the kept lookup of the old key is not used
    rollout = requeued
    assert store.get_rollout_by_key(rollout.api_key).attempt == 1
    # An unchanged row gives the rollout built for it; any change to the row, a new one.
    same = store.get_rollout_by_key(rollout.api_key)
    assert store.get_rollout_by_key(rollout.api_key) is same
    other.update_rollout_metadata(rollout.rollout_id, {"sampling": {"temperature": 0.5}})
    assert store.get_rollout_by_key(rollout.api_key).sampling.temperature == 0.5
    # Each thread reads on its own connection, and all of them close with the store.
    seen: list[object] = []
    read, closed = threading.Event(), threading.Event()

    def reader_thread() -> None:
        seen.append(store.get_rollout_by_key(rollout.api_key).rollout_id)
        read.set()
        closed.wait(timeout=60)
        try:
            store.get_rollout_by_key(rollout.api_key)  # on its own connection, closed by now
        except sqlite3.ProgrammingError as exc:
            seen.append(exc)

    reader = threading.Thread(target=reader_thread)
    reader.start()
    assert read.wait(timeout=60)
    store.close()
    other.close()
    closed.set()
    reader.join(timeout=60)
    assert seen[0] == rollout.rollout_id and isinstance(seen[1], sqlite3.ProgrammingError), seen
    with pytest.raises(sqlite3.ProgrammingError):
        store.get_rollout_by_key(rollout.api_key)


def _open_fds_on(path: Path) -> int:
    """How many of this process's file descriptors are open on the database file or its -wal/-shm."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_a_thread_that_ended_leaves_no_connection_open(tmp_path: Path) -> None:
    """Each thread that read by key or the gate, or wrote at once, opened connections of its own that
    stayed open until the store closed: two file descriptors per thread that ever did, so worker
    threads that come and go (anyio's expire after 10 s idle) ran a long-lived process out of them.
    A thread's connections now close when it ends."""
    path = tmp_path / "store.db"
    with SQLiteStore(path) as store:
        rollout = store.create_rollout()
        store.get_rollout_by_key(rollout.api_key)  # this thread's own connections, kept while it lives
        store.read_gate()

        def use_the_store() -> None:
            assert store.get_rollout_by_key(rollout.api_key).rollout_id == rollout.rollout_id
            assert store.read_gate().command == 0
            assert store.add_call_now(_a_call(rollout.rollout_id)) is not None

        def threads_come_and_go(n: int) -> None:
            for _ in range(n):
                thread = threading.Thread(target=use_the_store)
                thread.start()
                thread.join(timeout=60)

        def settled(at_most: int) -> int:
            deadline = time.monotonic() + 30  # a thread's end is seen a moment after join returns
            while _open_fds_on(path) > at_most and time.monotonic() < deadline:
                time.sleep(0.01)
            return _open_fds_on(path)

        # SQLite defers closing a descriptor while another connection of the process holds locks on
        # the file, and reuses it later: the count after a few threads, not before any, is the bound.
        threads_come_and_go(2)
        bound = _open_fds_on(path)
        threads_come_and_go(20)  # each kept two descriptors open for good: 40 more
        assert settled(at_most=bound) <= bound
        assert store.count_calls(rollout.rollout_id) == 22  # the control: every thread did write


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_reads_keys_on_its_own_connection(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    rollout = store.create_rollout()
    store.get_rollout_by_key(rollout.api_key)  # the parent's reader connection exists
    store.start_rollout(rollout.rollout_id)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_reads_a_key, args=(store, rollout.api_key, out))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0 and out.get(timeout=5) == "running"
    store.close()


def _a_call(rollout_id: str, n: int = 0) -> Call:
    return Call(
        rollout_id=rollout_id, prompt_token_ids=[n, n + 1], response_token_ids=[7], response_logprobs=[-0.5]
    )


def test_add_call_now_writes_at_once_or_not_at_all(tmp_path: Path) -> None:
    """``add_call_now``: the same record as ``add_call`` when the write lock is free; ``None`` at once,
    and nothing written, while another connection (another process) holds it."""
    store = SQLiteStore(tmp_path / "store.db")
    rollout = store.create_rollout()
    now = store.add_call_now(_a_call(rollout.rollout_id, 0))
    later = store.add_call(_a_call(rollout.rollout_id, 1))
    assert now is not None and (now.seq, later.seq) == (0, 1)
    assert store.list_calls(rollout.rollout_id) == [now, later]

    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the write lock, held as another process would
    try:
        assert store.add_call_now(_a_call(rollout.rollout_id, 2)) is None  # at once: busy_timeout 0
        waiting = threading.Thread(target=store.add_call, args=(_a_call(rollout.rollout_id, 3),))
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive()  # the control: add_call waits for the lock
    finally:
        other.execute("COMMIT")
        other.close()
    waiting.join(timeout=30)
    assert [c.prompt_token_ids for c in store.list_calls(rollout.rollout_id)] == [[0, 1], [1, 2], [3, 4]]
    assert SQLiteStore(":memory:").add_call_now(_a_call(rollout.rollout_id)) is None  # one connection
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        store.add_call_now(_a_call(rollout.rollout_id))


def test_add_call_now_that_fails_leaves_the_lock_free(tmp_path: Path) -> None:
    """A call ``add_call_now`` cannot store (a token ID past int32) fails with its own error and takes
    nothing with it: no transaction stays open on the thread's connection, so another store on the
    file (another process) writes at once and the next ``add_call_now`` works. Before the fix the
    call was packed inside the transaction and its error left the write lock held."""
    store = SQLiteStore(tmp_path / "store.db")
    rollout = store.create_rollout()
    bad = Call(
        rollout_id=rollout.rollout_id,
        prompt_token_ids=[2**31],
        response_token_ids=[7],
        response_logprobs=[-0.5],
    )
    with pytest.raises(BadRequest, match="int32"):
        store.add_call_now(bad)
    other = SQLiteStore(tmp_path / "store.db", timeout_s=0.5)
    try:
        assert other.add_call(_a_call(rollout.rollout_id, 0)).seq == 0  # "database is locked" before
        assert other.cancel_rollout(store.create_rollout().rollout_id).status is RolloutStatus.CANCELLED
    finally:
        other.close()
    again = store.add_call_now(_a_call(rollout.rollout_id, 1))
    assert again is not None and again.seq == 1
    store.close()


def test_a_write_lock_held_past_the_busy_timeout_is_an_upstream_error_naming_the_store(
    tmp_path: Path,
) -> None:
    """Another connection (a process stopped mid-write, a program holding the file) keeps the write
    lock past the busy timeout: each write fails with an ``UpstreamError`` naming the store, as a
    PostgreSQL store names a server it cannot use, not the driver's bare "database is locked"
    traceback; reads go on meanwhile (WAL), and writes once the lock is free."""
    path = tmp_path / "store.db"
    store = SQLiteStore(path, timeout_s=0.2)
    queued, running = store.create_rollout(), store.start_rollout(store.create_rollout().rollout_id)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held as a stopped process would
    try:
        for write in (
            lambda: store.claim_rollouts("w", 1),
            lambda: store.add_call(_a_call(running.rollout_id)),
            lambda: store.finish_rollout(running.rollout_id, Outcome.SUCCESS, 1.0),
        ):
            with pytest.raises(UpstreamError, match=f"SQLite store '{path}' is locked"):
                write()
        assert store.get_rollout(queued.rollout_id).status is RolloutStatus.QUEUED  # reads go on
        with pytest.raises(UpstreamError, match="is locked"):  # so does a store opened meanwhile
            SQLiteStore(path, timeout_s=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r.rollout_id for r in store.claim_rollouts("w", 1)] == [queued.rollout_id]
    assert store.finish_rollout(running.rollout_id, Outcome.SUCCESS, 1.0).status is RolloutStatus.FINISHED
    assert store.list_calls(running.rollout_id) == []  # the refused call left nothing behind
    store.close()


class _LockedThenOpen:
    """A connection whose ``PRAGMA journal_mode = WAL`` fails as SQLite's race does ``failures`` times."""

    def __init__(self, failures: int, message: str = "database is locked") -> None:
        self.failures, self.message, self.tries = failures, message, 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode = WAL"
        self.tries += 1
        if self.tries <= self.failures:
            raise sqlite3.OperationalError(self.message)


def test_switching_to_wal_waits_out_another_opener_and_gives_up_at_the_timeout() -> None:
    """Openers of a fresh file race to switch it to WAL and SQLite answers the loser "database is
    locked" without its busy handler (a CI run lost one of three openers so): the switch is retried
    until the store's timeout, and other errors are not retried."""
    from harnessrl.store.sqlite import _enter_wal

    conn = _LockedThenOpen(failures=3)
    _enter_wal(conn, timeout_s=5)  # type: ignore[arg-type]
    assert conn.tries == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _enter_wal(_LockedThenOpen(failures=10**9), timeout_s=0.05)  # type: ignore[arg-type]
    other = _LockedThenOpen(failures=1, message="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk"):
        _enter_wal(other, timeout_s=5)  # type: ignore[arg-type]
    assert other.tries == 1
